"""A stand-in for NVIDIA's ``/usr/lib/nvidia/sriov-manage``, on a fake host.

NVIDIA's vGPU manager ships a shell script that enables or disables the VFs
of its GPUs (``sriov-manage -e|-d ADDRESS|ALL``); its guide says to enable
them with it "and not by any other means".  The ``nvidia`` driver cannot
configure SR-IOV through ``sriov_numvfs`` (no ``.sriov_configure``, see
:mod:`vgpu_driver.fake.drivers`), so the script moves the PF to
``pci-pf-stub``, writes ``sriov_numvfs`` there, and binds ``nvidia`` back.
This module does the same, by writing the same files of a fake host (its
tree, or its FUSE mount), so any process can run it where a test points
``[vgpu] sriov_manage_path`` at ``vgpu-fake-sriov-manage``.

What is modelled, from NVIDIA's script:

* the options: ``-e``/``-d`` with ``dddd:bb:dd.f`` or ``ALL`` (every NVIDIA
  display or 3D controller at function ``00.0``, one run each, stopping at
  the first that fails), ``-h``; anything else prints the usage, exit 1;
* an address that is no NVIDIA function: exit 1, nothing printed (the
  script's ``lspci -d 10de: -s`` finds nothing); one without
  ``sriov_numvfs``: exit 0, nothing done; not a display or 3D controller:
  "This is not a VGA or 3D controller. Exiting.", exit 1;
* VFs already on (``-e``) or off (``-d``): says so, exit 0;
* ``nvidia``'s unbind lock, refused while the board is in use (here: a VF
  holds a vGPU): "Cannot obtain unbindLock for ADDRESS", exit 1;
* the move: unbind the PF's driver, ``driver_override`` = ``pci-pf-stub``
  and bind it there, ``sriov_numvfs`` = ``sriov_totalvfs`` (or 0), unbind,
  clear the override, bind ``nvidia``.  The script uses ``new_id`` and
  ``remove_id`` where this uses ``driver_override``; the kernel treats
  both as a match for ``pci-pf-stub``.  A write the kernel refuses is
  reported as the shell reports it and the script goes on, as the shell
  script does; the exit status is then 1.

Not modelled: ``modprobe pci-pf-stub`` (the fake always has the driver),
the 0.5 s pause, ``nvidia-smi -pm 1``, and binding the VFs to ``nvidia``
(the fake's VFs are born bound to it).

The fake host's root comes from ``--sysfs-root`` or the environment
variable ``VGPU_FAKE_SYSFS_ROOT``; a root that is no fake host is refused,
so the stand-in never writes a real ``/sys``.
"""

import argparse
import os
import sys

from vgpu_driver import exception
from vgpu_driver import names

ENV_ROOT = "VGPU_FAKE_SYSFS_ROOT"
NVIDIA_VENDOR = "0x10de"
PF_STUB = "pci-pf-stub"
USAGE = """Usage:
    sriov-manage <-e|-d> <ssss:bb:dd.f|ALL>
        Enable/disable Virtual functions on the GPU specified by the PCI_ID=ssss:bb:dd.f.
        If 'ALL' is specified in place of PCI_ID, operate on all the nvidia GPUs in the system.

    sriov-manage -h
        Print this help.
"""


class Sysfs:
    """The files the script reads and writes under one root; ``write`` is
    the fake kernel's (a tree) or a plain file write (a FUSE mount)."""

    def __init__(self, root, write=None):
        self.root = root
        self._write = write

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def read(self, *parts):
        try:
            with open(self.path(*parts)) as f:
                return f.read().strip()
        except OSError:
            return None

    def write(self, path, value):
        if self._write is not None:
            self._write(path, value)
            return
        with open(path, "w") as f:
            f.write(value)

    def device(self, address, *parts):
        return self.path("bus", "pci", "devices", address, *parts)

    def driver(self, name, *parts):
        return self.path("bus", "pci", "drivers", name, *parts)

    def bound(self, address):
        target = os.path.realpath(self.device(address, "driver"))
        return os.path.basename(target) if os.path.lexists(self.device(address, "driver")) else None


def set_numvfs(sysfs, address, count, report=None):
    """Move the PF through ``pci-pf-stub`` to set its VF count, as the
    script's ``set_numvfs`` does.  Every refused write is given to
    ``report(path, error)`` and the next one is made; without ``report``
    the first is raised."""
    failed = []

    def write(path, value):
        try:
            sysfs.write(path, value)
        except OSError as exc:
            if report is None:
                raise
            failed.append(exc)
            report(path, exc)

    current = sysfs.bound(address)
    if current:
        write(sysfs.driver(current, "unbind"), address)
    write(sysfs.device(address, "driver_override"), PF_STUB)
    if not os.path.lexists(sysfs.driver(PF_STUB, address)):
        write(sysfs.driver(PF_STUB, "bind"), address)
    write(sysfs.device(address, "sriov_numvfs"), str(count))
    write(sysfs.driver(PF_STUB, "unbind"), address)
    write(sysfs.device(address, "driver_override"), "\n")
    write(sysfs.driver("nvidia", "bind"), address)
    return not failed


