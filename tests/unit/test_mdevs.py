"""Allocation, release and reconciliation on fake hosts, claims first."""

import errno
import uuid
from types import MappingProxyType

import pytest

from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver import mdevs
from vgpu_driver import reconcile
from vgpu_driver.conf import mdev_settings
from vgpu_driver.fake import domains

A100 = "0000:41:00.0"
A100_VFS = [f"0000:41:{d:02x}.{f}" for d in range(3) for f in range(8)][4:20]
T4A, T4B = "0000:18:00.0", "0000:19:00.0"


def removed(life):
    """Wait until the removal writers the kernel blocked have ended."""
    assert life.manager.removals.join(5), life.manager.removals.in_flight()


def new_uuid():
    return str(uuid.uuid4())


class Lifecycle:
    """A host, its config and a manager, as the driver wires them."""

    def __init__(self, host, config, state_dir, **kwargs):
        self.host, self.config = host, config
        self.journal = claims_journal.Journal(str(state_dir))
        self.domains = domains.InProcessDomains()
        self.manager = mdevs.MdevManager(host, self.journal, self.domains, config, **kwargs)
        self.reconciler = reconcile.Reconciler(self.manager)
        self.refresh()

    def refresh(self):
        self.manager.snapshot(refresh=True)
        snapshot = discovery.discover(self.host)
        self.tree = inventory.compute(
            snapshot,
            self.config,
            "cn1",
            self.reconciler.in_use(),
            rooms=inventory.read_rooms(self.host, snapshot, self.config),
        )
        self.providers = {f"rp-{p.gpu}": p for p in self.tree.providers}

    def allocate(self, instance, *gpus, units=1):
        allocations = {f"rp-{gpu}": {"resources": {"VGPU": units}} for gpu in gpus}
        return self.manager.allocate(instance, allocations, self.providers)

    def boot(self, *gpus, units=1):
        """Allocate, define the domain and mark it attached, as a spawn does."""
        instance = new_uuid()
        got = self.allocate(instance, *gpus, units=units)
        self.domains.define(instance, got)
        self.manager.mark_attached(instance)
        return instance, got

    def delete(self, instance):
        self.domains.undefine(instance)
        return self.manager.release(instance)

    def mdevs_by_parent(self):
        return {(m.parent, m.type_id, m.uuid) for m in self.host.list_mdevs()}


@pytest.fixture
def lifecycle(make_host, tmp_path):
    def make(*profiles, types=("nvidia-468", "nvidia-222"), mdevs=(), by_address=None, **kwargs):
        host = make_host(*profiles, mdevs=mdevs)
        by_address = by_address if by_address is not None else {A100: types[0]}
        cfg = mdev_settings.MdevConfig(
            types=tuple(
                mdev_settings.TypeConfig(t) for t in dict.fromkeys([*types, *by_address.values()])
            ),
            default_type=types[-1],
            by_address=MappingProxyType(by_address),
        )
        return Lifecycle(host, cfg, tmp_path / "state", **kwargs)

    return make


def before_on(gpu, mdevs):
    """UUIDs of ``{(uuid, parent, type)}`` whose parent is one of ``gpu``'s VFs."""
    prefix = gpu.rsplit(".", 1)[0]
    return {uuid for uuid, parent, _ in mdevs if parent.startswith(prefix)}


