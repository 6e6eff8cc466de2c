"""nova-compute killed at any step of receiving a vendor-VFIO guest.

The destination of a live migration of a guest whose vGPUs are NVIDIA
vendor-specific VFIO VFs: claim VFs (journal state ``migrating_in``), set
each one's vGPU type, hand the source the mapping, receive the guest's
domain, turn the claims into ``attached`` ones.  nova-compute can die
between any two of these; after its restart the migration ends one of two
ways, and either leaves the host consistent:

* ``rollback``: nova's rollback reaches the restarted destination (the
  source's migration failed, or never got the mapping): no claim of the
  guest is left and every VF the attempt typed is cleared;
* ``arrive``: the guest had the mapping and runs here: its claims are
  attached, on the VFs its domain names, typed.

A guest already on the destination (the bystander) keeps its VF and claim
throughout, and nothing is left an orphan.  As in :mod:`test_crash_safety`,
a child process runs the destination's steps and stops at the chosen one;
the parent SIGKILLs it and plays the restarted service.
"""

import uuid
from types import MappingProxyType

import pytest

from tests.functional import test_crash_safety as crash
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver import mdevs
from vgpu_driver import migration
from vgpu_driver import reconcile
from vgpu_driver.conf.mdev_settings import MdevConfig
from vgpu_driver.conf.mdev_settings import TypeConfig
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

L40S = "0000:c1:00.0"
TYPE = "nvidia-1156"  # L40S-8Q
SOURCE_VF = "0000:c1:00.4"  # the guest's VF on the source
CONFIG = MdevConfig(types=(TypeConfig(TYPE),), default_type=TYPE, by_address=MappingProxyType({}))

# Where the child is killed, in the order the destination passes them.
IN_CLAIM_TRANSACTION = "in-claim-transaction"  # claims written, not committed
CLAIM_COMMITTED = "claim-committed"  # committed, the VF not typed yet
VF_TYPED = "vf-typed"  # typed, the mapping not returned
MAPPED = "mapped"  # the source has the mapping
ARRIVED = "arrived"  # the guest's domain defined here
FINISHED = "finished"  # claims attached (control)
STEPS = (IN_CLAIM_TRANSACTION, CLAIM_COMMITTED, VF_TYPED, MAPPED, ARRIVED, FINISHED)
# The source can only have sent the guest once it had the mapping.
CAN_ARRIVE = (MAPPED, ARRIVED, FINISHED)


def start_driver(root, state_dir, domain_file):
    return mdevs.MdevManager(
        fakekernel.FakeKernel(root),
        claims_journal.Journal(state_dir),
        crash.domain_source(domain_file),
        CONFIG,
    )


def allocation(host):
    tree = inventory.compute(discovery.discover(host), CONFIG, "dest")
    providers = {str(uuid.uuid5(uuid.NAMESPACE_URL, p.name)): p for p in tree.providers}
    (rp_uuid,) = providers
    return {rp_uuid: {"resources": {"VGPU": 1}}}, providers


# -- the child: a destination that stops where it is told ----------------------------------


def inject_faults(manager, instance, step, marker):
    if step == IN_CLAIM_TRANSACTION:
        crash.stop_before_commit(manager, instance, step, marker)
    elif step in (CLAIM_COMMITTED, VF_TYPED):
        host = manager.host
        original_set = host.set_vendor_vgpu_type

        def set_vendor_vgpu_type(address, number, timeout=None):
            if step == CLAIM_COMMITTED:
                crash.stop_here(marker, step, [str(address)])
            original_set(address, number, timeout=timeout)
            crash.stop_here(marker, step, [str(address)])

        host.set_vendor_vgpu_type = set_vendor_vgpu_type


def receive(root, state_dir, domain_file, marker, step, instance, allocations, providers):
    """The destination's side of one live migration, in the child process."""
    manager = start_driver(root, state_dir, domain_file)
    inject_faults(manager, instance, step, marker)
    migrations = migration.Migrations(manager)
    mapping = migrations.claim_incoming(instance, {SOURCE_VF: TYPE}, allocations, providers)
    vfs = sorted(mapping.values())
    if step == MAPPED:
        crash.stop_here(marker, step, vfs)
    crash.define_domain(domain_file, instance, vfs)
    if step == ARRIVED:
        crash.stop_here(marker, step, vfs)
    migrations.finish_incoming(instance)
    crash.stop_here(marker, step, vfs)


