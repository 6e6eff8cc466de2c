"""Typed errors of vgpu-driver.

Every error formats ``msg_fmt`` with keyword arguments, so its text names
what happened and what an operator can do about it.  Errors are turned into
exit codes (CLI) or nova exceptions (adapter) only at the edges.

Tree::

    VgpuDriverError
    ├── InvalidConfiguration          nova.conf cannot be used as written
    ├── InvalidSysfsName              a name read from sysfs/config is unsafe
    ├── UnknownProfile                no such fake-host profile
    ├── FakeHostExists                fake-host target is not empty
    ├── FakeHostNotWritten            fake-host create cannot write its target
    ├── FakeHostMountPointInUse       fake-host serve's mount point is taken
    ├── MetricsNotWritten             metrics --output cannot write its file
    ├── MetricsNotServed              metrics serve cannot listen where asked
    ├── NvmlUnavailable               nvidia-ml-py or NVIDIA's library is missing
    ├── MixedSizeModeRefused          NVML refused to switch a GPU's vGPU mode
    ├── PrivilegedHelperUnavailable   the privsep daemon cannot start
    ├── ConfigDataRefused             the helper cannot read a configuration file
    ├── PrivilegedWriteRefused        the privileged side will not make this write
    │   └── WritesNeedRoot            vgpu-manage writes sysfs only as root
    ├── MdevWriteError                the kernel refused a write (has .errno)
    │   ├── MdevInvalidRequest        EINVAL
    │   ├── MdevAlreadyExists         EEXIST
    │   ├── MdevNoCapacity            EUSERS, ENOSPC, ENOMEM
    │   ├── MdevParentGone            ENODEV
    │   ├── MdevBusy                  EBUSY, or a remove that did not finish in time
    │   └── MdevIOError               EIO
    ├── AllocationError               an allocation cannot be met (nova reschedules)
    │   ├── UnknownProvider           the allocation names no GPU of this host
    │   ├── MixedSizeTypeUnknown      MiB on a mixed-size board that name no one type
    │   ├── GpuGone                   the GPU (or all its parents) vanished
    │   ├── WrongTypePresent          the GPU holds mdevs of another type in use
    │   └── NoGpuCapacity             nothing free and nothing creatable
    │       └── VfTypeRefused         a vendor-VFIO VF refused the type (GPU full)
    ├── UnknownVgpu                   no such mdev or vendor-VFIO VF on this host
    ├── ClaimConflict                 an mdev (or VF) is claimed by another instance
    ├── InvalidNodename               a compute node name Placement cannot take
    ├── ProviderNotOurs               a provider sync would write is not vgpu-driver's
    ├── NovaIncompatible              the installed nova lacks what the adapter hooks
    ├── AllocationOutsideOperation    nova asked for vGPUs where no instance is known
    ├── InvalidOption                 a command-line value that cannot be used
    ├── InvalidSysfsRoot              the sysfs root is missing or not sysfs
    ├── SriovRefused                  VFs of this device are not ours to change now
    ├── SriovManageFailed             NVIDIA's sriov-manage is missing or failed
    ├── SriovNotReady                 enabled VFs did not all offer mdev types in time
    ├── JournalError                  the claims journal cannot be used
    │   ├── JournalMissing            no journal (and not asked to create one)
    │   ├── JournalUnreadable         empty, truncated, garbage or failed integrity
    │   ├── NotAStateDirectory        claims init given another program's directory
    │   ├── JournalTooNew             written by a newer vgpu-driver
    │   ├── JournalUnsafe             a link, not a file, or another user's file
    │   ├── JournalNotWritable        this user may not write it (nothing written)
    │   └── JournalNotReadable        this user may not read it
    └── KeystoneError                 unified limits cannot be read or written
        ├── LimitsNotConfigured       [oslo_limit] lacks what is needed
        ├── KeystoneUnavailable       Keystone cannot be reached
        └── KeystoneRefused           Keystone refused (credentials, role, endpoint)
"""

