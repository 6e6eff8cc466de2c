"""nova: nova-compute as the adapter finds it, and nova's API."""

from vgpu_driver.exception import base


class NovaIncompatible(base.VgpuDriverError):
    """Found when nova-compute makes the driver, before it serves anything."""

    msg_fmt = (
        "vgpu-driver cannot run inside nova %(version)s: %(problems)s. This "
        "vgpu-driver supports %(supported)s; install a vgpu-driver release that "
        "supports this nova, or a nova in that range."
    )


class AllocationOutsideOperation(base.VgpuDriverError):
    """nova asked for vGPUs from a code path the adapter does not wrap: no
    instance is known, so no claim could be journalled."""

    msg_fmt = (
        "nova %(version)s asked for vGPUs outside the operations vgpu-driver "
        "knows (spawn, resize, migration, hard reboot); refused rather than "
        "handing out vGPUs no claim records. This vgpu-driver supports "
        "%(supported)s."
    )


class ComputeApiUnavailable(base.VgpuDriverError):
    msg_fmt = (
        "nova's API did not list the migrations of host %(host)s (%(reason)s); "
        "moves under way cannot be told apart"
    )
