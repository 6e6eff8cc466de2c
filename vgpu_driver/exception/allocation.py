"""Giving a guest its vGPUs: allocations that cannot be met, vGPUs that are not
this guest's, hostdevs libvirt cannot take, migrations refused."""

from vgpu_driver.exception import base


class AllocationError(base.VgpuDriverError):
    """The allocation cannot be turned into mdevs here; nova may reschedule."""

    msg_fmt = "Cannot give %(instance)s its vGPU on %(gpu)s: %(reason)s"


class UnknownProvider(AllocationError):
    msg_fmt = (
        "Cannot give %(instance)s its vGPU: resource provider %(provider)s is not "
        "a GPU of this host (was it removed? run 'vgpu-manage inventory')."
    )


class MixedSizeTypeUnknown(AllocationError):
    msg_fmt = (
        "Cannot give %(instance)s its vGPU on %(gpu)s: %(mib)s MiB of its "
        "mixed-size framebuffer (types %(types)s) name no single vGPU type: "
        "%(reason)s. A flavor asks for one type's MiB and requires its "
        "CUSTOM_MDEV_<type> trait."
    )


class GpuGone(AllocationError):
    msg_fmt = (
        "Cannot give %(instance)s its vGPU on %(gpu)s: the GPU has no mdev parent "
        "any more (driver unloaded, or SR-IOV VFs not enabled)."
    )


class WrongTypePresent(AllocationError):
    msg_fmt = (
        "Cannot give %(instance)s a %(type_id)s vGPU on %(gpu)s: the GPU holds "
        "%(present)s still in use; it serves %(type_id)s once they are gone."
    )


class NoGpuCapacity(AllocationError):
    msg_fmt = (
        "Cannot give %(instance)s %(wanted)d x %(type_id)s on %(gpu)s: %(free)d free "
        "and %(creatable)d creatable (%(claimed)d already claimed)."
    )


class VfTypeRefused(NoGpuCapacity):
    """Found at write time: the VF's type list cannot count claims that other
    allocations have not written yet, so the GPU may fill up meanwhile."""

    msg_fmt = (
        "Cannot give %(instance)s a %(type_id)s vGPU on %(gpu)s: VF %(vf)s "
        "refused the type (%(reason)s); the GPU has no room for another one now."
    )


class UnknownVgpu(base.VgpuDriverError):
    msg_fmt = (
        "%(vgpu)s is neither an mdev nor a vendor-VFIO VF of this host; it cannot "
        "be given to a guest."
    )


class ClaimConflict(base.VgpuDriverError):
    msg_fmt = "mdev %(mdev)s is already claimed by instance %(owner)s."


class UnsupportedDeviceApi(base.VgpuDriverError):
    msg_fmt = "mdev type device_api %(api)r has no libvirt hostdev model (known: %(known)s)."


class MigrationPreCheckFailed(base.VgpuDriverError):
    msg_fmt = "Cannot live-migrate instance %(instance)s with vGPUs: %(reason)s"


class SourceNotMigratable(base.VgpuDriverError):
    msg_fmt = "Cannot live-migrate the guest's vGPUs from this host: %(reason)s"
