"""Every hook vgpu-driver has on nova, in one place, checked at start-up.

The adapter subclasses nova's ``LibvirtDriver`` and replaces or wraps some of
its private methods, wraps callbacks on its ``Host``, and reads a few of its
objects.  None of that is nova's public API: a release may rename a method,
drop a parameter, or stop calling ``destroy`` from ``_hard_reboot``.  Left
unchecked, such a change surfaces deep in a spawn, as an ``AttributeError``
or a wrong vGPU count.  :func:`check` compares the running nova with
:data:`HOOKS` and :data:`BEHAVIOURS` when the driver is made, before
nova-compute serves anything, and stops it with one message naming nova's
version, the hook and the range of nova this vgpu-driver supports.

A hook is a name and the leading parameters the adapter passes or reads by
name; nova may add parameters after them (it often adds optional ones).
``tests/unit/nova/test_compat.py`` keeps :data:`HOOKS` complete: every
``super().X`` and ``self._host.X`` of the adapter must be listed here.
"""

import dataclasses
import importlib
import importlib.metadata
import inspect
import re

from vgpu_driver import exception

DISTRIBUTION = "vgpu-driver"


@dataclasses.dataclass(frozen=True)
class Hook:
    """``owner.name`` exists, is callable (unless ``callable`` is False),
    and its parameters begin with ``params``."""

    owner: str  # "module:Class" or "module"
    name: str
    params: tuple = ()
    callable: bool = True

    @property
    def label(self):
        return f"{self.owner.rpartition(':')[2] or self.owner}.{self.name}"


_DRIVER = "nova.virt.libvirt.driver:LibvirtDriver"
_HOST = "nova.virt.libvirt.host:Host"
_CTX = ("self", "context", "instance")

