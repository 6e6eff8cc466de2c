"""The claims journal: which instance holds which mdev, kept on disk.

An mdev is *free* when no libvirt domain and no claim references it.  Every
allocation records its claims here, in one transaction, before any mdev is
created or handed out, so two allocations (threads or processes) can never
take the same mdev, and a crash never loses track of one.  sqlite's
``BEGIN IMMEDIATE`` takes the database's write lock: allocation decisions on
a host are serialised by it, across processes.

States: ``claimed`` (handed out, guest not defined yet), ``attached`` (the
guest's domain references it), ``migrating_in`` (held for an incoming live
migration), ``releasing`` (being removed: not free until it is gone).

On NVIDIA's vendor-specific VFIO framework there is no mdev: the vGPU is a
VF given a type through ``current_vgpu_type``, and the guest gets the VF.
Its claim names it by the VF's PCI address in ``mdev_uuid`` (the VF is also
its ``parent``), the id domains name it by too.  The primary key then keeps
a VF to one claim, as it does an mdev, and journals written before VFs were
allocated read unchanged: the schema is the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from collections.abc import Collection
from collections.abc import Iterable
from collections.abc import Iterator
from typing import Any
from typing import TypeVar

from vgpu_driver import exception
from vgpu_driver import journal_files
from vgpu_driver import names

CLAIMED = "claimed"
ATTACHED = "attached"
MIGRATING_IN = "migrating_in"
RELEASING = "releasing"
STATES = (CLAIMED, ATTACHED, MIGRATING_IN, RELEASING)

_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    mdev_uuid     TEXT PRIMARY KEY,
    instance_uuid TEXT NOT NULL,
    gpu           TEXT NOT NULL,
    parent        TEXT NOT NULL,
    type_id       TEXT NOT NULL,
    state         TEXT NOT NULL
                  CHECK (state IN ('claimed', 'attached', 'migrating_in', 'releasing')),
    created       INTEGER NOT NULL DEFAULT 0,
    created_at    REAL NOT NULL,
    updated_at    REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS claims_by_instance ON claims (instance_uuid);
CREATE INDEX IF NOT EXISTS claims_by_gpu ON claims (gpu);
"""

# Each migration brings the schema from version i to i + 1; the journal
# records its version in ``PRAGMA user_version``.  Journals written before
# versioning hold the version-1 schema with user_version 0.
_MIGRATIONS = (_SCHEMA,)
SCHEMA_VERSION = len(_MIGRATIONS)

_COLUMNS = ("mdev_uuid, instance_uuid, gpu, parent, type_id, state, created, created_at, "
            "updated_at")


@dataclasses.dataclass(frozen=True)
class Claim:
    mdev_uuid: str    # the vGPU's id: an mdev UUID, or a vendor-VFIO VF's address
    instance_uuid: str
    gpu: str
    parent: str
    type_id: str
    state: str
    created: bool     # this claim's allocation created the mdev (set the VF's type)
    created_at: float
    updated_at: float

    @property
    def is_vf(self) -> bool:
        """A vendor-VFIO vGPU: the VF itself, not an mdev."""
        return names.is_vf_vgpu_id(self.mdev_uuid)


def _claim(row: Any) -> Claim:
    # A row of _COLUMNS: nine values, the seventh an int.
    return Claim(*row[:6], bool(row[6]), *row[7:])  # type: ignore[call-arg]


# The longest sqlite itself may wait for another writer, sleeping in C, at a
# time: under eventlet nothing else runs meanwhile.  Longer waits are made of
# such tries with Python's sleep in between, which yields to the hub.
BUSY_POLL = 0.05
_BUSY_CODES = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)

_PROCESS_LOCKS: dict[tuple[int, str], threading.RLock] = {}
_PROCESS_LOCKS_GUARD = threading.Lock()


def _process_lock(path: str) -> threading.RLock:
    """This process's lock for one journal (a forked child gets fresh ones)."""
    key = (os.getpid(), path)
    with _PROCESS_LOCKS_GUARD:
        return _PROCESS_LOCKS.setdefault(key, threading.RLock())


