"""``vgpu-manage status``: real CLI, fake kernel, real journal, libvirt's
test driver; each source read once."""

import contextlib
import io
import json
import re
import uuid

import pytest

from tests import libvirt_domains
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import domain_index
from vgpu_driver import inventory
from vgpu_driver import status
from vgpu_driver.cmd import base
from vgpu_driver.cmd import manage
from vgpu_driver.cmd import status_commands
from vgpu_driver.fake import fakekernel

T4_CONF = (
    "[devices]\nenabled_mdev_types = nvidia-231, nvidia-222\n"
    "[mdev_nvidia-231]\ndevice_addresses = 0000:18:00.0,0000:19:00.0\n"
)
A100_CONF = "[devices]\nenabled_mdev_types = nvidia-468\n"
UNREACHABLE = "qemu+unix:///system?socket=/nonexistent"


@pytest.fixture
def cli(tmp_path, fake_kernel_cli):
    def run(*argv, conf=T4_CONF, uri="test:///default"):
        conf_file = tmp_path / "nova.conf"
        conf_file.write_text(conf)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = manage.main(
                [
                    "--config-file",
                    str(conf_file),
                    "--nodename",
                    "cn1",
                    "--state-dir",
                    str(tmp_path / "state"),
                    "--libvirt-uri",
                    uri,
                    *argv,
                ]
            )
        return code, out.getvalue(), err.getvalue()

    return run


def claim(journal, instance, mdev, gpu, parent, type_id, state):
    with journal.transaction() as txn:
        txn.add(instance, mdev, gpu, parent, type_id, state=state, created=True)


@pytest.fixture
def busy_t4(make_host, tmp_path):
    """Eight T4: on 18:00.0 one attached guest, one claim in flight and one
    guest nobody claimed; 19:00.0 blocked by an unused mdev of another type;
    35:00.0 receiving a migration."""
    host = make_host("t4x8")
    ids = {
        name: str(uuid.uuid4())
        for name in ("attached", "claimed", "unclaimed", "stale", "incoming")
    }
    inst = {name: str(uuid.uuid4()) for name in ("web", "batch", "legacy", "moving")}
    for name in ("attached", "claimed", "unclaimed"):
        host.create_mdev("0000:18:00.0", "nvidia-231", ids[name])
    host.create_mdev("0000:19:00.0", "nvidia-222", ids["stale"])
    host.create_mdev("0000:35:00.0", "nvidia-222", ids["incoming"])
    journal = claims_journal.Journal(str(tmp_path / "state"))
    claim(
        journal,
        inst["web"],
        ids["attached"],
        "0000:18:00.0",
        "0000:18:00.0",
        "nvidia-231",
        claims.ATTACHED,
    )
    claim(
        journal,
        inst["batch"],
        ids["claimed"],
        "0000:18:00.0",
        "0000:18:00.0",
        "nvidia-231",
        claims.CLAIMED,
    )
    claim(
        journal,
        inst["moving"],
        ids["incoming"],
        "0000:35:00.0",
        "0000:35:00.0",
        "nvidia-222",
        claims.MIGRATING_IN,
    )
    uri = libvirt_domains.node_file(
        tmp_path / "node.xml",
        [
            libvirt_domains.domain_xml("instance-00000001", [ids["attached"]], inst["web"]),
            libvirt_domains.domain_xml("legacy-vm", [ids["unclaimed"]], inst["legacy"]),
        ],
    )
    return host, ids, inst, uri


def rows_of(out):
    return {r["gpu"]: r for r in json.loads(out)}


