"""Live migration between two fake hosts, each with its own libvirt (test
driver), journal and fake kernel: version gates, the mdev mapping, rollback,
and a destination restarting in the middle."""

import re
import uuid
from types import MappingProxyType

import pytest

from tests import libvirt_domains
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import guest
from vgpu_driver import inventory
from vgpu_driver import libvirt_host
from vgpu_driver import mdevs
from vgpu_driver import migration
from vgpu_driver import names
from vgpu_driver import reconcile
from vgpu_driver.conf import mdev_settings

A100 = "0000:41:00.0"


class Compute:
    """One compute host: fake kernel, libvirt test driver, journal, manager."""

    def __init__(self, root, kernel, types, name):
        self.root, self.kernel, self.name = root, kernel, name
        self.config = mdev_settings.MdevConfig(
            types=tuple(mdev_settings.TypeConfig(t) for t in types),
            default_type=types[0],
            by_address=MappingProxyType({}),
        )
        uri = libvirt_domains.node_file(root / f"{name}-node.xml", [])
        self.libvirt = libvirt_host.LibvirtHost(uri)
        self.restart()

    def restart(self):
        """A new process: everything in memory is gone, the journal stays."""
        journal = claims_journal.Journal(str(self.root / f"{self.name}-state"))
        self.manager = mdevs.MdevManager(self.kernel, journal, self.libvirt, self.config)
        self.reconciler = reconcile.Reconciler(self.manager)
        self.migrations = migration.Migrations(self.manager)
        snapshot = discovery.discover(self.kernel)
        tree = inventory.compute(
            snapshot,
            self.config,
            self.name,
            boards=inventory.read_boards(self.kernel, snapshot, self.config),
        )
        self.providers = {f"rp-{self.name}-{p.gpu}": p for p in tree.providers}

    def allocation(self, gpu, units=1):
        rp = f"rp-{self.name}-{gpu}"
        return {rp: {"resources": {"VGPU": units}}}

    def boot(self, name, gpu, units=1):
        instance = str(uuid.uuid4())
        got = self.manager.allocate(instance, self.allocation(gpu, units), self.providers)
        vfs = [g for g in got if names.is_vf_vgpu_id(g)]
        self.libvirt.conn.defineXML(
            libvirt_domains.domain_xml(name, [g for g in got if g not in vfs], instance, vfs=vfs)
        )
        self.manager.mark_attached(instance)
        return instance, got

    def states(self, instance):
        return sorted(c.state for c in self.manager.journal.claims(instance))


@pytest.fixture
def pair(make_host, tmp_path):
    source = Compute(tmp_path, make_host("a100-sriov"), ["nvidia-468"], "src")
    destination = Compute(tmp_path, make_host("a100-sriov"), ["nvidia-468"], "dst")
    return source, destination


def migrate(source, destination, instance, mdevs_on_source, units=1):
    """What the two computes do, in order, for one live migration."""
    types = source.migrations.source_mdev_types(mdevs_on_source)
    mapping = destination.migrations.claim_incoming(
        instance, types, destination.allocation(A100, units), destination.providers
    )
    dom = source.libvirt.conn.lookupByUUIDString(instance)
    xml = libvirt_domains.migrated_xml(dom.XMLDesc(0), mapping)
    return mapping, xml, dom


def test_success_moves_the_guest_to_mdevs_claimed_on_the_destination(pair):
    source, destination = pair
    instance, on_source = source.boot("web-1", A100, units=2)
    mapping, xml, dom = migrate(source, destination, instance, on_source, units=2)
    assert sorted(mapping) == sorted(on_source)
    assert destination.states(instance) == [claims.MIGRATING_IN] * 2
    destination.libvirt.conn.defineXML(xml)  # the guest arrives
    dom.undefine()  # and leaves the source
    destination.migrations.finish_incoming(instance)
    source.migrations.finish_outgoing(instance)
    arrived = destination.libvirt.conn.lookupByUUIDString(instance)
    assert sorted(guest.mdev_uuids(guest.parse(arrived.XMLDesc(0)))) == sorted(mapping.values())
    assert destination.states(instance) == [claims.ATTACHED] * 2
    assert source.manager.journal.claims(instance) == []
    assert {m.uuid for m in destination.kernel.list_mdevs()} == set(mapping.values())
    # The source's mdevs are free for the next guest.
    assert sorted(
        source.manager.allocate("next", source.allocation(A100, 2), source.providers)
    ) == sorted(on_source)


