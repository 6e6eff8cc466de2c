"""The fake kernel's PCI drivers: which driver each function is bound to.

A mixin of :class:`~vgpu_driver.fake.fakekernel.FakeKernel`.  Two drivers
are modelled, with the kernel's files for them: each function's ``driver``
link and ``driver_override``, each driver's ``bus/pci/drivers/<name>/``
with ``bind``, ``unbind`` and a link per bound function.

* ``nvidia`` binds NVIDIA display and 3D controllers.  Its ``struct
  pci_driver`` has no ``.sriov_configure`` (NVIDIA's open-gpu-kernel-modules,
  ``kernel-open/nvidia/nv-pci.c``), so ``sriov_numvfs`` of a PF it holds is
  refused: NVIDIA's ``sriov-manage`` exists for that.
* ``pci-pf-stub`` binds nothing by itself (no ID table) but takes a PF
  whose ``driver_override`` names it; its ``.sriov_configure`` is
  ``pci_sriov_configure_simple`` (``drivers/pci/pci-pf-stub.c``).

The rules, from the kernel's code:

* ``bind`` (``bind_store``, ``drivers/base/bus.c``): ``ENODEV`` for an
  address no function has, or a driver that does not match it (a
  ``driver_override`` naming another driver, ``pci_match_device`` in
  ``drivers/pci/pci-driver.c``); ``EBUSY`` when a driver holds it already
  (``__driver_probe_device``, ``drivers/base/dd.c``).
* ``unbind`` (``unbind_store``): ``ENODEV`` unless that driver holds it.
  Unbinding a PF leaves its VFs enabled (``pci_iov_remove`` only warns).
* ``driver_override`` (``driver_set_override``, ``drivers/base/driver.c``):
  one trailing newline dropped, empty clears it, ``EINVAL`` from a page
  on; reads ``(null)`` when unset.  It binds nothing by itself.
* ``nvidia`` bound to an SR-IOV PF starts the board afresh: equal-size
  mode and no vGPU type on any VF ("the vGPU mode [...] is reset when the
  driver is reloaded", *Virtual GPU Software User Guide* 17.0, 2.11).

``set_vfs`` plays the host's administrator running NVIDIA's script.

Not modelled: a VF's driver (the fake's VFs stay bound to ``nvidia``; a VF
written to ``bind`` or ``unbind`` is refused with ``EOPNOTSUPP``), and
``new_id``/``remove_id``.
"""

import errno
import os

from vgpu_driver import exception
from vgpu_driver import names
from vgpu_driver.fake import sriov_manage
from vgpu_driver.fake import tree
from vgpu_driver.sysfs import linux

NVIDIA = "nvidia"
PF_STUB = "pci-pf-stub"
# Whether each driver has .sriov_configure (see the module's docstring).
SRIOV_CONFIGURE = {NVIDIA: False, PF_STUB: True}
_PAGE_SIZE = 4096


