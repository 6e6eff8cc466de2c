"""vGPUs on NVIDIA's vendor-specific VFIO framework, end to end on a fake L40S.

There are no mdevs: a VF becomes a vGPU when its ``current_vgpu_type`` is
set, and the guest gets the VF.  The same lifecycle as for mdevs applies
(claims first, reuse, release, orphans, reboot restore), a VF's PCI address
naming the vGPU in claims and domains.
"""

import time
import uuid
from types import MappingProxyType

import pytest

from tests import libvirt_domains
from tests import libvirt_schema
from tests.unit.test_mdevs import Lifecycle
from vgpu_driver import audit
from vgpu_driver import claims
from vgpu_driver import discovery
from vgpu_driver import driver
from vgpu_driver import exception
from vgpu_driver import guest
from vgpu_driver import names
from vgpu_driver import reconcile
from vgpu_driver import takeover
from vgpu_driver.conf import mdev_settings
from vgpu_driver.fake import domains

L40S = "0000:c1:00.0"
VFS = [str(names.parse_pci_address(L40S).offset(4 + i)) for i in range(16)]
FOUR_Q, EIGHT_Q = "nvidia-1155", "nvidia-1156"  # 12 resp. 6 per GPU


def new_uuid():
    return str(uuid.uuid4())


def typed(host):
    """``{VF address: type number}`` of the VFs that are vGPUs now."""
    return {str(vf.address): vf.current_type for vf in host.list_vendor_vfio() if vf.current_type}


class BlindDomains(domains.InProcessDomains):
    """A domain source that, as an older one, reports mdev hostdevs only."""

    sees_pci_hostdevs = False


@pytest.fixture
def vf_life(make_host, tmp_path):
    def make(type_id=EIGHT_Q, max_instances=6, typed_vfs=(), **kwargs):
        host = make_host("l40s-vfio")
        for vf, number in typed_vfs:
            host.set_vendor_vgpu_type(vf, number)
        config = mdev_settings.MdevConfig(
            types=(mdev_settings.TypeConfig(type_id, max_instances=max_instances),),
            default_type=type_id,
            by_address=MappingProxyType({}),
        )
        return Lifecycle(host, config, tmp_path / "state", **kwargs)

    return make


class TestAllocate:
    def test_types_the_first_free_vfs_in_order_claims_first(self, vf_life):
        life = vf_life()
        instance = new_uuid()
        got = life.allocate(instance, L40S, units=2)
        assert got == VFS[:2]
        assert typed(life.host) == {VFS[0]: 1156, VFS[1]: 1156}
        assert [
            (c.mdev_uuid, c.parent, c.gpu, c.type_id, c.state, c.created, c.is_vf)
            for c in life.journal.claims()
        ] == [(vf, vf, L40S, EIGHT_Q, claims.CLAIMED, True, True) for vf in VFS[:2]]

    def test_a_free_vf_of_the_type_is_reused_before_typing_another(self, vf_life):
        life = vf_life(typed_vfs=[(VFS[5], 1156)])
        assert life.allocate("guest", L40S) == [VFS[5]]
        assert typed(life.host) == {VFS[5]: 1156}
        assert [c.created for c in life.journal.claims()] == [False]

    def test_vfs_a_domain_references_are_never_handed_out(self, vf_life):
        """Typed or not: a guest whose VF lost its type still owns the VF."""
        life = vf_life(typed_vfs=[(VFS[0], 1156)])
        life.domains.define("other-guest", [VFS[0], VFS[1]])
        assert life.allocate("guest", L40S) == [VFS[2]]

    def test_claims_not_written_yet_hold_their_place(self, vf_life):
        life = vf_life()
        with life.journal.transaction() as txn:  # another allocation, between steps
            txn.add("other", VFS[0], L40S, VFS[0], EIGHT_Q)
        assert life.allocate("guest", L40S) == [VFS[1]]
        assert typed(life.host) == {VFS[1]: 1156}

    def test_a_retry_returns_the_same_vfs_and_finishes_the_writes(self, vf_life):
        life = vf_life()
        with life.journal.transaction() as txn:  # died after the journal, before sysfs
            txn.add("guest", VFS[3], L40S, VFS[3], EIGHT_Q, created=True)
        first = life.allocate("guest", L40S, units=3)
        assert first == [VFS[0], VFS[1], VFS[3]]
        assert life.allocate("guest", L40S, units=3) == first
        assert typed(life.host) == dict.fromkeys(first, 1156)

    def test_a_full_gpu_is_refused_typed_and_leaves_nothing(self, vf_life):
        life = vf_life()
        for _ in range(6):
            life.boot(L40S)
        before = life.journal.claims()
        with pytest.raises(exception.NoGpuCapacity) as caught:
            life.allocate("late-guest", L40S)
        assert str(caught.value) == (
            "Cannot give late-guest 1 x nvidia-1156 on 0000:c1:00.0: 0 free and 0 "
            "creatable (6 already claimed)."
        )
        assert life.journal.claims() == before and len(typed(life.host)) == 6

    def test_the_drivers_refusal_is_a_typed_allocation_error(self, vf_life):
        """Without max_instances, only NVIDIA's driver knows the GPU is full."""
        life = vf_life(max_instances=None, typed_vfs=[(vf, 1156) for vf in VFS[:5]])
        for vf in VFS[:5]:
            life.domains.define(f"guest-{vf}", [vf])
        with pytest.raises(exception.VfTypeRefused) as caught:
            life.allocate("greedy", L40S, units=2)
        assert isinstance(caught.value, exception.NoGpuCapacity)
        assert f"VF {VFS[6]} refused the type ([EINVAL]" in str(caught.value)
        assert life.journal.claims() == []
        # What it did type stays, free for the next guest.
        assert typed(life.host) == dict.fromkeys(VFS[:6], 1156)
        assert life.allocate("next", L40S) == [VFS[5]]

    def test_a_type_in_use_of_another_size_is_typed(self, vf_life):
        life = vf_life(typed_vfs=[(VFS[0], 1155)])
        life.domains.define("old-guest", [VFS[0]])
        with pytest.raises(exception.WrongTypePresent) as caught:
            life.allocate("new-guest", L40S)
        assert "holds 1 VF(s) set to nvidia-1155 still in use" in str(caught.value)

    def test_vfs_gone_is_typed(self, vf_life):
        life = vf_life()
        life.host.set_vfs(L40S, 0)
        with pytest.raises(exception.GpuGone):
            life.allocate("guest", L40S)

    def test_a_domain_source_blind_to_pci_hostdevs_is_refused(self, vf_life):
        life = vf_life()
        life.manager.domains = BlindDomains()
        with pytest.raises(exception.AllocationError, match="does not report PCI hostdevs"):
            life.allocate("guest", L40S)
        assert life.journal.claims() == [] and typed(life.host) == {}


