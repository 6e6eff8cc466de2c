"""nova-compute killed at any step of a boot loses no mdev and leaks none.

A boot goes: claim in the journal, create (or reuse) the mdev, return it,
define the guest's domain, mark the claim attached.  nova-compute can die
between any two of these (OOM killer, ``systemctl kill``, a host crash), and
what it leaves must be put right by the restarted service's reconcile:

* an mdev a domain references is never removed, nor its claim dropped;
* a claim no domain came for is dropped;
* every mdev left is referenced, or a ``free`` orphan that the next boot
  reuses and that orphan reclaim can remove: nothing is lost track of.

A child process runs the boot and stops at the chosen step (fault injection:
it writes a marker file and sleeps); the parent checks that the child really
got there, SIGKILLs it, then plays the restarted driver over the same sysfs
tree and state directory.  Domains are recorded in a JSON file, as libvirt
keeps them on disk, and loaded into an ``InProcessDomains`` on each start.
"""

import contextlib
import json
import multiprocessing
import os
import signal
import time
import uuid
from types import MappingProxyType

import pytest

from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver import mdevs
from vgpu_driver import reconcile
from vgpu_driver.conf.mdev_settings import MdevConfig
from vgpu_driver.conf.mdev_settings import TypeConfig
from vgpu_driver.fake import domains
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

GPU = "0000:18:00.0"
TYPE = "nvidia-222"
TIMEOUT = 30.0

CONFIG = MdevConfig(types=(TypeConfig(TYPE),), default_type=TYPE, by_address=MappingProxyType({}))
CONTEXT = multiprocessing.get_context("spawn")

# Where the child is killed, in the order a boot passes them.
IN_CLAIM_TRANSACTION = "in-claim-transaction"  # claims written, not committed
CLAIM_COMMITTED = "claim-committed"  # committed, mdev not created yet
MDEV_CREATED = "mdev-created"  # created, allocate not returned
ALLOCATE_RETURNED = "allocate-returned"  # returned, no domain yet
DOMAIN_DEFINED = "domain-defined"  # domain defined, not marked attached
ATTACHED = "attached"  # the boot finished (control)
STEPS = (
    IN_CLAIM_TRANSACTION,
    CLAIM_COMMITTED,
    MDEV_CREATED,
    ALLOCATE_RETURNED,
    DOMAIN_DEFINED,
    ATTACHED,
)

CREATE = "create"  # the GPU has no free mdev: the boot creates one
REUSE = "reuse"  # a free mdev waits on the GPU: the boot takes it, creates nothing


# -- the host and the domains "libvirt" keeps on disk ------------------------------------


def one_t4():
    """The first GPU of t4x8 alone: 16 x nvidia-222."""
    profile = profiles.load("t4x8")
    return {**profile, "gpus": profile["gpus"][:1]}


def placement_allocation(host):
    tree = inventory.compute(discovery.discover(host), CONFIG, "cn1")
    providers = {str(uuid.uuid5(uuid.NAMESPACE_URL, p.name)): p for p in tree.providers}
    (rp_uuid,) = providers
    return {rp_uuid: {"resources": {"VGPU": 1}}}, providers


