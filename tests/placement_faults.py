"""A WSGI middleware that makes the real Placement misbehave on cue.

The Placement sync is meant to survive what a real cloud does to it: a
generation that moves under a write because someone else wrote first,
server errors, an API that is down for a while, a slow one.  Mocking the
HTTP client would only test our idea of those answers.  :class:`FaultInjector`
instead sits in front of upstream Placement's own WSGI application (through
``EmbeddedPlacement(middleware=FaultInjector)``), so every fault is a real
HTTP response from a real server, read by the real openstacksdk, and every
request that gets through is handled by Placement itself.

It also records every request with the status it got, so that tests can
assert what reached the server ("a steady-state sync makes one GET and no
write") rather than what our own code believes it did.

Scripting, each rule matching a method and a path regex (``None``: any);
rules are consumed before they act, so a hook that calls back into the same
server cannot trigger itself again:

* :meth:`FaultInjector.fail`: answer the next ``times`` matches with a status
  (500, 503, ...) and a Placement-style error body, without calling Placement
  or, with ``lost=True``, after Placement handled the request (a proxy that
  timed out after the backend committed: the client never sees the answer);
* :meth:`FaultInjector.conflict`: the same with Placement's own 409 body for
  a generation conflict (``placement.concurrent_update``);
* :meth:`FaultInjector.delay`: sleep, then pass the request through;
* :meth:`FaultInjector.before`: run ``hook(environ)`` and then pass the
  request through, e.g. to make a real concurrent write just before ours (a
  hook that raises is kept in :attr:`FaultInjector.errors` and answered 500);
* :meth:`FaultInjector.outage`: Placement goes down (every request gets a
  status) once a number of writes got through; :meth:`restore` ends it.

Requests carrying the :data:`BYPASS_HEADER` header (a second, "operator"
connection) skip every rule and are logged apart, so they neither trip a
fault meant for the code under test nor pollute its counters.
"""

import contextlib
import dataclasses
import json
import re
import threading
import time
import uuid

BYPASS_HEADER = "X-Fault-Injector-Bypass"
_BYPASS_ENVIRON = "HTTP_" + BYPASS_HEADER.upper().replace("-", "_")
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_REASONS = {
    409: "Conflict",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}


@dataclasses.dataclass
class Request:
    """One request as the server saw it, and what it answered."""

    method: str
    path: str
    query: str
    status: int | None = None  # what the client was answered
    injected: bool = False  # the answer came from the injector
    handled: bool = False  # Placement itself handled the request
    delayed: float = 0.0

    @property
    def write(self):
        return self.method in WRITE_METHODS


@dataclasses.dataclass
class _Rule:
    method: str | None
    path: re.Pattern | None
    times: int | None  # None: forever
    status: int | None = None
    body: bytes = b""
    delay: float = 0.0
    hook: object = None
    lost: bool = False

    def matches(self, method, path):
        return (self.method is None or re.fullmatch(self.method, method) is not None) and (
            self.path is None or self.path.fullmatch(path) is not None
        )


def placement_error_body(status, detail, code="placement.undefined_code"):
    """An error body shaped as Placement writes its own (``{"errors": [...]}``)."""
    title = _REASONS.get(status, "Error")
    return json.dumps(
        {
            "errors": [
                {
                    "status": status,
                    "title": title,
                    "detail": detail,
                    "code": code,
                    "request_id": f"req-{uuid.uuid4()}",
                }
            ]
        }
    ).encode()


