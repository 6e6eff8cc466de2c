"""A GPU's vGPU mode, read and set through NVML, NVIDIA's management library.

Whether a board hosts vGPUs of one framebuffer size (equal-size mode, the
default) or of several (mixed-size mode) is NVML state, not a sysfs file:
``nvidia-smi vgpu -shm`` calls ``nvmlDeviceSetVgpuHeterogeneousMode``.
NVIDIA's own bindings (``pynvml``, from nvidia-ml-py: the ``nvml`` extra)
are imported only when a mode is read or set, so hosts without such
boards need neither them nor NVIDIA's library.  Each call opens and closes
its own NVML session.  ``bindings`` stands for ``pynvml`` where a test's
fake vendor driver answers: bindings registered under the
``vgpu_driver.test_nvml_bindings`` entry point group, loaded only when a
configuration names a fake host with both test-only options
(:func:`bindings_for`), so that nothing in production imports them.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import importlib.metadata
from collections.abc import Iterable
from collections.abc import Iterator
from typing import TYPE_CHECKING
from typing import Any

from vgpu_driver import exception
from vgpu_driver import names

if TYPE_CHECKING:
    from oslo_config import cfg

    from vgpu_driver.names import PciAddress

# nvml.h: the values of a feature's state, and the return codes told apart.
FEATURE_DISABLED = 0
FEATURE_ENABLED = 1
HETEROGENEOUS_MODE = 0  # NVML_VGPU_PGPU_HETEROGENEOUS_MODE: a list's mode
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_IN_USE = 19
# Where the test-only fake vendor driver registers its bindings.
TEST_BINDINGS_GROUP = "vgpu_driver.test_nvml_bindings"
TEST_BINDINGS = "fake-kernel"

_REFUSALS: dict[int | None, str] = {
    ERROR_IN_USE: "vGPUs exist on it, and the mode changes only on a GPU without any",
    ERROR_NOT_SUPPORTED: "the GPU cannot mix vGPU sizes (MIG is on, or its driver does not "
    "report 'Heterogeneous Time-Slice Sizes')",
    ERROR_NO_PERMISSION: "NVML needs root to change it",
    ERROR_NOT_FOUND: "NVML knows no GPU at this address",
}


def bindings_for(conf: cfg.ConfigOpts) -> Any:
    """NVIDIA's bindings (None), or on a fake host in a test the bindings
    registered for it: only when ``conf`` names one with both test-only
    options."""
    if not (conf.vgpu.test_only_fake_nvml_host and conf.vgpu.test_only_fake_sysfs_root):
        return None
    found = importlib.metadata.entry_points(group=TEST_BINDINGS_GROUP, name=TEST_BINDINGS)
    if not found:
        raise exception.NvmlUnavailable(
            reason=f"no {TEST_BINDINGS!r} bindings are registered under "
            f"{TEST_BINDINGS_GROUP!r} (is vgpu-driver installed?)"
        )
    return next(iter(found)).load()(conf.vgpu.test_only_fake_nvml_host)


def _library(bindings: Any) -> Any:
    if bindings is not None:
        return bindings
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:
        raise exception.NvmlUnavailable(
            reason="nvidia-ml-py is not installed (pip install 'vgpu-driver[nvml]')"
        ) from exc


# What NVML's refusals mean where a vGPU type's size or maximum is read,
# in either mode: under NVIDIA's data-center driver (no vGPU manager),
# nvmlVgpuTypeGetMaxInstances answers NOT_SUPPORTED and
# nvmlVgpuTypeGetFramebufferSize INVALID_ARGUMENT for every type (read on an
# H200 with driver 580.159.04).
_TYPE_REFUSALS: dict[int | None, str] = {
    **_REFUSALS,
    ERROR_NOT_SUPPORTED: "NVML reports no vGPU on it (NVIDIA's vGPU manager is not "
    "loaded: its data-center driver answers so)",
}


@contextlib.contextmanager
def _gpu(
    pf_address: str | PciAddress,
    action: str,
    bindings: Any,
    refused: type[exception.MixedSizeModeRefused] = exception.MixedSizeModeRefused,
) -> Iterator[tuple[Any, Any]]:
    """``(library, handle)`` of the GPU at ``pf_address`` in an NVML session;
    NVML's refusals become ``refused`` (:class:`MixedSizeModeRefused`, or
    for a read of types :class:`VgpuTypesUnreadable`)."""
    address = str(names.parse_pci_address(pf_address))
    library = _library(bindings)
    try:
        library.nvmlInit()
    except library.NVMLError as exc:
        raise exception.NvmlUnavailable(reason=str(exc)) from exc
    try:
        yield library, library.nvmlDeviceGetHandleByPciBusId(address)
    except library.NVMLError as exc:
        refusals = _TYPE_REFUSALS if refused is exception.VgpuTypesUnreadable else _REFUSALS
        reason = refusals.get(getattr(exc, "value", None), f"NVML said: {exc}")
        raise refused(action=action, gpu=address, reason=reason) from exc
    finally:
        with contextlib.suppress(library.NVMLError):
            library.nvmlShutdown()


def heterogeneous_mode(pf_address: str | PciAddress, bindings: Any = None) -> bool:
    """Whether the GPU is in mixed-size mode."""
    with _gpu(pf_address, "read", bindings) as (library, handle):
        mode: int = library.nvmlDeviceGetVgpuHeterogeneousMode(handle)
        return mode == FEATURE_ENABLED


def set_heterogeneous_mode(
    pf_address: str | PciAddress, enabled: bool, bindings: Any = None
) -> None:
    """Put the GPU in mixed-size mode (``enabled``) or back in equal-size
    mode.  NVML refuses while any vGPU exists on the GPU; on KVM the mode is
    lost when the GPU's VFs are disabled or enabled, or the host reboots."""
    action = "enable" if enabled else "disable"
    with _gpu(pf_address, action, bindings) as (library, handle):
        library.nvmlDeviceSetVgpuHeterogeneousMode(
            handle, FEATURE_ENABLED if enabled else FEATURE_DISABLED
        )