HOOKS = (
    # LibvirtDriver methods the adapter replaces (nova calls them, with these
    # parameters) or wraps (super() is called with them).
    Hook(_DRIVER, "__init__", ("self", "virtapi", "read_only")),
    Hook(_DRIVER, "init_host", ("self", "host")),
    Hook(_DRIVER, "cleanup_host", ("self", "host")),
    Hook(_DRIVER, "_start_inactive_mediated_devices", ("self",)),
    Hook(_DRIVER, "_get_supported_vgpu_types", ("self",)),
    Hook(
        _DRIVER,
        "_update_provider_tree_for_vgpu",
        ("self", "provider_tree", "nodename", "allocations"),
    ),
    Hook(_DRIVER, "_allocate_mdevs", ("self", "allocations")),
    Hook(_DRIVER, "_guest_add_mdevs", ("self", "guest", "chosen_mdevs")),
    Hook(_DRIVER, "_get_all_assigned_mediated_devices", ("self", "instance")),
    Hook(_DRIVER, "_get_mdev_types_from_uuids", ("self", "mdev_uuids")),
    Hook(_DRIVER, "spawn", _CTX),
    Hook(_DRIVER, "finish_migration", ("self", "context", "migration", "instance")),
    Hook(
        _DRIVER, "confirm_migration", ("self", "context", "migration", "instance", "network_info")
    ),
    Hook(_DRIVER, "finish_revert_migration", _CTX),
    Hook(_DRIVER, "_hard_reboot", _CTX),
    Hook(_DRIVER, "resume", _CTX),
    Hook(
        _DRIVER,
        "destroy",
        (*_CTX, "network_info", "block_device_info", "destroy_disks", "destroy_secrets"),
    ),
    Hook(_DRIVER, "_undefine_domain", ("self", "instance")),
    Hook(
        _DRIVER,
        "check_source_migrate_data_at_dest",
        ("self", "ctxt", "instance", "migrate_data", "migration", "limits", "allocs"),
    ),
    Hook(_DRIVER, "check_can_live_migrate_source", (*_CTX, "dest_check_data")),
    Hook(_DRIVER, "post_live_migration_at_destination", _CTX),
    Hook(_DRIVER, "post_live_migration_at_source", (*_CTX, "network_info")),
    Hook(_DRIVER, "rollback_live_migration_at_destination", _CTX),
    Hook(_DRIVER, "cleanup_lingering_instance_resources", ("self", "instance")),
    # The Host: its connection, and the callbacks it registers on each new
    # connection by looking them up on itself (the domain index wraps them).
    Hook(_HOST, "_get_new_connection", ("self",)),
    Hook(_HOST, "_event_lifecycle_callback", ("conn", "dom")),
    Hook(_HOST, "_event_device_removed_callback", ("conn", "dom")),
    Hook(_HOST, "get_connection", ("self",)),
    Hook(_HOST, "list_guests", ("self", "only_running")),
    Hook(_HOST, "get_hostname", ("self",)),
    # What the adapter reads or builds of nova's.
    Hook("nova.virt.libvirt.host", "libvirt", callable=False),
    Hook("nova.virt.libvirt.config", "LibvirtConfigGuestHostdevPCI"),
    Hook("nova.objects.service", "SERVICE_VERSION", callable=False),
    Hook(
        "nova.scheduler.client.report:SchedulerReportClient",
        "get_allocs_for_consumer",
        ("self", "context", "consumer"),
    ),
    Hook(
        "nova.scheduler.client.report:SchedulerReportClient",
        "get_provider_traits",
        ("self", "context", "rp_uuid"),
    ),
    Hook("nova.scheduler.client.report:SchedulerReportClient", "get", ("self", "url")),
    Hook(
        "nova.scheduler.client.report:SchedulerReportClient",
        "get_providers_in_tree",
        ("self", "context", "uuid"),
    ),
    Hook(
        "nova.compute.utils",
        "add_instance_fault_from_exc",
        ("context", "instance", "fault", "exc_info"),
    ),
    Hook(
        "nova.scheduler.client.report:SchedulerReportClient",
        "set_inventory_for_provider",
        ("self", "context", "rp_uuid", "inv_data"),
    ),
    Hook(
        "nova.scheduler.client.report:SchedulerReportClient",
        "_refresh_and_get_inventory",
        ("self", "context", "rp_uuid"),
    ),
    Hook("nova.context", "get_admin_context"),
    # The scheduler filter and weigher (vgpu_driver.nova.scheduler), and
    # the stat the weigher reads (digested by nova's resource tracker from
    # get_available_resource's "stats").
    Hook("nova.scheduler.client.report", "report_client_singleton"),
    Hook(
        "nova.scheduler.weights:BaseHostWeigher",
        "_weigh_object",
        ("self", "obj", "weight_properties"),
    ),
    Hook("nova.scheduler.weights:BaseHostWeigher", "weight_multiplier", ("self", "host_state")),
    Hook("nova.compute.stats:Stats", "digest_stats", ("self", "stats")),
    Hook(_DRIVER, "get_available_resource", ("self", "nodename")),
    Hook(
        "nova.scheduler.filters:BaseHostFilter",
        "host_passes",
        ("self", "host_state", "filter_properties"),
    ),
    Hook("nova.conf.devices", "register_dynamic_opts", ("conf",)),
    Hook("nova.compute.provider_tree:ProviderTree", "new_child", ("self", "name", "parent")),
    Hook(
        "nova.compute.provider_tree:ProviderTree",
        "get_provider_uuids_in_tree",
        ("self", "name_or_uuid"),
    ),
)

# Instance attributes nova's LibvirtDriver sets in its __init__ (the mdev
# maps: filled by the adapter for a mixed-size board, which nova refuses).
DRIVER_ATTRIBUTES = (
    "_host",
    "virtapi",
    "provider_tree",
    "pgpu_type_mapping",
    "mdev_class_mapping",
    "mdev_classes",
    "mdev_type_max_mapping",
    "pgpu_type_default",
)


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """What nova's code does that the adapter relies on: ``needle`` appears
    in the source of ``owner.name``."""

    owner: str
    name: str
    needle: str
    meaning: str


