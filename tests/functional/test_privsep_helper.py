"""The daemons as nova's user starts them: through the real sudo, with the
rule and the helper's file ``install-units`` writes, from a caller that
controls its own environment, HOME and nova.conf.

A throwaway system user stands in for nova.  The test process plays
nova-compute's side of oslo.privsep (it listens on the socket), and the
helper command runs ``sudo -n`` as that user with an environment of its
choosing (``runuser -u USER -- env ... sudo -n ...``).  What the daemon
then is, is read from ``/proc``: its bounding set, effective
capabilities and environment.
"""

import gc
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import uuid

import pytest

from tests import served_host
from tests.functional import test_install_units
from tests.functional import test_privileged_writes
from tests.functional import test_sudoers
from vgpu_driver import exception
from vgpu_driver import host_files
from vgpu_driver import privsep
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

system_user = test_install_units.system_user
VENV_BIN = os.path.dirname(sys.executable)
HELPER = os.path.join(VENV_BIN, "vgpu-privsep-helper")
T4 = "0000:18:00.0"
CAP_DAC_OVERRIDE, CAP_SYS_ADMIN = 1, 21
CONTEXTS = {
    "vgpu_driver.privsep.sysfs_writer": (privsep.sysfs_writer, CAP_DAC_OVERRIDE),
    "vgpu_driver.privsep.gpu_admin": (privsep.gpu_admin, CAP_SYS_ADMIN),
}

# oslo.privsep hands the helper's stderr a pipe whose ends it never closes.
pytestmark = pytest.mark.filterwarnings(
    "ignore:Exception ignored in:pytest.PytestUnraisableExceptionWarning"
)

# A logging configuration whose handler arguments Python's fileConfig
# evaluates: code run by whoever loads it as oslo.log's log_config_append.
LOGGING_CODE = textwrap.dedent("""\
    [loggers]
    keys = root
    [handlers]
    keys = planted
    [formatters]
    keys =
    [logger_root]
    handlers = planted
    [handler_planted]
    class = StreamHandler
    args = (open({marker!r}, "w"),)
    """)


def status(pid, field):
    with open(f"/proc/{pid}/status") as f:
        line = next(line for line in f if line.startswith(f"{field}:"))
    return int(line.split()[1], 16)


def environment(pid):
    with open(f"/proc/{pid}/environ", "rb") as f:
        return dict(item.decode().split("=", 1) for item in f.read().split(b"\0") if item)


def daemons(marker):
    """``{context: pid}`` of the daemons whose command line names ``marker``."""
    found = {}
    for pid in test_privileged_writes.daemon_pids(marker):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        if argv[1:2] == [HELPER] or argv[:1] == [HELPER]:
            found[argv[argv.index("--privsep_context") + 1]] = pid
    return found