import errno as errno_mod

_REBUILD = "vgpu_driver.exception:rebuild"
_PLAIN = (str, int, float, bool, type(None))


def _plain(value):
    """``value`` made of what msgpack carries, else its text."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


class _Rebuildable(type):
    """Lets ``cls(*error.args)`` give back the error, whatever ``cls.__init__`` takes.

    oslo.privsep raises a privileged-side error on the caller's side as
    ``exc_type(*args)``; errors with their own constructor signature would
    come back as a ``TypeError`` instead.
    """

    def __call__(cls, *args, **kwargs):
        if len(args) == 3 and args[0] == _REBUILD and not kwargs:
            error = cls.__new__(cls)
            Exception.__init__(error, args[1])
            error.__dict__.update(args[2])
            return error
        return super().__call__(*args, **kwargs)


class VgpuDriverError(Exception, metaclass=_Rebuildable):
    """Base class: formats ``msg_fmt`` with the keyword arguments."""

    msg_fmt = "An unknown error occurred."

    def __init__(self, message=None, **kwargs):
        self.kwargs = kwargs
        if message is None:
            message = self.msg_fmt % kwargs
        self.message = message
        super().__init__(message)

    @property
    def args(self):
        """Plain values only, from which the metaclass rebuilds the error."""
        return (_REBUILD, self.message, _plain(self.__dict__))


class ConfigProblem:
    """One actionable finding about the configuration."""

    __slots__ = ("option", "value", "reason", "severity")

    def __init__(self, option, value, reason, severity="error"):
        self.option = option
        self.value = value
        self.reason = reason
        self.severity = severity

    def __str__(self):
        return f"{self.severity}: {self.option} = {self.value!r}: {self.reason}"

    def __repr__(self):
        return f"ConfigProblem({self})"


class InvalidConfiguration(VgpuDriverError):
    msg_fmt = "Invalid vGPU configuration:\n%(details)s"

    def __init__(self, problems):
        self.problems = list(problems)
        super().__init__(details="\n".join(f"  {p}" for p in self.problems))


class InvalidSysfsName(VgpuDriverError):
    msg_fmt = ("Refusing %(kind)s %(name)r%(source)s: it is not a valid %(kind)s, "
               "so it is never joined into a sysfs path.")

    def __init__(self, kind, name, source=None):
        super().__init__(kind=kind, name=name,
                         source=f" from {source}" if source else "")


class UnknownProfile(VgpuDriverError):
    msg_fmt = "No fake-host profile named %(name)r; known profiles: %(known)s."


class FakeHostExists(VgpuDriverError):
    msg_fmt = ("%(path)s is not empty; choose an empty or new directory for the "
               "fake host.")


class FakeHostNotWritten(VgpuDriverError):
    msg_fmt = "Cannot write the fake host at %(path)s: %(reason)s."


class MetricsNotWritten(VgpuDriverError):
    msg_fmt = "Cannot write the metrics to %(path)s: %(reason)s."


class MetricsNotServed(VgpuDriverError):
    msg_fmt = "Cannot serve the metrics on %(listen)s: %(reason)s."


class NvmlUnavailable(VgpuDriverError):
    msg_fmt = "NVIDIA's management library (NVML) cannot be used: %(reason)s."


class MixedSizeModeRefused(VgpuDriverError):
    msg_fmt = "Cannot %(action)s mixed-size mode on GPU %(gpu)s: %(reason)s."


class FakeHostMountPointInUse(VgpuDriverError):
    msg_fmt = ("Cannot serve the fake host at %(path)s: %(why)s; choose an empty "
               "directory that nothing is mounted on.")


class PrivilegedHelperUnavailable(VgpuDriverError):
    msg_fmt = ("Cannot start the privileged helper (%(reason)s), so no sysfs write can be "
               "made. nova-compute starts it as [vgpu_driver_sysfs_writer] helper_command "
               "says (by default 'sudo <bin>/vgpu-privsep-helper --config-file "
               "/etc/vgpu-driver/privsep.conf --privsep_context "
               "vgpu_driver.privsep.sysfs_writer ...'); write the sudoers rule and the "
               "helper's file with 'vgpu-manage install-units'.")


class ConfigDataRefused(VgpuDriverError):
    """The privileged helper will not use a configuration file.  Only the
    file and the line are named: the helper reads as root, and the text
    may be anything the file links to."""

    msg_fmt = "The privileged helper cannot use %(path)s (line %(line)s): %(reason)s."


class PrivilegedWriteRefused(VgpuDriverError):
    """The privileged side checked the write and will not make it.

    ``rule`` names the check that refused, so an operator can tell a
    configuration that does not enable the write from a sysfs tree that
    does not look like the kernel's.
    """

    msg_fmt = "Refusing to write %(target)s: %(rule)s."

    def __init__(self, target, rule):
        super().__init__(target=target, rule=rule)


class WritesNeedRoot(PrivilegedWriteRefused):
    msg_fmt = ("vgpu-manage writes sysfs only when it runs as root (it runs as uid "
               "%(uid)s), so %(target)s was not written; run the command as root, "
               "e.g. with sudo.")

    def __init__(self, target, uid):
        VgpuDriverError.__init__(self, target=target, uid=uid)


class MdevWriteError(VgpuDriverError):
    """The kernel refused a write to an mdev control file."""

    msg_fmt = "%(action)s failed on %(target)s: %(reason)s. %(hint)s"

    HINTS = {
        errno_mod.EINVAL: "The value written was malformed (a create needs a "
                          "36-character UUID).",
        errno_mod.EEXIST: "An mdev with this UUID already exists; reuse it or "
                          "pick a new UUID.",
        errno_mod.EUSERS: "The parent has no free instance of this type; check "
                          "'vgpu-manage types' and free or reclaim mdevs.",
        errno_mod.ENOSPC: "The parent's resources are exhausted; free an mdev "
                          "first.",
        errno_mod.ENOMEM: "The vendor driver ran out of memory or its instance "
                          "limit; free an mdev first.",
        errno_mod.ENODEV: "The parent device is gone or being unregistered; "
                          "check the vendor driver and, for SR-IOV boards, that "
                          "the VFs are enabled.",
        errno_mod.EBUSY: "The device is in use; stop the guest using it first.",
        errno_mod.EIO: "The vendor driver reported an I/O error; check the "
                       "host kernel log.",
        errno_mod.ETIMEDOUT: "The kernel is still waiting for the guest to release "
                             "the device; the mdev goes once the guest lets go.",
    }

    # Where NVIDIA's current_vgpu_type means something else by the same errno.
    ACTION_HINTS = {
        ("current_vgpu_type", errno_mod.EINVAL):
            "The VF does not offer this vGPU type now (see its "
            "nvidia/creatable_vgpu_types): the GPU holds vGPUs of another size or "
            "the type's per-GPU maximum is reached.",
        ("current_vgpu_type", errno_mod.EBUSY):
            "The VF already has a vGPU type, or a guest still holds it; its type "
            "can change once the guest is gone (write 0 first).",
    }

    def __init__(self, action, target, os_error):
        self.errno = os_error.errno
        reason = os_error.strerror or str(os_error)
        hint = self.ACTION_HINTS.get((action, self.errno)) or self.HINTS.get(self.errno, "")
        super().__init__(action=action, target=target,
                         reason=f"[{errno_mod.errorcode.get(self.errno, self.errno)}] {reason}",
                         hint=hint)

    @staticmethod
    def from_os_error(action, target, os_error):
        """The typed subclass for the errno the kernel gave.

        A control file that is not there (ENOENT) means its device is gone:
        it is reported as the kernel reports a vanishing device, ENODEV.
        """
        if os_error.errno == errno_mod.ENOENT:
            os_error = OSError(errno_mod.ENODEV, "No such device", os_error.filename)
        cls = _BY_ERRNO.get(os_error.errno, MdevWriteError)
        return cls(action, target, os_error)


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


_BY_ERRNO = {
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


class AllocationError(VgpuDriverError):
    """The allocation cannot be turned into mdevs here; nova may reschedule."""

    msg_fmt = "Cannot give %(instance)s its vGPU on %(gpu)s: %(reason)s"


class UnknownProvider(AllocationError):
    msg_fmt = ("Cannot give %(instance)s its vGPU: resource provider %(provider)s is not "
               "a GPU of this host (was it removed? run 'vgpu-manage inventory').")


class MixedSizeTypeUnknown(AllocationError):
    msg_fmt = ("Cannot give %(instance)s its vGPU on %(gpu)s: %(mib)s MiB of its "
               "mixed-size framebuffer (types %(types)s) name no single vGPU type: "
               "%(reason)s. A flavor asks for one type's MiB and requires its "
               "CUSTOM_MDEV_<type> trait.")


class GpuGone(AllocationError):
    msg_fmt = ("Cannot give %(instance)s its vGPU on %(gpu)s: the GPU has no mdev parent "
               "any more (driver unloaded, or SR-IOV VFs not enabled).")


class WrongTypePresent(AllocationError):
    msg_fmt = ("Cannot give %(instance)s a %(type_id)s vGPU on %(gpu)s: the GPU holds "
               "%(present)s still in use; it serves %(type_id)s once they are gone.")


class NoGpuCapacity(AllocationError):
    msg_fmt = ("Cannot give %(instance)s %(wanted)d x %(type_id)s on %(gpu)s: %(free)d free "
               "and %(creatable)d creatable (%(claimed)d already claimed).")


class VfTypeRefused(NoGpuCapacity):
    """Found at write time: the VF's type list cannot count claims that other
    allocations have not written yet, so the GPU may fill up meanwhile."""

    msg_fmt = ("Cannot give %(instance)s a %(type_id)s vGPU on %(gpu)s: VF %(vf)s "
               "refused the type (%(reason)s); the GPU has no room for another one now.")


class UnknownVgpu(VgpuDriverError):
    msg_fmt = ("%(vgpu)s is neither an mdev nor a vendor-VFIO VF of this host; it cannot "
               "be given to a guest.")


class ClaimConflict(VgpuDriverError):
    msg_fmt = "mdev %(mdev)s is already claimed by instance %(owner)s."


class InvalidNodename(VgpuDriverError):
    msg_fmt = ("Refusing nodename %(nodename)r: %(reason)s. Pass the compute node's name "
               "as nova-compute reports it (--nodename, or [DEFAULT] host).")


class ProviderNotOurs(VgpuDriverError):
    """A provider a Placement sync would write holds a name of this host's
    tree but is not vgpu-driver's; found before anything is written."""

    msg_fmt = ("Refusing to write provider %(name)s: %(reason)s (%(where)s, traits "
               "%(traits)s); nothing was written. A provider vgpu-driver does not own is "
               "left to its owner.")