def test_unsupported_type_is_refused_before_anything_is_claimed(make_host, tmp_path):
    source = Compute(tmp_path, make_host("a100-sriov"), ["nvidia-468"], "src")
    t4 = Compute(tmp_path, make_host("t4x8"), ["nvidia-222"], "dst")
    instance, on_source = source.boot("web-1", A100)
    types = source.migrations.source_mdev_types(on_source)
    with pytest.raises(migration.MigrationPreCheckFailed) as caught:
        t4.migrations.claim_incoming(instance, types, t4.allocation("0000:18:00.0"), t4.providers)
    assert (
        "source mdev types ['nvidia-468'] are not served by this host (it serves "
        "['nvidia-222'])" in str(caught.value)
    )
    assert t4.manager.journal.claims() == [] and t4.kernel.list_mdevs() == []


def test_rollback_removes_only_what_the_attempt_created(pair):
    source, destination = pair
    free = str(uuid.uuid4())
    destination.kernel.create_mdev("0000:41:00.4", "nvidia-468", free)  # reusable
    instance, on_source = source.boot("web-1", A100, units=2)
    mapping, _xml, _dom = migrate(source, destination, instance, on_source, units=2)
    assert free in mapping.values()
    created = [u for u in mapping.values() if u != free]
    removed = destination.migrations.rollback_incoming(instance)
    assert removed == created
    assert destination.manager.journal.claims() == []
    assert {m.uuid for m in destination.kernel.list_mdevs()} == {free}
    assert source.states(instance) == [claims.ATTACHED] * 2  # the guest never left


def test_destination_restart_during_migration_keeps_the_claims(pair):
    source, destination = pair
    instance, on_source = source.boot("web-1", A100)
    mapping, xml, dom = migrate(source, destination, instance, on_source)
    destination.restart()
    destination.reconciler.clean_stale_claims(grace=0)  # what init_host does
    assert destination.states(instance) == [claims.MIGRATING_IN]
    # Even a reboot of the destination: the claimed mdev comes back.
    destination.kernel.reboot()
    destination.kernel.set_vfs(A100, 16)
    outcomes = destination.reconciler.restore()
    assert [(o.mdev_uuid, o.result) for o in outcomes] == [(list(mapping.values())[0], "restored")]
    # Nothing else can take it while the migration is under way.
    other = destination.manager.allocate(
        "other", destination.allocation(A100), destination.providers
    )
    assert other[0] not in mapping.values()
    destination.libvirt.conn.defineXML(xml)
    dom.undefine()
    destination.migrations.finish_incoming(instance)
    assert destination.states(instance) == [claims.ATTACHED]


def test_the_kernel_gate_names_the_side_and_version():
    migration.check_kernel("i-1", "source", "5.18.0-1-generic")
    with pytest.raises(migration.MigrationPreCheckFailed) as caught:
        migration.check_kernel("i-1", "destination", "5.15.0-91-generic")
    assert str(caught.value) == (
        "Cannot live-migrate instance i-1 with vGPUs: the "
        "destination host's Linux kernel is 5.15.0, 5.18.0 or "
        "later is needed"
    )


def test_post_copy_warning(caplog):
    assert migration.post_copy_warning(False) is None
    assert "post-copy" in migration.post_copy_warning(True)
    assert "live_migration_permit_post_copy is on" in caplog.text


L40S = "0000:c1:00.0"
L40S_8Q = "nvidia-1156"