class TestAllocate:
    def test_reuses_a_free_mdev_before_creating(self, lifecycle):
        free = new_uuid()
        life = lifecycle("t4x8", mdevs=[{"parent": T4A, "type": "nvidia-222", "uuid": free}])
        instance = new_uuid()
        assert life.allocate(instance, T4A) == [free]
        assert len(life.host.list_mdevs()) == 1
        assert [(c.mdev_uuid, c.state, c.gpu) for c in life.journal.claims()] == [
            (free, claims.CLAIMED, T4A)
        ]

    def test_creates_on_the_first_free_vf_in_order(self, lifecycle):
        life = lifecycle("a100-sriov")
        _, first = life.boot(A100)
        _, second = life.boot(A100)
        assert {(p, t) for p, t, _ in life.mdevs_by_parent()} == {
            (A100_VFS[0], "nvidia-468"),
            (A100_VFS[1], "nvidia-468"),
        }
        assert len(set(first + second)) == 2

    def test_an_mdev_a_domain_uses_is_never_reused(self, lifecycle):
        used = new_uuid()
        life = lifecycle("t4x8", mdevs=[{"parent": T4A, "type": "nvidia-222", "uuid": used}])
        life.domains.define("other-guest", [used])
        got = life.allocate(new_uuid(), T4A)
        assert got != [used] and len(life.host.list_mdevs()) == 2

    def test_an_mdev_claimed_by_another_instance_is_never_reused(self, lifecycle):
        life = lifecycle("t4x8")
        first = life.allocate(new_uuid(), T4A)
        second = life.allocate(new_uuid(), T4A)
        assert set(first).isdisjoint(second)

    def test_several_vgpus_on_several_gpus(self, lifecycle):
        life = lifecycle("a100-sriov", "t4x8")
        instance = new_uuid()
        got = life.allocate(instance, A100, T4A, T4B, units=2)
        assert len(got) == 6 and len(set(got)) == 6
        by_gpu = {}
        for claim in life.journal.claims(instance):
            by_gpu.setdefault(claim.gpu, []).append(claim.parent)
        assert sorted(by_gpu[A100]) == A100_VFS[:2]
        assert by_gpu[T4A] == [T4A, T4A] and by_gpu[T4B] == [T4B, T4B]

    def test_a_retry_returns_the_same_mdevs(self, lifecycle):
        life = lifecycle("a100-sriov")
        instance = new_uuid()
        first = life.allocate(instance, A100, units=3)
        assert life.allocate(instance, A100, units=3) == first
        assert len(life.host.list_mdevs()) == 3

    def test_no_capacity_is_typed_and_leaves_nothing_behind(self, lifecycle):
        life = lifecycle("a100-sriov")
        for _ in range(10):
            life.boot(A100)
        before = life.journal.claims()
        with pytest.raises(exception.NoGpuCapacity) as caught:
            life.allocate("late-guest", A100)
        assert str(caught.value) == (
            "Cannot give late-guest 1 x nvidia-468 on 0000:41:00.0: 0 free and 0 "
            "creatable (10 already claimed)."
        )
        assert life.journal.claims() == before

    def test_asking_more_than_fits_claims_nothing(self, lifecycle):
        life = lifecycle("a100-sriov")
        with pytest.raises(exception.NoGpuCapacity):
            life.allocate("greedy", A100, units=11)
        assert life.journal.claims() == [] and life.host.list_mdevs() == []

    def test_wrong_type_in_use_is_typed(self, lifecycle):
        old = new_uuid()
        life = lifecycle(
            "t4x8",
            types=("nvidia-231",),
            by_address={},
            mdevs=[{"parent": T4A, "type": "nvidia-222", "uuid": old}],
        )
        life.domains.define("old-guest", [old])
        with pytest.raises(exception.WrongTypePresent) as caught:
            life.allocate("new-guest", T4A)
        assert "holds 1 mdev(s) of nvidia-222 still in use" in str(caught.value)

    def test_parent_gone_is_typed(self, lifecycle):
        life = lifecycle("a100-sriov")
        life.host.set_vfs(A100, 0)
        with pytest.raises(exception.GpuGone) as caught:
            life.allocate("guest", A100)
        assert "SR-IOV VFs not enabled" in str(caught.value)

    def test_a_parent_gone_while_its_reads_disagree_is_typed(self, lifecycle, monkeypatch):
        """Another writer adds an mdev between each pair of reads, then the
        vendor driver unregisters the parent: the GPU is gone, no crash."""
        life = lifecycle("t4x8")
        listed = life.host.parent_mdev_uuids
        calls = []

        def churning(parent):
            calls.append(parent)
            if len(calls) <= 5:
                life.host.create_mdev(T4A, "nvidia-222", new_uuid())
            found = listed(parent)
            if len(calls) == 5:
                life.host.unregister_parent(T4A)
            return found

        monkeypatch.setattr(life.host, "parent_mdev_uuids", churning)
        with pytest.raises(exception.GpuGone):
            life.allocate("guest", T4A)
        assert len(calls) == 5

    def test_unknown_provider_is_typed(self, lifecycle):
        life = lifecycle("t4x8")
        with pytest.raises(exception.UnknownProvider):
            life.manager.allocate(
                "guest", {"rp-elsewhere": {"resources": {"VGPU": 1}}}, life.providers
            )

    def test_other_resource_classes_are_ignored(self, lifecycle):
        life = lifecycle("t4x8")
        assert (
            life.manager.allocate("guest", {"root": {"resources": {"VCPU": 4}}}, life.providers)
            == []
        )


