"""Small JSON files in the state directory that other processes read.

nova-compute's host reconciler and ``vgpu-manage audit`` leave what they
last did there for ``status`` and ``metrics``, which run as other
processes.  A file is replaced whole (written beside it, then renamed), so
a reader never sees half of it.
"""

import json
import os
import threading


def write(path, data):
    """Replace ``path`` by ``data`` as JSON; OSError if it cannot be.  Of
    two writers at once, the last to finish wins, each file whole."""
    # One temporary name per thread: two writers never share one.
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read(path):
    """What ``path`` holds: None when it does not exist, ``{"unreadable":
    why}`` when it cannot be read or parsed."""
    try:
        with open(path, encoding="utf-8") as source:
            return json.load(source)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"unreadable": f"{path}: {exc}"}
