"""Placement grants a request iff the board accepts it, on every board family.

For each board family of :mod:`vgpu_driver.fake.board_tables` that can mix
sizes (A100 40 and 80 GB, A40, A10, L40S, L4, H100 80 GB, H100 NVL, the
96 GB Blackwell board; under NVIDIA's vendor-specific VFIO framework, in
mixed-size mode, every type of the family configured), random walks of
creations and removals of 1-, 2- and 3-vGPU requests of one type run
against a real Placement: the board's inventory is computed by
``inventory.compute`` from what NVML says and synced after every step,
granted requests are allocated in Placement and their VFs typed through
the real planner and vendor-VFIO strategy.  After each step, for every
configured type and every count of 1 to 3, Placement's allocation
candidates (the flavor's extra specs, :func:`size_classes.flavor_spec`)
are compared with the board itself: the request's VFs typed one after
another, then cleared.  Each walk is short (a few steps, two walks per
board by default: ``VGPU_PROPERTY_EXAMPLES`` draws more).

Every board family as a type pool (equal-size mode, one size at a time)
meets the same property, one walk per board.

The mutations check the test can fail: the framebuffer class alone with
the old ``max_unit`` (the largest size creatable now), and a size class
that counts one free VF as enough, and a pool board that offers every
size while it holds one, each give a counterexample.
"""

import collections
import copy
import dataclasses
import itertools
import random
import sys
import uuid
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tests import properties
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import framebuffer
from vgpu_driver import inventory
from vgpu_driver import nvml
from vgpu_driver import placement
from vgpu_driver import size_classes
from vgpu_driver.conf.mdev_settings import MdevConfig
from vgpu_driver.conf.mdev_settings import TypeConfig
from vgpu_driver.fake import board_tables
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import nvml as fake_nvml
from vgpu_driver.fake import profiles
from vgpu_driver.fake import vendor
from vgpu_driver.fake.domains import InProcessDomains
from vgpu_driver.inventory import pool
from vgpu_driver.mdevs import planner
from vgpu_driver.mdevs import strategies
from vgpu_driver.placement_service import EmbeddedPlacement

PF = "0000:c1:00.0"
PROJECT = USER = "0" * 32
COUNTS = (1, 2, 3)
VFS = 12


def profile_of(board):
    """A fake host whose one GPU is ``board`` (:mod:`vgpu_driver.fake.board_tables`)
    under vendor VFIO, every type of its family offered, with fewer VFs
    than small placements so that VFs run out first on some walks."""
    return board_tables.host_profile(board, PF, numvfs=VFS, first_type=9000)


def boards():
    """``[(board key, profile)]``: every board family of the fake that can
    mix sizes (48 GB Ampere and Ada, 24, 40, 80 and 94 GB, and the 96 GB
    Blackwell board with its 3-slot 2 GB type)."""
    found = []
    for key, board in sorted(board_tables.BOARDS.items()):
        profile = profile_of(board)
        if vendor.can_mix_sizes(vendor.host_model(profile)["gpus"][0]):
            found.append((key, profile))
    return found


BOARDS = boards()


