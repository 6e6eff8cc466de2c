"""The real openstack-placement service, run in-process: demos and tests.

It is upstream Placement itself (its WSGI application, its database schema,
its policy), on sqlite by default or on any database URL, served with the
standard library's WSGI server on 127.0.0.1 so that openstacksdk and the
``openstack`` CLI can reach it.  No authentication: the ``noauth2`` strategy
with the ``admin`` token, as Placement's own functional tests use.

    with EmbeddedPlacement() as placement:
        conn = placement.connection()   # an openstacksdk Connection

Placement keeps its database engine in a process-wide facade, so one
EmbeddedPlacement runs at a time in a process (each on its own database).

On sqlite, requests are served one at a time.  The in-memory database is a
single connection every request thread shares, so overlapping transactions
fail ("cannot start a transaction within a transaction"), and a file database
takes one writer at a time ("database is locked"): either way an overlapping
request would get a 500.  Other databases are served concurrently.
"""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Callable
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Any
from wsgiref import simple_server

from oslo_log import log as logging

from vgpu_driver import placement as vgpu_placement

if TYPE_CHECKING:
    from wsgiref.types import StartResponse
    from wsgiref.types import WSGIApplication
    from wsgiref.types import WSGIEnvironment

    from oslo_config import cfg

LOG = logging.getLogger(__name__)

# noauth2 makes this token an admin; it is no secret.
ADMIN_TOKEN = "admin"  # noqa: S105


class _QuietHandler(simple_server.WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


class _ThreadingServer(socketserver.ThreadingMixIn, simple_server.WSGIServer):
    daemon_threads = True


def serve_on_loopback(port: int, app: WSGIApplication, name: str) -> simple_server.WSGIServer:
    """Serve a WSGI app on 127.0.0.1:``port`` from a daemon thread; the
    server is stopped with :func:`stop_serving`."""
    server = simple_server.make_server(
        "127.0.0.1", port, app, server_class=_ThreadingServer, handler_class=_QuietHandler
    )
    threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True
    ).start()
    return server


def stop_serving(server: simple_server.WSGIServer) -> None:
    """Stop serving and close the socket: connections are refused from now."""
    server.shutdown()
    server.server_close()


def _one_at_a_time(app: WSGIApplication) -> WSGIApplication:
    """``app`` behind a lock held until its response body is complete."""
    lock = threading.Lock()

    def serialized(environ: WSGIEnvironment, start_response: StartResponse) -> list[bytes]:
        with lock:
            response: Iterable[bytes] = app(environ, start_response)
            try:
                return [b"".join(response)]
            finally:
                if hasattr(response, "close"):
                    response.close()

    return serialized


def _placement_config(database_url: str) -> cfg.ConfigOpts:
    from oslo_config import cfg
    from placement import conf as placement_conf
    from placement import db_api

    config = cfg.ConfigOpts()
    placement_conf.register_opts(config)
    config.set_override("connection", database_url, group="placement_database")
    config.set_override("sync_on_startup", True, group="placement_database")
    config.set_override("auth_strategy", "noauth2", group="api")
    config([], project="placement", default_config_files=[])
    # Once per process; later engines are patched in, so Placement's warning
    # that it is "not reconfiguring" says nothing here.
    logging.getLogger("placement.db_api").logger.setLevel(logging.ERROR)
    db_api.configure(config)
    return config


class EmbeddedPlacement:
    """Placement served on 127.0.0.1 by a thread of this process."""

    def __init__(
        self,
        database_url: str = "sqlite://",
        port: int = 0,
        middleware: Callable[[WSGIApplication], WSGIApplication] | None = None,
    ) -> None:
        """``middleware``: optionally wraps the app (a callable app -> app)."""
        self.database_url = database_url
        self.port = port
        self.middleware = middleware
        self._server: simple_server.WSGIServer | None = None

    def start(self) -> EmbeddedPlacement:
        from oslo_db.sqlalchemy import engines
        from placement import db_api

        # Placement's database facade is global to the process: give it this
        # instance's engine (as Placement's own test fixture does), so each
        # EmbeddedPlacement has its own database.  One runs at a time.
        from placement import deploy
        from placement.objects import resource_class
        from placement.objects import trait

        config = _placement_config(self.database_url)
        self._engine = engines.create_engine(self.database_url)
        self._unpatch = db_api.placement_context_manager.patch_engine(self._engine)
        # Placement syncs standard traits and resource classes once per process;
        # a new database needs them again (its own test fixture resets the same).
        trait._TRAITS_SYNCED = False
        resource_class._RESOURCE_CLASSES_SYNCED = False
        app = deploy.loadapp(config)  # schema, traits and classes in this database
        if self.database_url.startswith("sqlite"):
            app = _one_at_a_time(app)
        if self.middleware is not None:
            app = self.middleware(app)
        self._server = serve_on_loopback(self.port, app, "placement")
        LOG.info("Placement (%s) serving on %s", self.database_url, self.endpoint)
        return self

    def stop(self) -> None:
        if self._server is not None:
            stop_serving(self._server)
            self._server = None
            self._unpatch()
            self._engine.dispose()

    def __enter__(self) -> EmbeddedPlacement:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]  # type: ignore[union-attr]  # started
        return f"http://{host!s}:{port}"

    def connection(self) -> Any:
        """An openstacksdk Connection to this Placement, as an admin."""
        import openstack

        return openstack.connection.Connection(
            auth_type="admin_token", auth={"endpoint": self.endpoint, "token": ADMIN_TOKEN}
        )

    def cli_environment(self) -> dict[str, str]:
        """Environment for the ``openstack`` CLI (osc-placement) to reach it."""
        return {
            "OS_AUTH_TYPE": "admin_token",
            "OS_ENDPOINT": self.endpoint,
            "OS_TOKEN": ADMIN_TOKEN,
            "OS_PLACEMENT_API_VERSION": vgpu_placement.MICROVERSION,
        }