class TestRelease:
    def test_keep_leaves_the_mdev_for_the_next_guest(self, lifecycle):
        life = lifecycle("t4x8")
        instance, got = life.boot(T4A)
        assert life.delete(instance) == got
        assert life.journal.claims() == []
        assert life.allocate(new_uuid(), T4A) == got

    def test_remove_policy_removes_the_mdev(self, lifecycle):
        life = lifecycle("t4x8", remove_on_release=True)
        instance, got = life.boot(T4A)
        assert life.delete(instance) == got
        assert life.host.list_mdevs() == [] and life.journal.claims() == []

    def test_a_busy_mdev_stays_reserved_until_the_kernel_lets_go(self, lifecycle):
        life = lifecycle("t4x8", remove_on_release=True, remove_timeout=0.2)
        instance, got = life.boot(T4A)
        life.host.hold(got[0])
        assert life.delete(instance) == []
        assert [c.state for c in life.journal.claims()] == [claims.RELEASING]
        assert life.allocate("next", T4A) != got  # not handed out meanwhile
        life.host.release(got[0])
        removed(life)  # the blocked remove completes once the guest lets go
        assert life.reconciler.finish_releases() == got
        assert got[0] not in {m.uuid for m in life.host.list_mdevs()}

    def test_a_guest_back_gets_a_new_vgpu_not_the_one_going_away(self, lifecycle):
        """Its own claim on a vGPU whose removal the kernel still blocks is
        not reused: once the kernel lets go, that vGPU is gone."""
        life = lifecycle("t4x8", remove_on_release=True, remove_timeout=0.2)
        instance, old = life.boot(T4A)
        life.host.hold(old[0])
        assert life.delete(instance) == []
        again = life.allocate(instance, T4A)
        assert again != old
        life.host.release(old[0])
        removed(life)
        assert life.reconciler.finish_releases() == old
        assert {m.uuid for m in life.host.list_mdevs()} == set(again)
        assert [(c.mdev_uuid, c.state) for c in life.journal.claims()] == [
            (again[0], claims.CLAIMED)
        ]

    def test_a_guest_defined_again_leaves_its_blocked_removal_releasing(self, lifecycle):
        """A guest that moved away while its old vGPU's removal is blocked,
        and came back: its new domain is attached, the old vGPU stays going
        (attached, it would be held for nobody, Placement counting it not)."""
        life = lifecycle("t4x8", remove_on_release=True, remove_timeout=0.2)
        instance, old = life.boot(T4A)
        life.host.hold(old[0])
        assert life.delete(instance) == []
        new = life.allocate(instance, T4B)
        life.domains.define(instance, new)
        assert life.manager.mark_attached(instance) == 1
        assert {c.mdev_uuid: c.state for c in life.journal.claims()} == {
            old[0]: claims.RELEASING,
            new[0]: claims.ATTACHED,
        }
        life.host.release(old[0])
        removed(life)
        assert life.reconciler.finish_releases() == old
        assert [c.mdev_uuid for c in life.journal.claims()] == new


class TestTypeChange:
    def test_one_gpu_draining_one_converting(self, lifecycle):
        in_use, unused = new_uuid(), new_uuid()
        life = lifecycle(
            "t4x8",
            types=("nvidia-231",),
            by_address={},
            mdevs=[
                {"parent": T4A, "type": "nvidia-222", "uuid": in_use},
                {"parent": T4B, "type": "nvidia-222", "uuid": unused},
            ],
        )
        life.domains.define("old-guest", [in_use])
        outcomes = life.reconciler.reclaim_stale_types()
        assert [(o.mdev_uuid, o.result) for o in outcomes] == [(unused, "removed")]
        life.refresh()
        draining, converted = life.tree.by_gpu(T4A), life.tree.by_gpu(T4B)
        assert (draining.total, draining.reserved) == (8, 8)
        assert draining.reason.startswith("draining: mdevs (1 of nvidia-222) of which 1 in use")
        assert (converted.total, converted.reserved) == (8, 0)
        assert life.allocate("new-guest", T4B)
        with pytest.raises(exception.WrongTypePresent):
            life.allocate("another", T4A)
        life.domains.undefine("old-guest")
        assert [o.mdev_uuid for o in life.reconciler.reclaim_stale_types()] == [in_use]
        life.refresh()
        assert (life.tree.by_gpu(T4A).total, life.tree.by_gpu(T4A).reserved) == (8, 0)