class Walk:
    """One board, its real Placement provider, its vGPUs by consumer."""

    def __init__(self, root, profile, client, nodename, old_flavors=False, pools=False):
        self.kernel = fakekernel.FakeKernel.build(root, profile)
        fake_nvml.use_host(root)
        if not pools:  # a type pool stays in equal-size mode
            nvml.set_heterogeneous_mode(PF, True)
        self.types = tuple(t["id"] for t in profile["gpus"][0]["types"])
        self.config = MdevConfig(
            types=tuple(TypeConfig(t, device_addresses=(PF,)) for t in self.types),
            mixed_by_address=MappingProxyType({PF: self.types}),
            pools=pools,
        )
        self.client, self.nodename, self.old_flavors = client, nodename, old_flavors
        self.sync = placement.ProviderSync(client)
        self.domains = InProcessDomains()
        self.held = {}  # consumer -> [VF]
        for type_id in self.types:
            client.request("PUT", f"/traits/{self.trait(type_id)}")
        self.resync()

    @staticmethod
    def trait(type_id):
        return inventory.type_traits(type_id, None)[0]

    def resync(self):
        snapshot = discovery.discover(self.kernel)
        self.tree = inventory.compute(
            snapshot,
            self.config,
            self.nodename,
            boards=inventory.read_boards(self.kernel, snapshot, self.config),
        )
        self.provider = self.tree.by_gpu(PF)
        assert self.provider is not None, self.tree.unserved
        self.sync.sync(self.tree)
        self.root_uuid = self.sync.known[self.nodename].uuid

    def spec(self, type_id, count):
        size = dict(self.provider.sizes)[type_id] // framebuffer.SLOT_MIB
        specs = size_classes.flavor_spec(
            self.trait(type_id),
            None if self.old_flavors else size,
            size * framebuffer.SLOT_MIB,
            count,
            framebuffer.RESOURCE_CLASS,
        )
        # in_tree<group>: the walk's own board, not those of walks before it.
        return {
            **size_classes.candidates_query(specs),
            f"in_tree{size_classes.GROUP}": self.root_uuid,
        }

    def candidates(self, type_id, count):
        found = self.client.request(
            "GET", placement.query_url("/allocation_candidates", **self.spec(type_id, count))
        )
        return found["allocation_requests"]

    def board_takes(self, type_id, most):
        """How many of ``most`` free VFs take the type one after another
        (undone): the board accepts ``N`` vGPUs of it iff that is ``N`` or
        more, since the first ``N`` of them are typed as ``N`` would be."""
        number = int(type_id.split("-")[1])
        done = []
        try:
            for vf in self.free_vfs()[:most]:
                self.kernel.set_vendor_vgpu_type(vf, number)
                done.append(vf)
        except (exception.MdevInvalidRequest, exception.MdevNoCapacity):
            pass  # the board refused: what is asked
        for vf in done:
            self.kernel.set_vendor_vgpu_type(vf, 0)
        return len(done)

    def free_vfs(self):
        return [str(vf.address) for vf in self.kernel.list_vendor_vfio() if not vf.current_type]

    def counterexample(self):
        """The first ``(type, count, granted, accepted)`` that disagree, or None."""
        for type_id in self.types:
            taken = self.board_takes(type_id, max(COUNTS))
            for count in COUNTS:
                granted = bool(self.candidates(type_id, count))
                if granted != (taken >= count):
                    return type_id, count, granted, taken >= count
        return None

    def create(self, type_id, count):
        """Allocate and type what Placement grants (nothing if it refuses)."""
        found = self.candidates(type_id, count)
        if not found:
            return False
        consumer = str(uuid.uuid4())
        allocations = found[0]["allocations"]
        self.client.request(
            "PUT",
            f"/allocations/{consumer}",
            {
                "allocations": allocations,
                "project_id": PROJECT,
                "user_id": USER,
                "consumer_generation": None,
                "consumer_type": "INSTANCE",
            },
        )
        by_uuid = {self.sync.known[p.name].uuid: p for p in self.tree.providers}
        (request,) = planner.requests_of(
            consumer, allocations, by_uuid, self.config.mdev_classes, {self.trait(type_id)}
        )
        gpu = discovery.discover(self.kernel).gpu(PF)
        strategy = strategies.VendorVfioStrategy(self.kernel, self.domains, self.config)
        users = self.domains.mdev_users()
        state = strategy.gpu_state(consumer, gpu, request.type_id, users)
        items = planner.plan_gpu(consumer, request, state, {}, users)
        for item in items:
            strategy.create(consumer, item)
        self.domains.define(consumer, [item.mdev_uuid for item in items])
        self.held[consumer] = [item.mdev_uuid for item in items]
        self.resync()
        return True

    def remove(self, consumer):
        strategy = strategies.VendorVfioStrategy(self.kernel, self.domains, self.config)
        self.domains.undefine(consumer)
        for vf in self.held.pop(consumer):
            strategy.destroy(vf, timeout=5)
        self.client.request("DELETE", f"/allocations/{consumer}")
        self.resync()

    def step(self, rng):
        if self.held and rng.random() < 0.35:
            self.remove(rng.choice(sorted(self.held)))
        else:
            self.create(rng.choice(self.types), rng.choice(COUNTS))


@pytest.fixture(scope="module")
def service():
    with EmbeddedPlacement() as running:
        yield running


@pytest.fixture(autouse=True)
def fake_pynvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    yield
    fake_nvml.use_host(None)


_names = itertools.count()


def new_walk(tmp_path_factory, service, profile, **kwargs):
    root = str(tmp_path_factory.mktemp("board") / "sys")
    return Walk(
        root, profile, placement.Client(service.connection()), f"cn{next(_names)}", **kwargs
    )


@pytest.mark.parametrize("label, profile", BOARDS, ids=[b[0] for b in BOARDS])
@settings(
    max_examples=properties.examples(2),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(3, 6))
def test_placement_grants_iff_the_board_accepts(
    tmp_path_factory, service, label, profile, seed, steps
):
    walk, rng = new_walk(tmp_path_factory, service, profile), random.Random(seed)
    for _step in range(steps):
        assert walk.counterexample() is None, (label, walk.held)
        walk.step(rng)
    assert walk.counterexample() is None, (label, walk.held)


POOL_BOARDS = [(key, profile_of(board)) for key, board in sorted(board_tables.BOARDS.items())]


@pytest.mark.parametrize("label, profile", POOL_BOARDS, ids=[b[0] for b in POOL_BOARDS])
@settings(
    max_examples=properties.examples(1),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(4, 8))
def test_a_type_pool_grants_iff_the_board_accepts(
    tmp_path_factory, service, label, profile, seed, steps
):
    """Every board family as a type pool (equal-size mode, every type of the
    family configured): the same property, one size at a time, with VFs
    fewer than the small types' maxima."""
    walk = new_walk(tmp_path_factory, service, profile, pools=True)
    rng = random.Random(seed)
    for _step in range(steps):
        assert walk.counterexample() is None, (label, walk.held)
        walk.step(rng)
    assert walk.counterexample() is None, (label, walk.held)


