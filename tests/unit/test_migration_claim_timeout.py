"""``migrating_in`` claims whose migration never settled them: the periodic
cleaning and the start-up drop them once ``[vgpu] migration_claim_timeout``
has passed, unless a domain references their vGPU (the guest arrived).

Real components: the fake kernel, a real journal (its rows back-dated in
sqlite, as a month-old claim would be), libvirt's test driver.
"""

import logging
import re
import sqlite3
import uuid

from tests import libvirt_domains
from vgpu_driver import claims
from vgpu_driver import libvirt_host

A100 = "0000:41:00.0"
MONTH = 31 * 86400.0


def a100_driver(make_driver, host, tmp_path, extra=""):
    node = tmp_path / "node.xml"
    uri = f"test://{node}" if node.exists() else libvirt_domains.node_file(node, [])
    return make_driver(host, ("restore_wait = 0", extra), domains=libvirt_host.LibvirtHost(uri))


def incoming(vgpu, instance):
    """The destination's side of a live migration's start: one vGPU claimed
    ``migrating_in`` for a guest on another host; returns its id."""
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    mapping = vgpu.migrations.claim_incoming(
        instance, {str(uuid.uuid4()): "nvidia-468"}, {"rp": {"resources": {"VGPU": 1}}}, providers
    )
    return next(iter(mapping.values()))


def age(vgpu, instance, seconds):
    """Make the instance's claims ``seconds`` older, in the journal's file."""
    db = sqlite3.connect(vgpu.journal.path)
    with db:
        db.execute(
            "UPDATE claims SET created_at = created_at - ?, "
            "updated_at = updated_at - ? WHERE instance_uuid = ?",
            (seconds, seconds, instance),
        )
    db.close()


def arrive(vgpu, instance, vgpu_id):
    """libvirt starts the incoming guest here: its domain uses the vGPU."""
    vgpu.domains.conn.defineXML(
        libvirt_domains.domain_xml(f"guest-{instance[:8]}", [vgpu_id], instance)
    )


def states(vgpu):
    return {c.instance_uuid: c.state for c in vgpu.journal.claims()}


def test_the_periodic_update_drops_a_month_old_unreferenced_migrating_in_claim(
    make_host, make_driver, tmp_path, caplog
):
    host = make_host("a100-sriov")
    vgpu = a100_driver(make_driver, host, tmp_path)
    dead, young, arrived = (str(uuid.uuid4()) for _ in range(3))
    dead_vgpu = incoming(vgpu, dead)
    incoming(vgpu, young)
    arrived_vgpu = incoming(vgpu, arrived)
    arrive(vgpu, arrived, arrived_vgpu)
    age(vgpu, dead, MONTH)
    age(vgpu, arrived, MONTH)

    with caplog.at_level(logging.WARNING, logger="vgpu_driver.reconcile"):
        tree = vgpu.provider_tree("cn1", allocations_on=lambda name: {})

    assert states(vgpu) == {young: claims.MIGRATING_IN, arrived: claims.MIGRATING_IN}
    # Placement no longer has a unit reserved for the dead migration.
    assert tree.by_gpu(A100).reserved == 2
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert dead in record.getMessage() and dead_vgpu in record.getMessage()
    # Its age as the update read it: a month, and the seconds the test took.
    (said,) = re.findall(r"(\d+)s old", record.getMessage())
    assert MONTH <= int(said) < MONTH + 300
    # Its mdev is left, unreferenced, for the next guest of the type.
    assert dead_vgpu in {m.uuid for m in host.list_mdevs()}


def test_start_up_drops_it_too(make_host, make_driver, tmp_path):
    host = make_host("a100-sriov")
    vgpu = a100_driver(make_driver, host, tmp_path)
    dead, young = str(uuid.uuid4()), str(uuid.uuid4())
    incoming(vgpu, dead)
    incoming(vgpu, young)
    age(vgpu, dead, MONTH)
    restarted = a100_driver(make_driver, host, tmp_path)
    restarted.init_host()
    assert states(restarted) == {young: claims.MIGRATING_IN}


def test_the_timeout_is_the_option(make_host, make_driver, tmp_path):
    host = make_host("a100-sriov")
    vgpu = a100_driver(make_driver, host, tmp_path, "migration_claim_timeout = 60")
    minutes_old, seconds_old = str(uuid.uuid4()), str(uuid.uuid4())
    incoming(vgpu, minutes_old)
    incoming(vgpu, seconds_old)
    age(vgpu, minutes_old, 120)
    age(vgpu, seconds_old, 30)
    vgpu.reconcile_claims()
    assert states(vgpu) == {seconds_old: claims.MIGRATING_IN}


def test_zero_keeps_them_for_the_migration_or_the_operator(make_host, make_driver, tmp_path):
    host = make_host("a100-sriov")
    vgpu = a100_driver(make_driver, host, tmp_path, "migration_claim_timeout = 0")
    instance = str(uuid.uuid4())
    incoming(vgpu, instance)
    age(vgpu, instance, 10 * 365 * 86400.0)
    vgpu.reconcile_claims()
    vgpu.init_host()
    assert states(vgpu) == {instance: claims.MIGRATING_IN}
