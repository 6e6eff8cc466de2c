"""Keystone registered limits for the resource classes this host allocates.

With nova's unified limits, a flavor asking for a resource class nobody
registered a ``class:<RC>`` limit for is refused (nova counts a missing
limit as zero), and nothing on the compute side says why.  The limits live
under the service and region of ``[oslo_limit] endpoint_id``; this module
reads them and creates the missing ones, never changing one that exists.
Everything goes through openstacksdk's identity API.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Iterable
from typing import TYPE_CHECKING
from typing import Any

from keystoneauth1 import exceptions as ks_exceptions

from vgpu_driver import exception

if TYPE_CHECKING:
    from vgpu_driver.conf.mdev_settings import MdevConfig

OK = "ok"
MISSING = "missing"
CREATED = "created"
WOULD_CREATE = "would create"


@dataclasses.dataclass(frozen=True)
class LimitRow:
    resource_name: str
    default_limit: int | None
    status: str


def resource_names(mdev_config: MdevConfig) -> list[str]:
    """``class:<RC>`` for VGPU and every configured ``mdev_class``."""
    return sorted(f"class:{rc}" for rc in mdev_config.mdev_classes | {"VGPU"})


class RegisteredLimits:
    """The registered limits of one endpoint's service and region."""

    def __init__(self, connection: Any, endpoint_id: str) -> None:
        self._url = _auth_url(connection)
        # The proxy authenticates and discovers versions as it is built.
        self.identity = self._call("authenticate", lambda: connection.identity)
        self.endpoint_id = endpoint_id
        # Every use of the proxy is inside _call: openstacksdk raises as an
        # attribute is looked up (a service it could not load, for one).
        endpoint = self._call(
            "read endpoint " + endpoint_id, lambda: self.identity.get_endpoint(endpoint_id)
        )
        self.service_id, self.region_id = endpoint.service_id, endpoint.region_id

    def check(self, names: Iterable[str]) -> list[LimitRow]:
        """One :class:`LimitRow` per name, ``ok`` or ``missing``."""
        existing = self._existing()
        return [
            LimitRow(name, existing.get(name), OK if name in existing else MISSING)
            for name in names
        ]

    def apply(
        self, names: Iterable[str], default_limit: int, dry_run: bool = False
    ) -> list[LimitRow]:
        """Create the missing limits with ``default_limit``; rows of what was
        (or would be) created.  Existing limits are left as they are."""
        rows: list[LimitRow] = []
        for row in self.check(names):
            if row.status == OK:
                continue
            if not dry_run:
                self._call(
                    f"create registered limit {row.resource_name}",
                    lambda name=row.resource_name: self.identity.create_registered_limit(
                        service_id=self.service_id,
                        region_id=self.region_id,
                        resource_name=name,
                        default_limit=default_limit,
                    ),
                )
            rows.append(
                LimitRow(row.resource_name, default_limit, WOULD_CREATE if dry_run else CREATED)
            )
        return rows

    def _existing(self) -> dict[str, int]:
        limits = self._call(
            "list registered limits",
            lambda: list(
                self.identity.registered_limits(
                    service_id=self.service_id, region_id=self.region_id
                )
            ),
        )
        return {limit.resource_name: limit.default_limit for limit in limits}

    def _call(self, action: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        import openstack.exceptions as sdk_exceptions

        try:
            return function(*args, **kwargs)
        except ks_exceptions.ConnectionError as exc:
            raise exception.KeystoneUnavailable(url=self._url, reason=_first_line(exc)) from exc
        except ks_exceptions.Unauthorized as exc:
            raise exception.KeystoneRefused(
                action=action,
                reason=f"the [oslo_limit] credentials were rejected ({_first_line(exc)})",
            ) from exc
        except sdk_exceptions.ForbiddenException as exc:
            raise exception.KeystoneRefused(
                action=action,
                reason=f"the [oslo_limit] user lacks the role for it "
                f"(creating limits needs a system admin; "
                f"{_first_line(exc)})",
            ) from exc
        except (ks_exceptions.ClientException, sdk_exceptions.SDKException) as exc:
            raise exception.KeystoneRefused(action=action, reason=_first_line(exc)) from exc


def _auth_url(connection: Any) -> str:
    try:
        url: str = connection.session.auth.auth_url
        return url
    except AttributeError:
        return "the configured auth_url"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
