"""The host reconciler: one worker for what the host changes on its own.

Each test drives the core driver as nova-compute does (init_host, periodic
updates, releases) on a fake host whose kernel blocks removals while a
guest holds the device and brings VFs back late after a reboot.
"""

import contextlib
import io
import json
import threading
import time
import uuid

from vgpu_driver import claims
from vgpu_driver import discovery
from vgpu_driver import host_reconciler
from vgpu_driver import reconciler_state
from vgpu_driver.cmd import manage

A100 = "0000:41:00.0"
ONE_VGPU = {"rp": {"resources": {"VGPU": 1}}}


def boot(vgpu, instance, allocation=ONE_VGPU):
    providers = {"rp": vgpu.provider_tree("cn1").by_gpu(A100)}
    got = vgpu.allocate(instance, allocation, providers)
    vgpu.domains.define(instance, got)
    vgpu.instance_defined(instance)
    return got


def block_a_removal(vgpu, host, instance="deleted"):
    """Boot ``instance``, undefine its domain while its QEMU still holds the
    vGPU, and release it: the removal stays in flight.  The held vGPU."""
    (held,) = boot(vgpu, instance)
    vgpu.domains.undefine(instance)
    host.hold(held)
    assert vgpu.release(instance) == []
    return held


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def a100_vfs(host):
    return [p.name for p in discovery.discover(host).gpu(A100).parents]


# -- removals the kernel blocks -----------------------------------------------------------


def test_a_blocked_removal_is_one_writer_and_updates_do_not_wait_for_it(make_host, make_driver):
    """While QEMU still holds an mdev, each periodic update used to issue
    its removal again (one more blocked writer each time) and wait the full
    ``mdev_remove_timeout`` for it."""
    host = make_host("a100-sriov")
    vgpu = make_driver(host, "remove_mdevs_on_release = true\nmdev_remove_timeout = 30")
    (held,) = boot(vgpu, "deleted")
    vgpu.domains.undefine("deleted")
    host.hold(held)  # QEMU has not let go yet
    vgpu.manager.remove_timeout = 0.2  # nova's delete waits that long, once
    assert vgpu.release("deleted") == []
    vgpu.manager.remove_timeout = 30
    threads = threading.active_count()
    started = time.monotonic()
    for _ in range(5):
        vgpu.provider_tree("cn1")
    assert time.monotonic() - started < 10, "updates waited for the blocked removal"
    assert threading.active_count() == threads, "more writers blocked behind the first"
    assert list(vgpu.manager.removals.in_flight()) == [held]
    assert [c.state for c in vgpu.journal.claims()] == [claims.RELEASING]

    # Shown as stuck, with its age, to another process.
    state = reconciler_state.read(vgpu.conf.vgpu.state_dir)
    assert list(reconciler_state.removals_in_flight(state, time.time())) == [held]
    assert "1 stuck removal(s)" in reconciler_state.describe(state, time.time())

    host.release(held)  # QEMU exits: the writer returns
    assert wait_for(lambda: not vgpu.manager.removals.in_flight())
    vgpu.provider_tree("cn1")
    assert vgpu.journal.claims() == [] and host.list_mdevs() == []


def test_a_vgpu_released_while_its_domain_is_still_defined_is_removed_later(make_host, make_driver):
    """A guest that left by live migration is released here before nova
    undefines its domain (nova's cleanup, not destroy): the mdev used to lose
    its claim at once and stay behind for good."""
    host = make_host("a100-sriov")
    vgpu = make_driver(host, "remove_mdevs_on_release = true\nmdev_remove_timeout = 1")
    (held,) = boot(vgpu, "left")
    assert vgpu.release("left") == []  # its domain still uses it
    assert [c.state for c in vgpu.journal.claims()] == [claims.RELEASING]
    assert [m.uuid for m in host.list_mdevs()] == [held]
    vgpu.provider_tree("cn1")  # a pass: still in use, kept
    assert [m.uuid for m in host.list_mdevs()] == [held]
    vgpu.domains.undefine("left")  # nova's cleanup
    vgpu.provider_tree("cn1")  # the next pass removes it
    assert vgpu.journal.claims() == [] and host.list_mdevs() == []


