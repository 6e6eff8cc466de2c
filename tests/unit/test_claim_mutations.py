"""Claim mutations stay exact: a failed allocation undoes only what it added,
whatever went wrong, and checks made on one read never delete a claim that
changed hands before the write."""

import errno
import os
import threading
import time
from types import MappingProxyType

import pytest

from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver import mdevs
from vgpu_driver import reconcile
from vgpu_driver.conf import mdev_settings
from vgpu_driver.fake import domains
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

T4A = "0000:18:00.0"
MDEV = "9b8c0c2e-0f4a-4f83-a1d4-0b6b7f3f2a11"


class FaultyKernel(fakekernel.FakeKernel):
    """The fake kernel, whose next ``create`` stores fail as told: a refusal
    (an OSError, as the kernel answers) or anything a privileged call can
    raise on the way (a TypeError, a timeout)."""

    faults = ()

    def write_attr(self, path, value):
        if os.path.basename(path) == "create" and self.faults:
            fault, *self.faults = self.faults
            raise fault
        return super().write_attr(path, value)


@pytest.fixture
def life(tmp_path):
    host = FaultyKernel.build(str(tmp_path / "sys"), profiles.load("t4x8"))
    config = mdev_settings.MdevConfig(
        types=(mdev_settings.TypeConfig("nvidia-222"),),
        default_type="nvidia-222",
        by_address=MappingProxyType({}),
    )
    journal = claims_journal.Journal(str(tmp_path / "state"))
    guests = domains.InProcessDomains()
    manager = mdevs.MdevManager(host, journal, guests, config)
    tree = inventory.compute(manager.snapshot(refresh=True), config, "cn1", set())
    providers = {f"rp-{p.gpu}": p for p in tree.providers}

    def allocate(instance, units):
        return manager.allocate(instance, {f"rp-{T4A}": {"resources": {"VGPU": units}}}, providers)

    return host, journal, guests, manager, allocate


def test_a_failed_grow_keeps_the_claim_the_instance_already_held(life):
    host, journal, guests, manager, allocate = life
    first = allocate("guest", 1)
    guests.define("guest", first)
    manager.mark_attached("guest")
    host.faults = [OSError(errno.EUSERS, "no room")]
    with pytest.raises(exception.MdevNoCapacity):
        allocate("guest", 2)  # a resize 1 -> 2 vGPUs on the same host
    assert [(c.mdev_uuid, c.state) for c in journal.claims("guest")] == [
        (first[0], claims.ATTACHED)
    ]


@pytest.mark.parametrize("fault", [TypeError("bad argument"), KeyboardInterrupt()])
def test_any_failure_while_creating_undoes_the_new_claims(life, fault):
    host, journal, _guests, _manager, allocate = life
    host.faults = [fault]
    with pytest.raises(type(fault)):
        allocate("guest", 2)
    assert journal.claims() == []
    # The instance can try again, and the first attempt left nothing behind.
    assert len(allocate("guest", 2)) == 2


class _SignallingDomains(domains.InProcessDomains):
    """An in-process domain source that says when it was read."""

    def __init__(self):
        super().__init__()
        self.read = threading.Event()

    def mdev_users(self):
        self.read.set()
        return super().mdev_users()


def test_cleaning_stale_claims_never_deletes_one_taken_meanwhile(life):
    host, journal, _guests, manager, _allocate = life
    guests = manager.domains = _SignallingDomains()
    with journal.transaction() as txn:
        # A guest that lost its domain: its attached claim is stale.
        txn.add("gone-guest", MDEV, T4A, T4A, "nvidia-222", claims.ATTACHED)
    cleaner = reconcile.Reconciler(manager)
    in_txn, errors = threading.Event(), []

    def hand_over():
        """Another allocation gives the mdev to a new guest, committing only
        once the cleaner has started its check."""
        try:
            with journal.transaction() as txn:
                txn.remove("gone-guest", [MDEV])
                txn.add("new-guest", MDEV, T4A, T4A, "nvidia-222")
                in_txn.set()
                guests.read.wait(5)
                time.sleep(0.3)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    other = threading.Thread(target=hand_over)
    other.start()
    in_txn.wait(5)
    dropped = cleaner.clean_stale_claims(grace=600)
    other.join()
    assert errors == []
    assert dropped == []
    assert [(c.instance_uuid, c.state) for c in journal.claims()] == [("new-guest", claims.CLAIMED)]
