"""vgpu-manage run by a user who is not root reads, but writes nothing.

A privsep daemon started for such a user would read the global
configuration (nova-compute's files), not the ``--config-file`` and
``--sysfs-root`` the command was given, and write under another root.  So
every write is refused with one ``error:`` line naming the fix, and the
host is left as it was.  The command runs in a child process that really
drops to an unprivileged user (``nobody``) before it starts.
"""

import os
import tempfile

import pytest

from vgpu_driver.cmd import manage
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

A100 = "0000:41:00.0"
NOBODY = 65534


def run_as(uid, app, argv):
    """``(exit code, output)`` of ``app.run(argv)`` in a child running as ``uid``."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            os.close(read_end)
            out = os.fdopen(write_end, "w")
            app.stdout = app.stderr = out
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            code = app.run(argv)
            out.flush()
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        output = reader.read()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), output


@pytest.fixture
def world_readable_host():
    """A rebooted A100 (VFs off) and a nova.conf that configures it, where
    an unprivileged user can read them."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop to another user")
    top = tempfile.mkdtemp(prefix="vgpu-not-root-")
    os.chmod(top, 0o755)
    kernel = fakekernel.FakeKernel.build(os.path.join(top, "sys"), profiles.load("a100-sriov-off"))
    conf = os.path.join(top, "nova.conf")
    with open(conf, "w") as f:
        f.write(
            f"[devices]\nenabled_mdev_types = nvidia-468\n[mdev_nvidia-468]\n"
            f"device_addresses = {A100}\n[vgpu]\ntest_only_fake_sysfs_root = true\n"
        )
    yield kernel, conf
    import shutil

    shutil.rmtree(top)


def test_a_write_as_another_user_is_refused_with_one_error_line(world_readable_host):
    kernel, conf = world_readable_host
    argv = ["--config-file", conf, "--sysfs-root", kernel.paths.root, "sriov", "enable", "--all"]
    status_argv = [*argv[:4], "sriov", "status"]
    # As root first (the write dry): the commands' code is loaded before the
    # child drops to a user that may not read this checkout or Python's.
    assert manage.ManageApp().run(status_argv) == 0
    assert manage.ManageApp().run([*argv, "--dry-run"]) == 0
    status = run_as(NOBODY, manage.ManageApp(), status_argv)
    assert status[0] == 0, status[1]
    code, output = run_as(NOBODY, manage.ManageApp(), argv)
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert code == 2, output
    assert errors == [
        f"error: NVIDIA's sriov-manage (/usr/lib/nvidia/sriov-manage -e {A100}) "
        f"was not run: it needs root and vgpu-manage runs as uid {NOBODY}; run "
        "the command as root, e.g. with sudo; nothing was changed"
    ], output
    assert kernel.pci_device(A100).sriov_numvfs == 0
