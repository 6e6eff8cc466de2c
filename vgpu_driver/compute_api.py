"""nova's moves under way on a host, read from nova's REST API.

While a resize or a cold migration awaits confirmation (and while any move
runs), nova holds the source host's allocation under the *migration's*
UUID, not the instance's; the guest keeps its vGPUs there under its own.
The audit counts such an allocation as its instance's, given
``{migration uuid: instance uuid}`` (:func:`moves_on`).  Only nova knows
that link, and only through its API (``GET /os-migrations``, whose entries
carry their UUID from microversion 2.59); nova itself is never imported.
"""

from collections.abc import Iterable
from collections.abc import Mapping
from typing import Any

from keystoneauth1 import adapter as ks_adapter
from keystoneauth1 import exceptions as ks_exceptions

from vgpu_driver import exception

MICROVERSION = "2.80"

# A migration in one of these states holds no allocation of its own any
# more: nova moved it back to the instance, or deleted it.  ("error" and
# "failed" included: an allocation left under such a migration is nova's
# leak, and the audit shows it.)
ENDED = frozenset({"confirmed", "reverted", "completed", "done", "cancelled", "error", "failed"})


def moves_from(migrations: Iterable[Mapping[str, Any]], host: str) -> dict[str, str]:
    """``{migration uuid: instance uuid}`` of the moves under way to or
    from ``host``, from ``GET /os-migrations``'s entries."""
    return {
        m["uuid"]: m["instance_uuid"]
        for m in migrations
        if m.get("uuid")
        and m.get("status") not in ENDED
        and host in (m.get("source_compute"), m.get("dest_compute"))
    }


def moves_on(connection: Any, host: str) -> dict[str, str]:
    """The moves under way on ``host``, asked of nova's API through the
    session of ``connection`` (an openstacksdk Connection).

    Raises ComputeApiUnavailable when nova's API cannot be reached or
    refuses (no compute endpoint in the catalog, no admin role).
    """
    config = connection.config
    api = ks_adapter.Adapter(
        session=connection.session,
        service_type="compute",
        interface=config.get_interface("compute"),
        region_name=config.get_region_name("compute"),
        endpoint_override=config.get_endpoint("compute"),
    )
    try:
        response = api.get(
            "/os-migrations", params={"host": host}, microversion=MICROVERSION, raise_exc=True
        )
        migrations = response.json()["migrations"]
    except (ks_exceptions.ClientException, ValueError, KeyError) as exc:
        raise exception.ComputeApiUnavailable(
            host=host, reason=f"{type(exc).__name__}: {exc}"
        ) from exc
    return moves_from(migrations, host)
