"""``claims init|list|restore`` and the journal every other command refuses
to read as empty (real CLI, fake kernel, real journal)."""

import contextlib
import io
import json
import uuid

import pytest

from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver.cmd import base
from vgpu_driver.cmd import manage

A100 = "0000:41:00.0"
VF = "0000:41:00.4"
CONF = "[devices]\nenabled_mdev_types = nvidia-468\n"


@pytest.fixture
def cli(tmp_path, fake_kernel_cli):
    conf_file = tmp_path / "nova.conf"
    conf_file.write_text(CONF)

    def run(*argv, state_dir=None):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = manage.main(
                [
                    "--config-file",
                    str(conf_file),
                    "--nodename",
                    "cn1",
                    "--state-dir",
                    str(state_dir or tmp_path / "state"),
                    "--libvirt-uri",
                    "test:///default",
                    *argv,
                ]
            )
        return code, out.getvalue(), err.getvalue()

    return run


@pytest.fixture
def claimed_host(make_host, tmp_path):
    """A host with two attached mdevs recorded in its journal."""
    host = make_host("a100-sriov")
    journal = claims_journal.Journal(str(tmp_path / "state"))
    held = [str(uuid.uuid4()) for _ in range(2)]
    for number, mdev in enumerate(held):
        parent = f"0000:41:00.{4 + number}"
        host.create_mdev(parent, "nvidia-468", mdev)
        with journal.transaction() as txn:
            txn.add(
                f"inst-{number}",
                mdev,
                A100,
                parent,
                "nvidia-468",
                state=claims.ATTACHED,
                created=True,
            )
    return host, held


def mdevs_of(host):
    return sorted(m.uuid for m in host.list_mdevs())


def test_reclaim_with_a_mistyped_state_dir_removes_nothing(claimed_host, cli, tmp_path):
    host, held = claimed_host
    typo = tmp_path / "sate"
    code, out, err = cli("--sysfs-root", host.paths.root, "orphans", "reclaim", state_dir=typo)
    assert code == base.EXIT_ERROR and out == ""
    assert err == (
        f"error: No claims journal at {typo}/claims.sqlite: the state directory "
        "does not exist. Check --state-dir ([vgpu] state_dir); nova-compute "
        "creates it at start-up, or run 'vgpu-manage claims init' on a host "
        "that never had one.\n"
    )
    assert mdevs_of(host) == sorted(held) and not typo.exists()


def test_an_empty_journal_file_is_refused(claimed_host, cli, tmp_path):
    host, held = claimed_host
    state = tmp_path / "other"
    state.mkdir()
    (state / "claims.sqlite").write_bytes(b"")
    for argv in (
        ("orphans", "reclaim"),
        ("orphans", "list"),
        ("mdev", "list"),
        ("claims", "list"),
        ("inventory",),
    ):
        code, _, err = cli("--sysfs-root", host.paths.root, *argv, state_dir=state)
        assert code == base.EXIT_ERROR, argv
        assert err.startswith(f"error: Claims journal {state}/claims.sqlite is unusable")
        assert err.count("\n") == 1
    assert mdevs_of(host) == sorted(held)
    assert (state / "claims.sqlite").read_bytes() == b""


def test_a_host_without_vgpus_needs_no_journal(make_host, cli, tmp_path):
    host = make_host("a100-sriov")
    for argv in (("mdev", "list"), ("orphans", "list"), ("inventory", "-f", "value")):
        code, _, err = cli("--sysfs-root", host.paths.root, *argv)
        assert code == 0, err
    assert not (tmp_path / "state").exists()


def test_init_creates_once_and_then_reports(make_host, cli, tmp_path):
    code, out, _ = cli("claims", "init")
    path = tmp_path / "state" / "claims.sqlite"
    assert code == 0 and out == f"claims journal {path}: schema version 1, 0 claim(s)\n"
    code, out, _ = cli("claims", "init")
    assert code == 0 and out.endswith("0 claim(s)\n")