class FaultInjector:
    """WSGI middleware: counts requests and injects scripted faults."""

    def __init__(self, app):
        self.app = app
        self._lock = threading.Lock()
        self._rules = []
        self._outage = None  # (status, writes that may still pass)
        self.requests = []  # Request, in arrival order (bypass excluded)
        self.bypassed = []  # Request made with BYPASS_HEADER
        self.errors = []  # exceptions raised by hooks (answered 500)

    # -- scripting -------------------------------------------------------------------

    def _add(self, method, path, times, **kwargs):
        rule = _Rule(method, re.compile(path) if path is not None else None, times, **kwargs)
        with self._lock:
            self._rules.append(rule)
        return rule

    def fail(self, method=None, path=None, status=503, times=1, detail=None, lost=False):
        """Answer the next ``times`` matching requests with ``status``.

        ``lost``: let Placement handle the request first, then drop its answer.
        """
        detail = detail or f"injected fault: HTTP {status}"
        return self._add(
            method, path, times, status=status, lost=lost, body=placement_error_body(status, detail)
        )

    def conflict(self, method=None, path=None, times=1):
        """Answer with Placement's own 409 for a resource provider generation conflict."""
        detail = (
            "There was a conflict when trying to complete your request.\n\n "
            "resource provider generation conflict  "
        )
        return self._add(
            method,
            path,
            times,
            status=409,
            body=placement_error_body(409, detail, code="placement.concurrent_update"),
        )

    def delay(self, method=None, path=None, seconds=0.2, times=None):
        """Sleep ``seconds`` before passing matching requests to Placement."""
        return self._add(method, path, times, delay=seconds)

    def before(self, method, path, hook, times=1):
        """Run ``hook(environ)`` before passing a matching request to Placement."""
        return self._add(method, path, times, hook=hook)

    def outage(self, status=503, after_writes=0):
        """Every request gets ``status`` once ``after_writes`` more writes went through."""
        with self._lock:
            self._outage = (status, after_writes)

    def restore(self):
        """Placement is healthy again: no outage, no pending rule."""
        with self._lock:
            self._outage = None
            self._rules.clear()

    @contextlib.contextmanager
    def suspended(self):
        """Placement healthy for a moment, then the rules and outage as they
        were: for a test's own read in the middle of a fault window."""
        with self._lock:
            rules, outage = list(self._rules), self._outage
            self._rules.clear()
            self._outage = None
        try:
            yield
        finally:
            with self._lock:
                self._rules[:0] = rules
                self._outage = outage

    def reset(self):
        """Forget what was recorded (rules and outage stay)."""
        with self._lock:
            self.requests.clear()
            self.bypassed.clear()

    # -- reading the record ----------------------------------------------------------

    def calls(self, method=None, path=None, status=None, injected=None, handled=None):
        """Recorded requests matching a method regex, a path regex, a status..."""
        with self._lock:
            recorded = list(self.requests)
        return [
            r
            for r in recorded
            if (method is None or re.fullmatch(method, r.method))
            and (path is None or re.fullmatch(path, r.path))
            and (status is None or r.status == status)
            and (injected is None or r.injected == injected)
            and (handled is None or r.handled == handled)
        ]

    def count(self, method=None, path=None, status=None, injected=None, handled=None):
        return len(self.calls(method, path, status, injected, handled))

    @property
    def writes(self):
        """Writes Placement handled (those the injector answered alone excluded)."""
        return [r for r in self.calls(handled=True) if r.write]

    @property
    def reads(self):
        """Reads Placement handled."""
        return [r for r in self.calls(handled=True) if not r.write]

    # -- WSGI --------------------------------------------------------------------------

    def _decide(self, record):
        """The rule to apply to ``record`` (consumed), or an outage rule, or None."""
        with self._lock:
            if self._outage is not None:
                status, left = self._outage
                if left <= 0:
                    return _Rule(
                        None,
                        None,
                        None,
                        status=status,
                        body=placement_error_body(status, "injected outage"),
                    )
                if record.write:
                    self._outage = (status, left - 1)
            for rule in self._rules:
                if rule.matches(record.method, record.path):
                    if rule.times is not None:
                        rule.times -= 1
                        if rule.times <= 0:
                            self._rules.remove(rule)
                    return rule
        return None

    def __call__(self, environ, start_response):
        record = Request(
            environ["REQUEST_METHOD"], environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", "")
        )
        if environ.get(_BYPASS_ENVIRON):
            with self._lock:
                self.bypassed.append(record)
            return self._through(record, environ, start_response)
        with self._lock:
            self.requests.append(record)
        rule = self._decide(record)
        if rule is not None and rule.status is not None:
            if rule.lost:
                self._drain(self._through(record, environ, lambda *a, **k: None))
            record.status, record.injected = rule.status, True
            start_response(
                f"{rule.status} {_REASONS.get(rule.status, 'Error')}",
                [("Content-Type", "application/json"), ("Content-Length", str(len(rule.body)))],
            )
            return [rule.body]
        if rule is not None and rule.delay:
            record.delayed = rule.delay
            time.sleep(rule.delay)
        if rule is not None and rule.hook is not None:
            try:
                rule.hook(environ)
            except Exception as exc:  # noqa: BLE001 - reported to the test, not lost
                with self._lock:
                    self.errors.append(exc)
                body = placement_error_body(500, f"fault injector hook failed: {exc!r}")
                record.status, record.injected = 500, True
                start_response(
                    "500 Internal Server Error",
                    [("Content-Type", "application/json"), ("Content-Length", str(len(body)))],
                )
                return [body]
        return self._through(record, environ, start_response)

    def _through(self, record, environ, start_response):
        def recording_start_response(status, headers, exc_info=None):
            record.status, record.handled = int(status.split(" ", 1)[0]), True
            return start_response(status, headers, exc_info)

        return self.app(environ, recording_start_response)

    @staticmethod
    def _drain(body):
        """Run a WSGI answer to completion and throw it away."""
        try:
            for _chunk in body:
                pass
        finally:
            close = getattr(body, "close", None)
            if close is not None:
                close()
