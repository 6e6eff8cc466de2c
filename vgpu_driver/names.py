"""Validation of every name that may end up in a sysfs path.

Names come from nova.conf, from sysfs itself and from the CLI.  None of them
is joined into a path before it passed one of these checks, so a stray
``../`` or ``/`` can never steer a write outside the sysfs root.

Every check matches the whole string, ASCII only, and bounds its length: a
name with a trailing newline, a NUL, a non-ASCII digit or surrounding blanks is
refused, never trimmed into another name, so what passes is exactly what is
used as a path component and as a claims journal key.
"""

from __future__ import annotations

import dataclasses
import re
import uuid as uuid_mod
from collections.abc import Iterable

from vgpu_driver import exception

_PCI_RE = re.compile(
    r"(?P<domain>[0-9a-fA-F]{4}):(?P<bus>[0-9a-fA-F]{2}):"
    r"(?P<slot>[01][0-9a-fA-F])\.(?P<function>[0-7])",
    re.ASCII,
)
# Virtual (non-PCI) parents such as the kernel's mtty sample are named as in
# nova: "<class>_<device>" for /sys/devices/virtual/<class>/<device>.  Neither
# part holds an underscore, so the split is unambiguous.
_VIRTUAL_RE = re.compile(
    r"(?=.{3,128}\Z)(?P<cls>[a-z0-9][a-z0-9-]*)_(?P<dev>[a-z0-9][a-z0-9-]*)", re.ASCII
)
_TYPE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}", re.ASCII)
_UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.ASCII)


def _whole(pattern: re.Pattern[str], value: object) -> re.Match[str] | None:
    """The match of ``pattern`` over all of ``value``; None for anything else,
    non-strings included (``$`` would let a trailing newline through)."""
    return pattern.fullmatch(value) if isinstance(value, str) else None


@dataclasses.dataclass(frozen=True, order=True)
class PciAddress:
    domain: int
    bus: int
    slot: int
    function: int

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.slot:02x}.{self.function:x}"

    @property
    def provider_suffix(self) -> str:
        """The ``pci_dddd_bb_ss_f`` part of a provider name (as nova names it)."""
        return f"pci_{self.domain:04x}_{self.bus:02x}_{self.slot:02x}_{self.function:x}"

    def offset(self, n: int) -> PciAddress:
        """The address ``n`` routing IDs further on (how VFs are numbered)."""
        devfn = (self.slot << 3 | self.function) + n
        bus = self.bus + (devfn >> 8)
        devfn &= 0xFF
        return PciAddress(self.domain, bus, devfn >> 3, devfn & 7)


def parse_pci_address(value: object, source: str | None = None) -> PciAddress:
    """``dddd:bb:ss.f`` (any case) as a :class:`PciAddress`; ``str()`` of it is
    the canonical lower-case form.  Surrounding blanks are refused: sysfs
    entries and link targets never carry them; attribute reads, oslo.config
    lists and the SR-IOV commands' operator input trim theirs before a value
    gets here."""
    match = _whole(_PCI_RE, value)
    if not match:
        raise exception.InvalidSysfsName("PCI address", value, source)
    return PciAddress(
        int(match["domain"], 16),
        int(match["bus"], 16),
        int(match["slot"], 16),
        int(match["function"], 16),
    )


def is_pci_address(value: object) -> bool:
    return _whole(_PCI_RE, value) is not None


def parse_device_address(value: str, source: str | None = None) -> str:
    """A ``device_addresses`` entry: a PCI address or a virtual device name.

    Returns the canonical string (PCI addresses lower-cased).
    """
    if _whole(_VIRTUAL_RE, value):
        return value
    return str(parse_pci_address(value, source))


def virtual_device_path(name: str) -> tuple[str, str]:
    """``mtty_mtty`` -> ``("mtty", "mtty")`` (under devices/virtual)."""
    match = _whole(_VIRTUAL_RE, name)
    if not match:
        raise exception.InvalidSysfsName("virtual device name", name)
    return match["cls"], match["dev"]


def check_type_id(value: str, source: str | None = None) -> str:
    if not _whole(_TYPE_RE, value):
        raise exception.InvalidSysfsName("mdev type id", value, source)
    return value


