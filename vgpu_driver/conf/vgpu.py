"""``[vgpu]``: vgpu-driver's own options."""

from oslo_config import cfg

from vgpu_driver.sysfs import paths


def vgpu_group() -> cfg.OptGroup:
    """A new group object per ConfigOpts.

    ConfigOpts.register_group only copies a group shallowly, so one group
    object registered twice shares its option table, overrides included,
    between configs (nova's own CONF among them).
    """
    return cfg.OptGroup(
        "vgpu", title="vgpu-driver", help="Options of vgpu-driver itself (not read by nova)."
    )


vgpu_opts = [
    cfg.StrOpt(
        "sysfs_root",
        default=paths.DEFAULT_ROOT,
        help="""
Directory that plays the kernel's sysfs.  Keep the default on a real host.
Point it at a mount made by ``vgpu-manage fake-host serve`` to run the driver
on a fake host.  The privileged helper reads this option from the files it
is started with (by default nova-compute's own) and writes under it only,
and only when it is a sysfs mount (see ``test_only_fake_sysfs_root``).
""",
    ),
    cfg.BoolOpt(
        "test_only_fake_sysfs_root",
        default=False,
        help="""
TEST ONLY: let the privileged helper write into a ``sysfs_root`` that is not
a sysfs mount (a fake host's directory, or its FUSE mount served by
``vgpu-manage fake-host serve``).  Never set it on a real host: the helper
refuses any other filesystem so that nothing but the kernel's sysfs can
receive its writes, and a fake host served by an unprivileged user would
otherwise steer what root writes.  The privileged helper (``vgpu-privsep-helper``)
takes it from its own root-owned file (``/etc/vgpu-driver/privsep.conf``)
only, never from nova-compute's files; ``vgpu-manage`` run as root takes it
from its ``--config-file``.
""",
    ),
    cfg.StrOpt(
        "test_only_fake_nvml_host",
        help="""
TEST ONLY: the directory of a fake host (``vgpu-manage fake-host create``)
whose fake vendor driver the privileged NVML helper asks, instead of
NVIDIA's management library, to switch a GPU's mixed-size vGPU mode: the
host ``sysfs_root`` serves.  Honoured only together with
``test_only_fake_sysfs_root``, and by the helper from its own file only, as
that option.  Never set it on a real host.
""",
    ),
    cfg.StrOpt(
        "state_dir",
        default="/var/lib/vgpu-driver",
        help="""
Directory for the driver's persistent state (the mdev claims journal).  It
must survive reboots and be local to the host.
""",
    ),
    cfg.BoolOpt(
        "remove_mdevs_on_release",
        default=False,
        help="""
What to do with an instance's mdevs when it is deleted.  False keeps them
for the next guest of the same type (nova's behaviour; fastest).  True
removes them, leaving the GPU free to change type.  Either way an unused
mdev of a type its GPU no longer serves is removed automatically.
""",
    ),
    cfg.FloatOpt(
        "mdev_remove_timeout",
        default=30.0,
        min=0.1,
        help="""
Seconds a release waits for the kernel to remove an instance's mdevs.  The
kernel blocks a removal while a guest still holds the device; past this time
the removal stays in flight (one writer per mdev, never a second), the mdev
stays reserved, and the host reconciler drops its claim once the kernel has
removed it.  ``vgpu-manage status`` shows such a removal as stuck, with its
age.
""",
    ),
    cfg.IntOpt(
        "max_removals_in_flight",
        default=2,
        min=1,
        help="""
At most this many removals (an mdev's ``remove``, clearing a VF's vGPU type)
are written at once by this service.  The kernel can block each of them,
together with the privileged helper's worker that writes it, for as long as
a guest still holds the device; the others wait their turn, reserved.  Keep
it below the privileged helper's thread pool (``thread_pool_size`` in
``[vgpu_driver_sysfs_writer]``, the CPU count by default) so that creating
vGPUs never waits for a free worker.
""",
    ),
    cfg.FloatOpt(
        "reconcile_interval",
        default=60.0,
        min=1.0,
        help="""
Seconds between two passes of the host reconciler when nothing asks for
one sooner.  It also runs at each periodic inventory update, when a removal
the kernel blocked returns, and (every second, or at udev's events) while
vGPUs wait for their parents after a reboot.
""",
    ),
    cfg.FloatOpt(
        "restore_wait",
        default=300.0,
        min=0.0,
        help="""
Seconds after which a vGPU that a guest's claim still references, and
whose parent has not appeared since it was found missing (SR-IOV VFs appear
only after the vendor's enablement step), is reported as an error.  The
service does not wait for them: the host reconciler re-creates each one as
soon as its parent appears, and keeps trying after this time.
""",
    ),
    cfg.StrOpt(
        "hotplug_events",
        default="auto",
        choices=[
            ("auto", "udev on the kernel's own sysfs when a udev daemon runs, else polling"),
            (
                "udev",
                "udev whatever sysfs_root is (a fake host that announces its devices as udev does)",
            ),
            ("off", "polling: every refresh reads every GPU, waits sleep"),
        ],
        help="""
How the driver learns that GPUs, SR-IOV VFs or mdevs came or went: from
udev's events for the ``pci`` and ``mdev`` subsystems (needs the ``hotplug``
extra, pyudev), or by reading sysfs again.  With events, the periodic
inventory refresh re-reads only the GPUs that changed, and mdevs waiting for
late VFs after a reboot are re-created as soon as the VFs appear.  When udev
cannot be used the driver polls, and says why once in its log.
""",
    ),
    cfg.FloatOpt(
        "full_refresh_interval",
        default=600.0,
        min=0.0,
        help="""
Seconds between two full reads of every GPU when udev events drive the
inventory refresh (in between, only GPUs that events named are read again).
Bounds how long a change udev did not announce can go unseen; 0 reads
everything every time.
""",
    ),
    cfg.FloatOpt(
        "claim_grace",
        default=600.0,
        min=0.0,
        help="""
Seconds after which a claim that no guest has come to use is dropped as
stale (for example, after a crash during a boot).
""",
    ),
    cfg.FloatOpt(
        "unused_claim_grace",
        default=300.0,
        min=0.0,
        help="""
Seconds after which nova-compute's host reconciler releases a guest's claim
that no domain on this host uses, when the guest's domain here uses other
vGPUs, or the guest has none here and lives on another host, was deleted,
or is in ERROR (a crash or a failed step left the claim).  Its vGPU is
removed as on any release (``remove_mdevs_on_release``).  Never while nova
is in the middle of an operation on the guest (a task state, a migration
from or to this host, an operation nova-compute is running); a stopped
guest whose domain is gone keeps its claims, which its next start uses.
""",
    ),
    cfg.FloatOpt(
        "migration_claim_timeout",
        default=21600.0,
        min=0.0,
        help="""
Seconds after which a ``migrating_in`` claim (vGPUs a destination holds for
an incoming live migration) that no domain references is dropped as stale,
when the migration's rollback never reached this host.  A claim the guest's
domain references is never dropped.  Such a claim goes unreferenced only
between the destination's pre-check and libvirt starting the incoming guest
here, steps nova bounds by its RPC timeout (``[DEFAULT] long_rpc_timeout``,
30 minutes by default); from then on the domain references it however long
the copy takes.  The default, 6 hours, leaves a wide margin.  0 never drops
them: the migration settles them, or ``vgpu-manage claims drop`` does.
""",
    ),
    cfg.StrOpt(
        "metrics_textfile",
        default="",
        help="""
File nova-compute writes this host's metrics to, in Prometheus' text format,
at each periodic inventory update (``[DEFAULT] update_resources_interval``),
from what that update has just read: the same series as ``vgpu-manage
metrics``, with no second read of the host.  Point it into node_exporter's
textfile collector directory (its name must end in ``.prom``; the directory
must exist and be writable by nova-compute's user).  The file is replaced
whole each time.  Empty: not written (``vgpu-manage metrics serve`` or
``metrics --output`` still work).
""",
    ),
    cfg.FloatOpt(
        "board_weight_multiplier",
        default=1.0,
        help="""
In the scheduler, when ``vgpu_driver.nova.scheduler.VGPUBoardWeigher`` is in
``[filter_scheduler] weight_classes``: how much it counts beside nova's
weighers (whose multipliers default to 1.0; nova's RAM and CPU weighers
spread guests, this one packs vGPUs on boards already broken).  Negative
values invert it.
""",
    ),
    cfg.StrOpt(
        "libvirt_uri",
        default="qemu:///system",
        help="""
libvirt connection whose domains (active and inactive) tell which mdevs are
in use.
""",
    ),
    cfg.StrOpt(
        "sriov_manage_path",
        default="/usr/lib/nvidia/sriov-manage",
        help="""
NVIDIA's script that enables and disables the SR-IOV VFs of its GPUs,
installed with the NVIDIA vGPU manager.  ``vgpu-manage sriov enable`` and
``disable`` (and so the ``vgpu-driver-sriov`` boot unit) run it as root,
``-e ADDRESS`` or ``-d ADDRESS``, once per configured GPU: the ``nvidia``
driver refuses a direct write to ``sriov_numvfs``.  nova-compute never runs
it.
""",
    ),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(vgpu_group())
    conf.register_opts(vgpu_opts, group="vgpu")
