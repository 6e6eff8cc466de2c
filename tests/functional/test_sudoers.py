"""The shipped sudoers rule allows exactly the commands nova-compute runs for
our two helpers (the sysfs writer and the NVML mode switch), and nothing more.

The rule of ``etc/vgpu-driver/sudoers.d/vgpu-driver`` is installed into
``/etc/sudoers.d/`` for a throwaway system user, its helper path pointed at
an executable of the test (the rest of each line byte for byte as shipped),
and the real sudo is asked about each command line with ``sudo -l -U user
command...``: it prints the command and exits 0 when the rule allows it,
exits 1 silently when no rule does.  The allowed commands are those
our contexts' ``helper_command`` builds, with a socket path made as
oslo.privsep's daemon makes it.  The user and the file are removed at the
end, whatever happened.

oslo.rootwrap, the other way to run ``privsep-helper`` as root, is checked
here too: its own code accepts ``privsep-helper`` with any arguments, even
with no filter file at all, so no filter of ours can narrow it.
"""

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest
from oslo_config import cfg
from oslo_privsep import priv_context
from oslo_rootwrap import wrapper

from vgpu_driver import privsep
from vgpu_driver.conf import privsep as privsep_conf

# The module's tests share one worker: the rule and its user are installed
# once per run, not once per pytest-xdist worker.
pytestmark = pytest.mark.xdist_group("sudoers-rule")

SHIPPED = pathlib.Path(__file__).parents[2] / "etc" / "vgpu-driver" / "sudoers.d" / "vgpu-driver"
SHIPPED_USER = "nova"
SHIPPED_HELPER = "/usr/bin/vgpu-privsep-helper"
HELPER_CONF = "/etc/vgpu-driver/privsep.conf"
NOVA_CONF = "/etc/nova/nova.conf"
CONTEXTS = {
    "vgpu_driver.privsep.sysfs_writer": privsep.sysfs_writer,
    "vgpu_driver.privsep.gpu_admin": privsep.gpu_admin,
}
CONTEXT = "vgpu_driver.privsep.sysfs_writer"
SOCKET = "/tmp/tmpabcdefgh/privsep.sock"
# What Python's tempfile.mkdtemp() names its directories with.
NAME_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789_"


def _need_sudo():
    if os.geteuid() != 0:
        pytest.skip("installs a sudoers file and a system user: needs root")
    missing = [
        tool for tool in ("sudo", "visudo", "useradd", "userdel") if shutil.which(tool) is None
    ]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (Debian: sudo, passwd)")


def _run(*argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def install_rule(path, text):
    """Write a sudoers drop-in at ``path`` whole: sudo, run by tests in other
    workers at the same time, reads every file of /etc/sudoers.d.  The text is
    written under a name with a dot, which sudo skips, then linked (never
    over an existing file)."""
    staged = path.with_name(f".{path.name}.new")
    fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o440)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.link(staged, path)
    finally:
        staged.unlink(missing_ok=True)


def _rule_lines(text):
    """The rule's lines: the sysfs writer's, then the NVML helper's."""
    rules = [
        line
        for line in text.splitlines()
        if line.strip() and not line.lstrip().startswith(("#", "Defaults"))
    ]
    assert [
        f"--privsep_context {c.replace('.', chr(92) + '.')} " in line
        for line, c in zip(rules, CONTEXTS, strict=True)
    ] == [True, True], rules
    return rules


def _documented_command(monkeypatch, context=privsep.sysfs_writer, root_helper=None):
    """The argv oslo.privsep runs for ``context`` in nova-compute (which
    sets oslo.privsep's root helper to nova-rootwrap unless told not to),
    with a socket path made as its daemon makes it."""
    conf = cfg.ConfigOpts()
    for group in (privsep_conf.GROUP, privsep_conf.GPU_ADMIN_GROUP):
        conf.register_opts(priv_context.OPTS, group=group)
    conf([], project="nova", default_config_files=[], default_config_dirs=[])
    # The global configuration stands in for nova-compute's.
    monkeypatch.setattr(cfg, "CONF", conf)
    if root_helper is not None:
        monkeypatch.setattr(priv_context, "_HELPER_COMMAND_PREFIX", root_helper)
    # oslo.privsep's daemon: os.path.join(tempfile.mkdtemp(), "privsep.sock"),
    # in nova-compute's environment, where TMPDIR, TEMP and TMP are unset.
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", None)
    sock_dir = tempfile.mkdtemp()
    try:
        command = context.helper_command(os.path.join(sock_dir, "privsep.sock"))
    finally:
        os.rmdir(sock_dir)
    return command


