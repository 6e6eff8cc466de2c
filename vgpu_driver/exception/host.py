"""The host's other parts: NVIDIA's library, SR-IOV and its script, libvirt."""

from vgpu_driver.exception import base


class NvmlUnavailable(base.VgpuDriverError):
    msg_fmt = "NVIDIA's management library (NVML) cannot be used: %(reason)s."


class MixedSizeModeRefused(base.VgpuDriverError):
    msg_fmt = "Cannot %(action)s mixed-size mode on GPU %(gpu)s: %(reason)s."


class VgpuTypesUnreadable(MixedSizeModeRefused):
    """NVML would not say what a GPU's vGPU types take, in either mode;
    caught with the mode's refusals, which its callers read beside."""

    msg_fmt = "Cannot %(action)s GPU %(gpu)s: %(reason)s."


class SriovRefused(base.VgpuDriverError):
    """Checked before any write: nothing was changed."""

    msg_fmt = "Refusing to %(action)s SR-IOV VFs of %(address)r: %(reason)s."


class SriovManageFailed(base.VgpuDriverError):
    """NVIDIA's sriov-manage could not be run, or failed."""

    msg_fmt = "NVIDIA's sriov-manage (%(command)s) %(why)s"


class SriovNotReady(base.VgpuDriverError):
    msg_fmt = (
        "%(address)s: after %(waited).0fs, %(ready)d of %(numvfs)d VFs offer mdev "
        "types or NVIDIA's vGPU files; check that the NVIDIA vGPU manager "
        "(nvidia-vgpu-mgr.service) runs and the kernel log, or wait longer (--wait)."
    )


class LibvirtUnavailable(base.VgpuDriverError):
    msg_fmt = (
        "Cannot reach libvirt at %(uri)s: %(reason)s. Without it, mdevs used by "
        "guests cannot be told from free ones."
    )
