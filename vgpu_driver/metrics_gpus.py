"""The per-GPU and per-vGPU series of a :class:`~vgpu_driver.metrics.Reading`.

One unit per name: counts are vGPUs, per GPU and type, on every board (a
mixed-size board's framebuffer has its own ``_bytes`` series), each series
of one type, so that summing them over GPUs, hosts or a cloud means
something.  What describes a GPU (its provider, model, resource class, PCI
bus id) rides on ``vgpu_gpu_info`` alone, joined by ``gpu``: a label that
changes (a provider that comes) starts no new count series and resets no
alert's ``for``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from prometheus_client import core

from vgpu_driver import inventory
from vgpu_driver import names

if TYPE_CHECKING:
    from vgpu_driver.metrics import Reading

PREFIX = "vgpu"
MIB = 1024 * 1024


def _gauge(name: str, doc: str, labels: Iterable[str] = ()) -> core.GaugeMetricFamily:
    return core.GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


def _info(name: str, doc: str, labels: Iterable[str]) -> core.InfoMetricFamily:
    return core.InfoMetricFamily(f"{PREFIX}_{name}", doc, labels=list(labels))


def pci_bus_id(address: str) -> str:
    """A PCI address as NVML and dcgm-exporter's ``pci_bus_id`` write it
    (``00000000:3B:00.0``: eight hex digits of domain, upper case); empty
    for a GPU that is no PCI device."""
    if not names.is_pci_address(address):
        return ""
    pci = names.parse_pci_address(address)
    return f"{pci.domain:08X}:{pci.bus:02X}:{pci.slot:02X}.{pci.function:X}"


def gpu_families(reading: Reading) -> tuple[core.Metric, ...]:
    """``vgpu_gpu_*``: what each GPU is, offers, holds and holds back."""
    info = _info(
        "gpu",
        "What the GPU is: its resource provider (empty without one), "
        "resource class, model (vendor:device), PCI bus id as dcgm-exporter "
        "writes it, and the unit of its provider's inventory.",
        ["gpu", "provider", "resource_class", "model", "pci_bus_id", "unit"],
    )
    configured = _info(
        "gpu_configured_type",
        "A type nova.conf gives the GPU (several "
        "on a mixed-size board), whether it serves it or not.",
        ["gpu", "type"],
    )
    capacity = _gauge(
        "gpu_vgpus_capacity",
        "vGPUs of the type the GPU offers (on a "
        "mixed-size board: its size class's total, the most vGPUs of "
        "its size the board holds).",
        ["gpu", "type"],
    )
    used = _gauge(
        "gpu_vgpus_used",
        "vGPUs of the type on the GPU that guests or claims hold, each counted under its own type.",
        ["gpu", "type"],
    )
    reserved = _gauge(
        "gpu_vgpus_reserved",
        "vGPUs of the type the GPU offers that "
        "Placement may not hand out now (free = capacity - reserved - "
        "used, at least 0).",
        ["gpu", "type"],
    )
    by_reason = _gauge(
        "gpu_vgpus_reserved_by_reason",
        "The GPU's reserved vGPUs by what "
        "they are held back for: "
        + ", ".join(inventory.RESERVED_FOR)
        + " (a GPU serving one type).",
        ["gpu", "reason"],
    )
    fb_total = _gauge(
        "gpu_framebuffer_capacity_bytes",
        "A mixed-size board's framebuffer offered to vGPUs.",
        ["gpu"],
    )
    fb_used = _gauge(
        "gpu_framebuffer_used_bytes", "A mixed-size board's framebuffer its vGPUs take.", ["gpu"]
    )
    fb_reserved = _gauge(
        "gpu_framebuffer_reserved_bytes",
        "A mixed-size board's framebuffer Placement may not hand out, by what it is held back for.",
        ["gpu", "reason"],
    )
    served = _gauge(
        "gpu_served",
        "1 when the GPU has a resource provider, 0 when the "
        "configuration or its state leaves it out.",
        ["gpu"],
    )
    guests = _gauge(
        "gpu_guests",
        "Guests (libvirt domains) holding vGPUs of the GPU; "
        "absent when libvirt could not be asked.",
        ["gpu"],
    )
    vfs = _gauge("gpu_sriov_vfs", "An SR-IOV board's enabled virtual functions.", ["gpu"])
    vfs_max = _gauge(
        "gpu_sriov_vfs_max", "The virtual functions an SR-IOV board can enable.", ["gpu"]
    )
    for gpu in reading.host.gpus:
        provider = reading.providers.get(gpu.gpu)
        info.add_metric(
            [
                gpu.gpu,
                gpu.provider or "",
                provider.resource_class if provider else "",
                reading.models.get(gpu.gpu, ""),
                pci_bus_id(gpu.gpu),
                "MiB" if gpu.mixed else "vGPUs",
            ],
            {},
        )
        for type_id in reading.configured.get(gpu.gpu, ()):
            configured.add_metric([gpu.gpu, type_id], {})
        for count in gpu.types:
            labels = [gpu.gpu, count.type_id]
            capacity.add_metric(labels, count.capacity)
            used.add_metric(labels, count.used)
            reserved.add_metric(labels, count.reserved)
        held = dict(gpu.reserved_for)
        if provider is not None and gpu.mixed:
            fb_total.add_metric([gpu.gpu], gpu.total * MIB)
            fb_used.add_metric([gpu.gpu], gpu.used * MIB)
            for kind in inventory.RESERVED_FOR:
                fb_reserved.add_metric([gpu.gpu, kind], held.get(kind, 0) * MIB)
        elif provider is not None:
            for kind in inventory.RESERVED_FOR:
                by_reason.add_metric([gpu.gpu, kind], held.get(kind, 0))
        served.add_metric([gpu.gpu], 1 if gpu.provider else 0)
        if gpu.guests is not None:
            guests.add_metric([gpu.gpu], len({g.instance for g in gpu.guests}))
        if gpu.sriov is not None:
            vfs.add_metric([gpu.gpu], gpu.sriov.numvfs)
            vfs_max.add_metric([gpu.gpu], gpu.sriov.totalvfs)
    return (
        info,
        configured,
        capacity,
        used,
        reserved,
        by_reason,
        fb_total,
        fb_used,
        fb_reserved,
        served,
        guests,
        vfs,
        vfs_max,
    )


def vgpu_families(reading: Reading) -> list[core.InfoMetricFamily]:
    """``vgpu_vgpu_info``: one series per vGPU in sysfs, naming its GPU (and
    that GPU's ``pci_bus_id``, dcgm-exporter's join key), its type, and the
    guest holding it (instance UUID and domain; empty while none does) or
    the claim waiting for one; ``nodename`` is nova's, which dcgm-exporter's
    ``Hostname`` is on a host whose nodename is its hostname."""
    info = _info(
        "vgpu",
        "A vGPU: its id (mdev UUID, or the VF address of a vendor-VFIO "
        "vGPU), its GPU and that GPU's PCI bus id as dcgm-exporter writes it, "
        "its type, and the guest holding it (nova's instance UUID and the "
        "libvirt domain; the claim's instance and state when no guest does).",
        ["nodename", "vgpu", "gpu", "pci_bus_id", "type", "instance_uuid", "domain", "claim_state"],
    )
    claimed = {c.mdev_uuid: c for c in reading.claims}
    for vgpu_id, (gpu, type_id) in sorted(reading.vgpu_gpus.items()):
        guest = reading.guests.get(vgpu_id) if reading.guests is not None else None
        claim = claimed.get(vgpu_id)
        instance = guest.uuid if guest else claim.instance_uuid if claim else ""
        info.add_metric(
            [
                reading.host.nodename,
                vgpu_id,
                gpu,
                pci_bus_id(gpu),
                type_id or "",
                instance,
                guest.name if guest else "",
                claim.state if claim else "",
            ],
            {},
        )
    return [info]
