"""Claims no domain uses: the host reconciler's periodic pass releases
them past ``[vgpu] unused_claim_grace``, unless the compute driver's keeper
keeps their instance (an operation under way, a stopped guest)."""

from vgpu_driver import claims
from vgpu_driver import host_reconciler

A100 = "0000:41:00.0"
ONE_VGPU = {"rp": {"resources": {"VGPU": 1}}}


def boot(vgpu, instance):
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    got = vgpu.allocate(instance, ONE_VGPU, providers)
    vgpu.domains.define(instance, got)
    vgpu.instance_defined(instance)
    return got


def claimed_beside(vgpu, instance):
    """One more vGPU claimed for ``instance`` (an allocation of two, as a
    step a crash interrupted made) that its domain does not use; marked
    attached by the next define."""
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    got = vgpu.allocate(instance, {"rp": {"resources": {"VGPU": 2}}}, providers)
    vgpu.instance_defined(instance)
    (extra,) = set(got) - set(vgpu.domains.mdev_users())
    return extra


def held(vgpu):
    return sorted((c.instance_uuid, c.mdev_uuid, c.state) for c in vgpu.journal.claims())


def test_without_a_keeper_nothing_is_released(make_host, make_driver):
    host = make_host("a100-sriov")
    vgpu = make_driver(host, "unused_claim_grace = 0")
    (used,) = boot(vgpu, "guest")
    claimed_beside(vgpu, "guest")
    before = held(vgpu)
    vgpu.worker.run_pass({host_reconciler.PERIODIC})
    assert held(vgpu) == before


def test_a_claim_the_domain_does_not_use_goes_and_its_vgpu_with_it(make_host, make_driver):
    host = make_host("a100-sriov")
    vgpu = make_driver(host, "unused_claim_grace = 0\nremove_mdevs_on_release = true")
    (used,) = boot(vgpu, "guest")
    extra = claimed_beside(vgpu, "guest")
    asked = []
    vgpu.worker.keeper = lambda uuids: asked.append(set(uuids)) or set()
    vgpu.worker.run_pass({host_reconciler.PERIODIC})
    assert asked == [{"guest"}]
    assert held(vgpu) == [("guest", used, claims.ATTACHED)]
    assert extra not in {m.uuid for m in host.list_mdevs()}
    assert used in {m.uuid for m in host.list_mdevs()}


def test_kept_instances_and_young_claims_stay(make_host, make_driver):
    host = make_host("a100-sriov")
    vgpu = make_driver(host, "unused_claim_grace = 3600")
    boot(vgpu, "guest")
    claimed_beside(vgpu, "guest")
    before = held(vgpu)
    vgpu.worker.keeper = lambda uuids: set()
    vgpu.worker.run_pass({host_reconciler.PERIODIC})  # younger than the grace
    assert held(vgpu) == before
    vgpu.conf.set_override("unused_claim_grace", 0, group="vgpu")
    vgpu.worker.keeper = lambda uuids: set(uuids)  # an operation under way
    vgpu.worker.run_pass({host_reconciler.PERIODIC})
    assert held(vgpu) == before
