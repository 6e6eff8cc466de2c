"""``vgpu-manage install-units`` writes the units, the sudo rule and the
helper's file with this host's paths, and the rule it writes lets nova's
user run exactly the command nova-compute builds.

The rule is asked of the real sudo (``sudo -l -U``) for a throwaway system
user, as ``test_sudoers.py`` does for the shipped example; the examples in
``etc/`` are what the command writes with the default paths.
"""

import contextlib
import hashlib
import io
import os
import pathlib
import shutil
import subprocess
import uuid

import pytest

from tests.functional import test_sudoers
from vgpu_driver import host_files
from vgpu_driver.cmd import manage

REPO = pathlib.Path(__file__).parents[2]
SHIPPED = {
    host_files.SUDOERS: "etc/vgpu-driver/sudoers.d/vgpu-driver",
    host_files.PRIVSEP_CONF: "etc/vgpu-driver/privsep.conf",
    host_files.SRIOV_UNIT: "etc/systemd/vgpu-driver-sriov.service",
    host_files.COMPUTE_DROPIN: "etc/systemd/nova-compute.service.d/vgpu-driver.conf",
    host_files.METRICS_UNIT: "etc/systemd/vgpu-driver-metrics.service",
}


def test_the_shipped_examples_are_what_it_writes_with_the_default_paths():
    rendered = {f.path: f.text for f in host_files.render(host_files.EXAMPLE)}
    assert rendered == {path: (REPO / shipped).read_text() for path, shipped in SHIPPED.items()}


@pytest.fixture
def bin_dir(tmp_path):
    scripts = tmp_path / "venv" / "bin"
    scripts.mkdir(parents=True)
    for name in host_files.SCRIPTS:
        (scripts / name).write_text("#!/bin/sh\nexit 1\n")
        (scripts / name).chmod(0o755)
    return scripts


def make_root(tmp_path, *users):
    """A tree to install under, whose /etc/passwd lists ``users``."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text(
        "".join(
            f"{user}:x:{500 + i}:{500 + i}::/nonexistent:/usr/sbin/nologin\n"
            for i, user in enumerate(users)
        )
    )
    return root


@pytest.fixture
def root(tmp_path):
    return make_root(tmp_path, "nova", "compute")


@pytest.fixture
def nova_conf(tmp_path):
    conf = tmp_path / "etc" / "nova" / "nova.conf"
    conf.parent.mkdir(parents=True)
    conf.write_text("[DEFAULT]\n")
    return conf


def install(nova_conf, *argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = manage.main(["--config-file", str(nova_conf), "install-units", "-f", "value", *argv])
    return code, out.getvalue(), err.getvalue()


def snapshot(root):
    return {
        str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mode)
        for p in sorted(pathlib.Path(root).rglob("*"))
        if p.is_file()
    }


def test_it_writes_the_five_files_with_this_hosts_paths(root, bin_dir, nova_conf):
    empty = snapshot(root)
    code, out, err = install(nova_conf, "--root", str(root), "--bin-dir", str(bin_dir), "--dry-run")
    assert (code, snapshot(root)) == (0, empty)
    assert out.count("would be written") == 5
    code, out, err = install(nova_conf, "--root", str(root), "--bin-dir", str(bin_dir))
    assert code == 0 and out.count(" written") == 5, out
    assert "then: systemctl daemon-reload" in err
    files = {path: (root / path) for path in SHIPPED}
    assert {p: oct(f.stat().st_mode & 0o777) for p, f in files.items()} == {
        host_files.SUDOERS: "0o440",
        host_files.PRIVSEP_CONF: "0o644",
        host_files.SRIOV_UNIT: "0o644",
        host_files.COMPUTE_DROPIN: "0o644",
        host_files.METRICS_UNIT: "0o644",
    }
    assert (
        f"ExecStart={bin_dir}/vgpu-nova-compute --config-file {nova_conf}\n"
        in files[host_files.COMPUTE_DROPIN].read_text()
    )
    assert (
        f"ExecStart={bin_dir}/vgpu-manage --config-file {nova_conf} sriov enable "
        in files[host_files.SRIOV_UNIT].read_text()
    )
    metrics_unit = files[host_files.METRICS_UNIT].read_text()
    assert (
        f"ExecStart={bin_dir}/vgpu-manage --config-file {nova_conf} metrics serve\n" in metrics_unit
    )
    assert "\nUser=nova\n" in metrics_unit
    for rule in test_sudoers._rule_lines(files[host_files.SUDOERS].read_text()):
        assert rule.startswith(
            f"nova ALL = (root) NOPASSWD: {bin_dir}/vgpu-privsep-helper "
            "^--config-file /etc/vgpu-driver/privsep\\.conf "
            "--privsep_context "
        ), rule
    assert (
        f"\n[nova]\nconfig_files = {nova_conf}\nconfig_dirs =\n"
        in files[host_files.PRIVSEP_CONF].read_text()
    )

    # Again: nothing to do.  Changed by hand: refused unless --force.
    before = snapshot(root)
    code, out, _ = install(nova_conf, "--root", str(root), "--bin-dir", str(bin_dir))
    assert (code, out.count("unchanged"), snapshot(root)) == (0, 5, before)
    dropin = files[host_files.COMPUTE_DROPIN]
    dropin.write_text(dropin.read_text() + "# --log-file added by hand\n")
    edited = snapshot(root)
    code, out, err = install(
        nova_conf, "--root", str(root), "--bin-dir", str(bin_dir), "--user", "compute"
    )
    assert (code, out, snapshot(root)) == (2, "", edited)
    assert err.splitlines() == [
        f"error: {root}/{host_files.SUDOERS}, {dropin}, {root}/{host_files.METRICS_UNIT} "
        f"differ from what would be written "
        f"(--force replaces them); nothing was written."
    ]
    code, out, _ = install(
        nova_conf, "--root", str(root), "--bin-dir", str(bin_dir), "--user", "compute", "--force"
    )
    assert code == 0 and out.count("replaced") == 3 and out.count("unchanged") == 2, out
    assert "# --log-file" not in dropin.read_text()


def test_systemd_reads_the_units_it_writes_without_a_complaint(root, bin_dir, nova_conf):
    """systemd's own parser: a misspelt key or section is only a warning to
    systemd (the unit still loads, without it), so any output fails."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (bindep.txt: systemd)")
    code, _, err = install(nova_conf, "--root", str(root), "--bin-dir", str(bin_dir))
    assert code == 0, err
    for unit in (host_files.SRIOV_UNIT, host_files.METRICS_UNIT):
        checked = subprocess.run(
            [analyze, "verify", str(root / unit)],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"},
        )
        assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", ""), unit
    broken = root / host_files.METRICS_UNIT
    broken.write_text(broken.read_text().replace("Restart=", "Restrat="))
    checked = subprocess.run(
        [analyze, "verify", str(broken)], capture_output=True, text=True, check=False
    )
    assert "Unknown key 'Restrat'" in checked.stderr, checked.stderr


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--user", "No va"], "error: --user 'No va': not a user name"),
        (["--user", ""], "error: --user '': not a user name"),
        (["--tmpdir", "tmp"], "error: --tmpdir 'tmp': not an absolute, normalised path"),
        (["--tmpdir", "/tmp/../etc"], "error: --tmpdir '/tmp/../etc': not an absolute"),
        (["--bin-dir", "/usr/bin/../x y"], "error: --bin-dir '/usr/bin/../x y': not an"),
        (
            ["--bin-dir", "/nonexistent"],
            "error: /nonexistent has no vgpu-privsep-helper, "
            "vgpu-manage, vgpu-nova-compute (give --bin-dir",
        ),
        (["--root", "/nonexistent/root"], "error: --root /nonexistent/root is not a directory"),
    ],
)
def test_bad_input_writes_nothing(root, bin_dir, nova_conf, argv, message):
    empty = snapshot(root)
    default = ["--root", str(root), "--bin-dir", str(bin_dir)]
    code, out, err = install(nova_conf, *default, *argv)
    assert (code, out, snapshot(root)) == (2, "", empty)
    assert len(err.splitlines()) == 1 and err.startswith(message), err


