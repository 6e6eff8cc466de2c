"""``[placement]``: how to reach Placement, with keystoneauth's own options.

The same options nova-compute reads (``auth_type``, ``auth_url``,
``username``, ..., ``region_name``, ``valid_interfaces``), so vgpu-driver
running inside nova uses nova's credentials.  Without ``auth_type`` the
standard ``OS_*`` variables or ``clouds.yaml`` (``OS_CLOUD``) are used.
"""

from collections.abc import Iterable
from typing import Any

from keystoneauth1 import exceptions as ks_exceptions
from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

from vgpu_driver import exception

GROUP = "placement"


def placement_group() -> cfg.OptGroup:
    return cfg.OptGroup(GROUP, title="Placement", help="How to reach the Placement service.")


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(placement_group())
    ks_loading.register_session_conf_options(conf, GROUP)
    ks_loading.register_auth_conf_options(conf, GROUP)
    ks_loading.register_adapter_conf_options(conf, GROUP, include_deprecated=False)
    conf.set_default("service_type", "placement", group=GROUP)


def list_opts() -> list[tuple[cfg.OptGroup, list[Any]]]:
    options = (
        ks_loading.get_session_conf_options()
        + ks_loading.get_auth_common_conf_options()
        + ks_loading.get_auth_plugin_conf_options("password")
        + ks_loading.get_adapter_conf_options(include_deprecated=False)
    )
    return [(placement_group(), _unique(options))]


def _unique(options: Iterable[Any]) -> list[Any]:
    seen: set[str] = set()
    unique: list[Any] = []
    for option in options:
        if option.dest not in seen:
            seen.add(option.dest)
            unique.append(option)
    return unique


def connection(conf: cfg.ConfigOpts) -> Any:
    """An openstacksdk Connection to Placement from ``[placement]`` or OS_*;
    MissingCredentials names what is lacking."""
    import openstack
    from openstack import exceptions as sdk_exceptions

    try:
        return _connection(conf, openstack)
    except (ks_exceptions.ClientException, sdk_exceptions.SDKException) as exc:
        raise exception.MissingCredentials(reason=str(exc)) from exc


def _connection(conf: cfg.ConfigOpts, openstack: Any) -> Any:
    if conf[GROUP].auth_type:
        auth = ks_loading.load_auth_from_conf_options(conf, GROUP)
        session = ks_loading.load_session_from_conf_options(conf, GROUP, auth=auth)
        group = conf[GROUP]
        return openstack.connection.Connection(
            session=session,
            region_name=group.region_name,
            placement_interface=(group.valid_interfaces or [None])[0],
            placement_endpoint_override=group.endpoint_override,
        )
    return openstack.connect()
