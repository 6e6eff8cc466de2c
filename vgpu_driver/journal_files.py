"""The claims journal's files, in a state directory nova-compute's user owns.

Root runs ``vgpu-manage`` in that directory too, so its owner could put a
link where the journal or one of sqlite's side files (``-wal``, ``-shm``,
``-journal``) goes.  sqlite opens its files by path, and resolves a link at
the journal's own name (its side files it opens with ``O_NOFOLLOW``).  So
each file is checked here by fd before sqlite opens it, and the file sqlite
opened is checked after (:mod:`vgpu_driver.journal_connections`): a link,
anything but a regular file, or a file of another user than the directory's
owner or root is refused.

The journal is created here (``O_EXCL | O_NOFOLLOW``) and given to the
directory's owner and group, mode 0640: nova-compute (the owner) writes its
claims, the group (operators, monitoring) reads them, nobody else.  Run as
root, sqlite gives the side files it creates the journal's owner and mode.
A process that cannot write the journal reads it through connections that
write nothing (:func:`vgpu_driver.journal_connections.read`), which work
with side files of another user.
"""

from __future__ import annotations

import dataclasses
import grp
import os
import pwd
import stat
from collections.abc import Mapping

from oslo_log import log as logging

from vgpu_driver import exception

LOG = logging.getLogger(__name__)

MODE = 0o640
SIDE_FILES = ("-wal", "-shm", "-journal")

# ``{suffix: stat or None}`` of the journal ('') and its side files.
Found = Mapping[str, "os.stat_result | None"]


def user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return f"gid {gid}"


def describe(st: os.stat_result) -> str:
    """``owner:group, mode 0640`` of a stat result."""
    return f"{user(st.st_uid)}:{_group(st.st_gid)}, mode {stat.S_IMODE(st.st_mode):04o}"


def this_process() -> str:
    """Who this process is, as an error names it."""
    return f"uid {os.geteuid()} ({user(os.geteuid())})"


@dataclasses.dataclass(frozen=True)
class Place:
    """The journal's path and its state directory, as found when opened."""

    state_dir: str
    path: str
    directory: os.stat_result

    @classmethod
    def of(cls, state_dir: str, path: str) -> Place:
        return cls(state_dir, path, os.stat(state_dir))

    @property
    def owner(self) -> str:
        return user(self.directory.st_uid)


def inspect(place: Place, path: str) -> os.stat_result | None:
    """``path``'s stat, checked by fd (None when it is not there).

    Opened ``O_PATH | O_NOFOLLOW``: a link is seen as itself, nothing is
    read, and closing the fd drops none of sqlite's locks on the file.
    """
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        found = os.fstat(fd)
    finally:
        os.close(fd)
    reason = _refusal(place, path, found)
    if reason:
        raise exception.JournalUnsafe(path=place.path, file=path, reason=reason)
    return found


def _refusal(place: Place, path: str, found: os.stat_result) -> str | None:
    if stat.S_ISLNK(found.st_mode):
        try:
            return f"it is a link (to {os.readlink(path)!r})"
        except OSError:
            return "it is a link"
    if not stat.S_ISREG(found.st_mode):
        return "it is not a regular file"
    if found.st_nlink != 1:
        return f"it has {found.st_nlink} hard links (another name may be any file)"
    if found.st_uid not in (0, place.directory.st_uid):
        return (
            f"it belongs to {user(found.st_uid)}, neither the state directory's "
            f"owner ({place.owner}) nor root"
        )
    now: os.stat_result | None
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        now = None
    if now is None or (now.st_dev, now.st_ino) != (found.st_dev, found.st_ino):
        return "it was replaced while it was checked"
    return None


def inspect_all(place: Place) -> dict[str, os.stat_result | None]:
    """``{suffix: stat or None}`` of the journal ('') and its side files."""
    return {suffix: inspect(place, place.path + suffix) for suffix in ("", *SIDE_FILES)}