# A vGPU without a placement (NVA081_PLACEMENT_ID_INVALID in NVIDIA's ctrla081.h).
INVALID_PLACEMENT_ID = 0xFFFF

Placements = collections.namedtuple("Placements", "size supported creatable")
Placements.__doc__ = """A vGPU type's placements on a mixed-size GPU: its size
in slots, the placement IDs it may take, and those it could take now."""


def _ids(placement_list: Any) -> tuple[int, ...]:
    return tuple(int(i) for i in placement_list.placementIds[: placement_list.count])


def placements(
    pf_address: str | PciAddress, type_numbers: Iterable[int], bindings: Any = None
) -> dict[int, Placements]:
    """``{type number: Placements}`` of a mixed-size GPU, in one NVML session
    (the lists of one moment).  NVML answers for the GPU (the PF), whose
    vGPUs its VFs serve."""
    found: dict[int, Placements] = {}
    with _gpu(pf_address, "read the placements in", bindings) as (library, handle):
        for number in type_numbers:
            supported = library.nvmlDeviceGetVgpuTypeSupportedPlacements(
                handle, number, HETEROGENEOUS_MODE
            )
            creatable = library.nvmlDeviceGetVgpuTypeCreatablePlacements(handle, number)
            found[number] = Placements(
                int(supported.placementSize), _ids(supported), _ids(creatable)
            )
    return found


def max_instances(
    pf_address: str | PciAddress, type_numbers: Iterable[int], bindings: Any = None
) -> dict[int, int]:
    """``{type number: most vGPUs of it the GPU holds}``, in one NVML session
    (``nvmlVgpuTypeGetMaxInstances``: "the maximum number of vGPU instances
    creatable on a device for given vGPU type", nvml.h): in equal-size mode
    the per-board maximum of NVIDIA's guide, which a vendor-VFIO VF's
    ``creatable_vgpu_types`` does not tell."""
    found: dict[int, int] = {}
    with _gpu(pf_address, "read the vGPU maxima of", bindings, exception.VgpuTypesUnreadable) as (
        library,
        handle,
    ):
        for number in type_numbers:
            found[number] = int(library.nvmlVgpuTypeGetMaxInstances(handle, number))
    return found