def _patiently(action: Callable[[], _T], patience: float) -> _T:
    """``action()``, retried while the database is busy for up to ``patience``
    seconds, sleeping between tries in Python (see :data:`BUSY_POLL`)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", None) not in _BUSY_CODES \
                    or time.monotonic() >= deadline:
                raise
        time.sleep(BUSY_POLL)


def _begin_immediate(db: sqlite3.Connection, patience: float) -> None:
    _patiently(lambda: db.execute("BEGIN IMMEDIATE"), patience)


def _make_state_dir(state_dir: str, path: str) -> None:
    try:
        os.makedirs(state_dir, mode=0o750, exist_ok=True)
    except OSError as exc:
        raise exception.JournalMissing(
            path=path, reason=f"cannot create {state_dir}: {exc.strerror}") from exc


def _check_state_dir(state_dir: str, path: str) -> None:
    """Refuse a state dir that is not there: reading it as empty would make
    every claimed mdev look free."""
    if not os.path.isdir(state_dir):
        reason = ("the state directory is not a directory" if os.path.exists(state_dir)
                  else "the state directory does not exist")
        raise exception.JournalMissing(path=path, reason=reason)


def check_new_state_dir(state_dir: str, also_ours: Iterable[str] = ()) -> None:
    """Refuse to start a journal in a directory that holds other programs'
    files: ``claims init`` with a mistyped ``--state-dir`` (``/var/lib/nova``,
    a home directory) would otherwise put the host's claims among them.
    sqlite's side files, ``also_ours`` (the driver's other state files, and
    their temporary copies) and a new filesystem's ``lost+found`` are not
    another program's."""
    try:
        entries = sorted(os.listdir(state_dir))
    except (FileNotFoundError, NotADirectoryError):
        return      # created, or refused, when the journal is made
    if Journal.FILENAME in entries:
        return
    ours = (Journal.FILENAME, *also_ours)
    others = [e for e in entries
              if e != "lost+found" and not any(e.startswith(name) for name in ours)]
    if others:
        raise exception.NotAStateDirectory(state_dir=state_dir, count=len(others),
                                           examples=", ".join(others[:3]))


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
            _make_state_dir(state_dir, self.path)
        else:
            _check_state_dir(state_dir, self.path)
        self._busy_timeout = busy_timeout
        self._local = threading.local()
        self._place = journal_files.Place.of(state_dir, self.path)
        self.read_only: str | None = None
        if not os.access(state_dir, os.X_OK, effective_ids=True):
            raise exception.JournalNotReadable(
                path=self.path, user=journal_files.this_process(),
                reason=f"the state directory is {journal_files.describe(self._place.directory)}")
        if create and not os.path.lexists(self.path):
            why = journal_files.why_not_writable(self._place, {})
            if why:
                raise self._not_writable(why)
        created = create and journal_files.create(self._place)
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
            raise journal_files.refused(self.path, exc) from exc

    def _access(self, found: dict[str, os.stat_result | None], create: bool) -> str | None:
        why = journal_files.why_not_readable(self._place, found)
        if why:
            raise exception.JournalNotReadable(path=self.path,
                                               user=journal_files.this_process(), reason=why)
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
            fix = (f"The state directory must be the writer's (nova-compute's user): "
                   f"install -d -o USER -g GROUP -m 0750 {self._place.state_dir} (it is "
                   f"{owner}'s).")
        else:
            fix = (f"Run 'vgpu-manage claims init' as root: it gives the journal's files to "
                   f"the state directory's owner ({owner}), its claims unchanged.")
        return exception.JournalNotWritable(path=self.path, user=journal_files.this_process(),
                                            reason=why, fix=fix)

    def _open_checked(self, create: bool, created: bool, size: int) -> None:
        """Integrity and version checked read-only (a refused file is left
        byte for byte as it was), then the schema brought to this version."""
        version, has_claims = 0, False
        if not created:
            # A file that is there is ours only if it holds our table: an
            # empty file or another program's database is never adopted.
            if size == 0:
                raise exception.JournalUnreadable(path=self.path,
                                                  reason="the file is empty (0 bytes)")
            version, tables = self._check_read_only()
            has_claims = "claims" in tables
            # Without claims: another program's tables are never adopted; a
            # database with none (a first start cut short) only by a creator.
            if not has_claims and (tables or not create):
                raise exception.JournalUnreadable(path=self.path,
                                                  reason="it holds no claims table")
        # Written before versioning: the version-1 schema, user_version 0.
        schema = 1 if version == 0 and has_claims else version
        if self.read_only:
            if schema < SCHEMA_VERSION:
                raise self._not_writable(f"its schema (version {version}) must be brought "
                                         f"to version {SCHEMA_VERSION} by a writer")
            return
        db = self._db()
        if version < SCHEMA_VERSION:
            self._migrate(db, schema)

    def _check_read_only(self) -> tuple[int, set[str]]:
        """``(schema version, its table names)`` of a journal that passes
        sqlite's integrity check and is not newer than this code."""
        def check(db: sqlite3.Connection) -> tuple[int, set[str]]:
            verdict = db.execute("PRAGMA quick_check").fetchone()[0]
            if verdict != "ok":
                raise exception.JournalUnreadable(path=self.path,
                                                  reason=f"integrity check: {verdict}")
            version: int = db.execute("PRAGMA user_version").fetchone()[0]
            tables = {row[0] for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table'")}
            return version, tables

        if self.read_only:
            version, tables = _patiently(lambda: journal_files.read(self._place, check),
                                         self._busy_timeout)
        else:
            db = journal_files.connect(self._place, "mode=ro", timeout=self._busy_timeout)
            try:
                version, tables = check(db)
            finally:
                db.close()
        if version > SCHEMA_VERSION:
            raise exception.JournalTooNew(path=self.path, found=version, known=SCHEMA_VERSION)
        return version, tables

    def _migrate(self, db: sqlite3.Connection, version: int) -> None:
        with _process_lock(self.path):
            _begin_immediate(db, self._busy_timeout)
            try:
                for script in _MIGRATIONS[version:]:
                    for statement in filter(str.strip, script.split(";")):
                        db.execute(statement)
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION:d}")
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
        that writes nothing (see :func:`journal_files.read`)."""
        if self.read_only:
            return journal_files.read(self._place, action)
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
            db = journal_files.connect(self._place, "mode=rw", timeout=BUSY_POLL,
                                       isolation_level=None, check_same_thread=True)
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
    def transaction(self) -> Iterator[Transaction]:
        """A write transaction holding the host-wide allocation lock.

        Threads of this process queue on a lock of their own first, so only
        one of them waits on sqlite's lock at a time; a writer of another
        process (a ``vgpu-manage`` command) is waited for in short tries with
        Python's sleep between them: sqlite waits by sleeping in C, which
        under eventlet (nova-compute can run on it) would freeze every green
        thread for as long as the other process holds the lock.
        """
        with _process_lock(self.path):
            db = self._db()
            _begin_immediate(db, self._busy_timeout)
            try:
                yield Transaction(db)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def claims(self, instance_uuid: str | None = None) -> list[Claim]:
        return _patiently(lambda: self._read(lambda db: Transaction(db).claims(instance_uuid)),
                          self._busy_timeout)


class Transaction:
    """Reads and writes of one transaction (see :meth:`Journal.transaction`)."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def claims(self, instance_uuid: str | None = None) -> list[Claim]:
        query = f"SELECT {_COLUMNS} FROM claims"
        args: tuple[str, ...] = ()
        if instance_uuid is not None:
            query += " WHERE instance_uuid = ?"
            args = (instance_uuid,)
        return [_claim(row) for row in self._db.execute(query + " ORDER BY mdev_uuid", args)]

    def by_mdev(self) -> dict[str, Claim]:
        return {c.mdev_uuid: c for c in self.claims()}

    def on_gpu_or_of(self, gpus: Collection[str], instance_uuid: str) -> dict[str, Claim]:
        """Claims on any of ``gpus`` or held by ``instance_uuid``: all an
        allocation on those GPUs needs to look at, whatever the host's size."""
        marks = ", ".join("?" * len(gpus))
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM claims WHERE gpu IN ({marks}) OR instance_uuid = ?",
            (*gpus, instance_uuid))
        return {row[0]: _claim(row) for row in rows}

    def add(self, instance_uuid: str, mdev_uuid: str, gpu: str, parent: str, type_id: str,
            state: str = CLAIMED, created: bool = False) -> None:
        mdev_uuid = names.check_vgpu_id(mdev_uuid)
        if state not in STATES:
            raise ValueError(state)
        now = time.time()
        try:
            self._db.execute(
                f"INSERT INTO claims ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (mdev_uuid, instance_uuid, gpu, parent, type_id, state, int(created), now,
                 now))
        except sqlite3.IntegrityError:
            owner = self._db.execute("SELECT instance_uuid FROM claims WHERE mdev_uuid = ?",
                                     (mdev_uuid,)).fetchone()
            raise exception.ClaimConflict(mdev=mdev_uuid,
                                          owner=owner[0] if owner else "?") from None

    def set_state(self, instance_uuid: str, state: str,
                  mdev_uuids: Collection[str] | None = None,
                  from_states: Collection[str] | None = None) -> int:
        """Move the instance's claims (those of ``mdev_uuids``, and only
        those now in ``from_states``, if given) to ``state``; how many."""
        if state not in STATES or not set(from_states or ()) <= set(STATES):
            raise ValueError(state)
        query = "UPDATE claims SET state = ?, updated_at = ? WHERE instance_uuid = ?"
        args: list[object] = [state, time.time(), instance_uuid]
        if mdev_uuids is not None:
            query += f" AND mdev_uuid IN ({', '.join('?' * len(mdev_uuids))})"
            args += list(mdev_uuids)
        if from_states is not None:
            query += f" AND state IN ({', '.join('?' * len(from_states))})"
            args += list(from_states)
        return self._db.execute(query, args).rowcount

    def move(self, mdev_uuid: str, parent: str) -> None:
        """Record that an mdev now lives on another parent of its GPU."""
        self._db.execute("UPDATE claims SET parent = ?, updated_at = ? WHERE mdev_uuid = ?",
                         (parent, time.time(), mdev_uuid))

    def remove(self, instance_uuid: str | None = None,
               mdev_uuids: Collection[str] | None = None,
               state: str | None = None) -> list[Claim]:
        """Delete claims of an instance and/or of given mdevs (only those in
        ``state`` if given); returns them."""
        clauses: list[str] = []
        args: list[str] = []
        if state is not None:
            clauses.append("state = ?")
            args.append(state)
        if instance_uuid is not None:
            clauses.append("instance_uuid = ?")
            args.append(instance_uuid)
        if mdev_uuids is not None:
            clauses.append(f"mdev_uuid IN ({', '.join('?' * len(mdev_uuids))})")
            args += list(mdev_uuids)
        if instance_uuid is None and mdev_uuids is None:
            raise ValueError("refusing to delete every claim")
        where = " AND ".join(clauses)
        gone = [_claim(row) for row in self._db.execute(
            f"SELECT {_COLUMNS} FROM claims WHERE {where}", args)]
        self._db.execute(f"DELETE FROM claims WHERE {where}", args)
        return gone

    def remove_exact(self, claims: Iterable[Claim]) -> list[Claim]:
        """Delete these claims only if each is unchanged (same instance, vGPU,
        state and last update); returns those deleted.

        A check made on an earlier read then never removes a claim someone
        else took, or that moved on (attached, migrating) since.
        """
        gone: list[Claim] = []
        for claim in claims:
            cursor = self._db.execute(
                "DELETE FROM claims WHERE mdev_uuid = ? AND instance_uuid = ? AND state = ?"
                " AND updated_at = ?",
                (claim.mdev_uuid, claim.instance_uuid, claim.state, claim.updated_at))
            if cursor.rowcount:
                gone.append(claim)
        return gone