@pytest.fixture
def vf_pair(make_host, tmp_path):
    """Two hosts with an L40S each, under NVIDIA's vendor-specific VFIO."""
    source = Compute(tmp_path, make_host("l40s-vfio"), [L40S_8Q], "src")
    destination = Compute(tmp_path, make_host("l40s-vfio"), [L40S_8Q], "dst")
    return source, destination


def typed_vfs(compute):
    return {v.id: v.type_id for v in discovery.discover(compute.kernel).vgpus}


def test_vendor_vfio_vfs_move_to_vfs_typed_on_the_destination(vf_pair):
    source, destination = vf_pair
    _other, taken = destination.boot("other", L40S)  # another guest's VF there
    assert taken == ["0000:c1:00.4"]
    instance, on_source = source.boot("vdi-1", L40S, units=2)
    assert on_source == ["0000:c1:00.4", "0000:c1:00.5"]
    types = source.migrations.source_mdev_types(on_source)
    assert types == {vf: L40S_8Q for vf in on_source}
    mapping = destination.migrations.claim_incoming(
        instance, types, destination.allocation(L40S, 2), destination.providers
    )
    # The free VF of the same address keeps it; the taken one maps elsewhere.
    assert mapping == {"0000:c1:00.4": "0000:c1:00.6", "0000:c1:00.5": "0000:c1:00.5"}
    assert destination.states(_other) == [claims.ATTACHED]
    assert destination.states(instance) == [claims.MIGRATING_IN] * 2
    assert typed_vfs(destination) == {
        vf: L40S_8Q for vf in ("0000:c1:00.4", "0000:c1:00.5", "0000:c1:00.6")
    }
    dom = source.libvirt.conn.lookupByUUIDString(instance)
    xml = libvirt_domains.migrated_xml(dom.XMLDesc(0), mapping)
    assert sorted(guest.pci_vfs(guest.parse(xml))) == sorted(mapping.values())
    destination.libvirt.conn.defineXML(xml)
    dom.undefine()
    destination.migrations.finish_incoming(instance)
    source.migrations.finish_outgoing(instance)
    assert destination.states(instance) == [claims.ATTACHED] * 2
    assert source.manager.journal.claims(instance) == []
    # The source's VFs are free for the next guest (kept typed for reuse).
    assert (
        sorted(source.manager.allocate("next", source.allocation(L40S, 2), source.providers))
        == on_source
    )


def test_a_failed_vf_migration_leaves_nothing_on_the_destination(vf_pair):
    source, destination = vf_pair
    instance, on_source = source.boot("vdi-1", L40S)
    mapping = destination.migrations.claim_incoming(
        instance,
        source.migrations.source_mdev_types(on_source),
        destination.allocation(L40S),
        destination.providers,
    )
    assert typed_vfs(destination) == {mapping[on_source[0]]: L40S_8Q}
    assert destination.migrations.rollback_incoming(instance) == [mapping[on_source[0]]]
    assert destination.manager.journal.claims() == [] and typed_vfs(destination) == {}
    assert source.states(instance) == [claims.ATTACHED]


def test_a_mixed_size_destination_without_a_placement_left_refuses_and_keeps_nothing(vf_pair):
    """On a board in mixed-size mode an 8Q vGPU needs one of NVIDIA's four
    8 GB placements (0, 16, 24, 40 on 48 GB): with four taken, no free VF
    lists the type as creatable.  The destination refuses before it claims
    anything or the guest moves (nova then tries another host)."""
    source, destination = vf_pair
    destination.kernel.set_heterogeneous_mode(L40S, True)
    residents = [destination.boot(f"resident-{n}", L40S)[0] for n in range(4)]
    before = typed_vfs(destination)
    assert len(before) == 4
    instance, on_source = source.boot("vdi-1", L40S)
    with pytest.raises(exception.NoGpuCapacity, match="0 free and 0 creatable"):
        destination.migrations.claim_incoming(
            instance,
            source.migrations.source_mdev_types(on_source),
            destination.allocation(L40S),
            destination.providers,
        )
    assert destination.manager.journal.claims(instance) == []
    assert typed_vfs(destination) == before
    assert all(destination.states(r) == [claims.ATTACHED] for r in residents)
    assert source.states(instance) == [claims.ATTACHED]