def test_removals_in_flight_are_bounded(make_host, make_driver):
    """However many removals the kernel blocks, at most
    ``max_removals_in_flight`` writers (privileged workers) wait on it."""
    host = make_host("a100-sriov")
    vgpu = make_driver(
        host,
        "remove_mdevs_on_release = true\nmdev_remove_timeout = 0.2\nmax_removals_in_flight = 2",
    )
    held = boot(vgpu, "big", {"rp": {"resources": {"VGPU": 4}}})
    vgpu.domains.undefine("big")
    for mdev in held:
        host.hold(mdev)
    assert vgpu.release("big") == []
    vgpu.provider_tree("cn1")
    assert len(vgpu.manager.removals.in_flight()) == 2
    assert {c.state for c in vgpu.journal.claims()} == {claims.RELEASING}
    for mdev in held:
        host.release(mdev)
    assert wait_for(lambda: (vgpu.provider_tree("cn1"), vgpu.journal.claims())[1] == [])
    assert host.list_mdevs() == []


# -- the reboot restore -------------------------------------------------------------------


def test_a_guest_deleted_while_its_vfs_are_off_does_not_get_its_vgpu_back(make_host, make_driver):
    """The restore used to read the claims once and keep creating for
    ``restore_wait``: a guest deleted meanwhile got its mdev back."""
    host = make_host("a100-sriov")
    first = make_driver(host)
    got = boot(first, "guest")
    first.close()
    host.reboot()  # VFs come back later
    vgpu = make_driver(host, "restore_wait = 60")
    vgpu.domains.define("guest", got)
    assert [o.result for o in vgpu.init_host()] == ["waiting"]
    vgpu.domains.undefine("guest")  # nova deletes the guest
    vgpu.release("guest")
    host.set_vfs(A100, 16)
    assert vgpu.worker.run_now(host_reconciler.UDEV)  # the VFs' events
    assert not vgpu.worker.waiting
    assert host.list_mdevs() == [] and vgpu.journal.claims() == []


def test_a_restore_takes_no_parent_another_claim_points_at(make_host, make_driver):
    """Its own VF taken, the restore used to fall back to the next VF of
    the GPU, the one another allocation had just claimed."""
    host = make_host("a100-sriov")
    vgpu = make_driver(host)
    own, claimed_by_other, free = a100_vfs(host)[:3]
    restored, others = str(uuid.uuid4()), str(uuid.uuid4())
    with vgpu.journal.transaction() as txn:
        txn.add("guest", restored, A100, own, "nvidia-468", claims.ATTACHED)
        txn.add("booting", others, A100, claimed_by_other, "nvidia-468", claims.CLAIMED)
    vgpu.domains.define("guest", [restored])
    host.create_mdev(own, "nvidia-468", str(uuid.uuid4()))  # an mdev nobody claims
    outcomes = {o.mdev_uuid: o for o in vgpu.reconciler.restore(attached_only=True)}
    assert (outcomes[restored].result, outcomes[restored].reason) == ("restored", f"on {free}")
    on = {m.uuid: m.parent for m in host.list_mdevs()}
    assert on[restored] == free and claimed_by_other not in on.values()
    by_mdev = {c.mdev_uuid: c for c in vgpu.journal.claims()}
    assert by_mdev[restored].parent == free
    assert by_mdev[others].parent == claimed_by_other


def test_a_vgpu_whose_claim_went_while_it_was_written_is_removed_again(
    make_host, make_driver, monkeypatch
):
    host = make_host("a100-sriov")
    vgpu = make_driver(host)
    got = boot(vgpu, "guest")
    host.reboot()
    host.set_vfs(A100, 16)
    create = host.create_mdev

    def create_while_the_guest_goes(parent, type_id, mdev):
        create(parent, type_id, mdev)
        vgpu.domains.undefine("guest")
        vgpu.release("guest")

    monkeypatch.setattr(host, "create_mdev", create_while_the_guest_goes)
    vgpu.manager.host = vgpu.reconciler.manager.host = host
    (outcome,) = vgpu.reconciler.restore()
    assert (outcome.mdev_uuid, outcome.result) == (got[0], "skipped")
    assert host.list_mdevs() == [] and vgpu.journal.claims() == []


