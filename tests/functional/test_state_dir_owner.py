"""The state directory as a production host has it: nova's, with root and
read-only readers in it too.

``install/production.rst`` makes the state directory nova's user's
(``install -d -o nova -g nova -m 0750``).  nova-compute writes its claims
there as that user, root runs ``vgpu-manage`` there (``claims init``, the
boot unit's ``sriov enable``), and operators or monitoring in nova's group
read it (``status``, ``metrics``).  Each runs here as itself: throwaway
system users stand in for nova and for a reader, and the code runs in a
child that really switches to that user (groups, gid, uid) after it was
imported as root (this checkout's interpreter is not theirs to read).
"""

import contextlib
import io
import json
import os
import pathlib
import shlex
import shutil
import stat
import subprocess
import tempfile
import traceback
import uuid

import pytest
from oslo_config import cfg

from tests.functional import test_install_units
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import conf as vgpu_conf
from vgpu_driver import driver
from vgpu_driver import host_files
from vgpu_driver.cmd import manage
from vgpu_driver.fake import domains
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

A100 = "0000:41:00.0"
VF = "0000:41:00.4"
INSTANCE = "6a1b3c4d-0000-4000-8000-000000000001"
MDEV = "7b2c4d5e-0000-4000-8000-000000000002"


def _run(*argv):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def users():
    """``(nova, reader, outsider)``: nova's stand-in with its own group, a
    reader in that group, and a user in neither."""
    if os.geteuid() != 0:
        pytest.skip("creates system users and switches to them: needs root")
    if shutil.which("useradd") is None:
        pytest.skip("needs useradd and userdel (Debian: passwd)")
    tag = uuid.uuid4().hex[:6]
    made = []
    try:
        for name, extra in (
            (f"vgnova{tag}", ["--user-group"]),
            (f"vgread{tag}", ["-G", f"vgnova{tag}"]),
            (f"vgout{tag}", []),
        ):
            result = _run(
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                *extra,
                name,
            )
            assert result.returncode == 0, result.stderr
            made.append(name)
        yield tuple(made)
    finally:
        for name in reversed(made):
            result = _run("userdel", name)
            assert result.returncode == 0, result.stderr
        if made:
            _run("groupdel", made[0])  # userdel leaves a group another user is in


def as_user(name, action):
    """``action()``'s JSON-able result, run in a child as user ``name``;
    ``{"raised": type, "message": text}`` if it raised."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 99
        try:
            os.close(read_end)
            import pwd

            entry = pwd.getpwnam(name)
            os.initgroups(name, entry.pw_gid)
            os.setresgid(entry.pw_gid, entry.pw_gid, entry.pw_gid)
            os.setresuid(entry.pw_uid, entry.pw_uid, entry.pw_uid)
            try:
                result = action()
            except Exception as exc:
                result = {
                    "raised": type(exc).__name__,
                    "message": str(exc),
                    "trace": traceback.format_exc(),
                }
            with os.fdopen(write_end, "w") as out:
                json.dump(result, out)
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as reader:
        text = reader.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    return json.loads(text)


def cli(conf_file, *argv):
    """``{"code", "out"}`` of vgpu-manage run in this process (stdout and
    stderr together)."""
    app = manage.ManageApp()
    out = io.StringIO()
    app.stdout = app.stderr = out
    with contextlib.redirect_stderr(out):
        code = app.run(
            [
                "--config-file",
                str(conf_file),
                "--nodename",
                "cn1",
                "--libvirt-uri",
                "test:///default",
                *argv,
            ]
        )
    return {"code": code, "out": out.getvalue()}


@pytest.fixture
def production(users, monkeypatch, sriov_manage):
    """A host laid out as install/production.rst says: an A100 after a
    boot (VFs off), NVIDIA's sriov-manage (its stand-in), nova.conf, and
    nova's state directory."""
    nova = users[0]
    top = pathlib.Path(tempfile.mkdtemp(prefix="vgpu-production-"))
    os.chmod(top, 0o755)
    monkeypatch.setattr(manage.ManageApp, "host_factory", fakekernel.FakeKernel)
    kernel = fakekernel.FakeKernel.build(str(top / "sys"), profiles.load("a100-sriov-off"))
    state = top / "var" / "lib" / "vgpu-driver"
    state.parent.mkdir(parents=True)
    result = _run("install", "-d", "-o", nova, "-g", nova, "-m", "0750", str(state))
    assert result.returncode == 0, result.stderr
    conf_file = top / "etc" / "nova" / "nova.conf"
    conf_file.parent.mkdir(parents=True)
    conf_file.write_text(
        f"[devices]\nenabled_mdev_types = nvidia-468\n"
        f"[mdev_nvidia-468]\ndevice_addresses = {A100}\n"
        f"{sriov_manage(kernel.paths.root)}"
        f"sysfs_root = {kernel.paths.root}\nstate_dir = {state}\n"
        f"test_only_fake_sysfs_root = true\nrestore_wait = 5\n"
    )
    conf_file.chmod(0o644)
    yield kernel, conf_file, state
    shutil.rmtree(top)