class PciDrivers:
    """Binding and unbinding PCI functions; who answers ``sriov_numvfs``."""

    def _driver_dir(self, name):
        return self.paths.join("bus", "pci", "drivers", name)

    def _make_drivers(self):
        for name in SRIOV_CONFIGURE:
            os.makedirs(self._driver_dir(name), exist_ok=True)
            for attr in ("bind", "unbind"):
                path = os.path.join(self._driver_dir(name), attr)
                if not os.path.exists(path):
                    tree.write_file(path, "", 0o200)

    def bound_driver(self, dev):
        """The name of the driver bound to a device directory, or None."""
        target = linux.resolve_link(os.path.join(dev, "driver"))
        return os.path.basename(target) if target else None

    def _attach(self, dev, name):
        tree.link(self._driver_dir(name), os.path.join(dev, "driver"))
        tree.link(dev, os.path.join(self._driver_dir(name), os.path.basename(dev)))
        self._uevent_driver(dev, name)

    def _detach(self, dev):
        name = self.bound_driver(dev)
        tree.remove_link(os.path.join(dev, "driver"))
        if name:
            tree.remove_link(os.path.join(self._driver_dir(name), os.path.basename(dev)))
        self._uevent_driver(dev, None)

    @staticmethod
    def _uevent_driver(dev, name):
        """``uevent`` names the bound driver first, as the kernel's does."""
        path = os.path.join(dev, "uevent")
        lines = [
            line
            for line in (linux.read_attr(path) or "").splitlines()
            if line and not line.startswith("DRIVER=")
        ]
        tree.write_file(
            path, "".join(f"{line}\n" for line in ([f"DRIVER={name}"] if name else []) + lines)
        )

    def _override(self, dev):
        value = linux.read_attr(os.path.join(dev, "driver_override"))
        return None if value in (None, "(null)") else value

    def _matches(self, dev, name):
        """``pci_match_device``: an override names the one driver that
        matches; else ``nvidia`` matches NVIDIA display or 3D controllers
        and ``pci-pf-stub`` nothing."""
        override = self._override(dev)
        if override is not None:
            return override == name
        return (
            name == NVIDIA
            and linux.read_attr(os.path.join(dev, "vendor")) == "0x10de"
            and (linux.read_attr(os.path.join(dev, "class")) or "").startswith("0x03")
        )

    def _function_dir(self, value, attr):
        """The device directory of the address written to bind or unbind."""
        try:
            address = str(names.parse_pci_address(value.strip()))
        except exception.InvalidSysfsName:
            raise tree.os_error(errno.ENODEV, attr) from None
        link = self.paths.pci_device(address)
        if not os.path.lexists(link):
            raise tree.os_error(errno.ENODEV, attr)
        dev = os.path.realpath(link)
        if os.path.lexists(os.path.join(dev, "physfn")):
            raise tree.os_error(errno.EOPNOTSUPP, attr)
        return dev

    def set_vfs(self, pf_address, count):
        """The host's administrator enables ``count`` VFs (0 disables them)
        as NVIDIA's ``sriov-manage`` does: through ``pci-pf-stub``, then
        ``nvidia`` bound back (any count, for tests; the script asks for
        ``sriov_totalvfs``).  The kernel's errno is raised."""
        sriov_manage.set_numvfs(
            sriov_manage.Sysfs(self.paths.root, self.write_attr),
            str(names.parse_pci_address(str(pf_address))),
            count,
        )

    def _boot_driver(self, dev):
        """As after a boot: ``nvidia`` bound, no override."""
        tree.write_file(os.path.join(dev, "driver_override"), "(null)\n", 0o644)
        if self.bound_driver(dev) != NVIDIA:
            self._detach(dev)
            self._attach(dev, NVIDIA)

    def _store_bind(self, name, value):
        dev = self._function_dir(value, "bind")
        if not self._matches(dev, name):
            raise tree.os_error(errno.ENODEV, "bind")
        if self.bound_driver(dev):
            raise tree.os_error(errno.EBUSY, "bind")
        self._attach(dev, name)
        gpu = self._gpu_at(dev)
        if name == NVIDIA and gpu is not None and gpu.get("sriov"):
            self._restart_board(gpu)
        self._announce_pci("bind", dev, DRIVER=name)

    def _store_unbind(self, name, value):
        dev = self._function_dir(value, "unbind")
        if self.bound_driver(dev) != name:
            raise tree.os_error(errno.ENODEV, "unbind")
        self._detach(dev)
        self._announce_pci("unbind", dev)

    def _store_driver_override(self, dev, value):
        """``driver_set_override`` (``drivers/base/driver.c``): a write of
        ``PAGE_SIZE - 1`` bytes or more is ``EINVAL``; the name ends at the
        first newline, and an empty name clears the override."""
        if len(value.encode()) >= _PAGE_SIZE - 1:
            raise tree.os_error(errno.EINVAL, "driver_override")
        value = value.split("\n", 1)[0]
        tree.write_file(os.path.join(dev, "driver_override"), f"{value or '(null)'}\n", 0o644)

    def _check_sriov_configure(self, pf_dir):
        """``sriov_numvfs_store`` (``drivers/pci/iov.c``) asks the PF's
        driver: none bound ("no driver bound to device; cannot configure
        SR-IOV") or one without ``.sriov_configure`` ("driver does not
        support SR-IOV configuration via sysfs") is ``ENOENT``."""
        name = self.bound_driver(pf_dir)
        if name is None or not SRIOV_CONFIGURE.get(name, False):
            raise tree.os_error(errno.ENOENT, "sriov_numvfs")

    def _gpu_at(self, dev):
        name = os.path.basename(dev)
        return next((g for g in self.model["gpus"] if g.get("address") == name), None)

    def _restart_board(self, gpu):
        """The vGPU manager takes the board afresh: equal-size mode, and no
        VF keeps a vGPU type (see the module's docstring)."""
        self._forget_mixed_size(gpu)
        if gpu["model"] == "nvidia-vfio":
            for vf in self._current_vfs(gpu):
                current = os.path.join(self._device_dir(gpu, vf), "nvidia", "current_vgpu_type")
                if os.path.exists(current):
                    tree.write_file(current, "0\n", 0o644)
        self._refresh(gpu)
