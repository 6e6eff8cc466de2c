"""Writes to the host refused: by the kernel, or by the privileged side first."""

from __future__ import annotations

import errno as errno_mod

from vgpu_driver.exception import base


class PrivilegedHelperUnavailable(base.VgpuDriverError):
    msg_fmt = (
        "Cannot start the privileged helper (%(reason)s), so no sysfs write can be "
        "made. nova-compute starts it as [vgpu_driver_sysfs_writer] helper_command "
        "says (by default 'sudo <bin>/vgpu-privsep-helper --config-file "
        "/etc/vgpu-driver/privsep.conf --privsep_context "
        "vgpu_driver.privsep.sysfs_writer ...'); write the sudoers rule and the "
        "helper's file with 'vgpu-manage install-units'."
    )


class ConfigDataRefused(base.VgpuDriverError):
    """The privileged helper will not use a configuration file.  Only the
    file and the line are named: the helper reads as root, and the text
    may be anything the file links to."""

    msg_fmt = "The privileged helper cannot use %(path)s (line %(line)s): %(reason)s."


class PrivilegedWriteRefused(base.VgpuDriverError):
    """The privileged side checked the write and will not make it.

    ``rule`` names the check that refused, so an operator can tell a
    configuration that does not enable the write from a sysfs tree that
    does not look like the kernel's.
    """

    msg_fmt = "Refusing to write %(target)s: %(rule)s."

    def __init__(self, target: str, rule: str) -> None:
        super().__init__(target=target, rule=rule)


class WritesNeedRoot(PrivilegedWriteRefused):
    msg_fmt = (
        "vgpu-manage writes sysfs only when it runs as root (it runs as uid "
        "%(uid)s), so %(target)s was not written; run the command as root, "
        "e.g. with sudo."
    )

    def __init__(self, target: str, uid: int) -> None:
        base.VgpuDriverError.__init__(self, target=target, uid=uid)


class MdevWriteError(base.VgpuDriverError):
    """The kernel refused a write to an mdev control file."""

    msg_fmt = "%(action)s failed on %(target)s: %(reason)s. %(hint)s"

    HINTS: dict[int | None, str] = {
        errno_mod.EINVAL: "The value written was malformed (a create needs a 36-character UUID).",
        errno_mod.EEXIST: "An mdev with this UUID already exists; reuse it or pick a new UUID.",
        errno_mod.EUSERS: "The parent has no free instance of this type; check "
        "'vgpu-manage types' and free or reclaim mdevs.",
        errno_mod.ENOSPC: "The parent's resources are exhausted; free an mdev first.",
        errno_mod.ENOMEM: "The vendor driver ran out of memory or its instance "
        "limit; free an mdev first.",
        errno_mod.ENODEV: "The parent device is gone or being unregistered; "
        "check the vendor driver and, for SR-IOV boards, that "
        "the VFs are enabled.",
        errno_mod.EBUSY: "The device is in use; stop the guest using it first.",
        errno_mod.EIO: "The vendor driver reported an I/O error; check the host kernel log.",
        errno_mod.ETIMEDOUT: "The kernel is still waiting for the guest to release "
        "the device; the mdev goes once the guest lets go.",
    }

    # Where NVIDIA's current_vgpu_type means something else by the same errno.
    ACTION_HINTS: dict[tuple[str, int | None], str] = {
        (
            "current_vgpu_type",
            errno_mod.EINVAL,
        ): "The VF does not offer this vGPU type now (see its "
        "nvidia/creatable_vgpu_types): the GPU holds vGPUs of another size or "
        "the type's per-GPU maximum is reached.",
        (
            "current_vgpu_type",
            errno_mod.EBUSY,
        ): "The VF already has a vGPU type, or a guest still holds it; its type "
        "can change once the guest is gone (write 0 first).",
    }

    def __init__(self, action: str, target: str, os_error: OSError) -> None:
        self.errno = os_error.errno
        reason = os_error.strerror or str(os_error)
        hint = self.ACTION_HINTS.get((action, self.errno)) or self.HINTS.get(self.errno, "")
        super().__init__(
            action=action, target=target, reason=f"[{_errno_name(self.errno)}] {reason}", hint=hint
        )

    @staticmethod
    def from_os_error(action: str, target: str, os_error: OSError) -> MdevWriteError:
        """The typed subclass for the errno the kernel gave.

        A control file that is not there (ENOENT) means its device is gone:
        it is reported as the kernel reports a vanishing device, ENODEV.
        """
        if os_error.errno == errno_mod.ENOENT:
            os_error = OSError(errno_mod.ENODEV, "No such device", os_error.filename)
        cls = _BY_ERRNO.get(os_error.errno, MdevWriteError)
        return cls(action, target, os_error)


def _errno_name(number: int | None) -> str | int | None:
    """``EBUSY`` for 16; the number itself when it has no name."""
    return errno_mod.errorcode.get(number, number) if number is not None else None


class MdevInvalidRequest(MdevWriteError):
    pass


class MdevAlreadyExists(MdevWriteError):
    pass


class MdevNoCapacity(MdevWriteError):
    pass


class MdevParentGone(MdevWriteError):
    pass


class MdevBusy(MdevWriteError):
    pass


class MdevIOError(MdevWriteError):
    pass


_BY_ERRNO: dict[int | None, type[MdevWriteError]] = {
    errno_mod.EINVAL: MdevInvalidRequest,
    errno_mod.EEXIST: MdevAlreadyExists,
    errno_mod.EUSERS: MdevNoCapacity,
    errno_mod.ENOSPC: MdevNoCapacity,
    errno_mod.ENOMEM: MdevNoCapacity,
    errno_mod.ENODEV: MdevParentGone,
    errno_mod.EBUSY: MdevBusy,
    errno_mod.ETIMEDOUT: MdevBusy,
    errno_mod.EIO: MdevIOError,
}
