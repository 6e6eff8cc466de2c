"""Random sequences of allocate / release / reclaim / type change.

Whatever the order, after every step: no mdev is held by two guests or two
claims, every guest's and claim's mdev exists with its claimed type, reclaim
never removes a referenced mdev, and the inventory never reports less than
what is in use.
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
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver import mdevs
from vgpu_driver import reconcile
from vgpu_driver.conf import mdev_settings
from vgpu_driver.fake import domains
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

A100, T4 = "0000:41:00.0", "0000:18:00.0"
T4_TYPES = ("nvidia-222", "nvidia-231")  # 16 and 8 per GPU
PROFILE = profiles.combine(
    "prop",
    profiles.load("a100-sriov"),
    {**profiles.load("t4x8"), "gpus": profiles.load("t4x8")["gpus"][:1]},
)

steps = st.lists(
    st.one_of(
        st.tuples(st.just("boot"), st.sampled_from([A100, T4]), st.integers(1, 3)),
        st.tuples(st.just("delete"), st.integers(0, 50)),
        st.tuples(st.just("reclaim"), st.booleans()),
        st.tuples(st.just("retype"), st.sampled_from(T4_TYPES)),
    ),
    max_size=30,
)


class Host:
    def __init__(self, root, remove_on_release):
        self.kernel = fakekernel.FakeKernel.build(f"{root}/sys", PROFILE)
        self.journal = claims_journal.Journal(f"{root}/state")
        self.domains = domains.InProcessDomains()
        self.guests = {}
        self.remove_on_release = remove_on_release
        self.retype(T4_TYPES[0])

    def retype(self, t4_type):
        self.config = mdev_settings.MdevConfig(
            types=(mdev_settings.TypeConfig("nvidia-468"), mdev_settings.TypeConfig(t4_type)),
            by_address=MappingProxyType({A100: "nvidia-468", T4: t4_type}),
        )
        self.manager = mdevs.MdevManager(
            self.kernel,
            self.journal,
            self.domains,
            self.config,
            remove_on_release=self.remove_on_release,
        )
        self.reconciler = reconcile.Reconciler(self.manager)
        self.reconciler.reclaim_stale_types()

    def tree(self):
        return inventory.compute(
            discovery.discover(self.kernel), self.config, "cn1", self.reconciler.in_use()
        )

    def boot(self, gpu, units):
        providers = {p.gpu: p for p in self.tree().providers}
        instance = str(uuid.uuid4())
        try:
            got = self.manager.allocate(instance, {gpu: {"resources": {"VGPU": units}}}, providers)
        except exception.AllocationError:
            assert self.journal.claims(instance) == []
            return
        self.domains.define(instance, got)
        self.manager.mark_attached(instance)
        self.guests[instance] = got

    def delete(self, index):
        if self.guests:
            instance = sorted(self.guests)[index % len(self.guests)]
            self.domains.undefine(instance)
            self.manager.release(instance)
            del self.guests[instance]

    def reclaim(self, everything):
        referenced = self.reconciler.in_use()
        orphans = self.reconciler.orphans()
        if not everything:
            orphans = [o for o in orphans if o.kind == reconcile.STALE_TYPE]
        self.reconciler.reclaim(orphans)
        present = {m.uuid for m in self.kernel.list_mdevs()}
        assert referenced <= present

    def check(self):
        present = {m.uuid: m for m in self.kernel.list_mdevs()}
        held = [u for got in self.guests.values() for u in got]
        assert len(held) == len(set(held))
        claimed = self.journal.claims()
        assert {c.mdev_uuid for c in claimed} == set(held)
        for claim in claimed:
            assert present[claim.mdev_uuid].type_id == claim.type_id
            assert present[claim.mdev_uuid].parent == claim.parent
        for provider in self.tree().providers:
            in_use = sum(
                1 for c in claimed if c.gpu == provider.gpu and c.type_id == provider.type_id
            )
            assert in_use <= provider.total


@settings(
    max_examples=properties.examples(12),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(steps=steps, remove_on_release=st.booleans())
def test_lifecycle_invariants_hold(steps, remove_on_release):
    root = tempfile.mkdtemp(prefix="vgpu-life-")
    try:
        host = Host(root, remove_on_release)
        for step in steps:
            getattr(host, step[0])(*step[1:])
            host.check()
    finally:
        shutil.rmtree(root)