class TestRelease:
    def test_kept_the_vf_keeps_its_type_for_the_next_guest(self, vf_life):
        life = vf_life()
        instance, got = life.boot(L40S)
        assert life.delete(instance) == got
        assert life.journal.claims() == [] and typed(life.host) == {got[0]: 1156}
        assert life.allocate(new_uuid(), L40S) == got

    def test_removal_clears_the_type(self, vf_life):
        life = vf_life(remove_on_release=True)
        instance, got = life.boot(L40S, units=2)
        assert life.delete(instance) == got
        assert life.journal.claims() == [] and typed(life.host) == {}

    def test_a_vf_a_guest_holds_stays_reserved_until_cleared(self, vf_life):
        life = vf_life(remove_on_release=True, remove_timeout=0.2)
        instance, got = life.boot(L40S)
        life.host.hold(got[0])
        assert life.delete(instance) == []
        assert [c.state for c in life.journal.claims()] == [claims.RELEASING]
        assert life.allocate("next", L40S) == [VFS[1]]  # not handed out meanwhile
        life.host.release(got[0])
        assert life.reconciler.finish_releases() == got
        assert typed(life.host) == {VFS[1]: 1156}


class TestOrphans:
    def test_kinds_grace_and_reclaim(self, vf_life):
        life = vf_life(typed_vfs=[(VFS[0], 1156), (VFS[1], 1156)])
        life.domains.define("guest", [VFS[1]])
        life.allocate("booting", L40S)  # takes VFS[0], the free one
        life.host.set_vendor_vgpu_type(VFS[3], 1156)
        assert {o.mdev_uuid: (o.kind, o.parent, o.gpu) for o in life.reconciler.orphans()} == {
            VFS[3]: (reconcile.FREE, VFS[3], L40S)
        }
        assert life.reconciler.orphans(grace=3600) == []
        done = life.reconciler.reclaim(life.reconciler.orphans())
        assert [(o.mdev_uuid, o.result) for o in done] == [(VFS[3], "removed")]
        assert typed(life.host) == {VFS[0]: 1156, VFS[1]: 1156}
        assert [c.instance_uuid for c in life.journal.claims()] == ["booting"]

    def test_stale_type_drains_then_is_reclaimed(self, vf_life):
        life = vf_life(typed_vfs=[(VFS[0], 1155), (VFS[1], 1155)])
        life.domains.define("old-guest", [VFS[0]])
        outcomes = life.reconciler.reclaim_stale_types()
        assert [(o.mdev_uuid, o.result) for o in outcomes] == [(VFS[1], "removed")]
        life.refresh()
        provider = life.tree.by_gpu(L40S)
        assert provider.reserved == provider.total
        assert provider.reason.startswith("draining: mdevs (1 of nvidia-1155) of which 1")
        life.domains.undefine("old-guest")
        assert [o.mdev_uuid for o in life.reconciler.reclaim_stale_types()] == [VFS[0]]
        life.refresh()
        assert (life.tree.by_gpu(L40S).total, life.tree.by_gpu(L40S).reserved) == (6, 0)
        assert life.allocate("new-guest", L40S) == [VFS[0]]

    def test_a_blind_domain_source_never_takes_a_typed_vf(self, vf_life):
        life = vf_life(
            type_id=FOUR_Q, max_instances=12, typed_vfs=[(VFS[0], 1156), (VFS[1], 1156)]
        )  # stale, unclaimed
        life.manager.domains = BlindDomains()
        assert life.reconciler.orphans() == []
        assert life.reconciler.reclaim_stale_types() == []
        assert {VFS[0], VFS[1]} <= life.reconciler.in_use()
        assert len(typed(life.host)) == 2