def equal_size_types(
    pf_address: str | PciAddress, type_numbers: Iterable[int], bindings: Any = None
) -> dict[int, tuple[int, int]]:
    """``{type number: (framebuffer MiB, most vGPUs of it the GPU holds)}``
    of the types the GPU supports, in one NVML session: what a board in
    equal-size mode serving several types offers of each while it holds
    no vGPU (``nvmlVgpuTypeGetFramebufferSize``, in bytes, and
    ``nvmlVgpuTypeGetMaxInstances``).  A type the GPU does not support
    ("INVALID_ARGUMENT if vgpuTypeId is invalid, or is not supported on
    target device", nvml.h) is left out."""
    found: dict[int, tuple[int, int]] = {}
    with _gpu(
        pf_address, "read the vGPU sizes and maxima of", bindings, exception.VgpuTypesUnreadable
    ) as (library, handle):
        for number in type_numbers:
            try:
                most = int(library.nvmlVgpuTypeGetMaxInstances(handle, number))
            except library.NVMLError as exc:
                if getattr(exc, "value", None) != ERROR_INVALID_ARGUMENT:
                    raise
                continue
            size = int(library.nvmlVgpuTypeGetFramebufferSize(number))
            found[number] = (size // (1024 * 1024), most)
    return found


def located_vgpus(
    pf_address: str | PciAddress, bindings: Any = None
) -> tuple[tuple[int, int], ...]:
    """``((type number, placement ID), ...)`` of the GPU's vGPUs NVML places,
    by placement ID, in one NVML session.  NVML lists *active* vGPU
    instances (a guest runs them); one it does not list, or cannot place
    (gone meanwhile, or :data:`INVALID_PLACEMENT_ID`), is left out, and the
    caller counts it as unlocated."""
    found: list[tuple[int, int]] = []
    with _gpu(pf_address, "locate the vGPUs in", bindings) as (library, handle):
        for instance in library.nvmlDeviceGetActiveVgpus(handle):
            try:
                placement = int(library.nvmlVgpuInstanceGetPlacementId(instance))
                if placement != INVALID_PLACEMENT_ID:
                    found.append((int(library.nvmlVgpuInstanceGetType(instance)), placement))
            except library.NVMLError:
                continue
    return tuple(sorted(found, key=lambda located: located[1]))


# nvml.h: nvmlGpuVirtualizationMode_t and nvmlHostVgpuMode_t.
VIRTUALIZATION_NONE = 0
VIRTUALIZATION_PASSTHROUGH = 1
VIRTUALIZATION_VGPU = 2  # a guest's view of its vGPU
VIRTUALIZATION_HOST_VGPU = 3  # NVIDIA's vGPU manager drives the GPU
VIRTUALIZATION_HOST_VSGA = 4
VIRTUALIZATION_NAMES = {
    VIRTUALIZATION_NONE: "none",
    VIRTUALIZATION_PASSTHROUGH: "pass-through",
    VIRTUALIZATION_VGPU: "vGPU (a guest's)",
    VIRTUALIZATION_HOST_VGPU: "host vGPU",
    VIRTUALIZATION_HOST_VSGA: "host vSGA",
}
HOST_VGPU_MODE_NAMES = {0: "non-SR-IOV", 1: "SR-IOV"}

GpuFacts = collections.namedtuple("GpuFacts", "name virtualization host_vgpu_mode error")
GpuFacts.__doc__ = """What NVML says of one GPU: its name, its virtualization
mode and host vGPU mode (None where NVML answers NOT_SUPPORTED), or, when
NVML could not answer for it at all, ``error``."""


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _unless_not_supported(library: Any, call: Any, handle: Any) -> Any:
    """``call(handle)``, or None when NVML answers NOT_SUPPORTED (NVIDIA's
    data-center driver does for every vGPU call)."""
    try:
        return call(handle)
    except library.NVMLError as exc:
        if getattr(exc, "value", None) == ERROR_NOT_SUPPORTED:
            return None
        raise


def gpu_facts(pf_addresses: Iterable[object], bindings: Any = None) -> dict[str, GpuFacts]:
    """``{address: GpuFacts}`` of GPUs, in one NVML session; raises
    NvmlUnavailable when there are no bindings or NVML will not start."""
    library = _library(bindings)
    try:
        library.nvmlInit()
    except library.NVMLError as exc:
        raise exception.NvmlUnavailable(reason=str(exc) or type(exc).__name__) from exc
    found: dict[str, GpuFacts] = {}
    try:
        for address in pf_addresses:
            address = str(names.parse_pci_address(str(address)))
            try:
                handle = library.nvmlDeviceGetHandleByPciBusId(address)
                name = _unless_not_supported(library, library.nvmlDeviceGetName, handle)
                found[address] = GpuFacts(
                    None if name is None else _text(name),
                    _unless_not_supported(library, library.nvmlDeviceGetVirtualizationMode, handle),
                    _unless_not_supported(library, library.nvmlDeviceGetHostVgpuMode, handle),
                    None,
                )
            except library.NVMLError as exc:
                found[address] = GpuFacts(None, None, None, f"NVML said: {exc}")
    finally:
        with contextlib.suppress(library.NVMLError):
            library.nvmlShutdown()
    return found
