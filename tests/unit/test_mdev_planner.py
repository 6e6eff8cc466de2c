"""The allocation decision over plain data: no host, no journal, no domains."""

import itertools

import pytest

from vgpu_driver import claims
from vgpu_driver import exception
from vgpu_driver.mdevs import planner

GPU = "0000:18:00.0"
OTHER_GPU = "0000:19:00.0"
T = "nvidia-222"
OTHER_T = "nvidia-223"
ME, THEM = "instance-me", "instance-them"


def ids(prefix="new"):
    """Deterministic ids for created mdevs, in the order they are asked for."""
    counter = itertools.count()
    return lambda parent: f"{prefix}-{next(counter):02d}-{parent}"


def gpu(*parents, limit=None, kind="mdev(s) of", new_vgpu_id=None, address=GPU):
    return planner.GpuState(address, tuple(parents), limit, kind, new_vgpu_id or ids())


def parent(name, *vgpus, available=0):
    return planner.ParentState(name, tuple(vgpus), available)


def claim(mdev, instance, parent_name, type_id=T, gpu_address=GPU):
    return claims.Claim(
        mdev, instance, gpu_address, parent_name, type_id, claims.CLAIMED, False, 0.0, 0.0
    )


def held(*claim_list):
    return {c.mdev_uuid: c for c in claim_list}


def plan(state, units=1, claimed=None, users=(), instance=ME, type_id=T):
    request = planner.Request(state.address, type_id, units)
    return planner.plan_gpu(instance, request, state, claimed or {}, set(users))


def summary(items):
    return [(p.mdev_uuid, p.parent, p.create) for p in items]


class TestReuseAndCreate:
    def test_a_free_vgpu_is_reused_before_room_is_used(self):
        state = gpu(parent("p0", ("m-free", T), available=3))
        assert summary(plan(state)) == [("m-free", "p0", False)]

    def test_vgpus_in_use_or_of_another_type_are_not_reused(self):
        state = gpu(
            parent("p0", ("m-domain", T), ("m-claimed", T), ("m-other", OTHER_T), available=1)
        )
        got = plan(state, claimed=held(claim("m-claimed", THEM, "p0")), users={"m-domain"})
        assert summary(got) == [("new-00-p0", "p0", True)]

    def test_reused_first_then_created_in_parent_order_sorted_by_id(self):
        state = gpu(
            parent("p0", ("z-free", T), available=1),
            parent("p1", available=2),
            new_vgpu_id=ids("a"),
        )
        got = plan(state, units=3)
        assert summary(got) == [
            ("a-00-p0", "p0", True),
            ("a-01-p1", "p1", True),
            ("z-free", "p0", False),
        ]
        assert {p.gpu for p in got} == {GPU} and {p.type_id for p in got} == {T}

    def test_a_vf_gpu_creates_the_vf_itself(self):
        vf0, vf1 = "0000:41:00.4", "0000:41:00.5"
        state = gpu(
            parent(vf0, (vf0, T)),
            parent(vf1, available=1),
            kind="VF(s) set to",
            new_vgpu_id=lambda p: p,
        )
        assert summary(plan(state, users={vf0})) == [(vf1, vf1, True)]


class TestOwnClaims:
    def test_the_instances_claims_come_back_on_a_retry(self):
        state = gpu(parent("p0", ("m-mine", T), ("m-free", T), available=4))
        mine = claim("m-mine", ME, "p0")
        got = plan(state, claimed=held(mine), users={"m-mine"})
        assert summary(got) == [("m-mine", "p0", False)]
        assert planner.new_claims(got, held(mine), ME) == []

    def test_a_claimed_vgpu_that_is_gone_is_created_again_with_its_id(self):
        """After a host reboot the claim names the mdev, which is made again."""
        state = gpu(parent("p0", available=2), parent("p1", available=2))
        mine = claim("m-lost", ME, "p1")
        assert summary(plan(state, claimed=held(mine))) == [("m-lost", "p1", True)]

    def test_claims_on_another_gpu_are_not_reused_here(self):
        state = gpu(parent("p0", available=1))
        elsewhere = claim("m-there", ME, "q0", gpu_address=OTHER_GPU)
        got = plan(state, claimed=held(elsewhere))
        assert summary(got) == [("new-00-p0", "p0", True)]
        assert planner.new_claims(got, held(elsewhere), ME) == got


