"""``[devices]`` and the per-type ``[mdev_<type>]`` groups, as nova reads them."""

from oslo_config import cfg


def devices_group() -> cfg.OptGroup:
    """A new group object per ConfigOpts (see ``conf.vgpu.vgpu_group``)."""
    return cfg.OptGroup(
        "devices",
        title="Mediated device types",
        help="Which mediated device (mdev) types this host offers to guests.",
    )


MDEV_CLASS_PATTERN = r"^(VGPU|CUSTOM_[A-Z0-9_]+)$"
# [devices] shared_board_mode: how a board listed under several types serves them.
SHARED_BOARD_MIXED = "mixed"
SHARED_BOARD_POOL = "pool"

devices_opts = [
    cfg.ListOpt(
        "enabled_mdev_types",
        default=[],
        deprecated_name="enabled_vgpu_types",
        help="""
The mdev type ids (as listed under
``<sysfs>/class/mdev_bus/*/mdev_supported_types``, e.g. ``nvidia-35``) that
guests can be given on this host.

A physical GPU hosts one type at a time.  With several types, give each one a
``[mdev_<type>]`` group whose ``device_addresses`` (or ``device_ids``, by GPU
model) names the GPUs that serve it.  At most one type may omit both: it
serves every GPU not taken by another type.  Run ``vgpu-manage types`` to
see what the host offers and ``vgpu-manage config check`` to validate the
result.
""",
    ),
    cfg.StrOpt(
        "shared_board_mode",
        default=SHARED_BOARD_MIXED,
        choices=[
            (SHARED_BOARD_MIXED, "vGPUs of several sizes at once, in NVIDIA's mixed-size mode"),
            (SHARED_BOARD_POOL, "one size at a time, taken from the board's first vGPU"),
        ],
        help="""
How a GPU listed under several NVIDIA types serves them.  ``mixed``: a
board serving vendor-specific VFIO vGPUs is switched to NVIDIA's mixed-size
mode and hosts vGPUs of several sizes at once.  ``pool``: the GPU stays in
equal-size mode; while it holds no vGPU it offers every size of its types,
its first vGPU fixes the size (on a time-sliced GPU such as the T4, the
type) up to NVIDIA's maximum for it, and once its last vGPU goes it offers
every size again.  ``pool`` also serves GPUs whose vGPUs are mdevs, and
boards that cannot mix sizes.
""",
    ),
]


def mdev_type_opts(type_id: str) -> list[cfg.Opt]:
    """The options of one ``[mdev_<type>]`` group."""
    return [
        cfg.ListOpt(
            "device_addresses",
            default=[],
            deprecated_group=f"vgpu_{type_id}",
            help=f"""
Physical GPUs that serve type ``{type_id}``: PCI addresses of physical
functions (``0000:84:00.0``), or, for boards with SR-IOV, of any of their
virtual functions (the whole GPU then serves the type).  Kernel sample
devices are named ``<class>_<device>`` (``mtty_mtty``).  An address may
appear under one type only.  Empty (and no ``device_ids``) means every GPU
not listed under another type.
""",
        ),
        cfg.ListOpt(
            "device_ids",
            default=[],
            help=f"""
GPU models that serve type ``{type_id}``, as PCI ``vendor:device`` ids of the
physical function (``10de:1eb8`` for a Tesla T4, see ``lspci -nn``), so one
nova.conf fits hosts whose GPUs sit at different addresses.  Matching GPUs
not named by any ``device_addresses`` are taken in PCI address order, up to
``gpu_count``; a GPU already holding vGPUs of this type keeps it.  Types with
a ``gpu_count`` are filled first (in ``enabled_mdev_types`` order), then the
type without one takes the rest; two types without a count may not share an
id.  ``vgpu-manage config check`` prints the resulting GPU to type map.
""",
        ),
        cfg.IntOpt(
            "gpu_count",
            min=1,
            help=f"""
Most GPUs that serve ``{type_id}`` on a host, counting those named by
``device_addresses``.  Needs ``device_ids``.  Unset means every matching GPU
left by the types that have a count.
""",
        ),
        cfg.StrOpt(
            "mdev_class",
            default="VGPU",
            regex=MDEV_CLASS_PATTERN,
            max_length=255,
            help=f"""
Placement resource class of the inventory reported for GPUs serving
``{type_id}``: ``VGPU`` or a custom class ``CUSTOM_[A-Z0-9_]+``.  Flavors ask
for it with ``resources:<class>=1``.
""",
        ),
        cfg.BoolOpt(
            "display",
            help=f"""
Give guests of ``{type_id}`` the vGPU's display (libvirt ``display='on'``),
for a console through the vGPU.  Unset leaves it to libvirt (off).
""",
        ),
        cfg.BoolOpt(
            "ramfb",
            help=f"""
Also give guests of ``{type_id}`` a boot-time framebuffer (``ramfb='on'``),
so firmware and boot messages show before the guest's vGPU driver loads.
Needs ``display = true``.
""",
        ),
        cfg.IntOpt(
            "max_instances",
            min=1,
            help=f"""
Most mdevs of type ``{type_id}`` this host may hand out, over all its GPUs.
Unset means as many as the GPUs can host.  GPUs are filled in PCI address
order and capped partially; a GPU left without capacity keeps its provider
with all of it reserved.  Each GPU's own limit (``max_instance`` in the
type's description, free VFs on SR-IOV boards) always applies.
""",
        ),
    ]


def group_name(type_id: str) -> str:
    return f"mdev_{type_id}"


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(devices_group())
    conf.register_opts(devices_opts, group="devices")


def register_beside_nova(conf: cfg.ConfigOpts) -> None:
    """On nova's CONF, whose ``[devices]`` declares ``enabled_mdev_types``
    itself: the options of that group nova lacks (registering nova's own
    again, with other help, is a duplicate oslo.config refuses)."""
    conf.register_opts([o for o in devices_opts if o.dest not in conf.devices], group="devices")


def template_group() -> tuple[cfg.OptGroup, list[cfg.Opt]]:
    """A documented stand-in for the dynamic groups, for the sample config."""
    group = cfg.OptGroup(
        "mdev_<type>",
        title="Per-type settings (template)",
        help="""
Template: one such group per type listed in ``[devices]/enabled_mdev_types``,
named after it, for example ``[mdev_nvidia-35]``.  These groups are read only
for enabled types.

One file for a whole fleet selects GPUs by model: on any host, the first four
Tesla T4 (in PCI address order) serve nvidia-319, the other T4s nvidia-320,
and every A100 board nvidia-468::

    [devices]
    enabled_mdev_types = nvidia-319, nvidia-320, nvidia-468
    [mdev_nvidia-319]
    device_ids = 10de:1eb8
    gpu_count = 4
    [mdev_nvidia-320]
    device_ids = 10de:1eb8
    [mdev_nvidia-468]
    device_ids = 10de:20f1
""",
    )
    return group, mdev_type_opts("<type>")
