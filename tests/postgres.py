"""A private PostgreSQL cluster for tests and benchmarks, started and stopped by PID.

``initdb`` makes a throw-away cluster in a fresh temporary directory, run as
the ``postgres`` OS user (the server refuses to run as root, so this needs
root to switch to it).  The server listens on a free port of 127.0.0.1 only,
with its UNIX socket in the same directory, so it neither clashes with nor
talks to a system cluster.  Stopping asks ``pg_ctl`` for a fast shutdown,
then checks that the postmaster PID (from ``postmaster.pid``) is gone, and
sends it SIGQUIT, then SIGKILL, if it is not.  Every wait is bounded; a
server that does not come up fails with its log.

Only the standard library is imported at module level (psycopg2 when a
database is created), so the benchmarks can load this file by its path::

    with postgres.private_cluster() as cluster:
        engine_url = cluster.url   # postgresql+psycopg2://postgres@127.0.0.1:PORT/placement
"""

import contextlib
import ctypes
import glob
import os
import pathlib
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time

OS_USER = "postgres"
DATABASE = "placement"
BIN_GLOB = "/usr/lib/postgresql/*/bin"
START_ATTEMPTS = 3  # a free port may be taken between choosing it and binding it
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


class PostgresFailed(AssertionError):
    """The cluster did not come up (or go down) as it should; carries its log."""


def bin_dir():
    """The newest ``/usr/lib/postgresql/<version>/bin`` with a server, or None."""
    found = []
    for path in glob.glob(BIN_GLOB):
        if all(os.access(os.path.join(path, b), os.X_OK) for b in ("initdb", "pg_ctl", "postgres")):
            version = os.path.basename(os.path.dirname(path))
            found.append((int(version) if version.isdigit() else 0, path))
    return max(found)[1] if found else None


def unavailable():
    """Why a private cluster cannot run here (a skip reason), or None.

    Only a missing server (bindep installs ``postgresql``) or not being root
    is a reason to skip; anything else missing is a failure of :meth:`start`.
    """
    if os.geteuid() != 0:
        return "a private PostgreSQL needs root (initdb and the server run as 'postgres')"
    if bin_dir() is None:
        return f"no PostgreSQL server binaries in {BIN_GLOB} (bindep: postgresql)"
    return None