BEHAVIOURS = (
    # A hard reboot destroys the domain through self.destroy, which keeps
    # the guest's claims only inside the adapter's _hard_reboot.
    Behaviour(
        _DRIVER,
        "_hard_reboot",
        "self.destroy(",
        "a hard reboot destroys the domain through destroy()",
    ),
    # compute_driver is imported as nova.virt.<compute_driver>
    # (vgpu_driver.nova_alias makes vgpu_driver.nova loadable so).
    Behaviour(
        "nova.virt.driver",
        "load_compute_driver",
        "'nova.virt.%s'",
        "compute_driver is imported as nova.virt.<compute_driver>",
    ),
)


def nova_version():
    """The installed nova's version, or "unknown"."""
    try:
        return importlib.metadata.version("nova")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def supported_range():
    """The nova versions this vgpu-driver declares (its ``nova`` extra)."""
    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or ()
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
    for requirement in requires:
        spec, _, marker = requirement.partition(";")
        match = re.fullmatch(r"\s*nova(?![\w.-])\s*\(?([^)]*)\)?\s*", spec)
        if match and re.search(r"extra\s*==\s*['\"]nova['\"]", marker):
            return f"nova{match.group(1).strip()}" if match.group(1).strip() else "any nova"
    return "unknown"


def _resolve(owner):
    module_name, _, class_name = owner.partition(":")
    found = importlib.import_module(module_name)
    return getattr(found, class_name) if class_name else found


def hook_problem(hook):
    """Why the running nova does not offer ``hook``, or None."""
    try:
        owner = _resolve(hook.owner)
    except (ImportError, AttributeError) as exc:
        return f"{hook.owner.replace(':', '.')} cannot be imported ({exc})"
    if not hasattr(owner, hook.name):
        return f"{hook.label} does not exist"
    if not hook.callable:
        return None
    found = inspect.getattr_static(owner, hook.name)
    if isinstance(found, (staticmethod, classmethod)):
        found = found.__func__
    if not callable(found):
        return f"{hook.label} is not callable"
    try:
        params = list(inspect.signature(found).parameters.values())
    except (TypeError, ValueError):
        return None  # a builtin: nothing to compare
    if not _takes(params, hook.params):
        return (
            f"{hook.label} takes ({', '.join(p.name for p in params)}), where "
            f"vgpu-driver passes ({', '.join(hook.params)}, ...)"
        )
    return None


def _takes(params, expected):
    """``params`` begin with the names ``expected``, or take anything from
    where they differ on (``*args``: a wrapper passing everything on)."""
    for index, name in enumerate(expected):
        if index >= len(params):
            return False
        if params[index].kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            return True
        if params[index].name != name:
            return False
    return True


def behaviour_problem(behaviour):
    """Why the running nova does not do what ``behaviour`` says, or None.

    Without source (an install of bytecode only) nothing can be said: None.
    """
    try:
        code = getattr(_resolve(behaviour.owner), behaviour.name)
        source = inspect.getsource(code)
    except (ImportError, AttributeError):
        return f"{behaviour.owner.replace(':', '.')}.{behaviour.name} does not exist"
    except (OSError, TypeError):
        return None
    if behaviour.needle not in source:
        label = behaviour.owner.rpartition(":")[2] or behaviour.owner
        return (
            f"{label}.{behaviour.name} no longer does what vgpu-driver relies on: "
            f"{behaviour.meaning}"
        )
    return None


def problems():
    """Every hook and behaviour the running nova lacks, as sentences."""
    found = [hook_problem(h) for h in HOOKS] + [behaviour_problem(b) for b in BEHAVIOURS]
    return [p for p in found if p is not None]


def check():
    """Refuse a nova that lacks what the adapter hooks (before the driver
    is made); NovaIncompatible names all of it."""
    found = problems()
    if found:
        raise exception.NovaIncompatible(
            version=nova_version(), problems="; ".join(found), supported=supported_range()
        )


def check_driver(driver):
    """Refuse a driver nova made without the attributes the adapter reads
    (after nova's ``__init__``)."""
    missing = [name for name in DRIVER_ATTRIBUTES if not hasattr(driver, name)]
    if missing:
        raise exception.NovaIncompatible(
            version=nova_version(),
            supported=supported_range(),
            problems="; ".join(f"LibvirtDriver sets no {name} attribute" for name in missing),
        )
