"""The state directory (``[vgpu] state_dir``) the claims journal lives in.

It is made when nova-compute starts and finds it missing; any other
reader refuses a missing one, because a journal read as empty would make
every claimed vGPU look free.  A new journal is never started in a
directory holding other programs' files: ``claims init`` with a mistyped
``--state-dir`` (``/var/lib/nova``, a home directory) would put the
host's claims among them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from vgpu_driver import exception

# A new filesystem's own directory, not another program's file.
_FILESYSTEM_ENTRIES = ("lost+found",)


def make(state_dir: str, journal_path: str) -> None:
    """Create ``state_dir`` (mode 0750) unless it is there."""
    try:
        os.makedirs(state_dir, mode=0o750, exist_ok=True)
    except OSError as exc:
        raise exception.JournalMissing(
            path=journal_path, reason=f"cannot create {state_dir}: {exc.strerror}"
        ) from exc


def check(state_dir: str, journal_path: str) -> None:
    """Refuse a state directory that is not there (JournalMissing)."""
    if not os.path.isdir(state_dir):
        reason = (
            "the state directory is not a directory"
            if os.path.exists(state_dir)
            else "the state directory does not exist"
        )
        raise exception.JournalMissing(path=journal_path, reason=reason)


def check_new(state_dir: str, journal_name: str, also_ours: Iterable[str] = ()) -> None:
    """Refuse (NotAStateDirectory) to start the journal ``journal_name`` in
    a directory that holds other programs' files.  sqlite's side files
    (named after the journal), ``also_ours`` (the driver's other state
    files, and their temporary copies) and ``lost+found`` are not."""
    try:
        entries = sorted(os.listdir(state_dir))
    except (FileNotFoundError, NotADirectoryError):
        return  # created, or refused, when the journal is made
    if journal_name in entries:
        return
    ours = (journal_name, *also_ours)
    others = [
        e
        for e in entries
        if e not in _FILESYSTEM_ENTRIES and not any(e.startswith(name) for name in ours)
    ]
    if others:
        raise exception.NotAStateDirectory(
            state_dir=state_dir, count=len(others), examples=", ".join(others[:3])
        )