def test_numbers_guests_and_claims_per_gpu(busy_t4, cli):
    host, ids, inst, uri = busy_t4
    code, out, err = cli("--sysfs-root", host.paths.root, "status", "-f", "json", uri=uri)
    assert (code, err) == (0, "")
    rows = rows_of(out)
    assert len(rows) == 8
    first = rows["0000:18:00.0"]
    assert {
        k: first[k]
        for k in ("provider", "type", "name", "used", "total", "bar", "reserved", "reason", "sriov")
    } == {
        "provider": "cn1_pci_0000_18_00_0",
        "type": "nvidia-231",
        "name": "GRID T4-2Q",
        "used": 3,
        "total": 8,
        "bar": "[####......] 3/8",
        "reserved": 0,
        "reason": None,
        "sriov": None,
    }
    assert sorted(first["guests"], key=lambda g: g["domain"]) == [
        {"vgpu": ids["attached"], "instance": inst["web"], "domain": "instance-00000001"},
        {"vgpu": ids["unclaimed"], "instance": inst["legacy"], "domain": "legacy-vm"},
    ]
    assert first["claims"] == [
        {"vgpu": ids["claimed"], "instance": inst["batch"], "state": "claimed", "stuck_for": None}
    ]
    moving = rows["0000:35:00.0"]
    assert (moving["used"], moving["total"], moving["guests"]) == (1, 16, [])
    assert moving["claims"] == [
        {
            "vgpu": ids["incoming"],
            "instance": inst["moving"],
            "state": "migrating_in",
            "stuck_for": None,
        }
    ]
    idle = rows["0000:36:00.0"]
    assert (idle["used"], idle["bar"], idle["guests"], idle["claims"]) == (
        0,
        "[..........] 0/16",
        [],
        [],
    )


def test_reserved_and_reason_are_what_inventory_says(busy_t4, cli):
    host, _, _, uri = busy_t4
    args = ("--sysfs-root", host.paths.root)
    _, out, _ = cli(*args, "inventory", "-f", "json", uri=uri)
    reported = {r["gpu"]: r for r in json.loads(out)}
    code, out, _ = cli(*args, "status", "-f", "json", uri=uri)
    shown = rows_of(out)
    assert code == 0 and set(shown) == set(reported)
    for gpu, row in shown.items():
        assert (row["provider"], row["total"], row["reserved"], row["reason"]) == (
            reported[gpu]["provider"],
            reported[gpu]["total"],
            reported[gpu]["reserved"],
            reported[gpu]["reason"],
        ), gpu
    blocked = shown["0000:19:00.0"]
    assert blocked["reserved"] == blocked["total"] == 8
    assert blocked["reason"].startswith("blocked by unused mdevs (1 of nvidia-222)")


def test_json_shape_is_one_object_per_gpu_with_snake_case_keys(busy_t4, cli):
    host, _, _, uri = busy_t4
    _, out, _ = cli("--sysfs-root", host.paths.root, "status", "-f", "json", uri=uri)
    for row in json.loads(out):
        assert list(row) == [
            "provider",
            "gpu",
            "type",
            "name",
            "used",
            "total",
            "bar",
            "reserved",
            "reason",
            "vgpus",
            "reserved_for",
            "sriov",
            "guests",
            "claims",
            "framebuffer",
        ]
        assert row["framebuffer"] is None  # on a board of one type
        assert isinstance(row["used"], int) and isinstance(row["guests"], list)
    _, out, _ = cli(
        "--sysfs-root",
        host.paths.root,
        "status",
        "-f",
        "yaml",
        "-c",
        "gpu",
        "-c",
        "claims",
        uri=uri,
    )
    assert "state: migrating_in" in out


def test_table_lists_guests_as_lines_and_ends_with_the_host_line(busy_t4, cli):
    host, ids, inst, uri = busy_t4
    code, out, _ = cli("--sysfs-root", host.paths.root, "status", uri=uri)
    lines = out.splitlines()
    assert code == 0
    assert lines[-1] == (
        "cn1: 8 GPU(s), 8 with a provider; vGPUs [#.........] 4/112 used, "
        "8 reserved; 2 guest(s); 2 claim(s) in flight"
    )
    assert any(f"{inst['web']} (instance-00000001)" in line for line in lines)
    assert any(f"{inst['legacy']} (legacy-vm)" in line for line in lines)
    assert any(f"{inst['batch']}: claimed" in line for line in lines)
    assert "[####......] 3/8" in out
    code, out, _ = cli(
        "--sysfs-root", host.paths.root, "status", "-f", "value", "-c", "gpu", uri=uri
    )
    assert out.split() == sorted(
        rows_of(cli("--sysfs-root", host.paths.root, "status", "-f", "json", uri=uri)[1])
    )