@pytest.fixture(scope="module")
def rule():
    """The shipped rule installed for a new system user; yields a function
    telling whether sudo lets that user run an argv as root, and the path of
    the helper the rule names."""
    _need_sudo()
    user = f"vgpusudo{uuid.uuid4().hex[:8]}"
    installed = pathlib.Path(f"/etc/sudoers.d/vgpu-driver-test-{user}")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="vgpu-sudoers-"))
    user_created = False
    try:
        helper = workdir / "vgpu-privsep-helper"
        helper.write_text("#!/bin/sh\nexit 1\n")
        helper.chmod(0o755)
        head = f"{SHIPPED_USER} ALL = (root) NOPASSWD: {SHIPPED_HELPER} "
        defaults = "env_reset, always_set_home, !env_keep, !env_check"
        lines = [f"Defaults!{helper} {defaults}"]
        assert f"\nDefaults!{SHIPPED_HELPER} {defaults}\n" in SHIPPED.read_text()
        for shipped in _rule_lines(SHIPPED.read_text()):
            assert shipped.startswith(head), shipped
            lines.append(f"{user} ALL = (root) NOPASSWD: {helper} " + shipped[len(head) :])

        result = _run(
            "useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user
        )
        assert result.returncode == 0, result.stderr
        user_created = True
        install_rule(installed, "".join(line + "\n" for line in lines))
        result = _run("visudo", "-c")
        assert result.returncode == 0, result.stdout + result.stderr

        def allowed(argv):
            result = _run("sudo", "-n", "-l", "-U", user, *argv)
            if result.returncode == 0:
                assert result.stdout.strip() == " ".join(argv), result.stdout
                return True
            # Refused by the policy, not by an error of sudo's.
            assert (result.returncode, result.stdout, result.stderr) == (1, "", ""), result
            return False

        yield allowed, str(helper)
    finally:
        installed.unlink(missing_ok=True)
        if user_created:
            result = _run("userdel", user)
            assert result.returncode == 0, result.stderr
        shutil.rmtree(workdir)


@pytest.fixture(params=sorted(CONTEXTS))
def documented(request, rule, monkeypatch):
    """The command nova-compute runs for a context, its helper replaced by
    the test's, and sudo's verdict function."""
    allowed, helper = rule
    # nova-compute's root helper is nova-rootwrap: our contexts use sudo alone.
    command = _documented_command(
        monkeypatch, CONTEXTS[request.param], ["sudo", "nova-rootwrap", "/etc/nova/rootwrap.conf"]
    )
    assert command[:2] == [
        "sudo",
        os.path.join(os.path.dirname(sys.executable), "vgpu-privsep-helper"),
    ], command
    argv = [helper] + command[2:]
    return allowed, argv


def test_the_shipped_file_passes_visudo():
    _need_sudo()
    result = _run("visudo", "-c", "-f", str(SHIPPED))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_documented_command_is_allowed(documented):
    allowed, argv = documented
    assert argv[1:-1] == [
        "--config-file",
        HELPER_CONF,
        "--privsep_context",
        _context(argv),
        "--privsep_sock_path",
    ]
    assert _context(argv) in CONTEXTS
    sock = pathlib.PurePath(argv[-1])
    assert (str(sock.parent.parent), sock.parent.name[:3], sock.name) == (
        "/tmp",
        "tmp",
        "privsep.sock",
    ), argv
    assert allowed(argv), argv


def test_every_socket_directory_name_mkdtemp_can_make_is_allowed(documented):
    allowed, argv = documented
    for start in range(0, len(NAME_CHARS), 8):
        name = (NAME_CHARS[start:] + NAME_CHARS)[:8]
        sock = f"/tmp/tmp{name}/privsep.sock"
        assert allowed(argv[:-1] + [sock]), sock


def _context(argv):
    return argv[argv.index("--privsep_context") + 1]


def _with_args(argv, *extra):
    return argv + list(extra)


def _replaced(argv, old, new):
    index = argv.index(old)
    return argv[:index] + list(new) + argv[index + 1 :]


