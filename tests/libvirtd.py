"""A private, real ``libvirtd`` for functional tests, started and stopped by PID.

The daemon gets its own config file, socket directory (the URI names the
socket, so it never talks to a system daemon) and log.  The qemu:///system
driver keeps its state at compiled-in paths (``/etc/libvirt/qemu`` for
defined domains, ``/run/libvirt/qemu``, ``/var/lib/libvirt/qemu``, ...), so
when this machine allows it the daemon runs in a private mount namespace
where empty directories are bind-mounted on those paths: then it neither
sees nor leaves domains on the host and cannot clash with a system daemon's
driver lock.  ``unshare`` execs the daemon without forking, so the PID we
start is libvirtd's own (its pid file says so).  Where mount namespaces are
not allowed, the daemon uses the host's state directories; callers undefine
every domain they define either way.

Nothing listens on TCP (``listen_tcp``/``listen_tls`` stay off, and no
``--listen``); ``--timeout`` makes an orphaned daemon exit on its own once
idle, should the test run be killed before it can stop it.
"""

import contextlib
import os
import pathlib
import signal
import subprocess
import threading
import time

LIBVIRTD = "/usr/sbin/libvirtd"
# Where libvirtd's drivers keep state and configuration when run as root.
STATE_DIRS = (
    "/etc/libvirt",
    "/run/libvirt",
    "/var/lib/libvirt",
    "/var/cache/libvirt",
    "/var/log/libvirt",
)
IDLE_EXIT_SECONDS = 120


def _namespace_script(targets):
    """Bind "$1".. on ``targets``, in order, then exec the rest of the arguments."""
    return " && ".join(
        [f'mount --bind "${i + 1}" {path}' for i, path in enumerate(targets)]
        + [f"shift {len(targets)}", 'exec "$@"']
    )


_NAMESPACE_SCRIPT = _namespace_script(STATE_DIRS)


class LibvirtdFailed(AssertionError):
    """The daemon did not come up (or go down) as it should; carries its log."""


def can_unshare_mounts():
    """Whether this process may make a private mount namespace (CAP_SYS_ADMIN)."""
    try:
        result = subprocess.run(
            ["unshare", "--mount", "--propagation", "private", "true"],
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


class Libvirtd:
    """One private libvirtd process under ``workdir``."""

    def __init__(self, workdir, sysfs=None):
        """``sysfs``: a fake host's tree to bind over ``/sys`` in the daemon's
        namespace, so that its node-device driver (libudev) enumerates the
        fake GPUs, their mdev types and mdevs as it would a host's."""
        self.workdir = pathlib.Path(workdir)
        self.sysfs = sysfs
        self.sock_dir = self.workdir / "sock"
        self.config = self.workdir / "libvirtd.conf"
        self.pid_file = self.workdir / "libvirtd.pid"
        self.log_file = self.workdir / "libvirtd.log"
        self.out_file = self.workdir / "libvirtd.out"
        self.process = None
        self._made_mountpoints = []

    @property
    def socket(self):
        return self.sock_dir / "libvirt-sock"

    @property
    def uri(self):
        return f"qemu:///system?socket={self.socket}"

    @property
    def pid(self):
        return self.process.pid if self.process else None

    def log(self):
        """The daemon's log file and its stdout/stderr, for failure messages."""
        parts = []
        for path in (self.log_file, self.out_file):
            with contextlib.suppress(OSError):
                parts.append(f"--- {path.name} ---\n{path.read_text(errors='replace')}")
        return "\n".join(parts) or "(no log)"

    def _argv(self):
        daemon = [
            LIBVIRTD,
            "--config",
            str(self.config),
            "--pid-file",
            str(self.pid_file),
            f"--timeout={IDLE_EXIT_SECONDS}",
        ]
        if not can_unshare_mounts():
            if self.sysfs:
                raise LibvirtdFailed("a fake /sys needs a private mount namespace")
            return daemon
        sources = []
        for path in STATE_DIRS:
            private = self.workdir / "state" / path.strip("/").replace("/", "-")
            private.mkdir(parents=True)
            private.chmod(0o755)  # the qemu user must reach its own dirs below
            sources.append(str(private))
            if not os.path.isdir(path):  # /run/libvirt exists once a daemon ran
                os.makedirs(path)
                self._made_mountpoints.append(path)
        targets = list(STATE_DIRS)
        if self.sysfs:
            sources.append(str(self.sysfs))
            targets.append("/sys")
        return [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            _namespace_script(targets),
            "sh",
            *sources,
            *daemon,
        ]

    def start(self, timeout=20.0):
        """Start the daemon; return once a client can open the URI (or raise)."""
        import libvirt

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sock_dir.mkdir()
        self.config.write_text(
            f'unix_sock_dir = "{self.sock_dir}"\n'
            f'log_outputs = "3:file:{self.log_file}"\n'
            "listen_tcp = 0\nlisten_tls = 0\n"
        )
        argv = self._argv()
        # libudev refuses a /sys that is not sysfs unless told not to check.
        env = {**os.environ, "SYSTEMD_DEVICE_VERIFY_SYSFS": "0"} if self.sysfs else None
        with open(self.out_file, "wb") as out:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env=env,
            )
        libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            if self.process.poll() is not None:
                self._fail(f"libvirtd exited with status {self.process.returncode}")
            if time.monotonic() > deadline:
                self._fail(f"no {self.socket} within {timeout:.0f} s")
            time.sleep(0.05)
        # The socket listens before the drivers are up, and a client's open then
        # waits for them without a timeout of its own: bound it here.
        answer = {}

        def try_open():
            try:
                libvirt.open(self.uri).close()
                answer["ok"] = True
            except libvirt.libvirtError as exc:
                answer["error"] = str(exc)

        opener = threading.Thread(target=try_open, daemon=True)
        opener.start()
        opener.join(max(deadline - time.monotonic(), 1.0))
        if not answer.get("ok"):
            self._fail(
                f"libvirtd did not answer on {self.socket} within {timeout:.0f} s: "
                f"{answer.get('error', 'no reply')}"
            )
        written = self.pid_file.read_text().strip()
        if written != str(self.pid):
            self._fail(f"libvirtd wrote PID {written}, we started {self.pid}")
        return self

    def _fail(self, message):
        """Stop what was started, then raise with the daemon's log."""
        self.stop()
        raise LibvirtdFailed(
            f"{message} ({' '.join(self.process.args)}, exit status "
            f"{self.process.returncode})\n{self.log()}"
        )

    def stop(self, timeout=10.0):
        """SIGTERM the PID, SIGKILL it if it lingers; return its exit status."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout)
        for path in reversed(self._made_mountpoints):
            with contextlib.suppress(OSError):
                os.rmdir(path)  # only if still empty: a system daemon may own it now
        self._made_mountpoints = []
        return self.process.returncode