def test_a_config_file_sudo_cannot_carry_is_refused(tmp_path, root, bin_dir):
    conf = tmp_path / "nova #1.conf"
    conf.write_text("[DEFAULT]\n")
    empty = snapshot(root)
    code, out, err = install(conf, "--root", str(root), "--bin-dir", str(bin_dir))
    assert (code, snapshot(root)) == (2, empty)
    assert err.startswith(f"error: --config-file '{conf}': not an absolute, normalised "), err


@pytest.fixture
def system_user():
    test_sudoers._need_sudo()
    user = f"vgpuunit{uuid.uuid4().hex[:8]}"
    result = test_sudoers._run(
        "useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", user
    )
    assert result.returncode == 0, result.stderr
    try:
        yield user
    finally:
        result = test_sudoers._run("userdel", user)
        assert result.returncode == 0, result.stderr


def test_the_rule_it_writes_allows_exactly_nova_computes_command(
    tmp_path, bin_dir, nova_conf, system_user, monkeypatch
):
    root = make_root(tmp_path, system_user)
    code, _, err = install(
        nova_conf, "--root", str(root), "--bin-dir", str(bin_dir), "--user", system_user
    )
    assert code == 0, err
    installed = pathlib.Path(f"/etc/sudoers.d/vgpu-driver-test-{system_user}")
    test_sudoers.install_rule(installed, (root / host_files.SUDOERS).read_text())
    try:
        result = test_sudoers._run("visudo", "-c")
        assert result.returncode == 0, result.stdout + result.stderr

        def allowed(words):
            result = test_sudoers._run("sudo", "-n", "-l", "-U", system_user, *words)
            assert result.returncode in (0, 1), result.stderr
            return result.returncode == 0

        for context in test_sudoers.CONTEXTS.values():
            command = test_sudoers._documented_command(monkeypatch, context)
            assert command[0] == "sudo", command
            argv = [str(bin_dir / "vgpu-privsep-helper"), *command[2:]]
            assert allowed(argv), argv
            assert not allowed(argv + ["--config-file", "/tmp/evil.conf"])
            assert not allowed([argv[0], "--config-file", "/tmp/evil.conf", *argv[1:]])
            assert not allowed([argv[0], "--config-file", str(nova_conf), *argv[3:]])
            assert not allowed(["/usr/bin/vgpu-privsep-helper", *argv[1:]])
    finally:
        installed.unlink()
