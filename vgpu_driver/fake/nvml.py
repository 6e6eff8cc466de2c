"""What the fake vendor driver answers through NVML, NVIDIA's management library.

Switching a GPU between equal-size and mixed-size mode is not a sysfs
write: ``nvidia-smi vgpu -shm`` calls NVML's
``nvmlDeviceSetVgpuHeterogeneousMode``.  Its failures carry NVML's return
codes (``nvml.h``), which nvidia-ml-py raises as ``NVMLError`` with the
code in ``value``; :class:`NvmlError` does the same.
"""

NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_IN_USE = 19

_TEXTS = {
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_IN_USE: "In use by another client",
}


class NvmlError(Exception):
    """An NVML call failed with return code ``value``."""

    def __init__(self, value):
        self.value = value
        super().__init__(_TEXTS.get(value, f"NVML error {value}"))
