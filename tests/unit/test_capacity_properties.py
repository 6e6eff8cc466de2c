"""Properties over random create/remove sequences on fake hosts.

Two promises are checked after every step: the fake kernel's
``available_instances`` is honest (a create succeeds exactly when it says
there is room), and the inventory is honest (what it reports as usable for
the configured type is exactly what exists plus what can still be created).
"""

import shutil
import tempfile
import uuid
from types import MappingProxyType

from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

from tests import properties
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver.conf import mdev_settings
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

A100 = profiles.load("a100-sriov")
T4_ONE = {**profiles.load("t4x8"), "gpus": profiles.load("t4x8")["gpus"][:1]}
A100_TYPES = [t["id"] for t in A100["type_sets"]["a100"]]
T4_TYPES = ["nvidia-222", "nvidia-223", "nvidia-231", "nvidia-234", "nvidia-319"]

step = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(A100_TYPES + T4_TYPES), st.integers(0, 15)),
    st.tuples(st.just("remove"), st.integers(0, 40)),
)


def available(host, parent, type_id):
    for info in host.list_parents():
        if info.name == parent:
            mdev_type = info.type(type_id)
            return mdev_type.available_instances if mdev_type else None
    return None


def apply(host, action):
    if action[0] == "remove":
        mdevs = host.list_mdevs()
        if mdevs:
            host.remove_mdev(mdevs[action[1] % len(mdevs)].uuid)
        return
    _, type_id, vf_index = action
    parent = host.list_parents()[0 if type_id in T4_TYPES else 1 + vf_index].name
    before = available(host, parent, type_id)
    try:
        host.create_mdev(parent, type_id, str(uuid.uuid4()))
        created = True
    except exception.MdevWriteError:
        created = False
    assert created == (before >= 1), (parent, type_id, before)


def creatable_now(host, gpu_parents, type_id):
    """Create greedily until refused, then undo: how many more really fit."""
    made = []
    for parent in gpu_parents:
        while True:
            uid = str(uuid.uuid4())
            try:
                host.create_mdev(parent, type_id, uid)
            except exception.MdevWriteError:
                break
            made.append(uid)
    for uid in made:
        host.remove_mdev(uid)
    return len(made)


def check_inventory(host, type_by_gpu):
    config = mdev_settings.MdevConfig(
        types=tuple(mdev_settings.TypeConfig(t) for t in sorted(set(type_by_gpu.values()))),
        by_address=MappingProxyType(dict(type_by_gpu)),
    )
    snapshot = discovery.discover(host)
    tree = inventory.compute(snapshot, config, "cn1")
    for gpu in snapshot.gpus:
        type_id = type_by_gpu[gpu.address]
        provider = tree.by_gpu(gpu.address)
        existing = gpu.vgpu_types_in_use().get(type_id, 0)
        more = creatable_now(host, [p.name for p in gpu.parents], type_id)
        assert provider.total - provider.reserved == existing + more, provider
        assert provider.reserved in (0, provider.total)


@settings(
    max_examples=properties.examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(
    steps=st.lists(step, max_size=25),
    a100_type=st.sampled_from(A100_TYPES),
    t4_type=st.sampled_from(T4_TYPES),
)
def test_advertised_and_reported_capacity_are_honest(steps, a100_type, t4_type):
    root = tempfile.mkdtemp(prefix="vgpu-prop-")
    try:
        host = fakekernel.FakeKernel.build(f"{root}/sys", profiles.combine("prop", T4_ONE, A100))
        for action in steps:
            apply(host, action)
        check_inventory(host, {"0000:18:00.0": t4_type, "0000:41:00.0": a100_type})
        for mdev in host.list_mdevs():
            host.remove_mdev(mdev.uuid)
        assert available(host, "0000:18:00.0", "nvidia-222") == 16
        assert all(available(host, p.name, "nvidia-468") == 1 for p in host.list_parents()[1:])
    finally:
        shutil.rmtree(root)
