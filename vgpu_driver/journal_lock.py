"""Waiting for the claims journal's write lock without freezing the process.

sqlite waits for another writer by sleeping in C: under eventlet (nova-compute
can run on it) nothing else runs meanwhile.  Threads of one process queue on
a lock of their own (:func:`process_lock`); a writer of another process is
waited for in short tries with Python's sleep between them
(:func:`patiently`), which yields to the hub.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")

# The longest sqlite itself may wait for another writer, sleeping in C, at a
# time: under eventlet nothing else runs meanwhile.  Longer waits are made of
# such tries with Python's sleep in between, which yields to the hub.
BUSY_POLL = 0.05
_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)

_PROCESS_LOCKS: dict[tuple[int, str], threading.RLock] = {}
_PROCESS_LOCKS_GUARD = threading.Lock()


def process_lock(path: str) -> threading.RLock:
    """This process's lock for one journal (a forked child gets fresh ones)."""
    key = (os.getpid(), path)
    with _PROCESS_LOCKS_GUARD:
        return _PROCESS_LOCKS.setdefault(key, threading.RLock())


def patiently(action: Callable[[], _T], patience: float) -> _T:
    """``action()``, retried while the database is busy for up to ``patience``
    seconds, sleeping between tries in Python (see :data:`BUSY_POLL`)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if (
                getattr(exc, "sqlite_errorcode", None) not in _BUSY_CODES
                or time.monotonic() >= deadline
            ):
                raise
        time.sleep(BUSY_POLL)


def begin_immediate(db: sqlite3.Connection, patience: float) -> None:
    patiently(lambda: db.execute("BEGIN IMMEDIATE"), patience)