def _missing_tools():
    """What else :meth:`PrivateCluster.start` needs and does not find, or None."""
    try:
        pwd.getpwnam(OS_USER)
    except KeyError:
        return f"no '{OS_USER}' OS user (Debian's postgresql package creates it)"
    if shutil.which("runuser") is None:
        return "no runuser (util-linux)"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (test-requirements.txt: psycopg2-binary)"
    return None


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _subreaper():
    """Make this process adopt what its children orphan, for the duration.

    ``pg_ctl start`` leaves the postmaster behind as an orphan.  Adopted by
    an init that does not reap (as in some containers), it would stay a
    zombie once stopped; adopted by us, :func:`_reap` collects it.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        before = ctypes.c_int(0)
        libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(before), 0, 0, 0)
        changed = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        changed = False
    try:
        yield
    finally:
        if changed:
            libc.prctl(PR_SET_CHILD_SUBREAPER, before.value, 0, 0, 0)


def _reap(pid):
    """Collect ``pid``'s exit status if it is our (adopted) child and has ended."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _alive(pid):
    """Whether ``pid`` runs (a zombie left for a non-reaping init counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _wait_gone(pid, timeout):
    deadline = time.monotonic() + timeout
    while True:
        _reap(pid)
        if not _alive(pid):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


class PrivateCluster:
    """One throw-away cluster in a temporary directory under ``parent``."""

    def __init__(self, parent=None, database=DATABASE):
        self.parent = parent
        self.database = database
        self.bin_dir = bin_dir()
        self.workdir = None
        self.port = None
        self.pid = None

    # -- paths ------------------------------------------------------------------------

    @property
    def data_dir(self):
        return self.workdir / "data"

    @property
    def socket_dir(self):
        return self.workdir / "sock"

    @property
    def log_file(self):
        return self.workdir / "postgres.log"

    @property
    def url(self):
        """The SQLAlchemy URL of the database (psycopg2, TCP, trust auth)."""
        return f"postgresql+psycopg2://postgres@127.0.0.1:{self.port}/{self.database}"

    def dsn(self, database=None):
        return (
            f"host=127.0.0.1 port={self.port} user=postgres "
            f"dbname={database or self.database} connect_timeout=10"
        )

    def log(self):
        try:
            return f"--- {self.log_file} ---\n{self.log_file.read_text(errors='replace')}"
        except OSError:
            return "(no server log)"

    # -- running things -----------------------------------------------------------------

    def _as_postgres(self, binary, *args, timeout):
        """Run a PostgreSQL binary as the postgres user; (returncode, output)."""
        argv = ["runuser", "-u", OS_USER, "--", os.path.join(self.bin_dir, binary), *args]
        try:
            result = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self.workdir,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            return None, f"{' '.join(argv)}: no answer within {timeout:.0f} s\n{exc.output}"
        return result.returncode, f"{' '.join(argv)}\n{result.stdout}{result.stderr}"

    def _fail(self, message):
        """Stop whatever runs, then raise with the server's log."""
        log = self.log()
        self.stop()
        raise PostgresFailed(f"{message}\n{log}")

    # -- the cluster's life ------------------------------------------------------------------

    def start(self, timeout=60.0):
        """initdb, start, create the database; return once it takes connections."""
        reason = unavailable() or _missing_tools()
        if reason:
            raise PostgresFailed(reason)
        user = pwd.getpwnam(OS_USER)
        self.workdir = pathlib.Path(tempfile.mkdtemp(prefix="vgpu-pg-", dir=self.parent))
        for path in (self.workdir, self.data_dir, self.socket_dir):
            path.mkdir(mode=0o700, exist_ok=True)
            os.chown(path, user.pw_uid, user.pw_gid)
        code, output = self._as_postgres(
            "initdb",
            "-D",
            str(self.data_dir),
            "-U",
            "postgres",
            "--auth=trust",
            "-E",
            "UTF8",
            "--no-sync",
            timeout=120,
        )
        if code != 0:
            self._fail(
                f"initdb failed (is {self.workdir.parent} reachable by '{OS_USER}'?):\n{output}"
            )
        for attempt in range(1, START_ATTEMPTS + 1):
            self.port = free_port()
            if self._pg_ctl_start(timeout):
                break
            taken = "Address already in use" in self.log()
            if not taken or attempt == START_ATTEMPTS:
                self._fail(
                    f"PostgreSQL did not start on 127.0.0.1:{self.port} (pg_ctl "
                    f"waits {timeout:.0f} s at most)"
                )
        self.pid = self._postmaster_pid()
        if self.pid is None or not _alive(self.pid):
            self._fail(f"no running postmaster behind {self.data_dir / 'postmaster.pid'}")
        self._create_database()
        return self

    def _pg_ctl_start(self, timeout):
        # pg_ctl hands these to a shell: quote what could hold spaces.
        options = [
            "-c listen_addresses=127.0.0.1",
            f"-p {self.port}",
            f"-k {shlex.quote(str(self.socket_dir))}",
        ]
        with _subreaper():
            code, output = self._as_postgres(
                "pg_ctl",
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-o",
                " ".join(options),
                "-w",
                "-t",
                str(int(timeout)),
                "start",
                timeout=timeout + 15,
            )
        if code == 0:
            return True
        with contextlib.suppress(OSError), open(self.log_file, "a") as log:
            log.write(f"\n--- pg_ctl start (exit status {code}) ---\n{output}\n")
        # pg_ctl may give up while a postmaster still comes up: never leave it.
        self._stop_postmaster(timeout=15)
        return False

    def _postmaster_pid(self):
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        return int(first) if first.strip().isdigit() else None

    def _create_database(self):
        import psycopg2

        try:
            conn = psycopg2.connect(self.dsn("postgres"))
        except psycopg2.Error as exc:
            self._fail(f"cannot connect to 127.0.0.1:{self.port}: {exc}")
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(f"CREATE DATABASE \"{self.database}\" ENCODING 'UTF8'")
        finally:
            conn.close()

    def _stop_postmaster(self, timeout):
        pid = self._postmaster_pid() or self.pid
        if pid is None or _wait_gone(pid, 0):
            return True
        self._as_postgres(
            "pg_ctl",
            "-D",
            str(self.data_dir),
            "-m",
            "fast",
            "-w",
            "-t",
            str(int(timeout)),
            "stop",
            timeout=timeout + 15,
        )
        if _wait_gone(pid, 5):
            return True
        for sig in (signal.SIGQUIT, signal.SIGKILL):  # immediate shutdown, then force
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            if _wait_gone(pid, 10):
                return True
        return False

    def stop(self, timeout=30.0):
        """Stop the server by its PID and delete the cluster's files."""
        if self.workdir is None:
            return
        gone = self._stop_postmaster(timeout)
        if not gone:
            raise PostgresFailed(f"postmaster {self.pid} still runs after SIGKILL\n{self.log()}")
        self.pid = None
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir = None

    def __enter__(self):
        try:
            return self.start()
        except BaseException:  # e.g. ^C while starting: leave nothing behind
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()


@contextlib.contextmanager
def private_cluster(**kwargs):
    """A started :class:`PrivateCluster`, stopped (by PID) and removed on exit."""
    with PrivateCluster(**kwargs) as cluster:
        yield cluster
