"""The one GPU a privileged write is on, read beneath the root by fd.

The policy needs of a GPU only its address, its mode and the addresses the
configuration may name it by (its own and its parents'), as discovery
groups them (:func:`vgpu_driver.discovery.assemble`): a VF belongs to the
GPU its ``physfn`` leads to; a registered mdev parent or a VF with NVIDIA's
vendor files is a parent; NVIDIA's files make the board vendor-VFIO; an
SR-IOV NVIDIA board with no parent yet is pending, and with its VFs off it
is also named by the addresses they will take.  Only that GPU's functions
are read: the PF, its ``virtfn`` links and theirs, and the names under
``class/mdev_bus`` (one directory read).  A VF registered as an mdev parent
is not also read for NVIDIA's vendor-VFIO files: a board serves one or the
other.
"""

import collections
import posixpath
import re

from vgpu_driver import names

MODE_MDEV = "mdev"              # the values of vgpu_driver.discovery
MODE_VENDOR_VFIO = "vendor-vfio"
MODE_VIRTUAL = "virtual"
MODE_VFS_PENDING = "vfs-pending"
NVIDIA_VENDOR = "0x10de"
_DISPLAY_CLASS_PREFIX = "0x03"
_CURRENT_RE = re.compile(r"0|[1-9][0-9]{0,8}", re.ASCII)  # as PciReads reads it

Gpu = collections.namedtuple("Gpu", "address mode addresses")


def _pci(address):
    return posixpath.join("bus", "pci", "devices", address)


def _number(root, relpath):
    text = root.read(relpath)
    return int(text) if text.isdigit() else 0


def _is_parent(root, name):
    return root.exists(posixpath.join("class", "mdev_bus", name))


def _registered(root):
    """The names under ``class/mdev_bus`` (none without the mdev core)."""
    try:
        return frozenset(root.listdir(posixpath.join("class", "mdev_bus")))
    except FileNotFoundError:
        return frozenset()


def _is_vendor_vf(root, device):
    """A VF with NVIDIA's vendor files, as :meth:`PciReads.vendor_vf` reads it."""
    vfio = posixpath.join(device, "nvidia")
    return (bool(_CURRENT_RE.fullmatch(root.read(posixpath.join(vfio, "current_vgpu_type"))))
            and root.exists(posixpath.join(vfio, "creatable_vgpu_types")))


def _vfs(root, pf_device):
    """``[(VF address, VF device)]`` of a PF, by its ``virtfn<N>`` links."""
    return sorted((posixpath.basename(vf), vf)
                  for entry, vf in root.links(pf_device, "virtfn").items()
                  if entry[6:].isdigit())


def _future_vfs(root, address, device):
    offset = _number(root, posixpath.join(device, "sriov_offset"))
    stride = _number(root, posixpath.join(device, "sriov_stride"))
    total = _number(root, posixpath.join(device, "sriov_totalvfs"))
    if not (total and offset and stride):
        return ()
    pf = names.parse_pci_address(address)
    return tuple(str(pf.offset(offset + i * stride)) for i in range(total))


def _is_sriov_gpu(root, device):
    return (_number(root, posixpath.join(device, "sriov_totalvfs")) > 0
            and root.read(posixpath.join(device, "vendor")) == NVIDIA_VENDOR
            and root.read(posixpath.join(device, "class")).startswith(_DISPLAY_CLASS_PREFIX))


def physical_gpu(root, pf_address, pf_device):
    """The GPU whose physical function is at ``pf_device``, or None when
    discovery would see no GPU there."""
    parents, mode = [], None
    vfs = _vfs(root, pf_device)
    registered = _registered(root) if vfs else ()
    if pf_address in registered or (not vfs and _is_parent(root, pf_address)):
        parents.append(pf_address)
        mode = MODE_MDEV
    for vf, vf_device in vfs:
        if vf in registered:        # an mdev parent: NVIDIA's VF files are not there
            parents.append(vf)
            mode = mode or MODE_MDEV
        elif _is_vendor_vf(root, vf_device):
            parents.append(vf)
            mode = MODE_VENDOR_VFIO
    if mode is not None:
        return Gpu(pf_address, mode,
                   (pf_address, *sorted(p for p in parents if p != pf_address)))
    if not _is_sriov_gpu(root, pf_device):
        return None
    addresses = (pf_address,)
    if not _number(root, posixpath.join(pf_device, "sriov_numvfs")):
        addresses += _future_vfs(root, pf_address, pf_device)
    return Gpu(pf_address, MODE_VFS_PENDING, addresses)


def gpu_of_parent(root, parent, device):
    """The GPU of a parent (a registered mdev parent, or a vendor-VFIO VF)
    at ``device``, or None when ``parent`` is neither."""
    if not names.is_pci_address(parent):
        if not _is_parent(root, parent):
            return None
        key = posixpath.relpath(device, posixpath.join("devices", "virtual"))
        return Gpu(key.replace("/", "_"), MODE_VIRTUAL,
                   tuple(dict.fromkeys((key.replace("/", "_"), parent))))
    if not (_is_parent(root, parent) or _is_vendor_vf(root, device)):
        return None
    pf_address, pf_device = parent, device
    if root.exists(posixpath.join(device, "physfn")):
        pf_device = root.follow(posixpath.join(device, "physfn"), parent)
        pf_address = posixpath.basename(pf_device)
    return physical_gpu(root, pf_address, pf_device)
