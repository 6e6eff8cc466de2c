"""The claims journal's database: opened checked, migrated, one connection
per thread, one write transaction at a time.

A journal is never read as empty when it is missing, unreadable or another
program's: that would make every claimed vGPU look free.  Its integrity and
schema version are checked read-only before anything writes it, and a
process that cannot write it reads it through connections that write
nothing.  A write transaction is sqlite's ``BEGIN IMMEDIATE``, which takes
the database's write lock: allocation decisions on a host are serialised by
it, across processes (:mod:`vgpu_driver.journal_lock` says how it is waited
for).  The claims themselves and their SQL are :mod:`vgpu_driver.claims`'.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable
from collections.abc import Iterator
from typing import TypeVar

from vgpu_driver import claims as claims_mod
from vgpu_driver import exception
from vgpu_driver import journal_connections
from vgpu_driver import journal_files
from vgpu_driver import journal_lock
from vgpu_driver import state_dir as state_dir_mod

_T = TypeVar("_T")


class Journal:
    """The claims database in ``[vgpu] state_dir``; one per process is fine."""

    FILENAME = "claims.sqlite"

    def __init__(self, state_dir: str, busy_timeout: float = 30.0, create: bool = True) -> None:
        """Open the journal, checked; ``create`` makes the state directory
        and a new journal when they are missing (nova-compute's start-up),
        and needs to write it.  Without it a missing journal raises
        JournalMissing, never an empty one, and a process that cannot
        write the journal reads it (:attr:`read_only` says why)."""
        self.path = os.path.join(state_dir, self.FILENAME)
        if create:
            state_dir_mod.make(state_dir, self.path)
        else:
            state_dir_mod.check(state_dir, self.path)
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._place = journal_files.Place.of(state_dir, self.path)
        self.read_only: str | None = None
        if not os.access(state_dir, os.X_OK, effective_ids=True):
            raise exception.JournalNotReadable(
                path=self.path,
                user=journal_files.this_process(),
                reason=f"the state directory is {journal_files.describe(self._place.directory)}",
            )
        if create and not os.path.lexists(self.path):
            why = journal_files.why_not_writable(self._place, {})
            if why:
                raise self._not_writable(why)
        made = journal_files.create(self._place) if create else None
        created = made is not None
        try:
            self._open(create, created)
        except BaseException:
            # The empty file made here would be refused by every later start
            # (an empty file is never taken for an empty journal).
            if made is not None:
                self.close()
                journal_files.remove_if_empty(self._place, made)
            raise

    def _open(self, create: bool, created: bool) -> None:
        found = journal_files.inspect_all(self._place)
        if found[""] is None:
            raise exception.JournalMissing(path=self.path, reason="the file does not exist")
        if create:
            journal_files.give_to_owner(self._place, found)
        #: Why this process cannot write the journal (None: it can).
        self.read_only = self._access(found, create)
        try:
            self._open_checked(create, created, found[""].st_size)
        except sqlite3.DatabaseError as exc:
            raise journal_connections.refused(self.path, exc) from exc

    def _access(self, found: dict[str, os.stat_result | None], create: bool) -> str | None:
        why = journal_files.why_not_readable(self._place, found)
        if why:
            raise exception.JournalNotReadable(
                path=self.path, user=journal_files.this_process(), reason=why
            )
        why = journal_files.why_not_writable(self._place, found)
        if why and create:
            raise self._not_writable(why)
        if why:
            journal_files.notice_read_only(self.path, why)
        return why

    def _not_writable(self, why: str) -> exception.JournalNotWritable:
        owner = self._place.owner
        if self.read_only:
            fix = f"Run this as root or as {owner}."
        elif self._place.directory.st_uid != os.geteuid():
            fix = (
                f"The state directory must be the writer's (nova-compute's user): "
                f"install -d -o USER -g GROUP -m 0750 {self._place.state_dir} (it is "
                f"{owner}'s)."
            )
        else:
            fix = (
                f"Run 'vgpu-manage claims init' as root: it gives the journal's files to "
                f"the state directory's owner ({owner}), its claims unchanged."
            )
        return exception.JournalNotWritable(
            path=self.path, user=journal_files.this_process(), reason=why, fix=fix
        )

    def _open_checked(self, create: bool, created: bool, size: int) -> None:
        """Integrity and version checked read-only (a refused file is left
        byte for byte as it was), then the schema brought to this version."""
        version, has_claims = 0, False
        if not created:
            # A file that is there is ours only if it holds our table: an
            # empty file or another program's database is never adopted.
            if size == 0:
                raise exception.JournalUnreadable(
                    path=self.path, reason="the file is empty (0 bytes)"
                )
            version, tables = self._check_read_only()
            has_claims = "claims" in tables
            # Without claims: another program's tables are never adopted; a
            # database with none (a first start cut short) only by a creator.
            if not has_claims and (tables or not create):
                raise exception.JournalUnreadable(path=self.path, reason="it holds no claims table")
        # Written before versioning: the version-1 schema, user_version 0.
        schema = 1 if version == 0 and has_claims else version
        if self.read_only:
            if schema < claims_mod.SCHEMA_VERSION:
                raise self._not_writable(
                    f"its schema (version {version}) must be brought "
                    f"to version {claims_mod.SCHEMA_VERSION} by a writer"
                )
            return
        db = self._db()
        if version < claims_mod.SCHEMA_VERSION:
            self._migrate(db, schema)

    def _check_read_only(self) -> tuple[int, set[str]]:
        """``(schema version, its table names)`` of a journal that passes
        sqlite's integrity check and is not newer than this code."""

        def check(db: sqlite3.Connection) -> tuple[int, set[str]]:
            verdict = db.execute("PRAGMA quick_check").fetchone()[0]
            if verdict != "ok":
                raise exception.JournalUnreadable(
                    path=self.path, reason=f"integrity check: {verdict}"
                )
            version: int = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {
                row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            return version, tables

        if self.read_only:
            version, tables = journal_lock.patiently(
                lambda: journal_connections.read(self._place, check), self._busy_timeout
            )
        else:
            db = journal_connections.connect(self._place, "mode=ro", timeout=self._busy_timeout)
            try:
                version, tables = check(db)
            finally:
                db.close()
        if version > claims_mod.SCHEMA_VERSION:
            raise exception.JournalTooNew(
                path=self.path, found=version, known=claims_mod.SCHEMA_VERSION
            )
        return version, tables

    def _migrate(self, db: sqlite3.Connection, version: int) -> None:
        with journal_lock.process_lock(self.path):
            journal_lock.begin_immediate(db, self._busy_timeout)
            try:
                for script in claims_mod.MIGRATIONS[version:]:
                    for statement in filter(str.strip, script.split(";")):
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {claims_mod.SCHEMA_VERSION:d}")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    @property
    def schema_version(self) -> int:
        version: int = self._read(lambda db: db.execute("PRAGMA user_version").fetchone()[0])
        return version

    def _read(self, action: Callable[[sqlite3.Connection], _T]) -> _T:
        """``action(db)`` on this thread's connection, or, read-only, on one
        that writes nothing (see :func:`journal_connections.read`)."""
        if self.read_only:
            return journal_connections.read(self._place, action)
        return action(self._db())

    def _db(self) -> sqlite3.Connection:
        """This thread's connection, kept open: opening one per transaction
        costs a WAL checkpoint each time.  A forked child opens its own."""
        if self.read_only:
            raise self._not_writable(self.read_only)
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            # mode=rw: sqlite never creates the file (that is done above,
            # following no link); the file it opened is checked.
            db = journal_connections.connect(
                self._place,
                "mode=rw",
                timeout=journal_lock.BUSY_POLL,
                isolation_level=None,
                check_same_thread=True,
            )
            db.execute("PRAGMA journal_mode=WAL")
            # Claims must survive power loss too: a reboot restores from them.
            db.execute("PRAGMA synchronous=FULL")
            local.db, local.pid = db, os.getpid()
        db_: sqlite3.Connection = local.db
        return db_

    def close(self) -> None:
        """Close this thread's connection (the next use opens another): a
        process that reads once per request leaves no file open behind."""
        db = getattr(self._local, "db", None)
        if db is not None and getattr(self._local, "pid", None) == os.getpid():
            db.close()
        self._local.__dict__.clear()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[claims_mod.Transaction]:
        """A write transaction holding the host-wide allocation lock.

        Threads of this process queue on a lock of their own first, so only
        one of them waits on sqlite's lock at a time; a writer of another
        process (a ``vgpu-manage`` command) is waited for in short tries with
        Python's sleep between them: sqlite waits by sleeping in C, which
        under eventlet (nova-compute can run on it) would freeze every green
        thread for as long as the other process holds the lock.
        """
        with journal_lock.process_lock(self.path):
            db = self._db()
            journal_lock.begin_immediate(db, self._busy_timeout)
            try:
                yield claims_mod.Transaction(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def claims(self, instance_uuid: str | None = None) -> list[claims_mod.Claim]:
        return journal_lock.patiently(
            lambda: self._read(lambda db: claims_mod.Transaction(db).claims(instance_uuid)),
            self._busy_timeout,
        )