UUID_OR_ADDRESS = re.compile(
    r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}"
    r"|[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]"
)


@pytest.mark.parametrize("width", [100, 80, 60])
def test_a_screen_narrower_than_the_table_gets_a_block_per_gpu(busy_t4, cli, width):
    """At 100 columns (and narrower) every line fits, no address or UUID is
    cut, and every guest, claim and reason of the JSON listing is there."""
    host, ids, inst, uri = busy_t4
    args = ("--sysfs-root", host.paths.root, "status")
    _, wide, _ = cli(*args, uri=uri)
    assert len(wide.splitlines()[0]) > width  # the table would not fit
    code, out, err = cli(*args, "--max-width", str(width), uri=uri)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= width
    whole = set(UUID_OR_ADDRESS.findall(wide))
    assert set(UUID_OR_ADDRESS.findall(out)) == whole
    assert {inst["web"], inst["legacy"], inst["batch"], inst["moving"]} <= whole
    heads = [line.split()[0] for line in lines if line[:1] not in (" ", "")]
    assert heads[:8] == sorted(rows_of(cli(*args, "-f", "json", uri=uri)[1]))
    flat = " ".join(" ".join(lines).split())
    for row in rows_of(cli(*args, "-f", "json", uri=uri)[1]).values():
        if row["reason"]:
            assert row["reason"] in flat
        if row["reserved"]:
            assert (
                f"{row['gpu']} {row['name']} ({row['type']}) {row['bar']} "
                f"{row['reserved']} reserved" in flat
            )
    assert f"guest {inst['web']} (instance-00000001)" in flat
    assert f"claim {inst['moving']}: migrating_in" in flat
    assert flat.endswith("2 guest(s); 2 claim(s) in flight")


def test_the_block_layout_shows_only_the_chosen_columns(busy_t4, cli):
    host, ids, inst, uri = busy_t4
    code, out, _ = cli(
        "--sysfs-root",
        host.paths.root,
        "status",
        "-c",
        "gpu",
        "-c",
        "claims",
        "-c",
        "reason",
        "--max-width",
        "70",
        uri=uri,
    )
    lines = out.splitlines()
    assert code == 0 and max(len(line) for line in lines) <= 70
    assert "0000:35:00.0" in lines
    assert f"    claim     {inst['moving']}: migrating_in" in lines
    blocks = out.split("\ncn1: ")[0]
    assert not any(word in blocks for word in ("provider ", "guest ", "GRID", "[", "cn1"))
    assert any(line.startswith("    reason    blocked by unused mdevs") for line in lines)


def test_a_table_that_fits_stays_a_table(busy_t4, cli):
    host, _, _, uri = busy_t4
    args = ("--sysfs-root", host.paths.root, "status")
    _, unbounded, _ = cli(*args, uri=uri)
    _, out, _ = cli(*args, "--max-width", "400", uri=uri)
    assert out == unbounded and out.startswith("+-")
    _, out, _ = cli(*args, "-c", "gpu", "-c", "bar", "--max-width", "100", uri=uri)
    lines = out.splitlines()
    assert lines[0].startswith("+-") and max(len(line) for line in lines) <= 100
    # The host line wraps between its parts.
    assert lines[-1].startswith("    ") and not lines[-2].startswith(" ")
    assert " ".join(line.strip() for line in lines[-2:]) == (
        "cn1: 8 GPU(s), 8 with a provider; vGPUs [#.........] 4/112 used, 8 reserved; "
        "2 guest(s); 2 claim(s) in flight"
    )


def counting(monkeypatch, owner, name, counts):
    real = getattr(owner, name)

    def counted(*args, **kwargs):
        counts[name] = counts.get(name, 0) + 1
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)