REFUSED = {
    "appended config file": lambda a: _with_args(a, "--config-file", "/tmp/evil.conf"),
    "appended logging option": lambda a: _with_args(a, "--log-config-append", "/tmp/x"),
    "appended config dir": lambda a: _with_args(a, "--config-dir", "/tmp/evil.d"),
    "config file inserted before the context": lambda a: _replaced(
        a, "--privsep_context", ["--config-file", "/tmp/evil.conf", "--privsep_context"]
    ),
    "socket path then more arguments": lambda a: _replaced(
        a, a[-1], [SOCKET, "--config-file", "/tmp/e.conf"]
    ),
    "socket path with more words in one argument": lambda a: _replaced(
        a, a[-1], [f"{SOCKET} --config-file /tmp/e.conf"]
    ),
    "another privsep context": lambda a: _replaced(a, _context(a), ["os_brick.privileged.default"]),
    "a context under another name": lambda a: _replaced(
        a, _context(a), [_context(a).replace("vgpu_driver.", "vgpu_driverX")]
    ),
    "config file path climbing out of /etc/vgpu-driver": lambda a: _replaced(
        a, HELPER_CONF, ["/etc/vgpu-driver/../../tmp/evil.conf"]
    ),
    "another config file": lambda a: _replaced(a, HELPER_CONF, ["/tmp/evil.conf"]),
    "nova.conf as the helper's configuration": lambda a: _replaced(a, HELPER_CONF, [NOVA_CONF]),
    "socket path climbing out of /tmp": lambda a: _replaced(
        a, a[-1], ["/tmp/../etc/x/privsep.sock"]
    ),
    "socket path below the socket directory": lambda a: _replaced(
        a, a[-1], ["/tmp/tmpabcdefgh/../../etc/privsep.sock"]
    ),
    "socket directory name of 9 characters": lambda a: _replaced(
        a, a[-1], ["/tmp/tmpabcdefghi/privsep.sock"]
    ),
    "no arguments": lambda a: a[:1],
    "the arguments without the socket": lambda a: a[:-2],
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_anything_else_is_refused(documented, case):
    allowed, argv = documented
    assert allowed(argv)
    changed = REFUSED[case](argv)
    assert changed != argv
    assert not allowed(changed), changed


def test_only_the_named_helper_is_allowed(documented):
    allowed, argv = documented
    other = pathlib.Path(argv[0]).with_name("other-helper")
    shutil.copy(argv[0], other)
    try:
        assert not allowed([str(other)] + argv[1:])
    finally:
        other.unlink()


def _regroupings(words):
    """Every other way to split the same words into arguments: a space
    between two words becomes part of one argument."""
    for i in range(len(words) - 1):
        yield words[:i] + [f"{words[i]} {words[i + 1]}"] + words[i + 2 :]


def test_the_same_words_regrouped_pass_sudo_and_the_helper_refuses_them(documented):
    """sudo matches the arguments joined with spaces, so the documented words
    split differently into arguments match too; vgpu-privsep-helper refuses
    each such split while parsing its command line, before it reads a file
    (there is none here: a read would be another error)."""
    allowed, argv = documented
    real_helper = os.path.join(os.path.dirname(sys.executable), "vgpu-privsep-helper")
    assert os.access(real_helper, os.X_OK), real_helper
    for regrouped in _regroupings(argv[1:]):
        assert allowed([argv[0]] + regrouped), regrouped
        result = _run(real_helper, *regrouped)
        assert result.returncode == 2, (regrouped, result)
        # argparse's refusal, not the helper's own "error: ..." of a read.
        assert result.stderr.startswith("usage: vgpu-privsep-helper"), result.stderr
        assert "\nvgpu-privsep-helper: error: " in result.stderr, result.stderr


def test_rootwrap_lets_anyone_run_privsep_helper_with_any_arguments(tmp_path):
    """Why no rootwrap filter is shipped: oslo.rootwrap adds its own
    unrestricted privsep-helper filter to whatever it loads."""
    filters_dir = tmp_path / "rootwrap.d"
    filters_dir.mkdir()
    filters = wrapper.load_filters([str(filters_dir)])
    # rootwrap runs what it finds in rootwrap.conf's exec_dirs.
    exec_dirs = [os.path.dirname(sys.executable)]
    command = [
        "privsep-helper",
        "--config-file",
        NOVA_CONF,
        "--privsep_context",
        CONTEXT,
        "--privsep_sock_path",
        SOCKET,
        "--config-file",
        "/tmp/evil.conf",
    ]
    chosen = wrapper.match_filter(filters, command, exec_dirs=exec_dirs)
    assert (chosen.name, chosen.run_as) == ("privsep-helper", "root")
    assert (
        chosen.get_command(command, exec_dirs=exec_dirs)
        == [os.path.join(exec_dirs[0], "privsep-helper")] + command[1:]
    )