class TestOrphans:
    def test_kinds_grace_and_reclaim(self, lifecycle):
        free, stale, used = new_uuid(), new_uuid(), new_uuid()
        life = lifecycle(
            "a100-sriov",
            "mtty",
            types=("nvidia-468",),
            mdevs=[
                {"parent": A100_VFS[0], "type": "nvidia-468", "uuid": free},
                {"parent": A100_VFS[1], "type": "nvidia-468", "uuid": used},
                {"parent": "mtty", "type": "mtty-1", "uuid": stale},
            ],
            by_address={A100: "nvidia-468", "mtty_mtty": "mtty-2"},
        )
        life.domains.define("guest", [used])
        orphans = {o.mdev_uuid: o.kind for o in life.reconciler.orphans()}
        assert orphans == {free: reconcile.FREE, stale: reconcile.STALE_TYPE}
        assert life.reconciler.orphans(grace=3600) == []
        dry = life.reconciler.reclaim(life.reconciler.orphans(), dry_run=True)
        assert {o.result for o in dry} == {"would-remove"}
        assert len(life.host.list_mdevs()) == 3
        done = life.reconciler.reclaim(life.reconciler.orphans())
        assert {(o.mdev_uuid, o.result) for o in done} == {(free, "removed"), (stale, "removed")}
        assert [m.uuid for m in life.host.list_mdevs()] == [used]
        assert life.journal.claims() == []

    def test_an_orphan_claimed_meanwhile_is_kept(self, lifecycle):
        free = new_uuid()
        life = lifecycle("t4x8", mdevs=[{"parent": T4A, "type": "nvidia-222", "uuid": free}])
        listed = life.reconciler.orphans()
        life.allocate("quick-guest", T4A)
        assert [(o.result, o.reason) for o in life.reconciler.reclaim(listed)] == [
            ("kept", "in use now")
        ]
        assert [m.uuid for m in life.host.list_mdevs()] == [free]


class TestReboot:
    def test_restores_exactly_the_referenced_mdevs_once_vfs_return(self, lifecycle):
        life = lifecycle("a100-sriov", "t4x8")
        referenced = []
        for gpu in (A100, A100, T4A):
            _, got = life.boot(gpu)
            referenced += got
        claimed_only = life.allocate("booting-guest", T4B)
        life.allocate("gone-guest", T4B)
        life.delete("gone-guest")  # its mdev is free: not restored
        before = {
            (m.uuid, m.parent, m.type_id)
            for m in life.host.list_mdevs()
            if m.uuid in referenced + claimed_only
        }
        life.host.reboot()
        assert life.host.list_mdevs() == []
        # The vendor's enablement step brings the VFs back a little later:
        # until then the A100's vGPUs wait, the T4's come back at once.
        waiting = {o.mdev_uuid: o.result for o in life.reconciler.restore()}
        assert {u for u, r in waiting.items() if r == "waiting"} == {
            u for u in referenced + claimed_only if u in before_on(A100, before)
        }
        life.host.set_vfs(A100, 16)
        outcomes = life.reconciler.restore()
        assert {(o.mdev_uuid, o.result) for o in outcomes} == {
            (u, "restored") for u in referenced + claimed_only if waiting[u] == "waiting"
        }
        after = {(m.uuid, m.parent, m.type_id) for m in life.host.list_mdevs()}
        assert after == before

    def test_restores_one_instance_only_when_asked(self, lifecycle):
        """A hard reboot re-creates that guest's mdevs, not its neighbours'."""
        life = lifecycle("t4x8")
        rebooting, mine = life.boot(T4A)
        _, theirs = life.boot(T4B)
        life.host.reboot()
        outcomes = life.reconciler.restore(instance_uuid=rebooting)
        assert [(o.mdev_uuid, o.result) for o in outcomes] == [(mine[0], "restored")]
        assert [m.uuid for m in life.host.list_mdevs()] == mine
        assert theirs[0] not in {m.uuid for m in life.host.list_mdevs()}

    def test_reports_what_could_not_be_restored(self, lifecycle):
        life = lifecycle("a100-sriov")
        _, got = life.boot(A100)
        life.domains.define("foreign-guest", [new_uuid()])
        life.host.reboot()
        outcomes = life.reconciler.restore()
        reasons = {o.mdev_uuid: (o.result, o.reason) for o in outcomes}
        assert reasons[got[0]] == (
            "waiting",
            f"parent {A100_VFS[0]} of GPU {A100} is not there yet",
        )
        assert sorted(r for r, _ in reasons.values()) == ["failed", "waiting"]
        assert "no claim records its GPU and type" in str(reasons)


