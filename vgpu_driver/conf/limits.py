"""``[oslo_limit]``: how nova's unified limits reach Keystone.

The options nova reads when ``[quota] driver = nova.quota.UnifiedLimitsDriver``:
keystoneauth's session and auth options (``auth_type``, ``auth_url``,
``username``, ``password``, ``user_domain_name``, ``system_scope``, ...)
and ``endpoint_id``, the Keystone endpoint whose service and region the
registered limits belong to.  ``vgpu-manage limits`` uses the same section,
so it checks exactly the limits nova-compute's API would look up.
"""

import urllib.parse
from typing import Any

from keystoneauth1 import loading as ks_loading
from oslo_config import cfg

from vgpu_driver import exception
from vgpu_driver.conf import placement

GROUP = "oslo_limit"

limit_opts = [
    cfg.StrOpt(
        "endpoint_id",
        help="""
The Keystone endpoint id of the compute service (nova) whose registered
limits apply; its service and region scope the ``class:<resource class>``
limits ``vgpu-manage limits`` checks and creates.
""",
    ),
]


def oslo_limit_group() -> cfg.OptGroup:
    return cfg.OptGroup(
        GROUP, title="Unified limits", help="How to reach Keystone's unified limits, as nova does."
    )


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_group(oslo_limit_group())
    conf.register_opts(limit_opts, group=GROUP)
    ks_loading.register_session_conf_options(conf, GROUP)
    ks_loading.register_auth_conf_options(conf, GROUP)


def list_opts() -> list[tuple[cfg.OptGroup, list[Any]]]:
    options = (
        limit_opts
        + ks_loading.get_session_conf_options()
        + ks_loading.get_auth_common_conf_options()
        + ks_loading.get_auth_plugin_conf_options("password")
    )
    return [(oslo_limit_group(), placement._unique(options))]


def connection(conf: cfg.ConfigOpts) -> tuple[Any, str]:
    """``(openstacksdk Connection, endpoint_id)`` from ``[oslo_limit]``."""
    import openstack

    group = conf[GROUP]
    for name in ("auth_type", "endpoint_id"):
        if not group[name]:
            raise exception.LimitsNotConfigured(option=f"[{GROUP}] {name}")
    auth = ks_loading.load_auth_from_conf_options(conf, GROUP)
    auth_url = getattr(auth, "auth_url", None)
    if auth_url and urllib.parse.urlsplit(auth_url).scheme not in ("http", "https"):
        raise exception.KeystoneUnavailable(
            url=auth_url, reason="[oslo_limit] auth_url is not an http:// or https:// URL"
        )
    session = ks_loading.load_session_from_conf_options(conf, GROUP, auth=auth)
    return openstack.connection.Connection(session=session), group.endpoint_id