def check_parent_name(value: str, source: str | None = None) -> str:
    """A name under class/mdev_bus: a PCI address or a plain device name."""
    if is_pci_address(value):
        return value.lower()
    if _whole(_TYPE_RE, value):
        return value
    raise exception.InvalidSysfsName("mdev parent name", value, source)


def is_mdev_uuid(value: object) -> bool:
    return _whole(_UUID_RE, value) is not None


def check_mdev_uuid(value: str, source: str | None = None) -> str:
    """A canonical lower-case UUID, the only form the kernel names mdevs by."""
    if not is_mdev_uuid(value):
        raise exception.InvalidSysfsName("mdev UUID", value, source)
    return value


def new_mdev_uuid() -> str:
    return str(uuid_mod.uuid4())


def check_vgpu_id(value: str, source: str | None = None) -> str:
    """What claims and domains name a vGPU by, in its canonical form.

    An mdev is named by its UUID.  On NVIDIA's vendor-specific VFIO framework
    the vGPU is the VF itself (a guest gets the VF, not an mdev), so it is
    named by the VF's PCI address.  The two forms never overlap.
    """
    if is_mdev_uuid(value):
        return value
    if is_pci_address(value):
        return str(parse_pci_address(value))
    raise exception.InvalidSysfsName("vGPU id (mdev UUID or VF PCI address)", value, source)


def is_vf_vgpu_id(value: object) -> bool:
    """True for the id of a vendor-VFIO vGPU (a VF's PCI address)."""
    return is_pci_address(value)


_VENDOR_TYPE_RE = re.compile(r"nvidia-(?P<number>[1-9][0-9]{0,8})", re.ASCII)


def vendor_type_id(number: int) -> str:
    """The type id a vendor-VFIO type number is known by (``1156`` -> ``nvidia-1156``),
    named like the mdev types NVIDIA's older drivers list.

    Only an int is taken: ``int()`` of a string would read non-ASCII digits
    and blanks into a number no sysfs file printed."""
    if isinstance(number, bool) or not isinstance(number, int):
        raise exception.InvalidSysfsName("vendor vGPU type number", number)
    return f"nvidia-{number}"


def is_vendor_type_id(type_id: object) -> bool:
    """True for a vendor-VFIO type id (``nvidia-<number>``)."""
    return bool(_whole(_VENDOR_TYPE_RE, type_id))


def vendor_type_number(type_id: str, source: str | None = None) -> int:
    """``nvidia-1156`` -> 1156: the only kind of value written to ``current_vgpu_type``."""
    match = _whole(_VENDOR_TYPE_RE, type_id)
    if not match:
        raise exception.InvalidSysfsName("vendor vGPU type id", type_id, source)
    return int(match["number"])


def trait_fragment(text: str) -> str:
    """Upper-case text with every run of other characters folded to ``_``."""
    return re.sub(r"[^A-Z0-9]+", "_", text.upper()).strip("_")


# Placement's limit on a resource provider name (its POST schema's maxLength).
PROVIDER_NAME_MAX = 200


def check_nodename(nodename: str, suffixes: Iterable[str] = ()) -> str:
    """A compute node name every provider name built on it can carry.

    Checked before anything is written: Placement would take the root
    provider and refuse its first GPU child, leaving half a tree behind.
    ``suffixes``: the ``_<device>`` parts the GPUs' providers add to it.
    """
    if not isinstance(nodename, str) or not nodename.strip():
        raise exception.InvalidNodename(nodename=nodename, reason="it is empty")
    if nodename != nodename.strip():
        raise exception.InvalidNodename(
            nodename=nodename, reason="it starts or ends with white space"
        )
    if not nodename.isprintable():
        raise exception.InvalidNodename(nodename=nodename, reason="it holds control characters")
    longest = max((len(s) for s in suffixes), default=0)
    if len(nodename) + longest > PROVIDER_NAME_MAX:
        raise exception.InvalidNodename(
            nodename=nodename,
            reason=f"with its GPU suffix a provider name would be {len(nodename) + longest} "
            f"characters; Placement takes at most {PROVIDER_NAME_MAX}",
        )
    return nodename