def test_a_pool_offering_every_size_while_it_holds_one_fails_it(
    tmp_path_factory, service, monkeypatch
):
    """A pool board that kept offering the other sizes once typed: the
    board refuses them (equal-size mode), Placement would grant them."""
    original = pool.room_by_size
    monkeypatch.setattr(
        pool, "room_by_size", lambda most, taken, free_vfs: original(most, {}, free_vfs)
    )
    walk = new_walk(tmp_path_factory, service, profiles.load("l40s-vfio"), pools=True)
    assert walk.create("nvidia-1156", 1)
    assert walk.counterexample() == ("nvidia-1155", 1, True, False)


def seeded_counterexample(tmp_path_factory, service, **kwargs):
    """The first counterexample seeded walks on every board find, or None."""
    for label, profile in BOARDS:
        walk, rng = new_walk(tmp_path_factory, service, profile, **kwargs), random.Random(7)
        for _step in range(25):
            found = walk.counterexample()
            if found:
                return label, found
            walk.step(rng)
    return None


def old_max_unit(original):
    """The framebuffer class as it was: max_unit the largest size creatable now."""

    def inventory_(board_slots, found, used_slots, free_vfs):
        fb = original(board_slots, found, used_slots, free_vfs)
        creatable = [f.size for f in found.values() if f.creatable]
        largest = (
            max(creatable) if creatable and free_vfs > 0 else min(f.size for f in found.values())
        )
        return dataclasses.replace(fb, max_unit=largest * framebuffer.SLOT_MIB)

    return inventory_


def test_the_old_max_unit_rule_fails_it(tmp_path_factory, service, monkeypatch):
    """Flavors asking MiB alone against the framebuffer class whose
    max_unit is the largest creatable size: 2 x 24 GB refused on an empty
    board, 3 x 4 GB granted where two fit."""
    monkeypatch.setattr(framebuffer, "inventory", old_max_unit(framebuffer.inventory))
    monkeypatch.setattr(size_classes, "inventories", lambda *args: {})
    assert seeded_counterexample(tmp_path_factory, service, old_flavors=True) is not None


def test_one_free_vf_enough_fails_it(tmp_path_factory, service, monkeypatch):
    """A size class counting every disjoint placement while one VF is free:
    ten 1 GB vGPUs on a 48 GB board of 12 VFs leave room for many more,
    but two VFs, and 3 x 1 GB is granted."""
    monkeypatch.setattr(
        size_classes, "available", lambda creatable, free_vfs: creatable if free_vfs else 0
    )
    profile = dict(BOARDS)["a40"]
    walk = new_walk(tmp_path_factory, service, profile)
    one_gb = walk.types[0]
    for _ in range(5):
        assert walk.create(one_gb, 2)
    assert len(walk.free_vfs()) == 2
    assert walk.counterexample() == (one_gb, 3, True, False)


def test_counts_of_each_walk_are_seen(tmp_path_factory, service):
    """The walks reach both answers for multi-vGPU requests: the property
    is not met by a board that is always empty or always full."""
    seen = collections.Counter()
    label, profile = BOARDS[0]
    walk, rng = new_walk(tmp_path_factory, service, profile), random.Random(3)
    for _step in range(10):
        for type_id, count in itertools.product(walk.types[:3], (2, 3)):
            seen[count, bool(walk.candidates(type_id, count))] += 1
        walk.step(rng)
    assert all(seen[count, answer] for count in (2, 3) for answer in (True, False)), seen


def test_a_flavors_vgpus_come_from_one_board(tmp_path_factory, service):
    """Two boards on one host: every candidate Placement offers for a
    flavor's specs takes the MiB, the size class and the trait from one
    board.  Ungrouped, Placement would also offer the MiB of one board with
    the size class of the other."""
    one = profiles.load("l40s-vfio")
    other = copy.deepcopy(one)
    other["gpus"][0]["address"] = "0000:c2:00.0"
    profile = profiles.combine("two", one, other)
    walk = new_walk(tmp_path_factory, service, profile)
    nvml.set_heterogeneous_mode("0000:c2:00.0", True)
    walk.config = MdevConfig(
        types=tuple(TypeConfig(t, device_addresses=(PF, "0000:c2:00.0")) for t in walk.types),
        mixed_by_address=MappingProxyType(dict.fromkeys((PF, "0000:c2:00.0"), walk.types)),
    )
    walk.resync()
    assert len(walk.tree.providers) == 2
    found = walk.candidates("nvidia-1155", 2)
    assert found and all(len(c["allocations"]) == 1 for c in found), found
    specs = size_classes.flavor_spec(
        walk.trait("nvidia-1155"), 4, 4096, 2, framebuffer.RESOURCE_CLASS
    )
    ungrouped = ",".join(
        f"{k.split(':', 1)[1]}:{v}" for k, v in specs.items() if k.startswith("resources")
    )
    split = walk.client.request(
        "GET",
        placement.query_url("/allocation_candidates", resources=ungrouped, in_tree=walk.root_uuid),
    )
    assert any(len(c["allocations"]) == 2 for c in split["allocation_requests"])