def killed_at(host, step, instance):
    """Run the destination in a child; yield once it stopped at ``step``, then SIGKILL it."""
    return crash.killed_at(receive, host, step, instance)


# -- the test --------------------------------------------------------------------------------


class Destination:
    """An L40S host whose first VF serves a guest already (the bystander)."""

    def __init__(self, tmp_path):
        self.root = str(tmp_path / "sys")
        self.state_dir = str(tmp_path / "state")
        self.domain_file = str(tmp_path / "domains.json")
        self.marker = str(tmp_path / "marker.json")
        fakekernel.FakeKernel.build(self.root, profiles.load("l40s-vfio"))
        crash.write_json(self.domain_file, {})
        manager = start_driver(self.root, self.state_dir, self.domain_file)
        self.allocations, self.providers = allocation(manager.host)
        self.bystander = str(uuid.uuid4())
        self.bystander_vfs = manager.allocate(self.bystander, self.allocations, self.providers)
        crash.define_domain(self.domain_file, self.bystander, self.bystander_vfs)
        manager.domains.define(self.bystander, self.bystander_vfs)
        manager.mark_attached(self.bystander)

    def typed(self, manager):
        return {v.id: v.type_id for v in manager.snapshot(refresh=True).vgpus}

    def claims(self, manager):
        return {c.mdev_uuid: (c.instance_uuid, c.state) for c in manager.journal.claims()}


def where_it_stopped(host, step, instance, vf):
    """Before the kill: the claim, the type and the domain as the step says."""
    manager = start_driver(host.root, host.state_dir, host.domain_file)
    claimed = host.claims(manager).get(vf)
    if step == IN_CLAIM_TRANSACTION:
        assert claimed is None, "the claim is visible before its transaction committed"
    else:
        assert claimed == (instance, claims.ATTACHED if step == FINISHED else claims.MIGRATING_IN)
    assert (vf in host.typed(manager)) == (step not in (IN_CLAIM_TRANSACTION, CLAIM_COMMITTED))
    assert (instance in crash.read_json(host.domain_file)) == (step in (ARRIVED, FINISHED))


CASES = [(step, "rollback") for step in STEPS if step != FINISHED] + [
    (step, "arrive") for step in CAN_ARRIVE
]


@pytest.mark.parametrize(("step", "ending"), CASES)
def test_a_killed_destination_ends_the_migration_consistent(tmp_path, step, ending):
    host = Destination(tmp_path)
    instance = str(uuid.uuid4())
    with killed_at(host, step, instance) as (vf,):
        assert vf not in host.bystander_vfs
        where_it_stopped(host, step, instance, vf)

    # The restarted service: init_host's passes keep a migration's claims.
    manager = start_driver(host.root, host.state_dir, host.domain_file)
    reconciler = reconcile.Reconciler(manager)
    assert reconciler.finish_releases() == []
    assert reconciler.clean_stale_claims(grace=0) == []
    # A claim whose VF the child never typed: typed now, as after a reboot.
    assert [(o.mdev_uuid, o.result) for o in reconciler.restore()] == (
        [(vf, "restored")] if step == CLAIM_COMMITTED else []
    )
    migrations = migration.Migrations(manager)

    if ending == "rollback":
        if step == ARRIVED:
            # nova's rollback destroys the domain here first.
            defined = crash.read_json(host.domain_file)
            del defined[instance]
            crash.write_json(host.domain_file, defined)
            manager = start_driver(host.root, host.state_dir, host.domain_file)
            migrations = migration.Migrations(manager)
        migrations.rollback_incoming(instance)
        expected = {}
    else:
        if step == MAPPED:
            crash.define_domain(host.domain_file, instance, [vf])
            manager.domains.define(instance, [vf])
        migrations.finish_incoming(instance)
        expected = {vf: (instance, claims.ATTACHED)}

    (bystander_vf,) = host.bystander_vfs
    assert host.claims(manager) == {bystander_vf: (host.bystander, claims.ATTACHED), **expected}
    assert host.typed(manager) == {bystander_vf: TYPE, **{v: TYPE for v in expected}}
    assert reconcile.Reconciler(manager).orphans() == []