class TestNeverTwice:
    def test_a_vgpu_another_instance_claimed_is_never_handed_out(self):
        state = gpu(parent("p0", ("m-1", T), ("m-2", T), available=0))
        claimed = held(claim("m-1", THEM, "p0"), claim("m-2", THEM, "p0"))
        with pytest.raises(exception.NoGpuCapacity):
            plan(state, claimed=claimed)

    def test_two_units_never_get_the_same_vgpu(self):
        state = gpu(parent("p0", ("m-1", T), available=1))
        got = plan(state, units=2)
        assert summary(got) == [("m-1", "p0", False), ("new-00-p0", "p0", True)]

    def test_the_next_instance_sees_the_first_ones_claims(self):
        """What one plan claims, the next one (for another instance) skips."""
        state = gpu(parent("p0", ("m-1", T), ("m-2", T), available=1))
        first = plan(state, units=2)
        claimed = held(*(claim(p.mdev_uuid, ME, p.parent) for p in first))
        second = plan(state, claimed=claimed, instance=THEM)
        assert summary(second) == [("new-00-p0", "p0", True)]
        with pytest.raises(exception.NoGpuCapacity):
            plan(state, units=2, claimed=claimed, instance=THEM)

    def test_pending_claims_hold_their_place_on_the_parent(self):
        """The kernel still counts room for a claimed mdev not created yet."""
        state = gpu(parent("p0", available=1), parent("p1", available=1))
        pending = claim("m-coming", THEM, "p0")
        got = plan(state, claimed=held(pending))
        assert summary(got) == [("new-00-p1", "p1", True)]


class TestLimitsAndRefusals:
    def test_the_per_gpu_limit_counts_existing_and_pending_vgpus(self):
        state = gpu(parent("p0", ("m-used", T), available=5), limit=3)
        claimed = held(claim("m-coming", THEM, "p0"))
        assert len(plan(state, claimed=claimed, users={"m-used"})) == 1
        with pytest.raises(exception.NoGpuCapacity) as refused:
            plan(state, units=2, claimed=claimed, users={"m-used"})
        assert refused.value.kwargs == {
            "instance": ME,
            "gpu": GPU,
            "type_id": T,
            "wanted": 2,
            "free": 0,
            "creatable": 1,
            "claimed": 1,
        }
        assert str(refused.value) == (
            f"Cannot give {ME} 2 x {T} on {GPU}: 0 free and 1 creatable (1 already claimed)."
        )

    def test_a_gpu_full_of_another_type_in_use_says_so(self):
        state = gpu(
            parent("p0", ("m-a", OTHER_T), ("m-b", OTHER_T), ("m-c", "nvidia-1"), available=0)
        )
        with pytest.raises(exception.WrongTypePresent) as refused:
            plan(state, claimed=held(claim("m-b", THEM, "p0", OTHER_T)), users={"m-a"})
        assert refused.value.kwargs["present"] == f"2 mdev(s) of {OTHER_T}"

    def test_vf_refusals_name_vfs(self):
        vf = "0000:41:00.4"
        state = gpu(parent(vf, (vf, OTHER_T)), kind="VF(s) set to")
        with pytest.raises(exception.WrongTypePresent) as refused:
            plan(state, users={vf})
        assert refused.value.kwargs["present"] == f"1 VF(s) set to {OTHER_T}"

    def test_another_type_nobody_uses_is_a_capacity_refusal(self):
        state = gpu(parent("p0", ("m-a", OTHER_T), available=0))
        with pytest.raises(exception.NoGpuCapacity) as refused:
            plan(state)
        assert type(refused.value) is exception.NoGpuCapacity
        assert (refused.value.kwargs["free"], refused.value.kwargs["creatable"]) == (0, 0)

    def test_a_partial_fit_is_refused_whole(self):
        state = gpu(parent("p0", ("m-free", T), available=1))
        with pytest.raises(exception.NoGpuCapacity) as refused:
            plan(state, units=3)
        assert (refused.value.kwargs["free"], refused.value.kwargs["creatable"]) == (1, 1)


class TestRequests:
    class Provider:
        mixed = False

        def __init__(self, gpu_address, type_id, resource_class="VGPU"):
            self.gpu, self.type_id, self.resource_class = gpu_address, type_id, resource_class

    def test_only_vgpu_classes_on_our_providers_become_requests(self):
        providers = {"rp-b": self.Provider(OTHER_GPU, OTHER_T), "rp-a": self.Provider(GPU, T)}
        allocations = {
            "rp-b": {"resources": {"VGPU": 2}},
            "rp-a": {"resources": {"VGPU": 1}},
            "rp-cn": {"resources": {"VCPU": 4, "MEMORY_MB": 512}},
        }
        got = planner.requests_of(ME, allocations, providers, {"VGPU"})
        assert got == [planner.Request(GPU, T, 1), planner.Request(OTHER_GPU, OTHER_T, 2)]

    def test_a_vgpu_allocation_on_an_unknown_provider_is_refused(self):
        allocations = {"rp-gone": {"resources": {"VGPU": 1}}}
        with pytest.raises(exception.UnknownProvider) as refused:
            planner.requests_of(ME, allocations, {}, {"VGPU"})
        assert "rp-gone" in str(refused.value)
