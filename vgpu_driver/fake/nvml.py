"""NVML as the fake vendor driver answers it: the calls of NVIDIA's bindings.

Switching a GPU between equal-size and mixed-size mode is not a sysfs
write: ``nvidia-smi vgpu -shm`` calls NVML's
``nvmlDeviceSetVgpuHeterogeneousMode``.  This module offers the functions
of nvidia-ml-py's ``pynvml`` the driver calls, with the same names,
arguments and errors (:class:`NVMLError` carries NVML's return code in
``value``), answered by a fake host's kernel.  A test puts it where
``pynvml`` is imported from, or passes :class:`Bindings` of one fake host
where the driver takes ``bindings``; it replaces NVIDIA's library and
bindings, never the driver's code that calls them.  The module's own host
is the one given to :func:`use_host`, else the fake kernel tree named by
the ``VGPU_FAKE_NVML_ROOT`` environment variable (for a process a test
starts).
"""

import os

from vgpu_driver import names

NVML_SUCCESS = 0
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_IN_USE = 19
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
# nvmlVgpuPlacementList_v2_t's mode (nvml.h, R565 and later).
NVML_VGPU_PGPU_HETEROGENEOUS_MODE = 0
NVML_VGPU_PGPU_HOMOGENEOUS_MODE = 1
# A vGPU without a placement (NVA081_PLACEMENT_ID_INVALID, ctrla081.h).
INVALID_PLACEMENT_ID = 0xFFFF
# nvmlGpuVirtualizationMode_t and nvmlHostVgpuMode_t (nvml.h).
NVML_GPU_VIRTUALIZATION_MODE_NONE = 0
NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH = 1
NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU = 3
NVML_HOST_VGPU_MODE_NON_SRIOV = 0
NVML_HOST_VGPU_MODE_SRIOV = 1
# NVIDIA's data-center driver (no vGPU manager): the fake's model of it.
DATACENTER_MODEL = "nvidia-datacenter"

_TEXTS = {
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
    NVML_ERROR_IN_USE: "In use by another client",
}
_host = {"root": None}


class NVMLError(Exception):
    """An NVML call failed with return code ``value`` (as pynvml's)."""

    def __init__(self, value):
        self.value = value
        super().__init__(_TEXTS.get(value, f"NVML error {value}"))


def use_host(root):
    """Answer from the fake kernel tree at ``root`` (None: the environment's)."""
    _host["root"] = root


class PlacementList:
    """pynvml's ``c_nvmlVgpuPlacementList_v1_t``, as its callers read it."""

    def __init__(self, size, ids):
        self.placementSize = size  # noqa: N815 - pynvml's field names
        self.count = len(ids)
        self.placementIds = list(ids)  # noqa: N815