class TestReboot:
    def test_restores_exactly_the_claimed_vfs_once_they_return(self, vf_life):
        life = vf_life()
        referenced = []
        for _ in range(2):
            _, got = life.boot(L40S)
            referenced += got
        claimed_only = life.allocate("booting-guest", L40S)
        life.allocate("gone-guest", L40S)
        life.delete("gone-guest")  # kept typed, free: not restored
        life.domains.define("nic-user", ["0000:3b:00.2"])  # a passed-through NIC
        before = {vf: n for vf, n in typed(life.host).items() if vf in referenced + claimed_only}
        life.host.reboot()
        assert life.host.list_vendor_vfio() == []
        assert {o.result for o in life.reconciler.restore()} == {"waiting"}
        life.host.set_vfs(L40S, 16)
        outcomes = life.reconciler.restore()
        assert {(o.mdev_uuid, o.result) for o in outcomes} == {
            (vf, "restored") for vf in referenced + claimed_only
        }
        assert typed(life.host) == before

    def test_one_instance_only_and_what_could_not_be_restored(self, vf_life):
        life = vf_life()
        rebooting, mine = life.boot(L40S)
        _, theirs = life.boot(L40S)
        life.host.reboot()
        outcomes = life.reconciler.restore(instance_uuid=rebooting)
        assert [(o.mdev_uuid, o.result, o.reason) for o in outcomes] == [
            (mine[0], "waiting", f"parent {mine[0]} of GPU {L40S} is not there yet")
        ]
        life.host.set_vfs(L40S, 16)
        outcomes = life.reconciler.restore(instance_uuid=rebooting)
        assert [(o.mdev_uuid, o.result) for o in outcomes] == [(mine[0], "restored")]
        assert typed(life.host) == {mine[0]: 1156}
        # Another size took the GPU meanwhile: the driver refuses, and it is said.
        life.host.set_vendor_vgpu_type(theirs[0], 0)
        life.host.set_vendor_vgpu_type(mine[0], 0)
        life.host.set_vendor_vgpu_type(VFS[9], 1160)  # L40S-48Q: the whole GPU
        (outcome,) = life.reconciler.restore(instance_uuid=rebooting)
        assert outcome.result == "failed" and "[EINVAL]" in outcome.reason