def _in_use(sysfs, address):
    """Whether a VF of the PF holds a vGPU (an mdev, or a vendor type)."""
    for entry in os.listdir(sysfs.device(address)):
        if not entry.startswith("virtfn"):
            continue
        vf = sysfs.device(address, entry)
        if (sysfs.read(vf, "nvidia", "current_vgpu_type") or "0") != "0":
            return True
        if any(names.is_mdev_uuid(name) for name in os.listdir(vf)):
            return True
    return False


def _manage(sysfs, enable, address, out, err):
    """One GPU, as the script's ``enable_vfs``/``disable_vfs``: the exit status."""
    try:
        address = str(names.parse_pci_address(address))
    except exception.InvalidSysfsName:
        return 1
    if sysfs.read("bus", "pci", "devices", address, "vendor") != NVIDIA_VENDOR:
        return 1
    if not os.path.exists(sysfs.device(address, "sriov_numvfs")):
        return 0
    if not (sysfs.read("bus", "pci", "devices", address, "class") or "").startswith("0x03"):
        err.write("This is not a VGA or 3D controller. Exiting.\n")
        return 1
    numvfs = sysfs.read("bus", "pci", "devices", address, "sriov_numvfs")
    if enable and numvfs != "0":
        out.write(f"GPU at {address} already has VFs enabled.\n")
        return 0
    if not enable and numvfs == "0":
        out.write(f"GPU at {address} already has VFs disabled.\n")
        return 0
    out.write(f"{'Enabling' if enable else 'Disabling'} VFs on {address}\n")
    if sysfs.bound(address) == "nvidia" and _in_use(sysfs, address):
        err.write(f"Cannot obtain unbindLock for {address}\n")
        return 1
    count = sysfs.read("bus", "pci", "devices", address, "sriov_totalvfs") if enable else "0"

    def report(path, exc):
        err.write(f"sriov-manage: line 1: {path}: write error: {exc.strerror}\n")

    return 0 if set_numvfs(sysfs, address, int(count), report) else 1


def _every_gpu(sysfs):
    """The script's ``lspci -Dd 10de: -s 0.0``, display and 3D controllers."""
    found = []
    for address in sorted(os.listdir(sysfs.path("bus", "pci", "devices"))):
        pci_class = sysfs.read("bus", "pci", "devices", address, "class") or ""
        if (
            address.endswith(":00.0")
            and pci_class[:6] in ("0x0300", "0x0302")
            and sysfs.read("bus", "pci", "devices", address, "vendor") == NVIDIA_VENDOR
        ):
            found.append(address)
    return found


def _is_fake(root):
    from vgpu_driver.fake import fakekernel  # not at import: it imports this module

    if fakekernel.FakeKernel.owns(root):
        return True
    real = os.path.realpath(root)
    with open("/proc/self/mounts") as f:
        return any(line.split()[:2] == ["vgpu-fake-host", real] for line in f)


def _open(root):
    from vgpu_driver.fake import fakekernel

    if fakekernel.FakeKernel.owns(root):
        return Sysfs(root, fakekernel.FakeKernel(root).write_attr)
    return Sysfs(root)


def main(argv=None, out=None, err=None):
    out, err = out or sys.stdout, err or sys.stderr
    parser = argparse.ArgumentParser(prog="sriov-manage", add_help=False)
    which = parser.add_mutually_exclusive_group()
    which.add_argument("-e", dest="enable", metavar="ADDRESS")
    which.add_argument("-d", dest="disable", metavar="ADDRESS")
    which.add_argument("-h", dest="help", action="store_true")
    parser.add_argument("--sysfs-root", default=os.environ.get(ENV_ROOT))
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        err.write(USAGE)
        return 1
    if args.help:
        err.write(USAGE)
        return 0
    target = args.enable or args.disable
    if not target:
        err.write(USAGE)
        return 1
    if not args.sysfs_root or not os.path.isdir(args.sysfs_root) or not _is_fake(args.sysfs_root):
        err.write(
            f"sriov-manage (fake): {args.sysfs_root or 'no root'} is no fake host "
            f"(give --sysfs-root or {ENV_ROOT})\n"
        )
        return 1
    sysfs = _open(args.sysfs_root)
    if target.lower() == "all":
        for address in _every_gpu(sysfs):
            code = _manage(sysfs, bool(args.enable), address, out, err)
            if code:
                return code
        return 0
    return _manage(sysfs, bool(args.enable), target, out, err)


if __name__ == "__main__":
    sys.exit(main())