@pytest.fixture
def host(tmp_path, system_user, monkeypatch):
    """The rule and helper file install-units writes for the throwaway user
    (the file's path under a test root), a fake sysfs, and nova.conf
    naming it, with log options a nova-writable nova.conf could hold."""
    root = test_install_units.make_root(tmp_path, system_user)
    kernel = fakekernel.FakeKernel.build(str(tmp_path / "sys"), profiles.load("t4x8"))
    caller_home = tmp_path / "caller-home"
    (caller_home / ".privsep" / "privsep.conf.d").mkdir(parents=True)
    shutil.chown(caller_home, system_user, system_user)
    log_dir = tmp_path / "nova-log"
    log_dir.mkdir()
    shutil.chown(log_dir, system_user, system_user)
    marker = tmp_path / "code-ran"
    logging_conf = tmp_path / "logging.conf"
    logging_conf.write_text(LOGGING_CODE.format(marker=str(marker)))
    nova_conf = tmp_path / "nova.conf"
    nova_conf.write_text(
        textwrap.dedent(f"""\
        [DEFAULT]
        log_config_append = {logging_conf}
        log_dir = {log_dir}
        debug = true
        [devices]
        enabled_mdev_types = nvidia-222
        [vgpu]
        sysfs_root = {kernel.paths.root}
        test_only_fake_sysfs_root = true
        """)
    )
    # A link planted where oslo.log would open privsep-helper's log as root.
    victim = tmp_path / "victim"
    (log_dir / "privsep-helper.log").symlink_to(victim)
    (log_dir / "vgpu-privsep-helper.log").symlink_to(victim)
    # What oslo.config would read from the caller's HOME for privsep-helper.
    (caller_home / ".privsep" / "privsep.conf.d" / "caps.conf").write_text(
        "[vgpu_driver_sysfs_writer]\ncapabilities = CAP_SYS_ADMIN,CAP_DAC_OVERRIDE\n"
    )
    code, _, err = test_install_units.install(
        nova_conf, "--root", str(root), "--bin-dir", VENV_BIN, "--user", system_user
    )
    assert code == 0, err
    helper_conf = root / host_files.PRIVSEP_CONF
    helper_conf.write_text(helper_conf.read_text() + "[vgpu]\ntest_only_fake_sysfs_root = true\n")
    rule = (
        (root / host_files.SUDOERS)
        .read_text()
        .replace("/etc/vgpu-driver/privsep\\.conf", str(helper_conf).replace(".", "\\."))
    )
    installed = pathlib.Path(f"/etc/sudoers.d/vgpu-driver-test-{system_user}")
    test_sudoers.install_rule(installed, rule)
    # Where oslo.privsep's client makes its socket: /tmp, as on a host.
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    caller = (
        f"runuser -u {system_user} -- env HOME={caller_home} PYTHONPATH={tmp_path} "
        f"TZ=Europe/Paris LANG=fr_FR.UTF-8 TERM=xterm VGPU_CALLER=1 "
        f"sudo -n {HELPER} --config-file {helper_conf}"
    )
    test_privileged_writes.use_helper(caller)
    try:
        assert test_sudoers._run("visudo", "-c").returncode == 0
        yield {
            "kernel": kernel,
            "marker": marker,
            "victim": victim,
            "conf": str(helper_conf),
            "caller_home": str(caller_home),
            "user": system_user,
        }
    finally:
        test_privileged_writes.stop_daemons()
        for pid in test_privileged_writes.daemon_pids(str(helper_conf)):
            os.kill(pid, signal.SIGTERM)
        served_host.wait_for(
            lambda: not test_privileged_writes.daemon_pids(str(helper_conf)),
            what="the privsep daemons to stop",
        )
        installed.unlink()
        gc.collect()  # oslo.privsep's pipes, closed while the warning is ignored


def test_the_daemons_hold_one_capability_and_sudos_environment(host):
    for context, _cap in CONTEXTS.values():
        privsep.ensure_started(context)
    found = daemons(host["conf"])
    assert set(found) == set(CONTEXTS)
    for name, pid in found.items():
        cap = CONTEXTS[name][1]
        assert (
            status(pid, "CapBnd"),
            status(pid, "CapEff"),
            status(pid, "CapPrm"),
            status(pid, "CapInh"),
            status(pid, "CapAmb"),
        ) == (1 << cap, 1 << cap, 1 << cap, 0, 0), name
        env = environment(pid)
        # sudo's own environment: HOME is root's, from the rule, and nothing
        # the caller set came through (its TERM neither).
        assert set(env) == {
            "HOME",
            "LOGNAME",
            "MAIL",
            "PATH",
            "SHELL",
            "SUDO_COMMAND",
            "SUDO_GID",
            "SUDO_UID",
            "SUDO_USER",
            "TERM",
            "USER",
        }, env
        assert (env["HOME"], env["TERM"], env["SUDO_USER"]) == ("/root", "unknown", host["user"]), (
            env
        )


def test_nova_conf_is_data_its_logging_options_do_nothing(host):
    """nova.conf's log_config_append (code) and log_dir (a planted link)
    reach no root process; its [devices] and [vgpu] sysfs_root are obeyed,
    its test_only_fake_sysfs_root is not needed (the helper's file says)."""
    made = str(uuid.uuid4())
    privsep.create_mdev(T4, "nvidia-222", made)
    create = os.path.join(
        host["kernel"].paths.root,
        "devices",
        "pci0000:18",
        T4,
        "mdev_supported_types",
        "nvidia-222",
        "create",
    )
    with open(create) as f:
        assert f.read().strip() == made
    with pytest.raises(exception.PrivilegedWriteRefused, match="nvidia-223 is not enabled"):
        privsep.create_mdev(T4, "nvidia-223", str(uuid.uuid4()))
    assert not os.path.exists(host["marker"])
    assert not os.path.lexists(host["victim"])


