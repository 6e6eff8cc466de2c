"""sqlite's connections to the claims journal, on the files
:mod:`vgpu_driver.journal_files` checked.

Apart from the files themselves: sqlite opens the journal by its name, so
what it reached is checked again once it has (:func:`connect`); a process
that cannot write the journal reads it through connections that write
nothing (:func:`read`); and a sqlite error met while opening becomes the
typed error that says whether the file is broken (:func:`refused`).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from typing import Any
from typing import TypeVar
from urllib import parse

from vgpu_driver import exception
from vgpu_driver import journal_files

_T = TypeVar("_T")


def connect(place: journal_files.Place, mode: str, **kwargs: Any) -> sqlite3.Connection:
    """A sqlite connection to the checked journal (``mode``: sqlite's URI
    parameters, ``rw`` or ``ro``...); refused if sqlite reached another file."""
    before = journal_files.inspect(place, place.path)
    db: sqlite3.Connection = sqlite3.connect(
        f"file:{parse.quote(place.path)}?{mode}", uri=True, **kwargs
    )
    try:
        opened = db.execute("PRAGMA database_list").fetchone()[2]
        after = journal_files.inspect(place, place.path)
        expected = os.path.join(os.path.realpath(place.state_dir), os.path.basename(place.path))
        if (
            opened != expected
            or before is None
            or after is None
            or (before.st_dev, before.st_ino) != (after.st_dev, after.st_ino)
        ):
            raise exception.JournalUnsafe(
                path=place.path, file=place.path, reason=f"sqlite reached {opened} through it"
            )
    except BaseException:
        db.close()
        raise
    return db


def read(
    place: journal_files.Place, action: Callable[[sqlite3.Connection], _T], tries: int = 3
) -> _T:
    """``action(db)`` on a connection that writes nothing, for a process
    that cannot write the journal.

    With a WAL file there (a writer has the journal open, or left it
    unfinished), sqlite reads it through the writer's ``-shm`` (read-only;
    it must be readable).  Without one every committed claim is in the
    journal itself, which is read as ``immutable`` (sqlite needs no
    ``-shm`` then, which a reader could not create); if a writer started
    meanwhile (a WAL file appeared, or the file changed), it is read again.
    """
    wal = place.path + "-wal"
    for _ in range(tries):
        if os.path.lexists(wal):
            db = connect(place, "mode=ro")
            try:
                return action(db)
            finally:
                db.close()
        before = _version(place.path)
        db = connect(place, "mode=ro&immutable=1")
        try:
            result = action(db)
        finally:
            db.close()
        if not os.path.lexists(wal) and _version(place.path) == before:
            return result
    raise sqlite3.OperationalError("the journal kept changing while it was read")


def _version(path: str) -> tuple[int, int, int]:
    found = os.lstat(path)
    return found.st_ino, found.st_size, found.st_mtime_ns


_CORRUPT = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def refused(path: str, exc: sqlite3.Error) -> exception.JournalError:
    """The typed error of a sqlite error met while opening: only a broken
    file is "unusable" (whose advice is to move it away); anything else
    (permissions, a file sqlite cannot open, the disk) leaves it be."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _CORRUPT:
        return exception.JournalUnreadable(path=path, reason=str(exc))
    return exception.JournalError(
        path=path, reason=f"sqlite cannot use it ({exc}); it was left as it was"
    )
