"""Opening paths beneath the sysfs root by directory fd, following no link.

The privileged side never opens a path by string.  It holds the root as a
directory fd and opens every path relative to it with ``openat2(2)`` and
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_XDEV``: the kernel
itself refuses a ``..`` that leaves the root, any symbolic link, and any
other mount on the way, at the moment of the open.  Where the kernel has no
``openat2`` (before 5.6, or a seccomp filter that hides it) the same rules
are kept by a walk that opens one component at a time with ``O_NOFOLLOW``
from the directory fd of the one before, and checks what it holds.

sysfs reaches devices through links (``class/mdev_bus/X``,
``bus/pci/devices/X``, ``bus/mdev/devices/X``).  :meth:`SysfsRoot.follow`
reads such a link itself, resolves its target lexically and accepts it only
under ``devices/``; the target is then opened like any other path, so no
link is ever followed by the kernel on the privileged side.  A directory
swapped for a link between two steps makes the open fail; it cannot move a
write elsewhere.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import stat
from typing import TYPE_CHECKING

from vgpu_driver import exception

if TYPE_CHECKING:
    from types import TracebackType

SYSFS_MAGIC = 0x62656572
_SYS_OPENAT2 = 437  # the same number on every architecture
_RESOLVE_NO_XDEV = 0x01
_RESOLVE_NO_MAGICLINKS = 0x02
_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
_RESOLVE = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_XDEV
_DEVICES = "devices"
_ATTR_MAX = 4096

_libc = ctypes.CDLL(None, use_errno=True)


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


# syscall(2) typed for openat2 alone (a CDLL of our own: nobody else's
# prototype changes), and one ``struct open_how`` per set of flags, built
# once: the entry points open a handful of paths per write.
_syscall = _libc.syscall
_syscall.argtypes = (ctypes.c_long, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t)
_syscall.restype = ctypes.c_long
_HOW_SIZE = ctypes.sizeof(_OpenHow)
_hows: dict[int, _OpenHow] = {}


def _how(flags: int) -> _OpenHow:
    how = _hows.get(flags)
    if how is None:
        how = _hows[flags] = _OpenHow(flags | os.O_CLOEXEC, 0, _RESOLVE)
    return how


def _openat2(dir_fd: int, relpath: str, flags: int) -> int:
    fd: int = _syscall(
        _SYS_OPENAT2, dir_fd, os.fsencode(relpath), ctypes.addressof(_how(flags)), _HOW_SIZE
    )
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), relpath)
    return fd


def _probe_openat2() -> bool:
    """True when this kernel (and its seccomp filter) lets us use openat2."""
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.close(_openat2(fd, ".", os.O_PATH | os.O_DIRECTORY))
        return True
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM):
            return False
        raise
    finally:
        os.close(fd)


HAVE_OPENAT2 = _probe_openat2()


def _fs_type(fd: int) -> int:
    """``f_type`` of the filesystem ``fd`` is on (the first field of struct statfs)."""
    buf = ctypes.create_string_buffer(256)
    if _libc.fstatfs(ctypes.c_int(fd), buf) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return ctypes.c_long.from_buffer(buf).value & 0xFFFFFFFF


def _components(relpath: str) -> list[str]:
    parts = relpath.split("/")
    if not relpath or relpath.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise exception.PrivilegedWriteRefused(relpath, "not a plain path beneath the root")
    return parts


class SysfsRoot:
    """The sysfs root held open; every path is taken relative to it.

    ``walk`` is ``"openat2"`` or ``"components"``; the default is the first
    where the kernel has it.  ``allow_fake`` lets a root that is not a
    sysfs mount through (``[vgpu] test_only_fake_sysfs_root``).
    """

    def __init__(self, path: str, allow_fake: bool = False, walk: str | None = None) -> None:
        self.path = path
        self.walk = walk or ("openat2" if HAVE_OPENAT2 else "components")
        self.fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            self._dev = os.fstat(self.fd).st_dev
            if not allow_fake and _fs_type(self.fd) != SYSFS_MAGIC:
                raise exception.PrivilegedWriteRefused(
                    path,
                    "the sysfs root is not a sysfs mount ([vgpu] sysfs_root); "
                    "test_only_fake_sysfs_root is for test hosts only",
                )
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> SysfsRoot:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- opening ------------------------------------------------------------------

    def open(self, relpath: str, flags: int) -> int:
        """An fd for ``relpath`` under the root; ELOOP for a link on the way,
        EXDEV for a path leaving the root's mount."""
        parts = _components(relpath)
        if self.walk == "openat2":
            return _openat2(self.fd, relpath, flags)
        return self._open_by_components(parts, flags)

    def _open_by_components(self, parts: list[str], flags: int) -> int:
        current = os.dup(self.fd)
        try:
            for name in parts[:-1]:
                following = self._step(current, name)
                os.close(current)
                current = following
            fd = os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
        finally:
            os.close(current)
        try:
            self._check_held(fd, parts[-1], final=True, flags=flags)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _step(self, dir_fd: int, name: str) -> int:
        """The directory ``name`` in ``dir_fd``, held by an ``O_PATH`` fd."""
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            self._check_held(fd, name)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _check_held(self, fd: int, name: str, final: bool = False, flags: int = 0) -> None:
        held = os.fstat(fd)
        if stat.S_ISLNK(held.st_mode) and not (final and flags & os.O_PATH):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), name)
        if not final and not stat.S_ISDIR(held.st_mode):
            raise OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), name)
        if held.st_dev != self._dev:
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV), name)

    # -- what the entry points need -----------------------------------------------

    def exists(self, relpath: str) -> bool:
        """True when ``relpath`` names anything, a link included (not followed)."""
        try:
            os.close(self.open(relpath, os.O_PATH | os.O_NOFOLLOW))
        except FileNotFoundError:
            return False
        return True

    def listdir(self, relpath: str) -> list[str]:
        """The names in the directory at ``relpath``, opened beneath the root."""
        fd = self.open(relpath, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return os.listdir(fd)
        finally:
            os.close(fd)

    def read(self, relpath: str) -> str:
        """A small attribute's text, stripped; '' when it is not there."""
        try:
            fd = self.open(relpath, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError:
            return ""
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ""
            return os.read(fd, _ATTR_MAX).decode("ascii", "replace").strip()
        finally:
            os.close(fd)

    def links(self, directory: str, prefix: str) -> dict[str, str]:
        """``{entry: device directory}`` of the links in ``directory`` whose
        names start with ``prefix`` (a PF's ``virtfn<N>``), the directory
        opened once; each target accepted as :meth:`follow` accepts it."""
        dir_fd = self.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            found: dict[str, str] = {}
            for entry in os.listdir(dir_fd):
                if entry.startswith(prefix):
                    target = os.readlink(entry, dir_fd=dir_fd)
                    found[entry] = self._under_devices(directory, entry, target)
            return found
        finally:
            os.close(dir_fd)

    def _under_devices(self, directory: str, base: str, target: str) -> str:
        resolved = posixpath.normpath(posixpath.join(directory, target))
        if posixpath.isabs(target) or not resolved.startswith(_DEVICES + "/"):
            raise exception.PrivilegedWriteRefused(
                posixpath.join(directory, base), f"a link leading outside {self.path}/{_DEVICES}"
            )
        return resolved

    def follow(self, link_relpath: str, name: str) -> str:
        """The device directory (relative to the root) a sysfs link leads to.

        ENODEV when the link is not there (the device is gone); a refusal
        when it is no link or leads anywhere but under ``devices/``.
        """
        directory, base = posixpath.split(link_relpath)
        dir_fd = self.open(directory, os.O_PATH | os.O_DIRECTORY)
        try:
            target = os.readlink(base, dir_fd=dir_fd)
        except FileNotFoundError:
            raise OSError(errno.ENODEV, os.strerror(errno.ENODEV), name) from None
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            raise exception.PrivilegedWriteRefused(
                link_relpath, "not a link, where sysfs has one"
            ) from None
        finally:
            os.close(dir_fd)
        return self._under_devices(directory, base, target)

    def write(self, relpath: str, value: str) -> None:
        """Write ``value`` into the attribute at ``relpath``: one ``write(2)``,
        as sysfs takes it, into a regular file and nothing else."""
        fd = self.open(relpath, os.O_WRONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise exception.PrivilegedWriteRefused(relpath, "not a regular attribute file")
            os.set_blocking(fd, True)  # the kernel may block a remove; so may we
            os.write(fd, value.encode("ascii"))
        finally:
            os.close(fd)
