"""``install-units`` names nothing another user can replace, and what it
makes is right whatever the umask, the ``--tmpdir`` spelling or the user.

A throwaway system user stands in for nova: it owns the directories a
venv made as nova would have, and the real sudo is asked whether the rule
matches what Python makes for a ``TMPDIR`` with a trailing slash.
"""

import os
import pathlib
import shutil
import sys
import tempfile

import pytest

from tests.functional import test_install_units
from tests.functional import test_sudoers
from tests.functional.test_install_units import install
from tests.functional.test_install_units import snapshot
from vgpu_driver import host_files
from vgpu_driver import privsep

# Fixtures shared with the neighbouring module.
system_user = test_install_units.system_user
nova_conf = test_install_units.nova_conf
VENV_BIN = os.path.dirname(sys.executable)


def scripts_in(directory, shebang="#!/bin/sh"):
    directory.mkdir(parents=True, exist_ok=True)
    for name in host_files.SCRIPTS:
        (directory / name).write_text(f"{shebang}\nexit 1\n")
        (directory / name).chmod(0o755)
    return directory


def refused(nova_conf, root, bin_dir, *argv):
    """install-units' one error line, after checking it wrote nothing."""
    before = snapshot(root)
    code, out, err = install(nova_conf, "--root", str(root), "--bin-dir", str(bin_dir), *argv)
    assert (code, out, snapshot(root)) == (2, "", before), err
    assert len(err.splitlines()) == 1 and err.startswith(
        "error: root would run or read what another user can replace: "
    ), err
    return err


@pytest.fixture
def owned(tmp_path, system_user):
    """A directory of the throwaway user's, where a venv made as nova is."""
    home = tmp_path / "home"
    home.mkdir()
    shutil.chown(home, system_user, system_user)
    return home, system_user


def test_the_real_environment_of_these_tests_is_accepted(tmp_path):
    """Everything from / to this venv's scripts and its Python is root's."""
    root = test_install_units.make_root(tmp_path, "nova")
    nova_conf = tmp_path / "nova.conf"
    nova_conf.write_text("[DEFAULT]\n")
    code, out, err = install(nova_conf, "--root", str(root), "--bin-dir", VENV_BIN)
    assert code == 0, err


def test_a_helper_in_a_directory_nova_owns_is_refused(tmp_path, nova_conf, owned):
    home, user = owned
    root = test_install_units.make_root(tmp_path, "nova")
    bin_dir = scripts_in(home / "venv" / "bin")  # made as root, in nova's directory
    err = refused(nova_conf, root, bin_dir)
    assert f"{home} (owner {user}, mode 0755) can be changed by another user than root" in err


def test_a_helper_nova_owns_is_refused(tmp_path, nova_conf, owned):
    _home, user = owned
    root = test_install_units.make_root(tmp_path, "nova")
    bin_dir = scripts_in(tmp_path / "venv" / "bin")
    helper = bin_dir / "vgpu-privsep-helper"
    shutil.chown(helper, user)
    err = refused(nova_conf, root, bin_dir)
    assert f"{helper} (owner {user}, mode 0755)" in err


def test_an_interpreter_nova_can_replace_is_refused(tmp_path, nova_conf, owned):
    """The script is root's, the Python of its #! line is not: nova's user
    would replace the Python and sudo would run it as root."""
    home, user = owned
    root = test_install_units.make_root(tmp_path, "nova")
    python = home / "venv" / "bin" / "python3"
    python.parent.mkdir(parents=True)
    shutil.chown(python.parent.parent, user, user)
    python.symlink_to(sys.executable)
    bin_dir = scripts_in(tmp_path / "venv" / "bin", shebang=f"#!{python}")
    err = refused(nova_conf, root, bin_dir)
    assert f"{home}/venv (owner {user}, mode 0755)" in err


def test_pips_long_path_trampoline_is_followed(tmp_path, nova_conf, owned):
    home, user = owned
    root = test_install_units.make_root(tmp_path, "nova")
    python = home / ("x" * 120) / "python3"
    bin_dir = tmp_path / "venv" / "bin"
    scripts_in(bin_dir)
    for name in host_files.SCRIPTS:
        (bin_dir / name).write_text(f"#!/bin/sh\n'''exec' {python} \"$0\" \"$@\"\n' '''\n")
    err = refused(nova_conf, root, bin_dir)
    assert f"{home} (owner {user}, mode 0755)" in err


def test_group_writable_and_linked_directories_are_refused(tmp_path, nova_conf, owned):
    home, user = owned
    root = test_install_units.make_root(tmp_path, "nova")
    shared = tmp_path / "shared"
    scripts_in(shared / "bin")
    shared.chmod(0o775)
    err = refused(nova_conf, root, shared / "bin")
    assert f"{shared} (owner root, mode 0775)" in err
    # A root-owned link whose target is in nova's directory.
    shared.chmod(0o755)
    scripts_in(home / "bin")
    link = tmp_path / "linked"
    link.symlink_to(home)
    err = refused(nova_conf, root, link / "bin")
    assert f"{home} (owner {user}, mode 0755)" in err


def test_configuration_root_reads_is_refused_when_nova_can_change_it(tmp_path, owned):
    """The SR-IOV unit runs vgpu-manage as root with nova-compute's files."""
    home, user = owned
    root = test_install_units.make_root(tmp_path, "nova")
    nova_conf = home / "nova.conf"
    nova_conf.write_text("[DEFAULT]\n")
    err = refused(nova_conf, root, scripts_in(tmp_path / "venv" / "bin"))
    assert f"{home} (owner {user}, mode 0755)" in err