class NovaIncompatible(VgpuDriverError):
    """Found when nova-compute makes the driver, before it serves anything."""

    msg_fmt = ("vgpu-driver cannot run inside nova %(version)s: %(problems)s. This "
               "vgpu-driver supports %(supported)s; install a vgpu-driver release that "
               "supports this nova, or a nova in that range.")


class AllocationOutsideOperation(VgpuDriverError):
    """nova asked for vGPUs from a code path the adapter does not wrap: no
    instance is known, so no claim could be journalled."""

    msg_fmt = ("nova %(version)s asked for vGPUs outside the operations vgpu-driver "
               "knows (spawn, resize, migration, hard reboot); refused rather than "
               "handing out vGPUs no claim records. This vgpu-driver supports "
               "%(supported)s.")


class JournalError(VgpuDriverError):
    """The claims journal cannot be used; nothing was read from or written to it."""

    msg_fmt = "Claims journal %(path)s: %(reason)s"


class JournalMissing(JournalError):
    msg_fmt = ("No claims journal at %(path)s: %(reason)s. Check --state-dir ([vgpu] "
               "state_dir); nova-compute creates it at start-up, or run "
               "'vgpu-manage claims init' on a host that never had one.")


class JournalUnreadable(JournalError):
    """Its contents are broken (empty, not sqlite, failed integrity): only
    then is moving it away any use."""

    msg_fmt = ("Claims journal %(path)s is unusable (%(reason)s); refusing to treat it as "
               "empty. Restore it from a backup, or move it away and run "
               "'vgpu-manage claims init'.")


