"""Placement's REST API: one request, with its retries and microversion.

:class:`Client` sends each request at :data:`MICROVERSION`; server errors,
timeouts and refused connections are retried with backoff, then reported as
:class:`PlacementUnavailable`, and a token is fetched first, so a Keystone
fault is named as Keystone's.  Answers are checked, not trusted
(:func:`exact_name_match`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Iterable
from typing import Any
from urllib import parse

from keystoneauth1 import adapter as ks_adapter
from keystoneauth1 import exceptions as ks_exceptions

from vgpu_driver.exception import Conflict
from vgpu_driver.exception import PlacementAuthRefused
from vgpu_driver.exception import PlacementAuthUnavailable
from vgpu_driver.exception import PlacementError
from vgpu_driver.exception import PlacementUnavailable

MICROVERSION = "1.39"


class Client:
    """Placement's REST API with retries, over an openstacksdk Connection.

    The Connection provides the session (auth, TLS, catalog); requests go
    through a plain keystoneauth adapter for the ``placement`` service, as
    nova's own client does.  (The SDK's proxy would discover API versions on
    first use, outside the retries, so a Placement that is down would fail
    there with an unhelpful error.)
    """

    def __init__(
        self,
        connection: Any,
        attempts: int = 4,
        backoff: float = 0.2,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        config = connection.config
        self.proxy = ks_adapter.Adapter(
            session=connection.session,
            service_type="placement",
            interface=config.get_interface("placement"),
            region_name=config.get_region_name("placement"),
            endpoint_override=config.get_endpoint("placement"),
        )
        self.attempts = attempts
        self.backoff = backoff
        self.sleep = sleep
        self._authenticated = False

    def _authenticate(self) -> None:
        """Get a token first, so a Keystone fault is named as Keystone's and
        not taken for Placement's."""
        if self._authenticated:
            return
        auth_url = getattr(self.proxy.session.auth, "auth_url", None) or "(no auth_url)"
        try:
            self.proxy.get_token()
        except ks_exceptions.ConnectionError as exc:
            raise PlacementAuthUnavailable(
                auth_url=auth_url, reason=f"{type(exc).__name__}: {exc}"
            ) from exc
        except ks_exceptions.ClientException as exc:
            raise PlacementAuthRefused(
                auth_url=auth_url, reason=f"{type(exc).__name__}: {exc}"
            ) from exc
        self._authenticated = True

    def request(self, method: str, url: str, body: Any = None, report: object = None) -> Any:
        """The JSON answer (or None); raises Conflict, PlacementError, or
        PlacementUnavailable once retries are spent."""
        self._authenticate()
        reason = ""
        for attempt in range(1, self.attempts + 1):
            if report is not None:
                setattr(
                    report,
                    "reads" if method == "GET" else "writes",
                    getattr(report, "reads" if method == "GET" else "writes") + 1,
                )
            try:
                response = self.proxy.request(
                    url, method, json=body, microversion=MICROVERSION, raise_exc=False
                )
            except ks_exceptions.ConnectionError as exc:  # refused, timed out, reset
                reason = f"{type(exc).__name__}: {exc}"
            else:
                if response.status_code == 409:
                    raise Conflict(method=method, url=url, detail=response.text[:300])
                if response.status_code < 500:
                    if response.status_code >= 400:
                        raise PlacementError(
                            method=method,
                            url=url,
                            status=response.status_code,
                            detail=response.text[:300],
                        )
                    return response.json() if response.content else None
                reason = f"HTTP {response.status_code}"
            if attempt < self.attempts:
                self.sleep(self.backoff * 2 ** (attempt - 1))
        raise PlacementUnavailable(method=method, url=url, attempts=self.attempts, reason=reason)


def query_url(path: str, **params: Any) -> str:
    """``path`` with its query parameters URL-encoded: a name holding ``+``,
    ``&`` or ``#`` must reach Placement as written."""
    return f"{path}?{parse.urlencode(params)}"


def exact_name_match(
    providers: Iterable[dict[str, Any]],
    name: str,
) -> dict[str, Any] | None:
    """The one provider of ``providers`` named exactly ``name``, or None: an
    answer is never trusted to hold only what the query asked for."""
    matches = [p for p in providers if p.get("name") == name]
    if len(matches) > 1:
        raise PlacementError(
            method="GET",
            url=query_url("/resource_providers", name=name),
            status=200,
            detail=f"{len(matches)} providers named {name!r}",
        )
    return matches[0] if matches else None