def create(place: Place) -> os.stat_result | None:
    """Create the journal's (empty) file for sqlite, following no link and
    given to the directory's owner; the file made, or None if something is
    already there."""
    try:
        fd = os.open(
            place.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, MODE
        )
    except FileExistsError:
        return None
    try:
        give(fd, place.directory)
        return os.fstat(fd)
    finally:
        os.close(fd)


def remove_if_empty(place: Place, made: os.stat_result) -> None:
    """Remove the journal's file if it is still the empty regular file
    :func:`create` made (``made``), when opening it then failed.  Whoever
    owns the state directory may have put something else there meanwhile:
    that is left alone (unlinking a name follows no link either way)."""
    try:
        found = os.lstat(place.path)
    except FileNotFoundError:
        return
    if (
        stat.S_ISREG(found.st_mode)
        and found.st_size == 0
        and (found.st_dev, found.st_ino) == (made.st_dev, made.st_ino)
    ):
        os.unlink(place.path)


def give(fd: int, directory: os.stat_result) -> None:
    """The file of ``fd`` to the owner and group of its ``directory`` (a
    stat result), mode 0640.  Another user than root can only pick a group
    it is in."""
    uid, gid = directory.st_uid, directory.st_gid
    if os.geteuid() == 0:
        os.fchown(fd, uid, gid)
    elif os.fstat(fd).st_gid != gid and gid in (os.getegid(), *os.getgroups()):
        os.fchown(fd, -1, gid)
    os.fchmod(fd, MODE)


def give_to_owner(place: Place, found: Found) -> list[str]:
    """Root only: give the directory's owner the journal files root made
    (by an earlier ``claims init``, or a command killed with its side
    files open), which nova-compute could not write.  Run before sqlite
    opens the journal in this process (closing an fd drops its locks)."""
    if os.geteuid() != 0 or place.directory.st_uid == 0:
        return []
    given: list[str] = []
    for suffix, st in found.items():
        if st is None or (st.st_uid, st.st_gid) == (place.directory.st_uid, place.directory.st_gid):
            continue
        path = place.path + suffix
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise exception.JournalUnsafe(
                    path=place.path, file=path, reason="it was replaced while it was checked"
                )
            if now.st_nlink != 1:
                raise exception.JournalUnsafe(
                    path=place.path,
                    file=path,
                    reason=f"it has {now.st_nlink} hard links (another name may be any file)",
                )
            give(fd, place.directory)
        finally:
            os.close(fd)
        given.append(path)
    return given


def why_not_writable(place: Place, found: Found) -> str | None:
    """Why this process cannot write the journal, or None if it can: it
    needs the directory (to make side files) and every file there."""
    if not os.access(place.state_dir, os.W_OK | os.X_OK, effective_ids=True):
        return f"the state directory {place.state_dir} is {describe(place.directory)}"
    for suffix, st in found.items():
        if st is not None and not _may(place.path + suffix, os.R_OK | os.W_OK):
            return f"{os.path.basename(place.path + suffix)} is {describe(st)}"
    return None


def why_not_readable(place: Place, found: Found) -> str | None:
    """Why this process cannot read the journal, or None if it can (side
    files too: a reader of a journal being written reads its WAL)."""
    for suffix, st in found.items():
        if st is not None and suffix != "-journal" and not _may(place.path + suffix, os.R_OK):
            return f"{os.path.basename(place.path + suffix)} is {describe(st)}"
    return None


def _may(path: str, mode: int) -> bool:
    return os.access(path, mode, effective_ids=True, follow_symlinks=False)


_NOTICED: set[tuple[int, str]] = set()


def notice_read_only(path: str, why: str) -> None:
    """Once per process and journal: a reader that cannot write says so."""
    if (os.getpid(), path) not in _NOTICED:
        _NOTICED.add((os.getpid(), path))
        LOG.warning(
            "Claims journal %s is opened read-only: %s cannot write it (%s); this "
            "process reads claims and writes none",
            path,
            this_process(),
            why,
        )
