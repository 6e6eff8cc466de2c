"""Reading what ``host check`` looks at, once, and changing nothing.

sysfs through :mod:`vgpu_driver.sysfs.host_reads` and discovery, NVML
through :mod:`vgpu_driver.nvml` (a missing ``pynvml`` or NVIDIA library is
a fact, not a traceback), the configuration as ``config check`` reads it,
then libvirt, the installed sudo rule, the state directory and Placement,
each asked once.  Nothing here writes: no journal is opened, no
privileged helper started, Placement only read.
"""

from __future__ import annotations

import functools
import os
import pwd
from collections.abc import Callable
from typing import TYPE_CHECKING

from keystoneauth1 import exceptions as ks_exceptions
from oslo_config import cfg
from oslo_privsep import priv_context

from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import host_check
from vgpu_driver import host_files
from vgpu_driver import libvirt_host
from vgpu_driver import names
from vgpu_driver import nvml
from vgpu_driver import root_only
from vgpu_driver import service_check
from vgpu_driver.conf import mdev_types
from vgpu_driver.conf import privsep as privsep_conf
from vgpu_driver.sysfs import host_reads

if TYPE_CHECKING:
    from vgpu_driver.conf.mdev_settings import MdevConfig
    from vgpu_driver.host_snapshot import HostSnapshot
    from vgpu_driver.sysfs.linux import LinuxSysfs
    from vgpu_driver.sysfs.paths import SysfsPaths

# Any of them makes openstacksdk find credentials without [placement].
_OS_VARIABLES = ("OS_CLOUD", "OS_AUTH_URL", "OS_AUTH_TYPE", "OS_ENDPOINT")


def read(
    conf: cfg.ConfigOpts, host: LinuxSysfs, settings: host_files.Settings, root: str = "/"
) -> host_check.HostFacts:
    """The :class:`~vgpu_driver.host_check.HostFacts` of ``host``;
    ``settings`` (:class:`vgpu_driver.host_files.Settings`) are what
    install-units renders the sudo rule with, ``root`` where it is installed."""
    paths = host.paths
    gpus = tuple(host_reads.nvidia_gpus(paths))
    snapshot = discovery.discover(host)
    config, problems = mdev_types.load(conf)
    nvml_facts, nvml_error = _nvml(host, gpus)
    return host_check.HostFacts(
        gpus=gpus,
        vfs={g.address: tuple(host_reads.nvidia_vfs(paths, g)) for g in gpus},
        functions_at=configured_functions(paths, config),
        iommu_groups=host_reads.iommu_groups(paths),
        mdev_core=host_reads.has_mdev_core(paths),
        mdev_parents=host_reads.has_mdev_parents(paths),
        nvidia_module=host.vgpu_manager_version(),
        nvml=nvml_facts,
        nvml_error=nvml_error,
        snapshot=snapshot,
        sriov_manage=_executable(conf.vgpu.sriov_manage_path),
        config=config,
        config_problems=tuple(p for p in problems if p.severity == "error"),
        services=service_check.ServiceFacts(
            libvirt=_libvirt(conf.vgpu.libvirt_uri),
            sudo=_sudo_rule(conf, settings, root),
            helper_conf=_helper_conf(conf, settings, root),
            state_dir=_state_dir(conf.vgpu.state_dir, settings.user),
            placement=_placement(conf),
        ),
    )


def unoffered_gpus(host: LinuxSysfs, snapshot: HostSnapshot) -> str | None:
    """The warning of a host whose NVIDIA GPUs are there but none offers a
    vGPU type (discovery has none of them); None otherwise."""
    gpus = host_reads.nvidia_gpus(host.paths)
    if not gpus or any(snapshot.gpu(g.address) for g in gpus):
        return None
    listed = ", ".join(f"{g.address} (driver {g.driver or 'none'})" for g in gpus)
    return (
        f"{len(gpus)} NVIDIA GPU(s) on this host, none offering a vGPU type: {listed}; "
        "'vgpu-manage host check' says why"
    )


def _nvml(
    host: LinuxSysfs,
    gpus: tuple[host_reads.PciFunction, ...],
) -> tuple[dict[str, nvml.GpuFacts] | None, str | None]:
    if not gpus:
        return None, None
    try:
        return nvml.gpu_facts([g.address for g in gpus], host.nvml_bindings), None
    except exception.NvmlUnavailable as exc:
        return None, str(exc)


def configured_functions(
    paths: SysfsPaths, config: MdevConfig
) -> dict[str, host_reads.PciFunction | None]:
    """``{address: PciFunction or None}`` of every configured address."""
    found: dict[str, host_reads.PciFunction | None] = {}
    for type_config in config.types:
        for address in type_config.device_addresses:
            if names.is_pci_address(address):
                found[address] = host_reads.pci_function(paths, address)
    return found


def _executable(path: str) -> tuple[str, str]:
    if not os.path.isfile(path):
        return path, "missing"
    return path, "ok" if os.access(path, os.X_OK) else "not executable"


