"""The real Keystone (from PyPI), run in-process on 127.0.0.1 for tests.

What ``keystone-manage db_sync``, ``fernet_setup`` and ``bootstrap`` do is
done through Keystone's own modules, on sqlite and a fernet key directory in
a temporary directory; then its WSGI application is served by a thread.
Keystone keeps its configuration and backends in process-wide globals and
refuses to load its backends twice, so the application is built once per
process (:func:`application`); servers on top of it can be started and
stopped at will (a stopped one plays "Keystone is down").

    with EmbeddedKeystone() as keystone:
        keystone.admin_connection()     # openstacksdk, system-scoped admin

Besides the bootstrapped ``admin`` (system admin), it has a ``nova`` compute
service with an endpoint in ``RegionOne`` (:attr:`nova_endpoint_id`) and a
system-reader user ``observer``.
"""

import atexit
import logging as std_logging
import os
import shutil
import socket
import tempfile
import warnings

from vgpu_driver import placement_service

ADMIN = ("admin", "admin-secret")
READER = ("observer", "observer-secret")
REGION = "RegionOne"

_APP = {}


def _configure(state_dir):
    import keystone.conf
    from keystone.common import sql

    conf_file = os.path.join(state_dir, "keystone.conf")
    keys = os.path.join(state_dir, "fernet-keys")
    with open(conf_file, "w") as out:
        out.write(
            f"[database]\nconnection = sqlite:///{state_dir}/keystone.db\n"
            f"[fernet_tokens]\nkey_repository = {keys}\n"
            f"[fernet_receipts]\nkey_repository = {keys}\n"
            "[identity]\npassword_hash_rounds = 4\n"
        )
    keystone.conf.configure()
    sql.initialize()
    keystone.conf.set_config_defaults()
    keystone.conf.CONF([], project="keystone", default_config_files=[conf_file])
    return keystone.conf.CONF, keys


def _fernet_setup(conf, keys):
    from keystone.common import fernet_utils

    futils = fernet_utils.FernetUtils(keys, conf.fernet_tokens.max_active_keys, "fernet_tokens")
    futils.create_key_directory(os.getuid(), os.getgid())
    futils.initialize_key_repository(os.getuid(), os.getgid())


def _bootstrap(public_url):
    from keystone.cmd import bootstrap
    from keystone.common.sql import upgrades

    upgrades.offline_sync_database_to_version()
    boot = bootstrap.Bootstrapper()  # loads the backends, once per process
    boot.admin_username, boot.admin_password = ADMIN
    boot.project_name = "admin"
    boot.admin_role_name = "admin"
    boot.service_name = "keystone"
    boot.region_id = REGION
    boot.public_url = public_url
    boot.bootstrap()


def application():
    """Keystone's WSGI app, its port and URL, built once per process."""
    if not _APP:
        # Keystone's import chain and bootstrap warn about its own
        # dependencies (eventlet, debtcollector): not ours to fix.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _build()
    return _APP


def _build():
    # In-process, Keystone's log would land in the output of the commands
    # under test.
    std_logging.getLogger("keystone").setLevel(std_logging.CRITICAL)
    from keystone.server.flask import application as ks_application
    from keystone.server.flask import core

    # The catalog needs Keystone's own URL before it serves: pick a port.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v3"
    state_dir = tempfile.mkdtemp(prefix="keystone-")
    # The app lives as long as the process (Keystone loads its backends once).
    atexit.register(shutil.rmtree, state_dir, True)
    conf, keys = _configure(state_dir)
    _fernet_setup(conf, keys)
    _bootstrap(url)
    app = core.setup_app_middleware(ks_application.application_factory("public"))
    _APP.update(app=placement_service._one_at_a_time(app), port=port, url=url, state_dir=state_dir)


class EmbeddedKeystone:
    """Keystone served on 127.0.0.1 by a thread of this process."""

    def __init__(self):
        self._server = None
        self.nova_endpoint_id = None

    def start(self):
        built = application()
        self.auth_url = built["url"]
        self._server = placement_service.serve_on_loopback(built["port"], built["app"], "keystone")
        self._ensure_nova_and_reader()
        return self

    def stop(self):
        """Stop serving: connections are refused until :meth:`start`."""
        if self._server is not None:
            placement_service.stop_serving(self._server)
            self._server = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def admin_connection(self):
        return self.connection(*ADMIN)

    def connection(self, username, password):
        """openstacksdk, system-scoped, as ``[oslo_limit]`` credentials are."""
        import openstack

        return openstack.connection.Connection(
            auth_type="password",
            region_name=REGION,
            auth={
                "auth_url": self.auth_url,
                "username": username,
                "password": password,
                "user_domain_name": "Default",
                "system_scope": "all",
            },
        )

    def oslo_limit_section(self, username, password, endpoint_id=None):
        """The ``[oslo_limit]`` text a nova.conf would have."""
        return (
            f"[oslo_limit]\nauth_type = password\nauth_url = {self.auth_url}\n"
            f"username = {username}\npassword = {password}\n"
            f"user_domain_name = Default\nsystem_scope = all\n"
            f"endpoint_id = {endpoint_id or self.nova_endpoint_id}\n"
        )

    def cli_environment(self):
        """``OS_*`` for the official ``openstack`` CLI, as the admin."""
        return {
            "OS_AUTH_URL": self.auth_url,
            "OS_USERNAME": ADMIN[0],
            "OS_PASSWORD": ADMIN[1],
            "OS_USER_DOMAIN_NAME": "Default",
            "OS_SYSTEM_SCOPE": "all",
            "OS_IDENTITY_API_VERSION": "3",
            "OS_REGION_NAME": REGION,
        }

    def nova_service_id(self):
        (service,) = self.admin_connection().identity.services(name="nova")
        return service.id

    def delete_registered_limits(self):
        identity = self.admin_connection().identity
        for limit in identity.registered_limits():
            identity.delete_registered_limit(limit)

    def _ensure_nova_and_reader(self):
        identity = self.admin_connection().identity
        service = next(iter(identity.services(name="nova")), None) or identity.create_service(
            name="nova", type="compute", enabled=True
        )
        endpoints = list(identity.endpoints(service_id=service.id))
        endpoint = (
            endpoints[0]
            if endpoints
            else identity.create_endpoint(
                service_id=service.id,
                interface="public",
                region_id=REGION,
                url="http://127.0.0.1:8774/v2.1",
            )
        )
        self.nova_endpoint_id = endpoint.id
        if not list(identity.users(name=READER[0])):
            user = identity.create_user(name=READER[0], password=READER[1], domain_id="default")
            (role,) = identity.roles(name="reader")
            identity.assign_system_role_to_user(user=user, role=role, system="all")
