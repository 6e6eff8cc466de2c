"""``status``, ``inventory`` and ``metrics`` of fixed fake hosts, whole, as
golden files (``tools/regen-golden.sh`` rewrites them).

Every vGPU, instance and domain has a fixed UUID; the only values that
change between runs, the host's temporary path, the times claims changed and
how long a read took,
are replaced with fixed words before comparing.
"""

import json
import re

import pytest

from tests import golden
from tests import libvirt_domains
from tests.unit import test_cli_status
from vgpu_driver import claims
from vgpu_driver import claims_journal

cli = test_cli_status.cli
T4_CONF = test_cli_status.T4_CONF
A100_CONF = test_cli_status.A100_CONF
L40S = "0000:c1:00.0"
MIXED = ("nvidia-1155", "nvidia-1156", "nvidia-1157", "nvidia-1159")
L40S_CONF = (
    "[devices]\nenabled_mdev_types = "
    + ", ".join(MIXED)
    + "\n"
    + "".join(f"[mdev_{t}]\ndevice_addresses = {L40S}\n" for t in MIXED)
)


def fixed(n):
    return f"00000000-0000-4000-8000-{n:012d}"


def claim(journal, instance, mdev, gpu, type_id, state, parent=None):
    with journal.transaction() as txn:
        txn.add(instance, mdev, gpu, parent or gpu, type_id, state=state, created=True)


@pytest.fixture
def t4_busy(make_host, tmp_path):
    """Eight T4: an attached guest, a claim in flight and a guest nobody
    claimed on 18:00.0; 19:00.0 blocked by an unused mdev of another type;
    35:00.0 receiving a migration."""
    host = make_host("t4x8")
    for n in (1, 2, 3):
        host.create_mdev("0000:18:00.0", "nvidia-231", fixed(n))
    host.create_mdev("0000:19:00.0", "nvidia-222", fixed(4))
    host.create_mdev("0000:35:00.0", "nvidia-222", fixed(5))
    journal = claims_journal.Journal(str(tmp_path / "state"))
    claim(journal, fixed(101), fixed(1), "0000:18:00.0", "nvidia-231", claims.ATTACHED)
    claim(journal, fixed(102), fixed(2), "0000:18:00.0", "nvidia-231", claims.CLAIMED)
    claim(journal, fixed(104), fixed(5), "0000:35:00.0", "nvidia-222", claims.MIGRATING_IN)
    uri = libvirt_domains.node_file(
        tmp_path / "node.xml",
        [
            libvirt_domains.domain_xml("instance-00000001", [fixed(1)], fixed(101)),
            libvirt_domains.domain_xml("legacy-vm", [fixed(3)], fixed(103)),
        ],
    )
    return host, T4_CONF, uri


@pytest.fixture
def a100_sriov(make_host, tmp_path):
    """An A100 with its 16 VFs on, two of them hosting a guest's vGPU."""
    host = make_host("a100-sriov")
    host.create_mdev("0000:41:00.4", "nvidia-468", fixed(11))
    host.create_mdev("0000:41:00.5", "nvidia-468", fixed(12))
    journal = claims_journal.Journal(str(tmp_path / "state"))
    for n in (11, 12):
        claim(
            journal,
            fixed(111),
            fixed(n),
            "0000:41:00.0",
            "nvidia-468",
            claims.ATTACHED,
            parent=f"0000:41:00.{n - 7}",
        )
    uri = libvirt_domains.node_file(
        tmp_path / "node.xml",
        [libvirt_domains.domain_xml("instance-00000002", [fixed(11), fixed(12)], fixed(111))],
    )
    return host, A100_CONF, uri


@pytest.fixture
def a100_sriov_off(make_host, tmp_path):
    """The same A100 after a reboot: SR-IOV capable, no VF on."""
    host = make_host("a100-sriov-off")
    return host, A100_CONF, libvirt_domains.node_file(tmp_path / "node.xml", [])


@pytest.fixture
def l40s_mixed(make_host, tmp_path):
    """An L40S in mixed-size mode configured for four sizes: a 4 GB and a
    12 GB vGPU on two VFs, one guest using both."""
    host = make_host("l40s-vfio")
    host.set_mixed_sizes(L40S, True)
    host.set_vendor_vgpu_type("0000:c1:00.4", 1155)
    host.set_vendor_vgpu_type("0000:c1:00.5", 1157)
    uri = libvirt_domains.node_file(
        tmp_path / "node.xml",
        [
            libvirt_domains.domain_xml(
                "instance-00000003", (), fixed(121), vfs=["0000:c1:00.4", "0000:c1:00.5"]
            )
        ],
    )
    return host, L40S_CONF, uri