def test_init_refuses_a_directory_of_other_files(cli, tmp_path):
    """A mistyped --state-dir (nova's own directory, say) gets no journal."""
    nova_dir = tmp_path / "nova"
    (nova_dir / "instances").mkdir(parents=True)
    (nova_dir / "keys").write_text("x")
    before = sorted(p.name for p in nova_dir.iterdir())
    code, out, err = cli("claims", "init", state_dir=nova_dir)
    assert (code, out) == (base.EXIT_ERROR, "")
    assert err == (
        f"error: Refusing to create a claims journal in {nova_dir}: it already "
        "holds 2 other file(s) (instances, keys) and no journal, so it is not "
        "vgpu-driver's state directory. Check --state-dir ([vgpu] state_dir); "
        "give a new or empty directory.\n"
    )
    assert sorted(p.name for p in nova_dir.iterdir()) == before
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    code, _, err = cli("claims", "init", state_dir=a_file)
    assert code == base.EXIT_ERROR and err.count("\n") == 1
    assert f"cannot create {a_file}" in err and a_file.read_text() == ""


@pytest.mark.parametrize("target", ["dangling", "a-journal"])
def test_init_refuses_a_journal_that_is_a_link_and_makes_nothing_where_it_points(
    cli, tmp_path, target
):
    """Root runs ``claims init`` in a directory nova's user owns: a link
    there, dangling or to a journal, is named and never followed."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if target == "a-journal":
        claims_journal.Journal(str(elsewhere)).close()
    before = sorted(p.name for p in elsewhere.iterdir())
    state = tmp_path / "state"
    state.mkdir()
    (state / "claims.sqlite").symlink_to(elsewhere / "claims.sqlite")
    code, out, err = cli("claims", "init", state_dir=state)
    assert (code, out) == (base.EXIT_ERROR, "")
    assert (
        err.startswith(
            f"error: Refusing {state}/claims.sqlite: it is a link (to '{elsewhere}/claims.sqlite')"
        )
        and err.count("\n") == 1
    ), err
    assert sorted(p.name for p in elsewhere.iterdir()) == before
    assert sorted(p.name for p in state.iterdir()) == ["claims.sqlite"]


@pytest.mark.parametrize(
    "present", [(), ("lost+found",), ("reconciler.json",), ("reconciler.json", "audit.json")]
)
def test_init_takes_a_new_empty_or_own_directory(cli, tmp_path, present):
    state = tmp_path / "mounted"
    state.mkdir()
    for name in present:
        if name.endswith(".json"):
            (state / name).write_text("{}")
        else:
            (state / name).mkdir()
    code, out, err = cli("claims", "init", state_dir=state)
    assert (code, err) == (0, "") and out.endswith("0 claim(s)\n")
    code, out, _ = cli("claims", "init", state_dir=state)  # and again: it is ours now
    assert code == 0 and (state / "claims.sqlite").is_file()


def test_list_says_which_claimed_mdev_is_gone_and_restore_brings_it_back(claimed_host, cli):
    host, held = claimed_host
    host.remove_mdev(held[1])
    code, out, _ = cli("--sysfs-root", host.paths.root, "claims", "list", "-f", "json")
    rows = json.loads(out)
    assert code == 0
    assert [
        (r["instance"], r["vgpu"], r["gpu"], r["type"], r["state"], r["exists"]) for r in rows
    ] == sorted(
        [
            ("inst-0", held[0], A100, "nvidia-468", "attached", True),
            ("inst-1", held[1], A100, "nvidia-468", "attached", False),
        ],
        key=lambda r: r[1],
    )
    assert all(r["age"] >= 0 for r in rows)
    code, out, _ = cli(
        "--sysfs-root",
        host.paths.root,
        "claims",
        "restore",
        "--instance",
        str(uuid.uuid4()),
        "-f",
        "json",
    )
    assert (code, json.loads(out)) == (0, [])
    assert held[1] not in mdevs_of(host)
    code, out, _ = cli("--sysfs-root", host.paths.root, "claims", "restore", "-f", "json")
    assert code == 0
    assert [(r["vgpu"], r["result"]) for r in json.loads(out)] == [(held[1], "restored")]
    assert mdevs_of(host) == sorted(held)


def test_restore_refuses_a_malformed_instance(claimed_host, cli):
    host, _ = claimed_host
    code, out, err = cli(
        "--sysfs-root", host.paths.root, "claims", "restore", "--instance", "../etc"
    )
    assert (code, out) == (base.EXIT_ERROR, "")
    assert err == (
        "error: --instance '../etc': not an instance UUID (lower-case, 8-4-4-4-12 hex digits)\n"
    )


def test_list_without_a_journal_names_the_path(claimed_host, cli, tmp_path):
    host, _ = claimed_host
    code, _, err = cli(
        "--sysfs-root", host.paths.root, "claims", "list", state_dir=tmp_path / "nowhere"
    )
    assert code == base.EXIT_ERROR and f"{tmp_path}/nowhere/claims.sqlite" in err