@pytest.mark.parametrize(
    "claimed, reason",
    [
        ({L40S_8Q: [str(uuid.uuid4())]}, f"has no {L40S_8Q} VF for source vGPU 0000:c1:00.4"),
        ({L40S_8Q: ["0000:c1:00.5", "0000:c1:00.6"]}, r"has 1 more vGPU\(s\) than the guest"),
    ],
)
def test_the_mapping_refuses_what_the_guest_cannot_use(claimed, reason):
    with pytest.raises(migration.MigrationPreCheckFailed, match=reason):
        migration._map_by_type("i-1", {"0000:c1:00.4": L40S_8Q}, claimed)


def test_a_mapping_nova_would_apply_as_a_type_swap_is_refused():
    """nova rewrites PCI hostdevs one at a time, the first match each: a
    destination address that is another source's, of another type, would
    swap the two guest devices' types."""
    types = {"0000:c1:00.4": "nvidia-1155", "0000:c1:00.5": L40S_8Q}
    with pytest.raises(migration.MigrationPreCheckFailed, match="would swap types"):
        migration._map_by_type(
            "i-1", types, {"nvidia-1155": ["0000:c1:00.5"], L40S_8Q: ["0000:c1:00.4"]}
        )
    assert migration._map_by_type(
        "i-1", types, {"nvidia-1155": ["0000:c1:00.4"], L40S_8Q: ["0000:c1:00.6"]}
    ) == {"0000:c1:00.4": "0000:c1:00.4", "0000:c1:00.5": "0000:c1:00.6"}


def test_post_copy_is_refused_for_vendor_vfio_vfs_only():
    migration.check_post_copy("i-1", [], True)
    migration.check_post_copy("i-1", ["0000:c1:00.4"], False)
    with pytest.raises(
        migration.MigrationPreCheckFailed,
        match="cannot be migrated in "
        "post-copy mode, and \\[libvirt\\] live_migration_permit_post_copy",
    ):
        migration.check_post_copy("i-1", ["0000:c1:00.4"], True)


def test_a_destination_restarted_or_rebooted_mid_migration_keeps_its_vfs(vf_pair):
    source, destination = vf_pair
    instance, on_source = source.boot("vdi-1", L40S)
    mapping = destination.migrations.claim_incoming(
        instance,
        source.migrations.source_mdev_types(on_source),
        destination.allocation(L40S),
        destination.providers,
    )
    (claimed,) = mapping.values()
    destination.restart()
    destination.reconciler.clean_stale_claims(grace=0)  # what init_host does
    assert destination.states(instance) == [claims.MIGRATING_IN]
    destination.kernel.reboot()  # the VFs and their types go
    destination.kernel.set_vfs(L40S, 16)
    assert typed_vfs(destination) == {}
    outcomes = destination.reconciler.restore()
    assert [(o.mdev_uuid, o.result) for o in outcomes] == [(claimed, "restored")]
    assert typed_vfs(destination) == {claimed: L40S_8Q}
    dom = source.libvirt.conn.lookupByUUIDString(instance)
    destination.libvirt.conn.defineXML(libvirt_domains.migrated_xml(dom.XMLDesc(0), mapping))
    destination.migrations.finish_incoming(instance)
    assert destination.states(instance) == [claims.ATTACHED]


