"""The fake kernel served as a filesystem (FUSE) that any process can drive.

The tree the fake kernel writes (its *state directory*) is shown at the mount
point, minus the kernel's own bookkeeping; reads, links and listings pass
straight through.  A write to a control file (``create``, ``remove``,
``sriov_numvfs``, ``nvidia/current_vgpu_type``, a driver's ``bind`` and
``unbind``, ``driver_override``) is handed to :meth:`FakeKernel.write_attr`,
the one model of the kernel's rules, and its errno is what the writer sees:
``mdevctl``, a privsep daemon, NVIDIA's ``sriov-manage`` (its stand-in) or
``echo 4 > sriov_numvfs`` get the kernel's answers, not a file.  Each request runs
in its own thread, so a ``remove`` blocked by a guest blocks only its writer.
Nothing is cached by the kernel (``direct_io``, zero timeouts): counts such
as ``available_instances`` are read fresh, as from sysfs.
"""

import errno
import os
import stat

import mfusepy

from vgpu_driver import exception
from vgpu_driver.fake import fakekernel

CONTROL_FILES = frozenset(
    {"create", "remove", "sriov_numvfs", "current_vgpu_type", "bind", "unbind", "driver_override"}
)
_STOPPED_BY_SIGNAL = 8
_STAT_FIELDS = (
    "st_mode",
    "st_nlink",
    "st_uid",
    "st_gid",
    "st_size",
    "st_atime",
    "st_mtime",
    "st_ctime",
)


def _fuse_error(code):
    return mfusepy.FuseOSError(code)


class FakeHostFS(mfusepy.Operations):
    """Filesystem operations over one fake kernel's state directory."""

    use_ns = False

    def __init__(self, kernel):
        self.kernel = kernel
        self.state = kernel.paths.root

    def _backing(self, path):
        """The state directory's path for a mount path; the kernel's
        bookkeeping directory is not part of the host."""
        parts = [p for p in path.split("/") if p]
        if parts and parts[0] == fakekernel.MARKER_DIR:
            raise _fuse_error(errno.ENOENT)
        return os.path.join(self.state, *parts)

    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._backing(path))
        except OSError as exc:
            raise _fuse_error(exc.errno) from None
        return {field: getattr(st, field) for field in _STAT_FIELDS}

    def readdir(self, path, fh):
        try:
            entries = os.listdir(self._backing(path))
        except OSError as exc:
            raise _fuse_error(exc.errno) from None
        return [".", "..", *(e for e in entries if e != fakekernel.MARKER_DIR)]

    def readlink(self, path):
        try:
            return os.readlink(self._backing(path))
        except OSError as exc:
            raise _fuse_error(exc.errno) from None

    def open(self, path, flags):
        backing = self._backing(path)
        if not os.path.isfile(backing):
            raise _fuse_error(errno.EISDIR if os.path.isdir(backing) else errno.ENOENT)
        if flags & (os.O_WRONLY | os.O_RDWR) and not self._writable(backing):
            # As kernfs: an attribute without a store handler opens read-only.
            raise _fuse_error(errno.EACCES)
        return 0

    @staticmethod
    def _writable(backing):
        return (
            os.path.basename(backing) in CONTROL_FILES and os.lstat(backing).st_mode & stat.S_IWUSR
        )

    def read(self, path, size, offset, fh):
        try:
            with open(self._backing(path), "rb") as f:
                f.seek(offset)
                return f.read(size)
        except OSError as exc:
            raise _fuse_error(exc.errno) from None

    def write(self, path, data, offset, fh):
        backing = self._backing(path)
        if not self._writable(backing):
            raise _fuse_error(errno.EACCES)
        try:
            self.kernel.write_attr(backing, data.decode("utf-8", "replace"))
        except OSError as exc:
            raise _fuse_error(exc.errno or errno.EIO) from None
        except exception.InvalidSysfsName:
            raise _fuse_error(errno.EINVAL) from None
        return len(data)

    def truncate(self, path, length, fh=None):
        """Shells open with O_TRUNC; sysfs ignores it, and so does this."""
        if not self._writable(self._backing(path)):
            raise _fuse_error(errno.EACCES)
        return 0

    def statfs(self, path):
        return {"f_bsize": 4096, "f_namemax": 255}


def check_mount_point(path):
    """Refuse a mount point that is mounted on already or holds anything."""
    if os.path.ismount(path):
        raise exception.FakeHostMountPointInUse(path=path, why="something is mounted there")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise exception.FakeHostMountPointInUse(path=path, why="it is not a directory")
    if os.path.isdir(path) and os.listdir(path):
        raise exception.FakeHostMountPointInUse(path=path, why="it is not empty")


def serve(kernel, mount_point):
    """Serve ``kernel`` at ``mount_point`` in the foreground until SIGTERM or
    SIGINT, which unmount it (libfuse's own signal handlers)."""
    check_mount_point(mount_point)
    os.makedirs(mount_point, exist_ok=True)
    try:
        mfusepy.FUSE(
            FakeHostFS(kernel),
            mount_point,
            foreground=True,
            allow_other=os.geteuid() == 0,
            direct_io=True,
            attr_timeout=0,
            entry_timeout=0,
            negative_timeout=0,
            fsname="vgpu-fake-host",
        )
    except RuntimeError as exc:
        # libfuse's main loop returns 8 when a signal ended it; it has
        # unmounted by then.  Any other code is a failure to serve.
        if exc.args != (_STOPPED_BY_SIGNAL,) or os.path.ismount(mount_point):
            raise exception.FakeHostMountPointInUse(
                path=mount_point, why=f"libfuse failed with code {exc}"
            ) from None