def write_json(path, data):
    """Atomically, as a SIGKILL may come right after."""
    with open(path + ".tmp", "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)


def read_json(path):
    with open(path) as f:
        return json.load(f)


def define_domain(path, instance, mdev_uuids):
    """libvirt's defineXML: the domain is on disk from now on."""
    defined = read_json(path)
    defined[instance] = list(mdev_uuids)
    write_json(path, defined)


def domain_source(path):
    """What libvirt reports after a (re)start: every domain defined on disk."""
    source = domains.InProcessDomains()
    for instance, mdev_uuids in read_json(path).items():
        source.define(instance, mdev_uuids)
    return source


def start_driver(root, state_dir, domain_file):
    """A driver (re)starting: fresh kernel view, journal and domain list."""
    return mdevs.MdevManager(
        fakekernel.FakeKernel(root),
        claims_journal.Journal(state_dir),
        domain_source(domain_file),
        CONFIG,
    )


# -- the child: a boot that stops where it is told ---------------------------------------


def stop_here(marker, step, mdev_uuids):
    """Tell the parent where we are, then wait for the SIGKILL."""
    write_json(marker, {"step": step, "mdevs": sorted(mdev_uuids)})
    while True:
        time.sleep(60)


def stop_before_commit(manager, instance, step, marker):
    """Stop in the journal's next transaction, its claims written, not committed."""
    journal = manager.journal
    original = journal.transaction

    @contextlib.contextmanager
    def transaction():
        with original() as txn:
            yield txn
            stop_here(marker, step, [c.mdev_uuid for c in txn.claims(instance)])

    journal.transaction = transaction


def inject_faults(manager, instance, step, marker):
    """Stop inside allocate: before COMMIT, or around the mdev's creation."""
    if step == IN_CLAIM_TRANSACTION:
        stop_before_commit(manager, instance, step, marker)
    elif step in (CLAIM_COMMITTED, MDEV_CREATED):
        host = manager.host
        original_create = host.create_mdev

        def create_mdev(parent, type_id, mdev_uuid):
            if step == CLAIM_COMMITTED:
                stop_here(marker, step, [mdev_uuid])
            original_create(parent, type_id, mdev_uuid)
            stop_here(marker, step, [mdev_uuid])

        host.create_mdev = create_mdev


def boot(root, state_dir, domain_file, marker, step, instance, allocations, providers):
    """nova-compute spawning one guest, in the child process."""
    manager = start_driver(root, state_dir, domain_file)
    inject_faults(manager, instance, step, marker)
    got = manager.allocate(instance, allocations, providers)
    if step == ALLOCATE_RETURNED:
        stop_here(marker, step, got)
    define_domain(domain_file, instance, got)
    if step == DOMAIN_DEFINED:
        stop_here(marker, step, got)
    manager.mark_attached(instance)
    stop_here(marker, step, got)


def wait_for(marker, proc):
    deadline = time.monotonic() + TIMEOUT
    while not os.path.exists(marker):
        assert proc.is_alive(), f"the child died first, exit code {proc.exitcode}"
        assert time.monotonic() < deadline, "the child never reached its step"
        time.sleep(0.02)
    return read_json(marker)


def crash_at(host, step, instance):
    """Run a boot in a child; yield once it stopped at ``step``, then SIGKILL it."""
    return killed_at(boot, host, step, instance)


@contextlib.contextmanager
def killed_at(target, host, step, instance):
    """Run ``target`` in a child; yield what it reached ``step`` with, then SIGKILL it."""
    proc = CONTEXT.Process(
        target=target,
        args=(
            host.root,
            host.state_dir,
            host.domain_file,
            host.marker,
            step,
            instance,
            host.allocations,
            host.providers,
        ),
    )
    proc.start()
    try:
        reached = wait_for(host.marker, proc)
        assert reached["step"] == step
        yield reached["mdevs"]
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(TIMEOUT)
        assert proc.exitcode == -signal.SIGKILL
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        proc.close()


# -- the test --------------------------------------------------------------------------------


class Host:
    """A single-T4 host with one guest already running on it (the bystander)."""

    def __init__(self, tmp_path, path):
        self.root = str(tmp_path / "sys")
        self.state_dir = str(tmp_path / "state")
        self.domain_file = str(tmp_path / "domains.json")
        self.marker = str(tmp_path / "marker.json")
        fakekernel.FakeKernel.build(self.root, one_t4())
        write_json(self.domain_file, {})
        manager = start_driver(self.root, self.state_dir, self.domain_file)
        self.allocations, self.providers = placement_allocation(manager.host)
        self.bystander = str(uuid.uuid4())
        self.bystander_mdevs = self.boot(manager, self.bystander)
        # With REUSE, a guest deleted earlier left its mdev behind, free.
        self.free = [str(uuid.uuid4())] if path == REUSE else []
        for mdev_uuid in self.free:
            manager.host.create_mdev(GPU, TYPE, mdev_uuid)

    def boot(self, manager, instance):
        got = manager.allocate(instance, self.allocations, self.providers)
        define_domain(self.domain_file, instance, got)
        manager.domains.define(instance, got)
        assert manager.mark_attached(instance) == len(got)
        return got

    def mdevs(self, manager):
        present = manager.host.list_mdevs()
        assert {(m.parent, m.type_id) for m in present} <= {(GPU, TYPE)}
        return {m.uuid for m in present}

    def claims(self, manager):
        return {c.mdev_uuid: (c.instance_uuid, c.state) for c in manager.journal.claims()}


def check_where_the_child_stopped(host, step, instance, crashed):
    """Before the kill: the child is at the step we meant, not elsewhere."""
    manager = start_driver(host.root, host.state_dir, host.domain_file)
    (mdev,) = crashed
    claimed = host.claims(manager).get(mdev)
    if step == IN_CLAIM_TRANSACTION:
        assert claimed is None, "the claim is visible before its transaction committed"
    elif step == ATTACHED:
        assert claimed == (instance, claims.ATTACHED)
    else:
        assert claimed == (instance, claims.CLAIMED)
    created = mdev in host.mdevs(manager)
    assert created == (step not in (IN_CLAIM_TRANSACTION, CLAIM_COMMITTED) or mdev in host.free)
    defined = instance in read_json(host.domain_file)
    assert defined == (step in (DOMAIN_DEFINED, ATTACHED))


CASES = [(CREATE, step) for step in STEPS] + [
    (REUSE, step) for step in (IN_CLAIM_TRANSACTION, ALLOCATE_RETURNED, DOMAIN_DEFINED, ATTACHED)
]


@pytest.mark.parametrize("recovery", ["retry", "reclaim"])
@pytest.mark.parametrize(("path", "step"), CASES)
def test_killed_boot_loses_and_leaks_nothing(tmp_path, path, step, recovery):
    """SIGKILL at ``step``; the restarted driver reconciles, then boots again.

    ``retry``: nova retries the boot on this host.  ``reclaim``: an operator
    first removes the orphans, then nova retries.
    """
    host = Host(tmp_path, path)
    instance = str(uuid.uuid4())
    with crash_at(host, step, instance) as crashed:
        if path == REUSE:
            assert crashed == host.free
        check_where_the_child_stopped(host, step, instance, crashed)
    (crashed_mdev,) = crashed

    defined = step in (DOMAIN_DEFINED, ATTACHED)
    committed = step != IN_CLAIM_TRANSACTION
    exists = path == REUSE or step not in (IN_CLAIM_TRANSACTION, CLAIM_COMMITTED)

    # The restarted driver reconciles.
    manager = start_driver(host.root, host.state_dir, host.domain_file)
    reconciler = reconcile.Reconciler(manager)
    assert reconciler.finish_releases() == []
    stale = reconciler.clean_stale_claims(grace=0)
    assert [(c.instance_uuid, c.mdev_uuid) for c in stale] == (
        [(instance, crashed_mdev)] if committed and not defined else []
    )
    assert reconciler.restore() == [], "an mdev a domain or claim references was missing"

    (bystander_mdev,) = host.bystander_mdevs
    referenced = {bystander_mdev} | ({crashed_mdev} if defined else set())
    expected_claims = {bystander_mdev: (host.bystander, claims.ATTACHED)}
    if defined:
        state = claims.ATTACHED if step == ATTACHED else claims.CLAIMED
        expected_claims[crashed_mdev] = (instance, state)
    assert host.claims(manager) == expected_claims
    leftover = {crashed_mdev} if exists and not defined else set()
    assert host.mdevs(manager) == referenced | leftover
    orphans = reconciler.orphans()
    assert [(o.mdev_uuid, o.kind) for o in orphans] == [
        (u, reconcile.FREE) for u in sorted(leftover)
    ]

    if recovery == "reclaim":
        outcomes = reconciler.reclaim(orphans)
        assert [(o.mdev_uuid, o.result) for o in outcomes] == [
            (u, "removed") for u in sorted(leftover)
        ]
        assert host.mdevs(manager) == referenced
        assert host.claims(manager) == expected_claims
        leftover = set()

    # nova retries the boot; a finished one is simply asked again.
    got = manager.allocate(instance, host.allocations, host.providers)
    assert len(got) == 1
    if defined or leftover:
        assert got == [crashed_mdev], "the boot's own or free mdev was not the one reused"
    else:
        assert got[0] not in referenced
    if not defined:
        define_domain(host.domain_file, instance, got)
        manager.domains.define(instance, got)
    manager.mark_attached(instance)

    assert host.mdevs(manager) == {bystander_mdev, got[0]}
    assert host.claims(manager) == {
        bystander_mdev: (host.bystander, claims.ATTACHED),
        got[0]: (instance, claims.ATTACHED),
    }
    assert reconciler.orphans() == []
    assert read_json(host.domain_file) == {host.bystander: [bystander_mdev], instance: got}
