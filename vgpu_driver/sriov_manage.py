"""NVIDIA's ``sriov-manage``: the one way the VFs of its GPUs are changed.

The ``nvidia`` driver has no ``.sriov_configure``, so the kernel refuses
a write to a PF's ``sriov_numvfs`` while ``nvidia`` holds it (``ENOENT``,
``sriov_numvfs_store`` in ``drivers/pci/iov.c``).  NVIDIA's vGPU manager
ships ``/usr/lib/nvidia/sriov-manage`` for that (its guide: enable the VFs
with it "and not by any other means"): it moves the PF to ``pci-pf-stub``,
sets the VF count, and binds ``nvidia`` back.

:class:`SriovManage` runs it, ``-e ADDRESS`` or ``-d ADDRESS``, one GPU per
call, as a list argv without a shell.  Only a root ``vgpu-manage`` runs it
(the boot unit, an operator); nova-compute never does.  A script that is
not there, not executable, or that fails is a
:class:`~vgpu_driver.exception.SriovManageFailed` naming the command and
what it printed, on one line.
"""

from __future__ import annotations

import os
import subprocess

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver import root_only

# NVIDIA's script pauses and rebinds drivers; a hung one must not hang the boot.
TIMEOUT = 300.0
_OUTPUT_LIMIT = 400


def replaceable_by_others(path: str) -> list[str]:
    """What another user than root can change of the script at ``path``:
    the file, its directories and its ``#!`` interpreter's."""
    found: list[str] = []
    for each in [path] + root_only.interpreter_paths(path):
        found += [p for p in root_only.problems(each) if p not in found]
    return found


def _printed(result: subprocess.CompletedProcess[str]) -> str:
    """What the script printed, on one line (its last words kept)."""
    text = " / ".join(
        line.strip()
        for line in f"{result.stdout or ''}\n{result.stderr or ''}".splitlines()
        if line.strip()
    )
    if len(text) > _OUTPUT_LIMIT:
        text = "..." + text[-_OUTPUT_LIMIT:]
    return text or "nothing"


class SriovManage:
    """NVIDIA's script at ``path`` (``[vgpu] sriov_manage_path``)."""

    def __init__(self, path: str, timeout: float = TIMEOUT) -> None:
        self.path = path
        self.timeout = timeout

    def command(self, flag: str, address: object) -> str:
        return f"{self.path} {flag} {address}"

    def check(self, flag: str, address: object) -> None:
        """SriovManageFailed unless this process can run the script: it is
        there, executable, only root can change it (root runs it, and
        nova.conf names it), and this is root; nothing is run."""

        def fail(why: str) -> exception.SriovManageFailed:
            return exception.SriovManageFailed(command=self.command(flag, address), why=why)

        if os.geteuid() != 0:
            raise fail(
                f"was not run: it needs root and vgpu-manage runs as uid "
                f"{os.geteuid()}; run the command as root, e.g. with sudo; nothing "
                "was changed"
            )
        if not os.path.isabs(self.path):
            raise fail(
                "cannot run: [vgpu] sriov_manage_path must be an absolute path; nothing was changed"
            )
        if not os.path.isfile(self.path):
            raise fail(
                "cannot run: there is no such file (it comes with NVIDIA's vGPU "
                "manager; set [vgpu] sriov_manage_path where it is installed); "
                "nothing was changed"
            )
        if not os.access(self.path, os.X_OK):
            raise fail("cannot run: the file is not executable; nothing was changed")
        changeable = replaceable_by_others(self.path)
        if changeable:
            raise fail(
                "was not run: root would run what another user can replace: "
                + "; ".join(changeable)
                + " (make the script and its directories "
                "writable by root alone); nothing was changed"
            )

    def enable(self, address: object) -> str:
        """``-e ADDRESS``: every VF of the GPU (sriov_totalvfs).  Returns
        what the script printed, on one line."""
        return self._run("-e", address)

    def disable(self, address: object) -> str:
        """``-d ADDRESS``: no VF.  Returns what the script printed."""
        return self._run("-d", address)

    def _run(self, flag: str, address: object) -> str:
        address = str(names.parse_pci_address(str(address)))
        self.check(flag, address)
        command = self.command(flag, address)
        try:
            result = subprocess.run(
                [self.path, flag, address],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            raise exception.SriovManageFailed(
                command=command, why=f"did not finish within {self.timeout:g}s"
            ) from None
        except OSError as exc:
            raise exception.SriovManageFailed(
                command=command, why=f"cannot run: {exc.strerror}"
            ) from None
        if result.returncode != 0:
            raise exception.SriovManageFailed(
                command=command,
                why=f"failed (exit code {result.returncode}); it printed: {_printed(result)}",
            )
        return _printed(result)