@pytest.fixture
def planted_module():
    """A module of the daemon's Python that writes a marker when imported."""
    name = f"vgpu_planted_{uuid.uuid4().hex[:8]}"
    path = pathlib.Path(sysconfig.get_path("purelib")) / f"{name}.py"
    marker = pathlib.Path(tempfile.mkdtemp(prefix="vgpu-planted-")) / "imported"
    path.write_text(f"open({str(marker)!r}, 'w').close()\ndef run():\n    pass\n")
    try:
        yield name, marker
    finally:
        path.unlink()
        shutil.rmtree(marker.parent)


def test_a_name_outside_the_entry_points_imports_nothing(host, planted_module):
    module, marker = planted_module
    privsep.ensure_started(privsep.sysfs_writer)
    channel = privsep.sysfs_writer.channel
    refusals = {}
    for name in (
        "this.x",
        "vgpu_no_such_module.run",
        f"{module}.run",
        "vgpu_driver.privsep.entrypoints.set_heterogeneous_mode",
        "vgpu_driver.privsep.entrypoints._sysfs",
    ):
        with pytest.raises(NameError) as caught:
            channel.remote_call(name, (), {}, None)
        refusals[name] = str(caught.value).replace(repr(name), "NAME")
    assert set(refusals.values()) == {"Invalid privsep function: NAME not exported"}, refusals
    assert not marker.exists()
    # The same daemon still serves its own entry points.
    with pytest.raises(exception.InvalidSysfsName):
        privsep.remove_mdev("../not-a-uuid")


def test_a_helper_file_nova_conf_cannot_parse_stops_the_start(host, tmp_path):
    nova_conf = tmp_path / "nova.conf"
    nova_conf.write_text(nova_conf.read_text() + "[mdev_nvidia-222]\ndevice_addresses = $x\n")
    with pytest.raises(exception.PrivilegedHelperUnavailable, match="exited non-zero"):
        privsep.ensure_started(privsep.sysfs_writer)
    assert daemons(host["conf"]) == {}


def test_the_helper_refuses_a_context_not_ours():
    result = subprocess.run(
        [
            HELPER,
            "--config-file",
            "/dev/null",
            "--privsep_context",
            "os_brick.privileged.default",
            "--privsep_sock_path",
            "/x",
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        "argument --privsep_context: invalid choice: 'os_brick.privileged.default'" in result.stderr
    )


def test_a_daemon_started_by_another_helper_writes_nothing(tmp_path):
    """oslo.privsep's own privsep-helper gives our contexts no configuration."""
    conf = tmp_path / "nova.conf"
    conf.write_text("[devices]\nenabled_mdev_types = nvidia-222\n")
    test_privileged_writes.use_helper(
        f"{os.path.join(VENV_BIN, 'privsep-helper')} --config-file {conf}"
    )
    try:
        with pytest.raises(exception.PrivilegedWriteRefused, match="no configuration of its own"):
            privsep.create_mdev(T4, "nvidia-222", str(uuid.uuid4()))
    finally:
        test_privileged_writes.stop_daemons()
        for pid in test_privileged_writes.daemon_pids(str(conf)):
            os.kill(pid, signal.SIGTERM)
        gc.collect()


def test_the_helper_reads_no_configuration_from_its_home(tmp_path):
    """Started without sudo's environment (as root, HOME the caller's),
    the helper still reads only its own file: oslo.config's default
    directories ($HOME/.privsep/privsep.conf.d among them) are not read."""
    home = tmp_path / "home"
    (home / ".privsep" / "privsep.conf.d").mkdir(parents=True)
    (home / ".privsep" / "privsep.conf.d" / "caps.conf").write_text(
        "[vgpu_driver_sysfs_writer]\ncapabilities = CAP_SYS_ADMIN,CAP_DAC_OVERRIDE\n"
    )
    nova_conf = tmp_path / "nova.conf"
    nova_conf.write_text("[devices]\nenabled_mdev_types = nvidia-222\n")
    conf = tmp_path / "privsep.conf"
    conf.write_text(f"[nova]\nconfig_files = {nova_conf}\n")
    test_privileged_writes.use_helper(f"env HOME={home} {HELPER} --config-file {conf}")
    try:
        privsep.ensure_started(privsep.sysfs_writer)
        (pid,) = daemons(str(conf)).values()
        assert status(pid, "CapEff") == 1 << CAP_DAC_OVERRIDE
        assert environment(pid)["HOME"] == str(home)
    finally:
        test_privileged_writes.stop_daemons()
        for pid in test_privileged_writes.daemon_pids(str(conf)):
            os.kill(pid, signal.SIGTERM)
        gc.collect()