def nova_compute_starts(conf_file, kernel, domain_mdevs=()):
    """What nova-compute does at start-up, as far as the journal goes: the
    driver it runs opens (or creates) the journal, and its host
    reconciler's start-up pass claims the vGPUs guests use without a claim
    (a takeover), writing them to the journal.  Returns the claims."""

    def start():
        conf = cfg.ConfigOpts()
        vgpu_conf.register_opts(conf)
        conf([], project="nova", default_config_files=[str(conf_file)])
        guests = domains.InProcessDomains()
        if domain_mdevs:
            guests.define(INSTANCE, list(domain_mdevs))
        vgpu = driver.VGPUDriver(conf, guests, host=fakekernel.FakeKernel(kernel.paths.root))
        try:
            vgpu.init_host()
            return [[c.instance_uuid, c.mdev_uuid, c.state] for c in vgpu.journal.claims()]
        finally:
            vgpu.close()
            vgpu.journal.close()

    return start


def owners(state):
    return {
        p.name: (p.owner(), p.group(), oct(stat.S_IMODE(p.stat().st_mode)))
        for p in sorted(state.iterdir())
        if p.name.startswith("claims.sqlite")
    }


def test_a_fresh_production_install_serves_nova_and_a_read_only_reader(users, production, tmp_path):
    nova, reader, _ = users
    kernel, conf_file, state = production
    # install-units, for nova's user, into an image root.
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in host_files.SCRIPTS:
        (bin_dir / name).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    # install-units takes --user from the passwd of the tree it installs in.
    (root / "etc" / "passwd").write_text(
        next(
            line
            for line in pathlib.Path("/etc/passwd").read_text().splitlines(True)
            if line.startswith(f"{nova}:")
        )
    )
    code, out, err = test_install_units.install(
        conf_file, "--root", str(root), "--bin-dir", str(bin_dir), "--user", nova
    )
    assert code == 0, err
    # The boot unit, as systemd runs it (as root, before nova-compute).
    unit = (root / host_files.SRIOV_UNIT).read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    argv = shlex.split(exec_start[len("ExecStart=") :])
    assert argv[0] == f"{bin_dir}/vgpu-manage" and "User=" not in unit
    assert manage.main(argv[1:]) == 0
    assert kernel.pci_device(A100).sriov_numvfs > 0
    assert sorted(p.name for p in state.iterdir()) == []  # root left nothing there
    # A guest's vGPU from before (a takeover): nova-compute claims it at start-up.
    kernel.create_mdev(VF, "nvidia-468", MDEV)
    found = as_user(nova, nova_compute_starts(conf_file, kernel, [MDEV]))
    assert found == [[INSTANCE, MDEV, claims.ATTACHED]], found
    assert owners(state) == {"claims.sqlite": (nova, nova, "0o640")}
    # The boot unit again (the next boot), then nova-compute again.
    assert manage.main(argv[1:]) == 0
    assert owners(state) == {"claims.sqlite": (nova, nova, "0o640")}
    found = as_user(nova, nova_compute_starts(conf_file, kernel, [MDEV]))
    assert found == [[INSTANCE, MDEV, claims.ATTACHED]], found
    # A reader in nova's group: status (loaded as root first, see the docstring).
    assert cli(conf_file, "status")["code"] == 0
    shown = as_user(reader, lambda: cli(conf_file, "status"))
    assert shown["code"] == 0, shown
    notices = [line for line in shown["out"].splitlines() if "opened read-only" in line]
    assert notices == [
        f"warning: Claims journal {state}/claims.sqlite is opened read-only: "
        f"uid {pwd_uid(reader)} ({reader}) cannot write it (the state "
        f"directory {state} is {nova}:{nova}, mode 0750); this process "
        f"reads claims and writes none"
    ], shown["out"]
    assert "error" not in shown["out"] and "move it away" not in shown["out"]
    # Root reading leaves its side files open here: sqlite gave them to nova.
    assert MDEV in cli(conf_file, "claims", "list", "-f", "value")["out"]
    assert set(owners(state)) > {"claims.sqlite"}
    assert set(owners(state).values()) == {(nova, nova, "0o640")}


def pwd_uid(name):
    import pwd

    return pwd.getpwnam(name).pw_uid


def test_claims_init_as_root_makes_a_journal_nova_compute_can_write(users, production):
    nova, _, _ = users
    _, conf_file, state = production
    done = cli(conf_file, "claims", "init")
    assert done["code"] == 0, done
    assert owners(state) == {"claims.sqlite": (nova, nova, "0o640")}

    def claim():
        journal = claims_journal.Journal(str(state))
        with journal.transaction() as txn:
            txn.add(INSTANCE, MDEV, A100, VF, "nvidia-468")
        return [c.mdev_uuid for c in journal.claims()]

    assert as_user(nova, claim) == [MDEV]