# -- the worker ---------------------------------------------------------------------------


def test_a_failing_step_is_logged_and_the_pass_and_worker_go_on(
    make_host, make_driver, monkeypatch, caplog
):
    host = make_host("a100-sriov")
    vgpu = make_driver(host)
    vgpu.init_host()
    done = []
    vgpu.worker.add_step("after", lambda reasons: done.append(reasons))

    def broken(**kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(vgpu.reconciler, "reclaim_stale_types", broken)
    assert vgpu.worker.run_now(host_reconciler.PERIODIC)
    assert vgpu.worker.last.errors == ("stale types: boom",)
    assert vgpu.worker.last_error[1:] == ("stale types", "boom")
    assert done == [(host_reconciler.PERIODIC,)]  # the next step ran
    assert "the stale types step failed" in caplog.text and "RuntimeError: boom" in caplog.text
    assert vgpu.worker.running
    monkeypatch.undo()
    assert vgpu.worker.run_now(host_reconciler.PERIODIC)
    assert vgpu.worker.last.errors == ()
    state = reconciler_state.read(vgpu.conf.vgpu.state_dir)
    assert state["last_error"]["step"] == "stale types" and state["passes"] >= 3
    assert "last error" in reconciler_state.describe(state, time.time())


def test_reasons_arriving_during_a_pass_make_one_more_pass(make_host, make_driver):
    host = make_host("a100-sriov")
    vgpu = make_driver(host)
    vgpu.init_host()
    inside, go_on = threading.Event(), threading.Event()
    seen = []

    def slow(reasons):
        seen.append(reasons)
        if len(seen) == 1:
            inside.set()
            go_on.wait(10)

    vgpu.worker.add_step("slow", slow)
    vgpu.worker.poke("first")
    assert inside.wait(10)
    for reason in ("udev", "removal-done", "udev", "tick") * 5:
        vgpu.worker.poke(reason)
    go_on.set()
    assert vgpu.worker.run_now("last")
    assert seen[0] == ("first",)
    assert set(seen[1]) <= {"udev", "removal-done", "tick", "last"} and len(seen) <= 3


def test_the_service_stopping_stops_the_worker(make_host, make_driver):
    host = make_host("a100-sriov")
    vgpu = make_driver(host)
    vgpu.init_host()
    assert vgpu.worker.running
    vgpu.close()
    assert not vgpu.worker.running
    # Without its worker, a periodic update runs the pass itself.
    passes = vgpu.worker.passes
    assert vgpu.worker.run_now(host_reconciler.PERIODIC)
    assert vgpu.worker.passes == passes + 1


def test_status_and_claims_list_show_a_stuck_removal_and_the_reconciler(
    make_host, make_driver, tmp_path, fake_kernel_cli
):
    """What nova-compute's reconciler knows is shown by another process."""
    host = make_host("a100-sriov")
    vgpu = make_driver(host, "remove_mdevs_on_release = true\nmdev_remove_timeout = 0.1")
    vgpu.init_host()
    held = block_a_removal(vgpu, host)
    assert vgpu.worker.run_now(host_reconciler.PERIODIC)
    conf_file = tmp_path / "cli.conf"
    conf_file.write_text(
        f"[devices]\nenabled_mdev_types = nvidia-468\n[vgpu]\nsysfs_root = {host.paths.root}\n"
    )

    def cli(*argv):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            code = manage.main(
                [
                    "--config-file",
                    str(conf_file),
                    "--nodename",
                    "cn1",
                    "--state-dir",
                    str(tmp_path / "state"),
                    "--libvirt-uri",
                    "test:///default",
                    *argv,
                ]
            )
        assert code == 0
        return out.getvalue()

    (row,) = json.loads(cli("claims", "list", "-f", "json"))
    assert row["vgpu"] == held and row["state"] == "releasing" and row["stuck_for"] >= 0
    table = cli("status")
    assert "deleted: releasing (removal stuck" in table
    assert "reconciler: " in table and "1 stuck removal(s)" in table
    host.release(held)
    assert wait_for(lambda: vgpu.journal.claims() == [])
    assert json.loads(cli("claims", "list", "-f", "json")) == []
