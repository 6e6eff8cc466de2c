"""``vgpu-privsep-helper``: the privileged daemons' command, run through sudo.

It replaces oslo.privsep's ``privsep-helper`` for our two contexts, keeping
its protocol and its daemon, and changes what runs as root before a call
is served:

* its command line is exactly ``--config-file F --privsep_context C
  --privsep_sock_path S``, C one of our contexts; its one file is
  root-owned and read with :mod:`.helper_conf`, nova-compute's files only
  as data.  oslo.config reads no other file or directory (no
  ``$HOME/.privsep``) and no environment variable, oslo.log is not set up:
  the helper opens no log file.  What it logs goes to its standard error
  (nova-compute's pipe) until its channel is up, then over the channel;
* a call is looked up among the context's own entry points, computed at
  start from :mod:`.entrypoints`; any other name is refused with the same
  ``NameError`` whatever it names, and nothing is imported for it
  (oslo.privsep's daemon imports the module of any name it is sent before
  it checks it);
* the bounding set keeps only the context's capabilities, so nothing the
  daemon might exec as uid 0 regains the others.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import socket
import sys
from typing import TYPE_CHECKING
from typing import Any

from oslo_config import cfg
from oslo_privsep import comm
from oslo_privsep import daemon

from vgpu_driver import exception
from vgpu_driver.privsep import context
from vgpu_driver.privsep import helper_conf

if TYPE_CHECKING:
    from collections.abc import Callable
    from collections.abc import Collection

LOG = logging.getLogger(__name__)
CONTEXTS = {
    "vgpu_driver.privsep.sysfs_writer": context.sysfs_writer,
    "vgpu_driver.privsep.gpu_admin": context.gpu_admin,
}
_PR_CAPBSET_DROP = 24


def exported(privileged: context.Context) -> dict[str, Callable[..., Any]]:
    """``{name a client sends: entry point}`` of one context."""
    from vgpu_driver.privsep import entrypoints

    # An entry point is partial(context._wrap, function): the client sends
    # the function's module and name.
    return {
        f"{f.args[0].__module__}.{f.args[0].__name__}": f
        for f in vars(entrypoints).values()
        if privileged.is_entrypoint(f)
    }


def keep_bounding_set(caps: Collection[int]) -> None:
    """Drop every capability but ``caps`` from the bounding set (needs
    CAP_SETPCAP: before oslo.privsep drops privileges)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as f:
        last = int(f.read())
    for cap in range(last + 1):
        if cap not in caps and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(code)}")


class Daemon(daemon.Daemon):
    """oslo.privsep's daemon, serving only ``calls``."""

    def __init__(
        self,
        channel: comm.ServerChannel,
        privileged: context.Context,
        calls: dict[str, Callable[..., Any]],
    ) -> None:
        super().__init__(channel, privileged)
        self.calls = calls

    def _drop_privs(self) -> None:
        keep_bounding_set(self.caps)
        super()._drop_privs()

    def _process_cmd(self, msgid: str, cmd: comm.Message, *args: Any) -> tuple[Any, ...]:
        if cmd == comm.Message.CALL and not (
            args and isinstance(args[0], str) and args[0] in self.calls
        ):
            # The text of oslo.privsep's own refusal, for any name.
            name = args[0] if args else None
            return (
                comm.Message.ERR.value,
                "builtins.NameError",
                (f"Invalid privsep function: {name!r} not exported",),
                "",
            )
        return super()._process_cmd(msgid, cmd, *args)


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=context.HELPER, allow_abbrev=False)
    parser.add_argument("--config-file", required=True)
    parser.add_argument("--privsep_context", required=True, choices=sorted(CONTEXTS))
    parser.add_argument("--privsep_sock_path", required=True)
    return parser.parse_args(argv)


def _start(
    args: argparse.Namespace,
) -> tuple[context.Context, dict[str, Callable[..., Any]], comm.ServerChannel]:
    """Everything that can fail before the caller is answered."""
    privileged = CONTEXTS[args.privsep_context]
    # The contexts' own options (capabilities, user...) keep their defaults.
    cfg.CONF(
        args=[],
        project="vgpu-driver-privsep",
        default_config_files=[],
        default_config_dirs=[],
        use_env=False,
    )
    context.fix_configuration(helper_conf.load(args.config_file))
    calls = exported(privileged)
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(args.privsep_sock_path)
    daemon.set_cloexec(sock)
    return privileged, calls, comm.ServerChannel(sock)


def main(argv: list[str] | None = None) -> int:
    args = _arguments(sys.argv[1:] if argv is None else argv)
    root = logging.getLogger()
    root.addHandler(logging.StreamHandler(sys.stderr))
    root.setLevel(logging.INFO)
    try:
        privileged, calls, channel = _start(args)
    except (exception.VgpuDriverError, OSError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if os.fork() != 0:
        return 0
    daemon.replace_logging(daemon.PrivsepLogHandler(channel))
    try:
        Daemon(channel, privileged, calls).run()
    except Exception as exc:  # noqa: BLE001 - the daemon's last word, as oslo.privsep's
        LOG.exception(exc)
        sys.exit(str(exc))
    sys.exit(0)