def test_a_journal_root_made_is_named_never_moved_and_claims_init_gives_it_to_nova(
    users, production
):
    """A journal an earlier ``claims init`` left root's (0644): nova-compute
    says who may not write what, and how to fix it; the fix keeps every claim."""
    nova, _, _ = users
    kernel, conf_file, state = production
    journal = claims_journal.Journal(str(state))
    with journal.transaction() as txn:
        txn.add(INSTANCE, MDEV, A100, VF, "nvidia-468", state=claims.ATTACHED)
    journal.close()
    os.chown(state / "claims.sqlite", 0, 0)
    os.chmod(state / "claims.sqlite", 0o644)
    failed = as_user(nova, nova_compute_starts(conf_file, kernel))
    assert failed["raised"] == "JournalNotWritable", failed
    assert failed["message"] == (
        f"Claims journal {state}/claims.sqlite cannot be written by uid {pwd_uid(nova)} "
        f"({nova}): claims.sqlite is root:root, mode 0644. Its claims are as they were. Run "
        f"'vgpu-manage claims init' as root: it gives the journal's files to the state "
        f"directory's owner ({nova}), its claims unchanged."
    )
    done = cli(conf_file, "claims", "init")
    assert done["code"] == 0 and done["out"].endswith("1 claim(s)\n"), done
    assert set(owners(state).values()) == {(nova, nova, "0o640")}
    kernel.set_vfs(A100, 16)
    kernel.create_mdev(VF, "nvidia-468", MDEV)
    found = as_user(nova, nova_compute_starts(conf_file, kernel, [MDEV]))
    assert found == [[INSTANCE, MDEV, claims.ATTACHED]], found


def test_readers_in_novas_group_read_while_nova_compute_writes(users, production):
    """nova-compute holds the journal open, its last claim still in the WAL
    file: a reader reads it through nova's ``-shm``, writing nothing."""
    nova, reader, _ = users
    _, conf_file, state = production
    assert cli(conf_file, "claims", "init")["code"] == 0
    for argv in (("status",), ("metrics",), ("claims", "list")):
        assert cli(conf_file, *argv)["code"] == 0  # loaded as root first
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    writer = os.fork()
    if writer == 0:  # nova-compute, holding the journal open
        code = 99
        try:
            import pwd

            entry = pwd.getpwnam(nova)
            os.initgroups(nova, entry.pw_gid)
            os.setresgid(entry.pw_gid, entry.pw_gid, entry.pw_gid)
            os.setresuid(entry.pw_uid, entry.pw_uid, entry.pw_uid)
            journal = claims_journal.Journal(str(state))
            with journal.transaction() as txn:
                txn.add(INSTANCE, MDEV, A100, VF, "nvidia-468")
            os.write(ready_w, b"x")
            os.read(done_r, 1)
            journal.close()
            code = 0
        finally:
            os._exit(code)
    os.close(ready_w)  # a writer that fails gives end of file, not a wait
    os.close(done_r)
    try:
        assert os.read(ready_r, 1) == b"x"
        assert (state / "claims.sqlite-wal").stat().st_size > 0
        listed = as_user(reader, lambda: cli(conf_file, "claims", "list", "-f", "value"))
        assert listed["code"] == 0 and MDEV in listed["out"], listed
        assert "opened read-only" in listed["out"]
        for argv in (("status",), ("metrics",)):
            shown = as_user(reader, lambda argv=argv: cli(conf_file, *argv))
            assert shown["code"] == 0 and "move it away" not in shown["out"], shown
        assert 'vgpu_claims{state="claimed"} 1.0' in shown["out"], shown["out"]
        assert set(owners(state).values()) == {(nova, nova, "0o640")}
    finally:
        os.write(done_w, b"x")
        os.waitpid(writer, 0)
        os.close(ready_r)
        os.close(done_w)


def test_who_may_not_read_or_write_is_told_what_it_lacks(users, production):
    nova, reader, outsider = users
    _, conf_file, state = production
    assert cli(conf_file, "claims", "init")["code"] == 0
    for argv in (("claims", "list"), ("claims", "drop", "--claim-state", "claimed")):
        assert cli(conf_file, *argv)["code"] == 0  # loaded as root first
    outside = as_user(outsider, lambda: cli(conf_file, "claims", "list"))
    assert outside["code"] == 2, outside
    assert outside["out"].splitlines() == [
        f"error: Claims journal {state}/claims.sqlite cannot be read by uid "
        f"{pwd_uid(outsider)} ({outsider}): the state directory is {nova}:{nova}, mode 0750. "
        f"Run this as root, as the state directory's owner or as a member of its group; the "
        f"journal is left as it was."
    ]
    dropped = as_user(
        reader, lambda: cli(conf_file, "claims", "drop", "--claim-state", "claimed", "--yes")
    )
    assert dropped["code"] == 2, dropped
    errors = [line for line in dropped["out"].splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: Claims journal {state}/claims.sqlite cannot be written by uid "
        f"{pwd_uid(reader)} ({reader}): the state directory {state} is {nova}:{nova}, mode "
        f"0750. Its claims are as they were. Run this as root or as {nova}."
    ], dropped