@pytest.mark.parametrize(
    "source_traits, own, refused",
    [
        ({"CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06", "CUSTOM_MDEV_NVIDIA_1156"}, "550.127.06", None),
        (
            {"CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06"},
            "570.133.10",
            "the source host runs NVIDIA vGPU manager 550.127.06 and this host 570.133.10",
        ),
        (
            {"CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06", "CUSTOM_NVIDIA_VGPU_MANAGER_570_133_10"},
            "570.133.10",
            "runs NVIDIA vGPU manager 550.127.06, 570.133.10 and this host",
        ),
        (
            {"CUSTOM_MDEV_NVIDIA_1156"},
            "550.127.06",
            "the source host's NVIDIA vGPU manager version is unknown",
        ),
        (
            {"CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06"},
            None,
            "this host's NVIDIA vGPU manager version is unknown",
        ),
    ],
)
def test_vfs_move_only_between_hosts_of_one_vgpu_manager(source_traits, own, refused):
    vfs = ["0000:c1:00.4"]
    if refused is None:
        migration.check_vgpu_manager("i-1", vfs, source_traits, own)
        return
    with pytest.raises(migration.MigrationPreCheckFailed, match=re.escape(refused)):
        migration.check_vgpu_manager("i-1", vfs, source_traits, own)


def test_mdevs_are_not_judged_by_the_vgpu_manager_version():
    migration.check_vgpu_manager("i-1", [], {"CUSTOM_NVIDIA_VGPU_MANAGER_535_54_03"}, "550.127.06")
    migration.check_vgpu_manager("i-1", [], set(), None)


@pytest.mark.parametrize(
    "devices, qemu, refused",
    [
        (["0000:c1:00.4"], (8, 1, 0), False),
        (["0000:c1:00.4", "0000:c1:00.5"], (8, 2, 0), False),
        (["0000:c1:00.4", "0000:c1:00.5"], (8, 1, 2), True),
        ([str(uuid.UUID(int=1)), "0000:3b:00.1"], (7, 2, 0), True),  # an mdev and a NIC's VF
    ],
)
def test_several_vfio_devices_need_a_qemu_that_migrates_them(devices, qemu, refused):
    if not refused:
        migration.check_several_vfio("i-1", "source", devices, qemu)
        return
    with pytest.raises(
        migration.MigrationPreCheckFailed,
        match=f"it has 2 VFIO devices .*the source host's QEMU is {'.'.join(map(str, qemu))}",
    ):
        migration.check_several_vfio("i-1", "source", devices, qemu)


def test_a_vgpu_of_a_mixed_size_board_moves_to_its_type_on_another(make_host, tmp_path):
    """Both boards serve 8 and 12 GB in mixed-size mode: the destination's
    MiB are typed as the source's vGPU is, on a free VF."""
    computes = []
    for name in ("src", "dst"):
        kernel = make_host("l40s-vfio")
        kernel.set_heterogeneous_mode(L40S, True)
        compute = Compute(tmp_path, kernel, [L40S_8Q, "nvidia-1157"], name)
        compute.config = mdev_settings.MdevConfig(
            types=compute.config.types,
            mixed_by_address=MappingProxyType({L40S: (L40S_8Q, "nvidia-1157")}),
        )
        compute.restart()
        computes.append(compute)
    source, destination = computes
    twelve = {f"rp-dst-{L40S}": {"resources": {"CUSTOM_VGPU_FRAMEBUFFER_MIB": 12288}}}
    destination.manager.allocate("resident", twelve, destination.providers)
    instance = str(uuid.uuid4())
    eight = {f"rp-src-{L40S}": {"resources": {"CUSTOM_VGPU_FRAMEBUFFER_MIB": 8192}}}
    on_source = source.manager.allocate(instance, eight, source.providers)
    types = source.migrations.source_mdev_types(on_source)
    assert types == {on_source[0]: L40S_8Q}
    mapping = destination.migrations.claim_incoming(
        instance, types, {f"rp-dst-{L40S}": eight[f"rp-src-{L40S}"]}, destination.providers
    )
    assert typed_vfs(destination)[mapping[on_source[0]]] == L40S_8Q
    assert destination.states(instance) == [claims.MIGRATING_IN]