@pytest.fixture
def l40s_idle(make_host, tmp_path):
    """An L40S in mixed-size mode whose three typed VFs no guest has opened:
    NVML lists none of them as active; each VF's placement_id places it."""
    host = make_host("l40s-vfio")
    host.set_mixed_sizes(L40S, True)
    for vf, number in (("0000:c1:00.4", 1155), ("0000:c1:00.5", 1157), ("0000:c1:00.6", 1156)):
        host.set_vendor_vgpu_type(vf, number)
    return host, L40S_CONF, libvirt_domains.node_file(tmp_path / "node.xml", [])


@pytest.fixture
def h100_datacenter(make_host, tmp_path):
    """An H100 under the data-center driver: a GPU with no vGPU at all."""
    host = make_host("h100-datacenter")
    conf = "[devices]\nenabled_mdev_types = nvidia-468\n"
    return host, conf, libvirt_domains.node_file(tmp_path / "node.xml", [])


HOSTS = ("t4_busy", "a100_sriov", "a100_sriov_off", "l40s_mixed", "h100_datacenter")
COMMANDS = {
    "status": ("status",),
    "status.json": ("status", "-f", "json"),
    "inventory": ("inventory",),
    "inventory.json": ("inventory", "-f", "json"),
    "metrics": ("metrics",),
}
# Times of the run (claims' changes) and how long a read took.
AGE = re.compile(
    r"^(vgpu_(?:claims_waiting_oldest_timestamp|scrape_duration)_seconds"
    r"(?:\{[^}]*\})?) \S+$",
    re.M,
)


def normalised(text, host, tmp_path):
    """The output without what differs from run to run."""
    text = text.replace(str(host.paths.root), "<sysfs-root>")
    text = text.replace(str(tmp_path), "<tmp>")
    return AGE.sub(r"\1 <age>", text)


@pytest.mark.parametrize("command", ["status", "status.json"])
def test_idle_vgpus_are_all_placed_in_the_map(request, tmp_path, cli, command):
    host, conf, uri = request.getfixturevalue("l40s_idle")
    code, out, err = cli("--sysfs-root", host.paths.root, *COMMANDS[command], conf=conf, uri=uri)
    assert "?" not in out.split("--- stderr")[0]
    golden.assert_golden(
        f"cli/l40s_idle.{command}",
        normalised(f"exit {code}\n--- stdout\n{out}--- stderr\n{err}", host, tmp_path),
    )


@pytest.mark.parametrize("host_name", ["l40s_idle", "l40s_mixed"])
def test_each_types_free_vgpus_are_what_fits_now(request, cli, host_name):
    """The vgpus column says what the size classes grant ("fit now" in the
    reason), not what the free MiB would hold unfragmented: on the idle
    board 4 x 4 GB fit (IDs 8, 32, 36, 44), not 5."""
    host, conf, uri = request.getfixturevalue(host_name)
    code, out, _err = cli(
        "--sysfs-root", host.paths.root, "status", "-f", "json", conf=conf, uri=uri
    )
    assert code == 0
    (row,) = [r for r in json.loads(out) if r["provider"]]
    sizes = {"nvidia-1155": 4096, "nvidia-1156": 8192, "nvidia-1157": 12288, "nvidia-1159": 24576}
    fits = {
        int(mib): int(count)
        for count, mib in re.findall(r"(\d+) x (\d+) MiB", row["reason"].split(";")[0])
    }
    free = {t["type"]: t["free"] for t in row["vgpus"]}
    assert free == {t: fits.get(mib, 0) for t, mib in sizes.items()}
    if host_name == "l40s_idle":
        assert free["nvidia-1155"] == 4


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("host_name", HOSTS)
def test_output_is_the_golden_file(request, tmp_path, cli, host_name, command):
    host, conf, uri = request.getfixturevalue(host_name)
    code, out, err = cli("--sysfs-root", host.paths.root, *COMMANDS[command], conf=conf, uri=uri)
    golden.assert_golden(
        f"cli/{host_name}.{command}",
        normalised(f"exit {code}\n--- stdout\n{out}--- stderr\n{err}", host, tmp_path),
    )
