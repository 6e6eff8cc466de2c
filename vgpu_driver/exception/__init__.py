"""Typed errors of vgpu-driver.

Every error formats ``msg_fmt`` with keyword arguments, so its text names
what happened and what an operator can do about it.  Errors are turned into
exit codes (CLI) or nova exceptions (adapter) only at the edges.

Every error of the package is defined here, in the module of its concern
(``config``, ``writes``, ``host``, ``allocation``, ``journal``,
``placement``, ``limits``, ``compute``, ``commands``; ``base`` holds the
base class), with a name no other error has, and is used as
``exception.<Name>``: this package exports every one.

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
    ├── InstallFilesRefused           install-units will not write its files
    ├── DemoFailed                    a demo step failed (names the step)
    ├── DemoDirNotEmpty               demo --dir is not empty
    ├── NoValidHost                   the demo's scheduler found no candidate
    ├── NvmlUnavailable               nvidia-ml-py or NVIDIA's library is missing
    ├── MixedSizeModeRefused          NVML refused to switch a GPU's vGPU mode
    │   └── VgpuTypesUnreadable       NVML will not tell a GPU's vGPU sizes or maxima
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
    ├── UnsupportedDeviceApi          a type's device_api has no hostdev model
    ├── MigrationPreCheckFailed       a live migration with vGPUs refused
    ├── SourceNotMigratable           this host cannot migrate the vGPUs
    ├── InvalidNodename               a compute node name Placement cannot take
    ├── ProviderNotOurs               a provider sync would write is not vgpu-driver's
    ├── PlacementError                Placement refused a request
    ├── Conflict                      HTTP 409: a generation moved, a name is taken
    ├── PlacementUnavailable          Placement did not answer (retries spent)
    ├── PlacementAuthUnavailable      Keystone did not answer for Placement
    ├── PlacementAuthRefused          Keystone refused Placement's credentials
    ├── MissingCredentials            no usable credentials for Placement
    ├── NovaIncompatible              the installed nova lacks what the adapter hooks
    ├── AllocationOutsideOperation    nova asked for vGPUs where no instance is known
    ├── ComputeApiUnavailable         nova's API did not list the migrations
    ├── InvalidOption                 a command-line value that cannot be used
    ├── InvalidSysfsRoot              the sysfs root is missing or not sysfs
    ├── SriovRefused                  VFs of this device are not ours to change now
    ├── SriovManageFailed             NVIDIA's sriov-manage is missing or failed
    ├── SriovNotReady                 enabled VFs did not all offer mdev types in time
    ├── LibvirtUnavailable            libvirt cannot be reached
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

from vgpu_driver.exception.allocation import AllocationError
from vgpu_driver.exception.allocation import ClaimConflict
from vgpu_driver.exception.allocation import GpuGone
from vgpu_driver.exception.allocation import MigrationPreCheckFailed
from vgpu_driver.exception.allocation import MixedSizeTypeUnknown
from vgpu_driver.exception.allocation import NoGpuCapacity
from vgpu_driver.exception.allocation import SourceNotMigratable
from vgpu_driver.exception.allocation import UnknownProvider
from vgpu_driver.exception.allocation import UnknownVgpu
from vgpu_driver.exception.allocation import UnsupportedDeviceApi
from vgpu_driver.exception.allocation import VfTypeRefused
from vgpu_driver.exception.allocation import WrongTypePresent
from vgpu_driver.exception.base import VgpuDriverError
from vgpu_driver.exception.commands import DemoDirNotEmpty
from vgpu_driver.exception.commands import DemoFailed
from vgpu_driver.exception.commands import FakeHostExists
from vgpu_driver.exception.commands import FakeHostMountPointInUse
from vgpu_driver.exception.commands import FakeHostNotWritten
from vgpu_driver.exception.commands import InstallFilesRefused
from vgpu_driver.exception.commands import MetricsNotServed
from vgpu_driver.exception.commands import MetricsNotWritten
from vgpu_driver.exception.commands import NoValidHost
from vgpu_driver.exception.commands import UnknownProfile
from vgpu_driver.exception.compute import AllocationOutsideOperation
from vgpu_driver.exception.compute import ComputeApiUnavailable
from vgpu_driver.exception.compute import NovaIncompatible
from vgpu_driver.exception.config import ConfigProblem
from vgpu_driver.exception.config import InvalidConfiguration
from vgpu_driver.exception.config import InvalidNodename
from vgpu_driver.exception.config import InvalidOption
from vgpu_driver.exception.config import InvalidSysfsName
from vgpu_driver.exception.config import InvalidSysfsRoot
from vgpu_driver.exception.host import LibvirtUnavailable
from vgpu_driver.exception.host import MixedSizeModeRefused
from vgpu_driver.exception.host import NvmlUnavailable
from vgpu_driver.exception.host import SriovManageFailed
from vgpu_driver.exception.host import SriovNotReady
from vgpu_driver.exception.host import SriovRefused
from vgpu_driver.exception.host import VgpuTypesUnreadable
from vgpu_driver.exception.journal import JournalError
from vgpu_driver.exception.journal import JournalMissing
from vgpu_driver.exception.journal import JournalNotReadable
from vgpu_driver.exception.journal import JournalNotWritable
from vgpu_driver.exception.journal import JournalTooNew
from vgpu_driver.exception.journal import JournalUnreadable
from vgpu_driver.exception.journal import JournalUnsafe
from vgpu_driver.exception.journal import NotAStateDirectory
from vgpu_driver.exception.limits import KeystoneError
from vgpu_driver.exception.limits import KeystoneRefused
from vgpu_driver.exception.limits import KeystoneUnavailable
from vgpu_driver.exception.limits import LimitsNotConfigured
from vgpu_driver.exception.placement import Conflict
from vgpu_driver.exception.placement import MissingCredentials
from vgpu_driver.exception.placement import PlacementAuthRefused
from vgpu_driver.exception.placement import PlacementAuthUnavailable
from vgpu_driver.exception.placement import PlacementError
from vgpu_driver.exception.placement import PlacementUnavailable
from vgpu_driver.exception.placement import ProviderNotOurs
from vgpu_driver.exception.writes import ConfigDataRefused
from vgpu_driver.exception.writes import MdevAlreadyExists
from vgpu_driver.exception.writes import MdevBusy
from vgpu_driver.exception.writes import MdevInvalidRequest
from vgpu_driver.exception.writes import MdevIOError
from vgpu_driver.exception.writes import MdevNoCapacity
from vgpu_driver.exception.writes import MdevParentGone
from vgpu_driver.exception.writes import MdevWriteError
from vgpu_driver.exception.writes import PrivilegedHelperUnavailable
from vgpu_driver.exception.writes import PrivilegedWriteRefused
from vgpu_driver.exception.writes import WritesNeedRoot

__all__ = [
    "AllocationError",
    "AllocationOutsideOperation",
    "ClaimConflict",
    "ComputeApiUnavailable",
    "ConfigDataRefused",
    "ConfigProblem",
    "Conflict",
    "DemoDirNotEmpty",
    "DemoFailed",
    "FakeHostExists",
    "FakeHostMountPointInUse",
    "FakeHostNotWritten",
    "GpuGone",
    "InstallFilesRefused",
    "InvalidConfiguration",
    "InvalidNodename",
    "InvalidOption",
    "InvalidSysfsName",
    "InvalidSysfsRoot",
    "JournalError",
    "JournalMissing",
    "JournalNotReadable",
    "JournalNotWritable",
    "JournalTooNew",
    "JournalUnreadable",
    "JournalUnsafe",
    "KeystoneError",
    "KeystoneRefused",
    "KeystoneUnavailable",
    "LibvirtUnavailable",
    "LimitsNotConfigured",
    "MdevAlreadyExists",
    "MdevBusy",
    "MdevIOError",
    "MdevInvalidRequest",
    "MdevNoCapacity",
    "MdevParentGone",
    "MdevWriteError",
    "MetricsNotServed",
    "MetricsNotWritten",
    "MigrationPreCheckFailed",
    "MissingCredentials",
    "MixedSizeModeRefused",
    "MixedSizeTypeUnknown",
    "NoGpuCapacity",
    "NoValidHost",
    "NotAStateDirectory",
    "NovaIncompatible",
    "NvmlUnavailable",
    "PlacementAuthRefused",
    "PlacementAuthUnavailable",
    "PlacementError",
    "PlacementUnavailable",
    "PrivilegedHelperUnavailable",
    "PrivilegedWriteRefused",
    "ProviderNotOurs",
    "SourceNotMigratable",
    "SriovManageFailed",
    "SriovNotReady",
    "SriovRefused",
    "UnknownProfile",
    "VgpuTypesUnreadable",
    "UnknownProvider",
    "UnknownVgpu",
    "UnsupportedDeviceApi",
    "VfTypeRefused",
    "VgpuDriverError",
    "WritesNeedRoot",
    "WrongTypePresent",
]

# Each error's name is vgpu_driver.exception.<Name>, whichever module of the
# package defines it: oslo.privsep sends an error across the privsep
# boundary by that name, and logs and tracebacks show it.
for _name in __all__:
    globals()[_name].__module__ = __name__
del _name
