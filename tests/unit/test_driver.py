"""The core facade: start-up order and the spawn/delete round trip."""

import time
import uuid

from vgpu_driver import driver
from vgpu_driver.fake import domains
from vgpu_driver.fake import fakekernel

A100 = "0000:41:00.0"


def test_spawn_delete_round_trip(make_host, make_driver):
    host = make_host("a100-sriov")
    vgpu = make_driver(host, "restore_wait = 5")
    tree = vgpu.provider_tree("cn1")
    providers = {"rp-a100": tree.by_gpu(A100)}
    instance = str(uuid.uuid4())
    got = vgpu.allocate(instance, {"rp-a100": {"resources": {"VGPU": 2}}}, providers)
    vgpu.domains.define(instance, got)
    vgpu.instance_defined(instance)
    assert [c.state for c in vgpu.journal.claims(instance)] == ["attached", "attached"]
    assert vgpu.provider_tree("cn1").by_gpu(A100).total == 10
    vgpu.domains.undefine(instance)
    assert sorted(vgpu.release(instance)) == sorted(got)


def test_init_host_after_a_reboot(make_host, make_driver):
    host = make_host("a100-sriov")
    vgpu = make_driver(host, "restore_wait = 5")
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    kept = str(uuid.uuid4())
    got = vgpu.allocate(kept, {"rp": {"resources": {"VGPU": 1}}}, providers)
    vgpu.domains.define(kept, got)
    vgpu.instance_defined(kept)
    vgpu.allocate("crashed-boot", {"rp": {"resources": {"VGPU": 1}}}, providers)
    host.reboot()
    host.set_vfs(A100, 16)
    restarted = make_driver(host, ("restore_wait = 5", "claim_grace = 0"))
    restarted.domains.define(kept, got)
    outcomes = restarted.init_host()
    assert {o.result for o in outcomes} == {"restored"}
    assert {c.instance_uuid for c in restarted.journal.claims()} == {kept}
    assert {m.uuid for m in host.list_mdevs()} == set(got)


def test_hostdevs_follow_the_type_settings(make_host, make_conf, tmp_path):
    from tests import libvirt_domains
    from tests import libvirt_schema
    from vgpu_driver import guest

    host = make_host("mtty")
    conf = make_conf(f"""
        [devices]
        enabled_mdev_types = mtty-2
        [mdev_mtty-2]
        display = true
        ramfb = true
        [vgpu]
        sysfs_root = {host.paths.root}
        state_dir = {tmp_path / "state"}
        """)
    vgpu = driver.VGPUDriver(
        conf, domains.InProcessDomains(), host=fakekernel.FakeKernel(host.paths.root)
    )
    provider = vgpu.provider_tree("cn1").providers[0]
    got = vgpu.allocate("i-1", {"rp": {"resources": {"VGPU": 2}}}, {"rp": provider})
    xml = vgpu.add_hostdevs(libvirt_domains.domain_xml("g"), got)
    libvirt_schema.assert_valid_domain(xml)
    root = guest.parse(xml)
    assert guest.mdev_uuids(root) == got
    assert {
        (h.get("model"), h.get("display"), h.get("ramfb")) for h in root.findall("devices/hostdev")
    } == {("vfio-pci", "on", "on")}


def test_release_unused_keeps_exactly_what_the_domain_uses(make_host, make_driver):
    host = make_host("a100-sriov")
    vgpu = make_driver(host, "restore_wait = 5")
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    old = vgpu.allocate("i-1", {"rp": {"resources": {"VGPU": 1}}}, providers)
    with vgpu.journal.transaction() as txn:  # a resize on the same host: a 2nd mdev
        txn.add("i-1", str(uuid.uuid4()), A100, "0000:41:00.5", "nvidia-468")
    kept = [c.mdev_uuid for c in vgpu.journal.claims("i-1") if c.mdev_uuid not in old]
    assert vgpu.release_unused("i-1", kept) == old
    assert [c.mdev_uuid for c in vgpu.journal.claims("i-1")] == kept


def test_inventory_updates_finish_refused_removals_and_drop_unused_claims(make_host, make_driver):
    """What a restart used to be needed for happens at the next update."""
    host = make_host("a100-sriov")
    options = ("remove_mdevs_on_release = true", "mdev_remove_timeout = 1", "claim_grace = 0")
    vgpu = make_driver(host, ("restore_wait = 5", *options))
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    allocation = {"rp": {"resources": {"VGPU": 1}}}
    (busy,) = vgpu.allocate("deleted", allocation, providers)
    (kept,) = vgpu.allocate("resizing", allocation, providers)
    vgpu.instance_defined("resizing")  # its domain is away for a while
    host.hold(busy)  # the guest has not let go yet
    assert vgpu.release("deleted") == []
    (unused,) = vgpu.allocate("never-came", allocation, providers)
    assert {c.mdev_uuid: c.state for c in vgpu.journal.claims()} == {
        busy: "releasing",
        kept: "attached",
        unused: "claimed",
    }

    host.release(busy)  # its one writer returns
    assert vgpu.manager.removals.join(10)
    vgpu.provider_tree("cn1")
    assert {c.mdev_uuid: c.state for c in vgpu.journal.claims()} == {kept: "attached"}
    assert busy not in {m.uuid for m in host.list_mdevs()}


def test_start_up_does_not_wait_for_late_vfs(make_host, make_driver):
    """The service starts at once; the guest's vGPU comes back once the
    vendor enables the VFs, and a late one is reported meanwhile."""
    host = make_host("a100-sriov")
    vgpu = make_driver(host, "restore_wait = 5")
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    got = vgpu.allocate("guest", {"rp": {"resources": {"VGPU": 1}}}, providers)
    vgpu.instance_defined("guest")
    host.reboot()  # VFs come back later
    restarted = make_driver(host, "restore_wait = 30")
    restarted.domains.define("guest", got)
    started = time.monotonic()
    try:
        outcomes = restarted.init_host()
        assert time.monotonic() - started < 15  # restore_wait is 30
        assert [(o.mdev_uuid, o.result) for o in outcomes] == [(got[0], "waiting")]
        assert host.list_mdevs() == [] and restarted.worker.running
        assert set(restarted.worker.waiting) == set(got)
        host.set_vfs(A100, 16)
        deadline = time.monotonic() + 10
        while {m.uuid for m in host.list_mdevs()} != set(got):
            assert time.monotonic() < deadline, "not restored by the host reconciler"
            time.sleep(0.05)
    finally:
        restarted.close()
    assert restarted.worker.waiting == {} and not restarted.worker.running
