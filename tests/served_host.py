"""A fake host served with FUSE by ``vgpu-manage fake-host serve``, for tests.

The server runs as its own process, exactly as an operator starts it; the
test stops it by PID with SIGTERM and checks that the mount went away.  Its
state directory is given, so a test can act as the host does (a guest holds
an mdev, the host reboots) through :class:`FakeKernel` on that directory.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from vgpu_driver.fake import fakekernel

MANAGE = os.path.join(os.path.dirname(sys.executable), "vgpu-manage")
# A FUSE mount is no sysfs: the privileged side writes into it only when the
# configuration says, for tests, that a fake root is meant.
FAKE_ROOT_CONF = "[vgpu]\ntest_only_fake_sysfs_root = true\n"


def can_serve():
    """Why this machine cannot serve a FUSE host, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to mount"
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    with open("/proc/filesystems") as f:
        if "fuse" not in f.read().split():
            return "no fuse filesystem in this kernel"
    return None


def wait_for(predicate, timeout=15.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class ServedHost:
    def __init__(self, process, mount, state):
        self.process = process
        self.mount = mount
        self.state = state

    @property
    def kernel(self):
        """The host's kernel, to act as the host does (hold, reboot)."""
        return fakekernel.FakeKernel(self.state)

    def stop(self):
        """SIGTERM by PID; returns the server's exit code once unmounted."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
        try:
            code = self.process.wait(timeout=15)
        finally:
            if os.path.ismount(self.mount):
                subprocess.run(["fusermount3", "-u", "-z", self.mount], check=False)
            if self.process.poll() is None:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return code


@contextlib.contextmanager
def served(tmp_path, *profile_names):
    reason = can_serve()
    if reason:
        pytest.skip(f"cannot serve a FUSE host here: {reason}")
    mount, state = str(tmp_path / "mnt"), str(tmp_path / "state")
    argv = [MANAGE, "fake-host", "serve", "--tree", state, mount]
    for name in profile_names:
        argv[3:3] = ["--profile", name]
    log = open(tmp_path / "serve.log", "w+")  # noqa: SIM115 - closed below
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    host = ServedHost(process, mount, state)
    try:
        wait_for(
            lambda: os.path.ismount(mount) or process.poll() is not None,
            what="the fake host's mount",
        )
        if process.poll() is not None:
            log.seek(0)
            raise AssertionError(f"fake-host serve exited: {log.read()}")
        yield host
    finally:
        host.stop()
        log.close()
        assert not os.path.ismount(mount)
