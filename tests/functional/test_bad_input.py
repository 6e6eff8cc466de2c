"""Bad input through the real CLI: every case exits as the contract says,
with one ``error:`` line naming the culprit, and changes nothing.

One world is shared by every case: a fake host with claimed, attached mdevs,
its journal, and its providers synced into one real Placement.  Before and
after each case the whole world is snapshotted: the sysfs tree, the files
around it, the journal's rows and version, and every provider in Placement
with its generation, inventories and traits.
"""

import contextlib
import hashlib
import io
import json
import os
import sqlite3
import uuid

import pytest

from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import placement
from vgpu_driver import placement_service
from vgpu_driver.cmd import base
from vgpu_driver.cmd import manage
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

A100 = "0000:41:00.0"
CONF = "[devices]\nenabled_mdev_types = nvidia-468\n"
KEYSTONE_DOWN = (
    "[placement]\nauth_type = password\nauth_url = http://127.0.0.1:9/v3\n"
    "username = u\npassword = p\nproject_name = p\n"
    "user_domain_name = Default\nproject_domain_name = Default\n"
)


class World:
    def __init__(self, root, service):
        self.root = str(root)
        self.service = service
        self.sys = os.path.join(self.root, "sys")
        self.state = os.path.join(self.root, "state")
        self.host = fakekernel.FakeKernel.build(self.sys, profiles.load("a100-sriov"))
        journal = claims_journal.Journal(self.state)
        for number in range(3):
            mdev, parent = str(uuid.uuid4()), f"0000:41:00.{4 + number}"
            self.host.create_mdev(parent, "nvidia-468", mdev)
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
        self.write("nova.conf", CONF)
        self.make_bad_inputs()

    def path(self, *parts):
        return os.path.join(self.root, *parts)

    def write(self, name, data):
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        return path

    def make_bad_inputs(self):
        os.makedirs(self.path("empty-dir"))
        os.makedirs(self.path("bus-only", "bus"))
        self.write("journals/zero/claims.sqlite", b"")
        self.write("journals/garbage/claims.sqlite", b"SQLite format 2\0" + b"x" * 5000)
        with open(os.path.join(self.state, "claims.sqlite"), "rb") as f:
            good = f.read()
        self.write("journals/truncated/claims.sqlite", good[: len(good) // 2 + 7])
        for name, setup in (
            ("newer", "CREATE TABLE claims (x); PRAGMA user_version = 9"),
            ("foreign", "CREATE TABLE other (x)"),
        ):
            self.write(f"journals/{name}/.keep", "")
            db = sqlite3.connect(self.path("journals", name, "claims.sqlite"))
            db.executescript(setup)
            db.close()

    def run(self, argv, conf=CONF, env=None):
        conf_file = self.write("case.conf", conf)
        saved = dict(os.environ)
        os.environ.update(self.service.cli_environment() if env is None else env)
        if env == {}:
            for key in [k for k in os.environ if k.startswith("OS_")]:
                del os.environ[key]
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = manage.main(
                    [
                        "--config-file",
                        conf_file,
                        "--nodename",
                        "cn1",
                        "--sysfs-root",
                        self.sys,
                        "--state-dir",
                        self.state,
                        "--libvirt-uri",
                        "test:///default",
                        *[a.format(w=self.root) for a in argv],
                    ]
                )
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return code, out.getvalue(), err.getvalue()

    # -- what must not change ---------------------------------------------------------------

    def files(self):
        found = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, self.root)
                if name.endswith(("-wal", "-shm", "case.conf")) or rel == os.path.join(
                    "state", "claims.sqlite"
                ):
                    continue
                if os.path.islink(path):
                    found[rel] = "-> " + os.readlink(path)
                elif os.path.isdir(path):
                    found[rel] = "dir"
                else:
                    with open(path, "rb") as f:
                        found[rel] = hashlib.sha256(f.read()).hexdigest()
        return found

    def journal_rows(self):
        db = sqlite3.connect(f"file:{self.state}/claims.sqlite?mode=ro", uri=True)
        try:
            return (
                db.execute("PRAGMA user_version").fetchone(),
                db.execute("SELECT * FROM claims ORDER BY mdev_uuid").fetchall(),
            )
        finally:
            db.close()

    def placement(self):
        conn = self.service.connection()

        def get(url):
            return conn.placement.request(url, "GET", microversion=placement.MICROVERSION).json()

        view = []
        for rp in get("/resource_providers")["resource_providers"]:
            base_url = f"/resource_providers/{rp['uuid']}"
            view.append(
                (
                    rp["name"],
                    rp["generation"],
                    rp["parent_provider_uuid"],
                    get(f"{base_url}/inventories")["inventories"],
                    sorted(get(f"{base_url}/traits")["traits"]),
                )
            )
        return sorted(view, key=str)

    def snapshot(self):
        return self.files(), self.journal_rows(), self.placement()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    with placement_service.EmbeddedPlacement() as service:
        world = World(tmp_path_factory.mktemp("world"), service)
        code, _, err = world.run(["sync"])
        assert code == 0, err
        world.run(["--nodename", "cn2", "sync"])  # another host's tree
        yield world


S = "--sysfs-root"
D = "--state-dir"
J = "{w}/journals"


def case(name, argv, culprit, conf=CONF, env=None, code=base.EXIT_ERROR):
    return pytest.param(argv, culprit, conf, env, code, id=name)


CASES = [
    # Nodenames Placement cannot take, or that would hit another host.
    *[
        case(f"nodename-{label}-{cmd}", ["--nodename", value, cmd], culprit)
        for label, value, culprit in (
            ("empty", "", "Refusing nodename ''"),
            ("blank", "   ", "Refusing nodename '   '"),
            ("leading-space", " cn1", "white space"),
            ("trailing-space", "cn1 ", "white space"),
            ("tab", "c\tn", "control characters"),
            ("newline", "cn\n1", "control characters"),
            ("190-chars", "n" * 190, "207 characters"),
            ("201-chars", "n" * 201, "218 characters"),
        )
        for cmd in ("sync", "inventory")
    ],
    case("nodename-empty-audit", ["--nodename", "", "audit"], "Refusing nodename ''"),
    case("nodename-empty-dry-run", ["--nodename", "", "sync", "--dry-run"], "Refusing nodename ''"),
    # Sysfs roots that are not sysfs.
    *[
        case(f"sysfs-{label}-{' '.join(cmd)}", [S, root, *cmd], culprit)
        for label, root, culprit in (
            ("missing", "{w}/no-such-sys", "{w}/no-such-sys does not exist"),
            ("a-file", "{w}/nova.conf", "{w}/nova.conf is not a directory"),
            ("empty-dir", "{w}/empty-dir", "has no bus/ and no class/"),
            ("bus-only", "{w}/bus-only", "{w}/bus-only has no class/"),
        )
        for cmd in (
            ("types",),
            ("inventory",),
            ("mdev", "list"),
            ("sync",),
            ("orphans", "reclaim"),
            ("claims", "restore"),
            ("metrics",),
        )
    ],
    case(
        "sysfs-missing-config-check", [S, "{w}/nope", "config", "check"], "{w}/nope does not exist"
    ),
    case("sysfs-missing-claims-list", [S, "{w}/nope", "claims", "list"], "{w}/nope does not exist"),
    # State dirs and journals that must not be read as "no claims".
    *[
        case(f"journal-{label}-{' '.join(cmd)}", [D, state, *cmd], culprit)
        for label, state, culprit in (
            (
                "typo",
                "{w}/sate",
                "No claims journal at {w}/sate/claims.sqlite: the state directory does not exist",
            ),
            (
                "a-file",
                "{w}/nova.conf",
                "{w}/nova.conf/claims.sqlite: the state directory is not a directory",
            ),
            ("no-file", "{w}/empty-dir", "{w}/empty-dir/claims.sqlite: the file does not"),
            ("zero-bytes", f"{J}/zero", f"{J}/zero/claims.sqlite is unusable (the file is empty"),
            (
                "garbage",
                f"{J}/garbage",
                f"{J}/garbage/claims.sqlite is unusable (file is not a database",
            ),
            ("truncated", f"{J}/truncated", f"{J}/truncated/claims.sqlite is unusable"),
            ("newer", f"{J}/newer", f"{J}/newer/claims.sqlite has schema version 9"),
            (
                "foreign",
                f"{J}/foreign",
                f"{J}/foreign/claims.sqlite is unusable (it holds no claims table",
            ),
        )
        for cmd in (("orphans", "reclaim"), ("claims", "list"), ("mdev", "list"))
        # A view works without a journal nova-compute never made (see below).
        if not (cmd == ("mdev", "list") and label in ("typo", "no-file"))
    ],
    *[
        case(f"journal-typo-{' '.join(cmd)}", [D, "{w}/sate", *cmd], "{w}/sate/claims.sqlite")
        for cmd in (
            ("orphans", "list"),
            ("claims", "restore"),
            ("sync",),
            ("audit",),
            ("sync", "--dry-run"),
        )
    ],
    case("journal-garbage-sync", [D, f"{J}/garbage", "sync"], f"{J}/garbage/claims.sqlite"),
    case(
        "claims-init-into-another-programs-dir",
        [D, "{w}/journals", "claims", "init"],
        "Refusing to create a claims journal in {w}/journals: it already holds 5 other",
    ),
    case(
        "claims-init-into-a-file",
        [D, "{w}/nova.conf", "claims", "init"],
        "cannot create {w}/nova.conf",
    ),
    case(
        "claims-init-over-an-empty-file",
        [D, f"{J}/zero", "claims", "init"],
        f"{J}/zero/claims.sqlite is unusable (the file is empty",
    ),
    case(
        "claims-init-over-another-database",
        [D, f"{J}/foreign", "claims", "init"],
        f"{J}/foreign/claims.sqlite is unusable (it holds no claims table",
    ),
    case(
        "restore-instance-path",
        ["claims", "restore", "--instance", "../etc"],
        "--instance '../etc': not an instance UUID",
    ),
    case("restore-instance-upper", ["claims", "restore", "--instance", "ABC"], "--instance 'ABC'"),
    # Configuration that cannot be used.
    case(
        "config-file-a-dir",
        ["--config-file", "{w}/empty-dir", "inventory"],
        "{w}/empty-dir: Is a directory",
    ),
    case("config-file-missing", ["--config-file", "{w}/nova.cnf", "inventory"], "{w}/nova.cnf"),
    case("config-unparsable", ["sync"], "case.conf", conf="[devices\nenabled_mdev_types=x\n"),
    case(
        "config-max-instances-0",
        ["sync"],
        "[mdev_nvidia-468] max_instances = '0'",
        conf=CONF + "[mdev_nvidia-468]\nmax_instances = 0\n",
    ),
    case(
        "config-bad-class",
        ["sync"],
        "[mdev_nvidia-468] mdev_class = 'vgpu'",
        conf=CONF + "[mdev_nvidia-468]\nmdev_class = vgpu\n",
    ),
    case(
        "config-bad-address",
        ["orphans", "reclaim"],
        "'0000:41:00'",
        conf=CONF + "[mdev_nvidia-468]\ndevice_addresses = 0000:41:00\n",
    ),
    case(
        "config-bad-address-inventory",
        ["inventory"],
        "'0000:41:00'",
        conf=CONF + "[mdev_nvidia-468]\ndevice_addresses = 0000:41:00\n",
    ),
    # Placement and Keystone that cannot be used.
    case("no-credentials-sync", ["sync"], "No usable credentials for Placement", env={}),
    case("no-credentials-audit", ["audit"], "No usable credentials for Placement", env={}),
    case(
        "keystone-down-sync",
        ["sync"],
        "Keystone did not answer at http://127.0.0.1:9/v3",
        conf=CONF + KEYSTONE_DOWN,
        env={},
    ),
    case(
        "keystone-down-dry-run",
        ["sync", "--dry-run"],
        "Keystone did not answer",
        conf=CONF + KEYSTONE_DOWN,
        env={},
    ),
    # Files the CLI would write.
    case(
        "fake-host-into-a-host",
        ["fake-host", "create", "--profile", "t4x8", "{w}/sys"],
        "{w}/sys is not empty",
    ),
    case(
        "fake-host-into-a-file",
        ["fake-host", "create", "--profile", "t4x8", "{w}/nova.conf"],
        "{w}/nova.conf is not empty",
    ),
    case(
        "fake-host-under-a-file",
        ["fake-host", "create", "--profile", "t4x8", "{w}/nova.conf/sub/host"],
        "Cannot write the fake host at {w}/nova.conf/sub/host: Not a directory",
    ),
    case(
        "fake-host-unknown-profile",
        ["fake-host", "create", "--profile", "t5", "{w}/new-host"],
        "No fake-host profile named 't5'",
    ),
    case(
        "fake-host-clashing-profiles",
        ["fake-host", "create", "--profile", "t4x8", "--profile", "t4x8", "{w}/new-host"],
        "Cannot write the fake host at {w}/new-host: File exists: devices/pci0000:18/",
    ),
    case("demo-dir-a-file", ["demo", "--dir", "{w}/nova.conf"], "{w}/nova.conf"),
    case(
        "metrics-output-under-a-file",
        ["metrics", "--output", "{w}/nova.conf/vgpu.prom"],
        "Cannot write the metrics to {w}/nova.conf/vgpu.prom: Not a directory",
    ),
    case(
        "metrics-output-a-directory",
        ["metrics", "--output", "{w}/empty-dir"],
        "--output '{w}/empty-dir': node_exporter's textfile collector reads only files "
        "named *.prom",
    ),
    case("metrics-nodename-empty", ["--nodename", "", "metrics"], "Refusing nodename ''"),
    case(
        "metrics-journal-garbage",
        [D, f"{J}/garbage", "metrics"],
        f"{J}/garbage/claims.sqlite is unusable (file is not a database",
    ),
    case(
        "metrics-serve-sysfs-missing",
        [S, "{w}/no-such-sys", "metrics", "serve", "--listen", "127.0.0.1:0"],
        "{w}/no-such-sys does not exist",
    ),
    case(
        "metrics-serve-listen-no-port",
        ["metrics", "serve", "--listen", "localhost"],
        "--listen 'localhost': give ADDR:PORT",
    ),
    # Usage errors: argparse's and cliff's, each one error: line too.
    case("usage-bad-format", ["types", "-f", "xml"], "argument -f/--format: invalid choice"),
    case(
        "usage-conflicting-flags",
        ["sriov", "enable", "--all", "--configured"],
        "argument --configured: not allowed with argument --all",
    ),
    case(
        "usage-misspelled-command",
        ["typos"],
        "'typos' is not a vgpu-manage command (did you mean 'types'?)",
    ),
    case("usage-command-option-first", ["-f", "json", "types"], "unknown option '-f'"),
    case(
        "usage-missing-value",
        ["types", "--sort-column"],
        "argument --sort-column: expected one argument",
    ),
    case(
        "usage-missing-global-value", ["--state-dir"], "argument --state-dir: expected one argument"
    ),
    case("usage-unknown-column", ["types", "-c", "nope"], "-c 'nope': no such column"),
    case("usage-unknown-argument", ["inventory", "--bogus"], "unrecognized arguments: --bogus"),
    case(
        "usage-global-abbreviation",
        ["claims", "drop", "--state", "claimed"],
        "unrecognized arguments: --state claimed",
    ),
    # Empty options never fall back to a default (the real /sys, for one).
    *[
        case(f"empty-{option}-{' '.join(cmd)}", [option, value, *cmd], f"{option} {value!r}: empty")
        for option, value, cmd in (
            (S, "", ("types",)),
            (S, " ", ("sriov", "status")),
            (D, "", ("claims", "list")),
            (D, "", ("orphans", "reclaim")),
            ("--libvirt-uri", "", ("orphans", "list")),
        )
    ],
    # Numbers of seconds that are not.
    *[
        case(
            f"seconds-{label}-{' '.join(cmd)}",
            [*cmd, option, value],
            f"argument {option}: {value!r} is not a",
        )
        for label, value in (("nan", "nan"), ("inf", "inf"), ("negative", "-1"), ("text", "soon"))
        for cmd, option in (
            (("sriov", "enable", "--all"), "--wait"),
            (("orphans", "reclaim"), "--grace"),
        )
    ],
    # Configuration files that cannot be read are named.
    case(
        "config-not-utf8",
        ["inventory"],
        "case.conf: not UTF-8 text",
        conf=b"[devices]\nenabled_mdev_types = nvidia-468\xff\n",
    ),
    case(
        "limits-url-without-scheme",
        ["limits", "check"],
        "auth_url is not an http:// or https:// URL",
        conf=CONF + "[oslo_limit]\nauth_type = password\nauth_url = keystone:5000/v3\n"
        "username = u\npassword = p\nuser_domain_name = Default\n"
        "system_scope = all\nendpoint_id = e\n",
        env={},
    ),
]


@pytest.mark.parametrize("argv, culprit, conf, env, code", CASES)
def test_bad_input(world, argv, culprit, conf, env, code):
    before = world.snapshot()
    got, out, err = world.run(argv, conf=conf, env=env)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert got == code, err
    assert len(errors) == 1, err
    assert culprit.format(w=world.root) in errors[0]
    assert "Traceback" not in err and out == ""
    assert world.snapshot() == before


@pytest.mark.parametrize("state", ["{w}/sate", "{w}/empty-dir"])
@pytest.mark.parametrize("view", [("inventory",), ("mdev", "list"), ("status",)])
def test_a_view_works_without_a_journal_and_says_claims_are_not_counted(world, view, state):
    """A host nova-compute never ran on (no journal) can be looked at; the
    writers above still refuse it."""
    before = world.snapshot()
    got, out, err = world.run([D, state, *view, "-f", "json"])
    warnings = [line for line in err.splitlines() if "claims are not counted" in line]
    assert got == base.EXIT_OK, err
    assert json.loads(out) and len(warnings) == 1, err
    assert f"No claims journal at {state.format(w=world.root)}/claims.sqlite" in warnings[0]
    assert world.snapshot() == before


def test_there_are_at_least_ninety_cases():
    assert len(CASES) >= 90


def test_the_snapshot_sees_every_kind_of_change(world):
    """The table's 'unchanged' could not pass by a blind snapshot."""
    files, rows, providers = world.snapshot()
    code, _, err = world.run(["--nodename", "cn3", "sync"])
    assert code == 0, err
    assert world.placement() != providers
    world.host.remove_mdev(rows[1][0][0])
    assert world.files() != files
    journal = claims_journal.Journal(world.state, create=False)
    with journal.transaction() as txn:
        txn.remove(mdev_uuids=[rows[1][0][0]])
    assert world.journal_rows() != rows