def test_each_source_is_read_once(busy_t4, cli, monkeypatch):
    host, _, _, uri = busy_t4
    counts = {}
    counting(monkeypatch, discovery, "discover", counts)
    counting(monkeypatch, inventory, "compute", counts)
    counting(monkeypatch, claims_journal.Journal, "claims", counts)
    counting(monkeypatch, domain_index.DomainIndex, "_refresh", counts)
    counting(monkeypatch, fakekernel.FakeKernel, "list_mdevs", counts)
    counting(monkeypatch, fakekernel.FakeKernel, "list_parents", counts)
    counting(monkeypatch, fakekernel.FakeKernel, "list_sriov_pfs", counts)
    code, out, _ = cli("--sysfs-root", host.paths.root, "status", "-f", "json", uri=uri)
    assert code == 0 and len(json.loads(out)) == 8
    assert counts == {
        "discover": 1,
        "compute": 1,
        "claims": 1,
        "_refresh": 1,
        "list_mdevs": 1,
        "list_parents": 1,
        "list_sriov_pfs": 1,
    }


def test_a100_sriov_enabled_with_a_guest(make_host, cli, tmp_path, monkeypatch):
    host = make_host("a100-sriov")
    mdev, instance = str(uuid.uuid4()), str(uuid.uuid4())
    host.create_mdev("0000:41:00.4", "nvidia-468", mdev)
    claim(
        claims_journal.Journal(str(tmp_path / "state")),
        instance,
        mdev,
        "0000:41:00.0",
        "0000:41:00.4",
        "nvidia-468",
        claims.ATTACHED,
    )
    uri = libvirt_domains.node_file(
        tmp_path / "node.xml", [libvirt_domains.domain_xml("instance-0000002a", [mdev], instance)]
    )
    counts = {}
    counting(monkeypatch, fakekernel.FakeKernel, "list_sriov_pfs", counts)
    code, out, _ = cli(
        "--sysfs-root", host.paths.root, "status", "-f", "json", conf=A100_CONF, uri=uri
    )
    assert code == 0 and counts == {"list_sriov_pfs": 1}
    (row,) = json.loads(out)
    assert row == {
        "provider": "cn1_pci_0000_41_00_0",
        "gpu": "0000:41:00.0",
        "type": "nvidia-468",
        "name": "NVIDIA A100-4C",
        "used": 1,
        "total": 10,
        "bar": "[#.........] 1/10",
        "reserved": 0,
        "reason": None,
        "vgpus": [{"type": "nvidia-468", "capacity": 10, "used": 1, "reserved": 0, "free": 9}],
        "reserved_for": dict.fromkeys(inventory.RESERVED_FOR, 0),
        "sriov": {"state": "enabled", "numvfs": 16, "totalvfs": 16},
        "guests": [{"vgpu": mdev, "instance": instance, "domain": "instance-0000002a"}],
        "claims": [],
        "framebuffer": None,
    }
    _, out, _ = cli("--sysfs-root", host.paths.root, "status", conf=A100_CONF, uri=uri)
    assert "enabled 16/16" in out and out.splitlines()[-1].endswith("SR-IOV on 1 of 1 board(s)")


def test_a100_with_sriov_off_says_why_it_has_no_provider(make_host, cli):
    host = make_host("a100-sriov-off")
    code, out, err = cli("--sysfs-root", host.paths.root, "status", "-f", "json", conf=A100_CONF)
    assert (code, err) == (0, "")
    (row,) = json.loads(out)
    assert row["provider"] is None and (row["used"], row["total"]) == (0, 0)
    # Served or not, the type is the one nova.conf gives the board (as the
    # metrics say), with nothing offered of it.
    assert row["type"] == "nvidia-468"
    assert row["vgpus"] == [
        {"type": "nvidia-468", "capacity": 0, "used": 0, "reserved": 0, "free": 0}
    ]
    assert row["sriov"] == {"state": "off", "numvfs": 0, "totalvfs": 16}
    assert row["reason"] == (
        "no provider: SR-IOV is off: run vgpu-manage sriov enable 0000:41:00.0"
    )
    _, out, _ = cli("--sysfs-root", host.paths.root, "status", conf=A100_CONF)
    assert "off 0/16" in out
    assert out.splitlines()[-1] == (
        "cn1: 1 GPU(s), 0 with a provider; vGPUs [..........] 0/0 used, 0 reserved; "
        "0 guest(s); 0 claim(s) in flight; SR-IOV on 0 of 1 board(s)"
    )


