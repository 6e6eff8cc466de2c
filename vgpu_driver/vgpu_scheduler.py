"""Which time-slice scheduler NVIDIA's vGPU manager runs on each GPU.

The policy is the ``RmPVMRL`` registry key, given to the ``nvidia`` module
as ``NVreg_RegistryDwords`` (every GPU) or ``NVreg_RegistryDwordsPerDevice``
(``pci=<address>;RmPVMRL=...`` for the keys that follow it), both readable
under ``module/nvidia/parameters/``.  Its low byte names the policy
(*Virtual GPU Software User Guide*, "RmPVMRL Registry Key"): ``0x00`` best
effort, ``0x01`` equal share (the default), ``0x11`` fixed share; the
higher bytes tune the time slice.  NVIDIA does not support the fixed-share
scheduler in mixed-size mode (ibid., 2.11).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from vgpu_driver import names
from vgpu_driver.sysfs import attrs

if TYPE_CHECKING:
    from vgpu_driver.names import PciAddress
    from vgpu_driver.sysfs.paths import SysfsPaths

KEY = "RmPVMRL"
BEST_EFFORT, EQUAL_SHARE, FIXED_SHARE = "best effort", "equal share", "fixed share"
_POLICIES = {0x00: BEST_EFFORT, 0x01: EQUAL_SHARE, 0x11: FIXED_SHARE}


def _parameter(paths: SysfsPaths, name: str) -> str:
    return attrs.read_attr(paths.join("module", "nvidia", "parameters", name)) or ""


def _value(text: str) -> int | None:
    try:
        return int(text, 0)
    except ValueError:
        return None


def _pairs(text: str) -> Iterator[tuple[str, str]]:
    for item in text.split(";"):
        key, sep, value = item.partition("=")
        if sep:
            yield key.strip(), value.strip()


def registry_values(paths: SysfsPaths, pf_address: str | PciAddress) -> int | None:
    """The ``RmPVMRL`` value the module applies to the GPU at ``pf_address``
    (its per-device setting over the global one), or None if unset."""
    address = str(names.parse_pci_address(str(pf_address)))
    found = None
    for key, value in _pairs(_parameter(paths, "NVreg_RegistryDwords")):
        if key == KEY:
            found = _value(value)
    device = None
    for key, value in _pairs(_parameter(paths, "NVreg_RegistryDwordsPerDevice")):
        if key == "pci":
            device = value if names.is_pci_address(value) else None
            device = str(names.parse_pci_address(device)) if device else None
        elif key == KEY and device == address:
            found = _value(value)
    return found


def policy(paths: SysfsPaths, pf_address: str | PciAddress) -> str | None:
    """The scheduler policy of the GPU (:data:`EQUAL_SHARE` when unset), or
    None for a value the module would not know."""
    value = registry_values(paths, pf_address)
    if value is None:
        return EQUAL_SHARE
    return _POLICIES.get(value & 0xFF)