class TestStaleClaims:
    def test_claims_nobody_came_for_are_dropped(self, lifecycle):
        life = lifecycle("t4x8")
        life.allocate("never-booted", T4A)
        kept_instance, _ = life.boot(T4A)
        life.allocate("migrating", T4B)
        with life.journal.transaction() as txn:
            txn.set_state("migrating", claims.MIGRATING_IN)
        lost_instance, _ = life.boot(T4B)
        life.domains.undefine(lost_instance)
        lost = life.reconciler.clean_stale_claims(grace=3600)
        assert [c.instance_uuid for c in lost] == [lost_instance]
        remaining = {c.instance_uuid for c in life.journal.claims()}
        assert remaining == {"never-booted", kept_instance, "migrating"}
        stale = life.reconciler.clean_stale_claims(grace=0)
        assert [c.instance_uuid for c in stale] == ["never-booted"]
        assert {c.instance_uuid for c in life.journal.claims()} == {kept_instance, "migrating"}

    @pytest.mark.parametrize("remove_on_release", [True, False])
    def test_a_dropped_claim_s_vgpu_goes_as_a_release_s_does(self, lifecycle, remove_on_release):
        """nova deletes an offloaded server without asking its last compute:
        the claim is dropped as stale, and its mdev must go with it when
        releases remove vGPUs (nothing else would ever remove it), or stay
        free for the next guest when they keep them."""
        life = lifecycle("t4x8", remove_on_release=remove_on_release)
        lost_instance, mdevs = life.boot(T4A)
        life.domains.undefine(lost_instance)
        dropped = life.reconciler.clean_stale_claims(grace=0)
        assert [c.mdev_uuid for c in dropped] == mdevs
        assert life.journal.claims() == []
        on_host = {m.uuid for m in life.host.list_mdevs()}
        assert (set(mdevs) <= on_host) is not remove_on_release


class TestErrno:
    @pytest.mark.parametrize(
        "code,cls",
        [
            (errno.EINVAL, exception.MdevInvalidRequest),
            (errno.EEXIST, exception.MdevAlreadyExists),
            (errno.EUSERS, exception.MdevNoCapacity),
            (errno.ENOSPC, exception.MdevNoCapacity),
            (errno.ENOMEM, exception.MdevNoCapacity),
            (errno.ENODEV, exception.MdevParentGone),
            (errno.EBUSY, exception.MdevBusy),
            (errno.EIO, exception.MdevIOError),
        ],
    )
    def test_each_kernel_errno_has_its_type_and_advice(self, code, cls):
        error = exception.MdevWriteError.from_os_error(
            "create", "nvidia-35 on 0000:84:00.0", OSError(code, "kernel says no")
        )
        assert type(error) is cls and error.errno == code
        assert str(error).startswith(
            f"create failed on nvidia-35 on 0000:84:00.0: "
            f"[{errno.errorcode[code]}] kernel says no. "
        )
        assert len(str(error)) > 80  # carries a hint an operator can act on

    def test_the_fake_kernel_errors_arrive_typed(self, lifecycle):
        life = lifecycle("mtty", types=("mtty-2",), by_address={})
        for _ in range(12):
            life.host.create_mdev("mtty", "mtty-2", new_uuid())
        with pytest.raises(exception.MdevNoCapacity):
            life.host.create_mdev("mtty", "mtty-2", new_uuid())
        with pytest.raises(exception.MdevParentGone):
            life.host.remove_mdev(new_uuid())  # no such mdev: its entry is gone