def test_a_helper_file_directory_nova_owns_is_refused(tmp_path, nova_conf, owned):
    _home, user = owned
    root = test_install_units.make_root(tmp_path, "nova")
    (root / "etc" / "vgpu-driver").mkdir()
    shutil.chown(root / "etc" / "vgpu-driver", user)
    err = refused(nova_conf, root, scripts_in(tmp_path / "venv" / "bin"))
    assert f"{root}/etc/vgpu-driver (owner {user}, mode 0755)" in err


def test_directories_are_0755_whatever_the_umask(tmp_path, nova_conf):
    root = test_install_units.make_root(tmp_path, "nova")
    bin_dir = scripts_in(tmp_path / "venv" / "bin")
    old = os.umask(0)
    try:
        code, _, err = install(nova_conf, "--root", str(root), "--bin-dir", str(bin_dir))
    finally:
        os.umask(old)
    assert code == 0, err
    made = [
        "etc/sudoers.d",
        "etc/vgpu-driver",
        "etc/systemd",
        "etc/systemd/system",
        "etc/systemd/system/nova-compute.service.d",
    ]
    assert {d: oct((root / d).stat().st_mode & 0o7777) for d in made} == {d: "0o755" for d in made}
    assert {
        f.path: oct((root / f.path).stat().st_mode & 0o7777)
        for f in host_files.render(host_files.EXAMPLE)
    } == {
        host_files.SUDOERS: "0o440",
        host_files.PRIVSEP_CONF: "0o644",
        host_files.SRIOV_UNIT: "0o644",
        host_files.COMPUTE_DROPIN: "0o644",
        host_files.METRICS_UNIT: "0o644",
    }


def test_a_user_that_does_not_exist_is_refused(tmp_path, nova_conf):
    root = test_install_units.make_root(tmp_path, "nova")
    bin_dir = scripts_in(tmp_path / "venv" / "bin")
    before = snapshot(root)
    code, out, err = install(
        nova_conf, "--root", str(root), "--bin-dir", str(bin_dir), "--user", "nosuchuser"
    )
    assert (code, out, snapshot(root)) == (2, "", before)
    assert err == f"error: --user 'nosuchuser': no such user in {root}/etc/passwd\n"
    # On this host (--root /): asked of the system's user database.
    code, out, err = install(
        nova_conf, "--bin-dir", str(bin_dir), "--user", "nosuchuser", "--dry-run"
    )
    assert (code, out) == (2, "")
    assert err == "error: --user 'nosuchuser': no such user in /etc/passwd\n"


def test_a_tmpdir_with_a_trailing_slash_gives_a_rule_sudo_matches(
    tmp_path, nova_conf, system_user, monkeypatch
):
    """nova-compute with TMPDIR=/var/tmp/: Python makes /var/tmp/tmpXXXXXXXX."""
    root = test_install_units.make_root(tmp_path, system_user)
    bin_dir = scripts_in(tmp_path / "venv" / "bin")
    code, _, err = install(
        nova_conf,
        "--root",
        str(root),
        "--bin-dir",
        str(bin_dir),
        "--user",
        system_user,
        "--tmpdir",
        "/var/tmp/",
    )
    assert code == 0, err
    text = (root / host_files.SUDOERS).read_text()
    assert "--privsep_sock_path /var/tmp/tmp[a-z0-9_]{8}/privsep\\.sock$\n" in text
    installed = pathlib.Path(f"/etc/sudoers.d/vgpu-driver-test-{system_user}")
    test_sudoers.install_rule(installed, text)
    try:
        monkeypatch.setenv("TMPDIR", "/var/tmp/")
        monkeypatch.setattr(tempfile, "tempdir", None)
        sock_dir = tempfile.mkdtemp()
        os.rmdir(sock_dir)
        command = privsep.sysfs_writer.helper_command(os.path.join(sock_dir, "privsep.sock"))
        argv = [str(bin_dir / "vgpu-privsep-helper"), *command[2:]]
        result = test_sudoers._run("sudo", "-n", "-l", "-U", system_user, *argv)
        assert result.returncode == 0, (argv, result)
    finally:
        installed.unlink()


def test_an_sriov_manage_nova_can_replace_is_refused(tmp_path, owned):
    """The SR-IOV unit's vgpu-manage runs [vgpu] sriov_manage_path as root."""
    home, user = owned
    root = test_install_units.make_root(tmp_path, "nova")
    script = home / "sriov-manage"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o755)
    nova_conf = tmp_path / "nova.conf"
    nova_conf.write_text(f"[vgpu]\nsriov_manage_path = {script}\n")
    err = refused(nova_conf, root, scripts_in(tmp_path / "venv" / "bin"))
    assert f"{home} (owner {user}, mode 0755)" in err


def test_a_file_of_the_right_text_another_user_owns_is_not_left_unchanged(
    tmp_path, nova_conf, owned
):
    """nova's user could edit a unit systemd runs as root: it differs from
    what would be written, like a file changed by hand."""
    _home, user = owned
    root = test_install_units.make_root(tmp_path, "nova")
    bin_dir = scripts_in(tmp_path / "venv" / "bin")
    code, _, err = install(nova_conf, "--root", str(root), "--bin-dir", str(bin_dir))
    assert code == 0, err
    unit = root / host_files.SRIOV_UNIT
    shutil.chown(unit, user)
    code, out, err = install(nova_conf, "--root", str(root), "--bin-dir", str(bin_dir))
    assert (code, out) == (2, "")
    assert (
        err == f"error: {unit} differs from what would be written (--force replaces "
        "them); nothing was written.\n"
    )
    assert unit.stat().st_uid != 0
    code, out, err = install(nova_conf, "--root", str(root), "--bin-dir", str(bin_dir), "--force")
    assert code == 0 and out.count("replaced") == 1, (out, err)
    assert unit.stat().st_uid == 0
