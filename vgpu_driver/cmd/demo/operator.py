"""The operator's view at the end of the demo: ``vgpu-manage`` in this process.

libvirt's test driver keeps its guests per process, so the commands an
operator would run (``mdev list``, ``audit``, ``status``) run here, against
the same host, and a non-zero exit fails the demo like any step.
"""

import io
import shlex

from vgpu_driver.cmd import base
from vgpu_driver.cmd import manage
from vgpu_driver.cmd.demo import progress
from vgpu_driver.cmd.demo import scenario
from vgpu_driver.fake import fakekernel


class _InProcessManage(manage.ManageApp):
    """vgpu-manage in this process: libvirt's test driver keeps its guests per
    process, so only here does the command see the demo's domains."""

    host_factory = fakekernel.FakeKernel

    def configure_logging(self):
        pass  # the demo's own app has set logging up


def run(out, conf_path, *command):
    """Run and show one vgpu-manage command; ``out`` is the demo's
    :class:`~vgpu_driver.cmd.demo.progress.Progress`."""
    argv = ["--config-file", conf_path, "--nodename", scenario.NODENAME, *command]
    out.say(f"==> $ vgpu-manage {shlex.join(argv)}\n")
    app = _InProcessManage()
    app.stdout, app.stderr = io.StringIO(), io.StringIO()
    code = app.run(argv)
    output = app.stdout.getvalue()
    if output.strip():
        out.say(output)
    elif command[0] == "audit" and code == base.EXIT_OK:
        out.detail(
            "no drift: Placement's allocations and inventory match the "
            "host's mdevs, claims and guests"
        )
    if code != base.EXIT_OK:
        said = app.stderr.getvalue().strip().splitlines()
        errors = [line for line in said if line.startswith("error: ")]
        if errors:
            why = errors[-1].removeprefix("error: ")
        elif command[0] == "audit":
            why = "drift, listed above"  # its warnings, if any, are not why
        else:
            why = said[-1] if said else "no message"
        raise progress.DemoFailed(
            step=f"vgpu-manage {' '.join(command[:2])}", reason=f"exit code {code}: {why}"
        )