def test_without_libvirt_gpus_and_claims_are_shown_with_one_warning(busy_t4, cli):
    host, ids, inst, _ = busy_t4
    code, out, err = cli("--sysfs-root", host.paths.root, "status", "-f", "json", uri=UNREACHABLE)
    assert code == base.EXIT_OK
    assert err.count("\n") == 1
    assert err.startswith(f"warning: Cannot reach libvirt at {UNREACHABLE}: ")
    assert err.endswith("Guests are shown as unknown.\n")
    rows = rows_of(out)
    assert all(r["guests"] is None for r in rows.values())
    first = rows["0000:18:00.0"]
    assert first["used"] == 2  # the claims; the unclaimed guest is not known
    assert first["claims"] == [
        {"vgpu": ids["claimed"], "instance": inst["batch"], "state": "claimed", "stuck_for": None}
    ]
    code, out, _ = cli("--sysfs-root", host.paths.root, "status", uri=UNREACHABLE)
    assert code == 0 and "unknown" in out
    assert "guests unknown (libvirt unreachable)" in out.splitlines()[-1]


def test_bad_input_is_one_error_line(busy_t4, cli, tmp_path):
    host, _, _, uri = busy_t4
    cases = [
        (("--sysfs-root", str(tmp_path / "nosys"), "status"), "error: Sysfs root "),
    ]
    empty = tmp_path / "empty-state"
    empty.mkdir()
    (empty / "claims.sqlite").write_bytes(b"")
    cases.append(
        (
            ("--sysfs-root", host.paths.root, "--state-dir", str(empty), "status"),
            f"error: Claims journal {empty}/claims.sqlite is unusable",
        )
    )
    for argv, said in cases:
        code, out, err = cli(*argv, uri=uri)
        assert code == base.EXIT_ERROR, argv
        assert out == "" and err.startswith(said) and err.count("\n") == 1, err
    code, out, err = cli(
        "--sysfs-root",
        host.paths.root,
        "status",
        uri=uri,
        conf="[devices]\nenabled_mdev_types = nvidia-231\n"
        "[mdev_nvidia-231]\ndevice_addresses = not-an-address\n",
    )
    assert code == base.EXIT_ERROR and out == "" and err.startswith("error: ")
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "used,total,expected",
    [
        (0, 10, "[..........] 0/10"),
        (5, 10, "[#####.....] 5/10"),
        (1, 100, "[#.........] 1/100"),
        (99, 100, "[#########.] 99/100"),
        (10, 10, "[##########] 10/10"),
        (12, 8, "[##########] 12/8"),
        (0, 0, "[..........] 0/0"),
        (2, 0, "[##########] 2/0"),
    ],
)
def test_bar(used, total, expected):
    assert status.bar(used, total) == expected


def test_columns_match_the_listing():
    assert status_commands.COLUMNS == (
        "provider",
        "gpu",
        "type",
        "name",
        "used",
        "total",
        "bar",
        "reserved",
        "reason",
        "vgpus",
        "reserved_for",
        "sriov",
        "guests",
        "claims",
        "framebuffer",
    )


def test_a_guest_with_two_vgpus_of_a_gpu_is_one_table_line():
    guests = (
        status.Guest("m1", "i1", "train-1"),
        status.Guest("m2", "i1", "train-1"),
        status.Guest("m3", "i2", "ml-1"),
    )
    column = status_commands.GuestsColumn(guests)
    # One line per guest, by domain name.
    assert column.human_readable() == "i2 (ml-1)\ni1 (train-1) x2"
    assert [g["vgpu"] for g in column.machine_readable()] == ["m1", "m2", "m3"]
    assert status_commands.GuestsColumn(None).machine_readable() is None