def _libvirt(uri: str) -> service_check.Reached:
    try:
        connection = libvirt_host.LibvirtHost(uri)
    except exception.VgpuDriverError as exc:
        return service_check.Reached(uri, error=exc.kwargs.get("reason") or str(exc))
    try:
        version = ".".join(str(n) for n in connection.versions()["libvirt"])
    finally:
        connection.close()
    return service_check.Reached(uri, detail=version)


def _helper_commands(conf: cfg.ConfigOpts) -> list[str]:
    """``helper_command`` of both privileged helpers ('' when unset)."""
    commands: list[str] = []
    for group in (privsep_conf.GROUP, privsep_conf.GPU_ADMIN_GROUP):
        try:
            commands.append(conf[group].helper_command)
        except (cfg.NoSuchOptError, cfg.NoSuchGroupError):
            conf.register_opts(priv_context.OPTS, group=group)
            commands.append(conf[group].helper_command)
    return commands


def _sudo_rule(
    conf: cfg.ConfigOpts, settings: host_files.Settings, root: str
) -> service_check.RootOnlyFile:
    described = (
        f"user {settings.user}, {settings.bin_dir}/vgpu-privsep-helper, "
        f"{' '.join(settings.config_files) or 'no configuration file'}"
    )
    return _root_only_file(
        conf,
        settings,
        root,
        host_files.SUDOERS,
        described,
        ("sudo-rule", "rule", "nova-compute cannot start its privileged helpers"),
        lambda path, status: (
            ()
            if status is None
            else service_check.sudoers_refused(path, status.st_mode & 0o7777, status.st_uid)
        ),
    )


def _helper_conf(
    conf: cfg.ConfigOpts, settings: host_files.Settings, root: str
) -> service_check.RootOnlyFile:
    described = " ".join(settings.config_files) or "no configuration file"
    return _root_only_file(
        conf,
        settings,
        root,
        host_files.PRIVSEP_CONF,
        described,
        ("helper-conf", "file", "the privileged helper cannot start"),
        lambda path, status: service_check.helper_conf_refused(
            path, tuple(root_only.problems(path))
        ),
    )


def _root_only_file(
    conf: cfg.ConfigOpts,
    settings: host_files.Settings,
    root: str,
    name: str,
    described: str,
    labels: tuple[str, str, str],
    refused: Callable[[str, os.stat_result | None], tuple[str, ...]],
) -> service_check.RootOnlyFile:
    """The installed file ``name`` beside what install-units renders;
    ``labels`` the fact's check, noun and what its absence stops;
    ``refused(path, its stat or None)`` says why its reader would refuse it."""
    path = os.path.join(root, name)
    check, noun, missing = labels
    fact = functools.partial(service_check.RootOnlyFile, check, path, noun, missing)
    if all(_helper_commands(conf)):
        return fact(
            not_needed="both [vgpu_driver_sysfs_writer] and [vgpu_driver_gpu_admin] "
            "set helper_command"
        )
    try:
        expected = next(f.text for f in host_files.render(settings) if f.path == name)
    except exception.VgpuDriverError as exc:
        return fact(render_error=str(exc))
    try:
        with open(path, encoding="utf-8") as installed:
            actual = installed.read()
            status = os.fstat(installed.fileno())
    except FileNotFoundError:
        return fact(expected=expected, settings=described)
    except (OSError, UnicodeDecodeError) as exc:
        return fact(
            expected=expected,
            settings=described,
            refused=refused(path, None),
            unreadable=getattr(exc, "strerror", None) or str(exc),
        )
    return fact(expected=expected, actual=actual, refused=refused(path, status), settings=described)


def _state_dir(path: str, user: str) -> service_check.StateDir:
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return service_check.StateDir(path, user, None)
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return service_check.StateDir(path, user, uid)
    return service_check.StateDir(
        path,
        user,
        uid,
        exists=True,
        is_dir=os.path.isdir(path),
        owner_uid=status.st_uid,
        mode=status.st_mode & 0o7777,
    )


def _placement(conf: cfg.ConfigOpts) -> service_check.Reached | None:
    """Placement's root document, read once (no write), or None when no
    Placement is configured."""
    if not (conf.placement.auth_type or any(os.environ.get(v) for v in _OS_VARIABLES)):
        return None
    try:
        from vgpu_driver import placement
        from vgpu_driver.conf import placement as placement_conf

        client = placement.Client(placement_conf.connection(conf), attempts=2)
        client.request("GET", "/")
        target = client.proxy.get_endpoint() or "its endpoint"
    except ImportError as exc:
        return service_check.Reached(
            "Placement", error=f"{exc} (pip install 'vgpu-driver[placement]')"
        )
    except (exception.VgpuDriverError, ks_exceptions.ClientException) as exc:
        return service_check.Reached("Placement", error=_one_line(exc))
    return service_check.Reached(target)


def _one_line(exc: BaseException) -> str:
    """An error's text on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__