class NotAStateDirectory(JournalError):
    msg_fmt = ("Refusing to create a claims journal in %(state_dir)s: it already holds "
               "%(count)d other file(s) (%(examples)s) and no journal, so it is not "
               "vgpu-driver's state directory. Check --state-dir ([vgpu] state_dir); give "
               "a new or empty directory.")


class JournalTooNew(JournalError):
    msg_fmt = ("Claims journal %(path)s has schema version %(found)d; this vgpu-driver "
               "knows versions up to %(known)d. Upgrade vgpu-driver before using it.")


class JournalUnsafe(JournalError):
    """A file where the journal or one of sqlite's side files goes that no
    one should follow or trust: whoever owns the state directory put it."""

    msg_fmt = ("Refusing %(file)s: %(reason)s. The claims journal's files must be regular "
               "files of the state directory's owner or root; nothing was opened or "
               "created through it. Remove it if vgpu-driver did not make it.")


class JournalNotWritable(JournalError):
    msg_fmt = ("Claims journal %(path)s cannot be written by %(user)s: %(reason)s. Its "
               "claims are as they were. %(fix)s")


class JournalNotReadable(JournalError):
    msg_fmt = ("Claims journal %(path)s cannot be read by %(user)s: %(reason)s. Run this as "
               "root, as the state directory's owner or as a member of its group; the "
               "journal is left as it was.")


