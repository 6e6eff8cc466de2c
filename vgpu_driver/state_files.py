"""Small JSON files in the state directory that other processes read.

nova-compute's host reconciler and ``vgpu-manage audit`` leave what they
last did there for ``status`` and ``metrics``, which run as other
processes.  A file is replaced whole (written beside it, then renamed), so
a reader never sees half of it.  The state directory is nova-compute's user's
and root writes there too: the temporary file is created following no link
(``O_EXCL | O_NOFOLLOW``) and given to the directory's owner and group, mode
0640 (see :mod:`vgpu_driver.journal_files`), and a reader follows no link.
"""

from __future__ import annotations

import json
import os
import stat
import threading
from typing import Any

from vgpu_driver import journal_files

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def write(path: str, data: Any) -> None:
    """Replace ``path`` by ``data`` as JSON; OSError if it cannot be.  Of
    two writers at once, the last to finish wins, each file whole."""
    # One temporary name per thread: two writers never share one.
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    text = json.dumps(data, indent=1, sort_keys=True).encode("utf-8")
    try:
        fd = _create(tmp)
        with os.fdopen(fd, "wb") as out:
            journal_files.give(out.fileno(), os.stat(os.path.dirname(path) or "."))
            out.write(text)
        os.replace(tmp, path)
    except OSError:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise


def _create(tmp: str) -> int:
    """A new file at ``tmp``; what is there already (left by a process
    killed with this pid, or put there) is removed, never followed."""
    try:
        return os.open(tmp, _CREATE, journal_files.MODE)
    except FileExistsError:
        os.unlink(tmp)
        return os.open(tmp, _CREATE, journal_files.MODE)


def read(path: str) -> Any:
    """What ``path`` holds: None when it does not exist, ``{"unreadable":
    why}`` when it cannot be read or parsed (a link is not followed)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return {"unreadable": f"{path}: {exc}"}
    try:
        with os.fdopen(fd, "rb") as source:
            if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
                return {"unreadable": f"{path}: not a regular file"}
            return json.loads(source.read().decode("utf-8"))
    except (OSError, ValueError) as exc:
        return {"unreadable": f"{path}: {exc}"}