class Bindings:
    """pynvml's calls the driver makes, answered by the fake host at
    ``root`` (None: the module's host, see :func:`use_host`)."""

    NVMLError = NVMLError

    def __init__(self, root=None):
        self.root = root

    def _kernel(self):
        from vgpu_driver.fake import fakekernel  # it imports this module: import when used

        root = self.root or _host["root"] or os.environ.get("VGPU_FAKE_NVML_ROOT")
        if not root or not fakekernel.FakeKernel.owns(root):
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
        return fakekernel.FakeKernel(root)

    def nvmlInit(self):  # noqa: N802 - pynvml's name
        self._kernel()

    def nvmlShutdown(self):  # noqa: N802 - pynvml's name
        pass

    def nvmlDeviceGetHandleByPciBusId(self, pci_bus_id):  # noqa: N802 - pynvml's name
        """The GPU's handle: here, its PCI address as sysfs names it."""
        if isinstance(pci_bus_id, bytes):
            pci_bus_id = pci_bus_id.decode()
        if not names.is_pci_address(pci_bus_id):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        address = str(names.parse_pci_address(pci_bus_id))
        if address not in self._kernel()._gpus:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return address

    def _gpu(self, handle):
        gpu = self._kernel()._gpus.get(handle)
        if gpu is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return gpu

    def nvmlDeviceGetName(self, handle):  # noqa: N802 - pynvml's name
        """The product name (``NVIDIA H100 80GB HBM3``): the profile's
        ``product_name``; the fake invents none, so a GPU without one is
        NOT_SUPPORTED."""
        name = self._gpu(handle).get("product_name")
        if name is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return name

    def nvmlDeviceGetVirtualizationMode(self, handle):  # noqa: N802 - pynvml's name
        """HOST_VGPU under NVIDIA's vGPU manager; under its data-center
        driver PASSTHROUGH where the host is itself a guest the GPU is passed
        through to (as read on such a host), else NONE (the profile's
        ``virtualization_mode``)."""
        gpu = self._gpu(handle)
        if gpu["model"] != DATACENTER_MODEL:
            return NVML_GPU_VIRTUALIZATION_MODE_HOST_VGPU
        if gpu.get("virtualization_mode") == "passthrough":
            return NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
        return NVML_GPU_VIRTUALIZATION_MODE_NONE

    def nvmlDeviceGetHostVgpuMode(self, handle):  # noqa: N802 - pynvml's name
        """SR-IOV or not under the vGPU manager; NOT_SUPPORTED under the
        data-center driver (as read on such a host)."""
        gpu = self._gpu(handle)
        if gpu["model"] == DATACENTER_MODEL:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return NVML_HOST_VGPU_MODE_SRIOV if gpu.get("sriov") else NVML_HOST_VGPU_MODE_NON_SRIOV

    def nvmlDeviceGetVgpuHeterogeneousMode(self, handle):  # noqa: N802 - pynvml's name
        enabled = self._kernel().heterogeneous_mode(handle)
        return NVML_FEATURE_ENABLED if enabled else NVML_FEATURE_DISABLED

    def nvmlDeviceSetVgpuHeterogeneousMode(self, handle, heterogeneous_mode):  # noqa: N802
        if heterogeneous_mode not in (NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._kernel().set_heterogeneous_mode(handle, heterogeneous_mode == NVML_FEATURE_ENABLED)
        return NVML_SUCCESS

    def nvmlDeviceGetVgpuTypeSupportedPlacements(  # noqa: N802
        self,
        handle,
        vgpuTypeId,  # noqa: N803
        mode=0,
        version=1,
    ):
        """The IDs a type may take in mixed-size mode (``mode``
        ``NVML_VGPU_PGPU_HETEROGENEOUS_MODE``) or, where the board has them,
        in equal-size mode (``NVML_VGPU_PGPU_HOMOGENEOUS_MODE``)."""
        if mode not in (NVML_VGPU_PGPU_HETEROGENEOUS_MODE, NVML_VGPU_PGPU_HOMOGENEOUS_MODE):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        size, supported, _creatable = self._kernel().placements(
            handle, vgpuTypeId, homogeneous=mode == NVML_VGPU_PGPU_HOMOGENEOUS_MODE
        )
        return PlacementList(size, supported)

    def nvmlDeviceGetVgpuTypeCreatablePlacements(self, handle, vgpuTypeId, version=1):  # noqa: N802,N803
        """The IDs a vGPU of the type could take now, in the board's mode
        (none in equal-size mode on a board without homogeneous placements)."""
        size, _supported, creatable = self._kernel().placements(handle, vgpuTypeId)
        return PlacementList(size, creatable)

    def nvmlVgpuTypeGetMaxInstances(self, handle, vgpuTypeId):  # noqa: N802,N803
        """The most vGPUs of the type the GPU holds, in its mode (pynvml
        returns the count itself)."""
        return self._kernel().max_instances(handle, vgpuTypeId)

    def nvmlVgpuTypeGetFramebufferSize(self, vgpuTypeId):  # noqa: N802,N803 - pynvml's names
        """The type's framebuffer in bytes; it takes no GPU: a type's ID
        names one product's type (pynvml returns the size itself)."""
        return self._kernel().framebuffer_size(vgpuTypeId)

    def nvmlDeviceGetActiveVgpus(self, handle):  # noqa: N802 - pynvml's name
        """The GPU's active vGPU instances (their guests running): here,
        each one's VF address."""
        return [vf for vf, _number, _placement in self._kernel().active_vgpus(handle)]

    def _instance(self, vgpuInstance):  # noqa: N803 - pynvml's argument name
        """``(type number, placement ID)`` of a vGPU instance still there."""
        if not names.is_pci_address(str(vgpuInstance)):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        found = self._kernel().vgpu_instance(vgpuInstance)
        if found is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return found

    def nvmlVgpuInstanceGetType(self, vgpuInstance):  # noqa: N802,N803 - pynvml's names
        return self._instance(vgpuInstance)[0]

    def nvmlVgpuInstanceGetPlacementId(self, vgpuInstance):  # noqa: N802,N803
        """The instance's placement ID (pynvml returns the ID itself):
        ``INVALID_PLACEMENT_ID`` for a vGPU without one ("Otherwise it is
        NVA081_PLACEMENT_ID_INVALID", ``ctrla081.h``): equal-size mode on a
        board without homogeneous placements."""
        placement = self._instance(vgpuInstance)[1]
        return INVALID_PLACEMENT_ID if placement is None else placement


_MODULE_HOST = Bindings()
nvmlInit = _MODULE_HOST.nvmlInit  # noqa: N816 - pynvml's names, from here down
nvmlShutdown = _MODULE_HOST.nvmlShutdown  # noqa: N816
nvmlDeviceGetHandleByPciBusId = _MODULE_HOST.nvmlDeviceGetHandleByPciBusId  # noqa: N816
nvmlDeviceGetName = _MODULE_HOST.nvmlDeviceGetName  # noqa: N816
nvmlDeviceGetVirtualizationMode = _MODULE_HOST.nvmlDeviceGetVirtualizationMode  # noqa: N816
nvmlDeviceGetHostVgpuMode = _MODULE_HOST.nvmlDeviceGetHostVgpuMode  # noqa: N816
nvmlDeviceGetVgpuHeterogeneousMode = _MODULE_HOST.nvmlDeviceGetVgpuHeterogeneousMode  # noqa: N816
nvmlDeviceSetVgpuHeterogeneousMode = _MODULE_HOST.nvmlDeviceSetVgpuHeterogeneousMode  # noqa: N816
nvmlDeviceGetVgpuTypeSupportedPlacements = (  # noqa: N816
    _MODULE_HOST.nvmlDeviceGetVgpuTypeSupportedPlacements
)
nvmlDeviceGetVgpuTypeCreatablePlacements = (  # noqa: N816
    _MODULE_HOST.nvmlDeviceGetVgpuTypeCreatablePlacements
)
nvmlDeviceGetActiveVgpus = _MODULE_HOST.nvmlDeviceGetActiveVgpus  # noqa: N816
nvmlVgpuTypeGetMaxInstances = _MODULE_HOST.nvmlVgpuTypeGetMaxInstances  # noqa: N816
nvmlVgpuInstanceGetType = _MODULE_HOST.nvmlVgpuInstanceGetType  # noqa: N816
nvmlVgpuInstanceGetPlacementId = _MODULE_HOST.nvmlVgpuInstanceGetPlacementId  # noqa: N816