class InvalidOption(VgpuDriverError):
    msg_fmt = "%(option)s %(value)r: %(reason)s"


class InvalidSysfsRoot(VgpuDriverError):
    msg_fmt = ("Sysfs root %(root)s %(reason)s, so it cannot play /sys. Check --sysfs-root "
               "([vgpu] sysfs_root).")


class SriovRefused(VgpuDriverError):
    """Checked before any write: nothing was changed."""

    msg_fmt = "Refusing to %(action)s SR-IOV VFs of %(address)r: %(reason)s."


class SriovManageFailed(VgpuDriverError):
    """NVIDIA's sriov-manage could not be run, or failed."""

    msg_fmt = "NVIDIA's sriov-manage (%(command)s) %(why)s"


class SriovNotReady(VgpuDriverError):
    msg_fmt = ("%(address)s: after %(waited).0fs, %(ready)d of %(numvfs)d VFs offer mdev "
               "types or NVIDIA's vGPU files; check that the NVIDIA vGPU manager "
               "(nvidia-vgpu-mgr.service) runs and the kernel log, or wait longer (--wait).")


class KeystoneError(VgpuDriverError):
    msg_fmt = "Keystone: %(reason)s"


class LimitsNotConfigured(KeystoneError):
    msg_fmt = ("Keystone: %(option)s is not set; set [oslo_limit] as nova's unified "
               "limits use it.")


class KeystoneUnavailable(KeystoneError):
    msg_fmt = "Keystone at %(url)s cannot be reached: %(reason)s"


class KeystoneRefused(KeystoneError):
    msg_fmt = "Keystone refused to %(action)s: %(reason)s"