class TestDomainsAndTools:
    def test_hostdevs_are_the_vfs_and_valid_for_libvirt(self, make_host, make_conf, tmp_path):
        host = make_host("l40s-vfio")
        conf = make_conf(f"""
            [devices]
            enabled_mdev_types = nvidia-1156
            [mdev_nvidia-1156]
            max_instances = 6
            [vgpu]
            sysfs_root = {host.paths.root}
            state_dir = {tmp_path / "state"}
            """)
        vgpu = driver.VGPUDriver(conf, domains.InProcessDomains(), host=host)
        provider = vgpu.provider_tree("cn1").by_gpu(L40S)
        got = vgpu.allocate("i-1", {"rp": {"resources": {"VGPU": 2}}}, {"rp": provider})
        xml = vgpu.add_hostdevs(libvirt_domains.domain_xml("g"), got)
        libvirt_schema.assert_valid_domain(xml)
        root = guest.parse(xml)
        assert guest.vgpu_ids(root) == got == VFS[:2]
        assert {(h.get("type"), h.get("managed")) for h in root.findall("devices/hostdev")} == {
            ("pci", "no")
        }
        with pytest.raises(exception.UnknownVgpu):
            vgpu.add_hostdevs(xml, ["0000:3b:00.2"])
        assert vgpu.mdev_types(got) == {vf: EIGHT_Q for vf in got}  # they migrate
        with pytest.raises(exception.VgpuDriverError, match="cannot take a migrated mdev"):
            vgpu.migrations.claim_incoming(
                "i-2", {new_uuid(): EIGHT_Q}, {"rp": {"resources": {"VGPU": 1}}}, {"rp": provider}
            )
        assert [c.instance_uuid for c in vgpu.journal.claims()] == ["i-1", "i-1"]

    def test_libvirt_indexes_the_pci_hostdevs_of_every_domain(self, tmp_path):
        from vgpu_driver import libvirt_host

        mdev = new_uuid()
        uri = libvirt_domains.node_file(
            tmp_path / "node.xml",
            [
                libvirt_domains.domain_xml("with-vf", vfs=[VFS[2]]),
                libvirt_domains.domain_xml("with-both", [mdev], vfs=[VFS[3]]),
            ],
        )
        host = libvirt_host.LibvirtHost(uri)
        users = host.mdev_users()
        assert host.sees_pci_hostdevs
        assert {k: v.name for k, v in users.items()} == {
            VFS[2]: "with-vf",
            VFS[3]: "with-both",
            mdev: "with-both",
        }

    def test_adopt_and_audit_count_vfs(self, vf_life):
        life = vf_life(typed_vfs=[(VFS[0], 1156), (VFS[1], 1156)])
        life.domains.define("nova-era-guest", [VFS[0]])
        (adopted,) = takeover.adopt(life.manager)
        assert (adopted.mdev_uuid, adopted.instance_uuid, adopted.state) == (
            VFS[0],
            "nova-era-guest",
            claims.ATTACHED,
        )
        life.allocate("new-guest", L40S)
        usage = audit.host_usage(
            discovery.discover(life.host), life.journal.claims(), life.domains.mdev_users()
        )
        assert usage == {(L40S, "nova-era-guest"): 1, (L40S, "new-guest"): 1}
        assert [
            (v.id, v.parent, v.type_id, v.is_vf) for v in discovery.discover(life.host).vgpus
        ] == [(VFS[0], VFS[0], EIGHT_Q, True), (VFS[1], VFS[1], EIGHT_Q, True)]


class TestSysfsAndPrivsep:
    def test_type_numbers_are_validated_before_any_write(self, make_host):
        host = make_host("l40s-vfio")
        for bad in (-1, "1156", 1.5, True):
            with pytest.raises(exception.InvalidSysfsName):
                host.set_vendor_vgpu_type(VFS[0], bad)
        with pytest.raises(exception.InvalidSysfsName):
            names.vendor_type_number("mtty-1")
        assert names.vendor_type_number(EIGHT_Q) == 1156
        assert names.check_vgpu_id("0000:C1:00.4") == VFS[0]
        with pytest.raises(exception.InvalidSysfsName):
            names.check_vgpu_id("../0000:c1:00.4")

    def test_driver_errnos_arrive_typed_with_vgpu_advice(self, make_host):
        host = make_host("l40s-vfio")
        host.set_vendor_vgpu_type(VFS[0], 1156)
        with pytest.raises(exception.MdevBusy, match="already has a vGPU type"):
            host.set_vendor_vgpu_type(VFS[0], 1155)
        with pytest.raises(exception.MdevInvalidRequest, match="does not offer this vGPU"):
            host.set_vendor_vgpu_type(VFS[1], 1155)
        host.hold(VFS[0])
        with pytest.raises(exception.MdevBusy):
            host.set_vendor_vgpu_type(VFS[0], 0)
        host.release(VFS[0])
        host.set_vendor_vgpu_type(VFS[0], 0)
        host.set_vfs(L40S, 0)
        with pytest.raises(exception.MdevParentGone):
            host.set_vendor_vgpu_type(VFS[0], 1156)
        assert host.vendor_vf(VFS[0]) is None and host.vendor_vgpu_set_at(VFS[0]) is None


def test_vf_gpus_have_their_vgpus_in_the_snapshot_age_too(vf_life):
    """A typed VF's age comes from its current_vgpu_type's change time."""
    life = vf_life(typed_vfs=[(VFS[0], 1156)])
    time.sleep(0.05)
    (orphan,) = life.reconciler.orphans()
    assert orphan.age is not None and orphan.age >= 0.05
