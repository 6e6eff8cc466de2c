"""Threads and processes race for the last slots of one GPU.

nova-compute allocates from several greenthreads at once, and ``vgpu-manage``
or a second service may act on the same host from another process.  What
keeps them from handing out one mdev twice, or more mdevs than the GPU
holds, is the claims journal: every decision is taken and recorded in one
``BEGIN IMMEDIATE`` transaction before any mdev is created.  This test makes
48 contenders (32 threads here, 4 processes running 4 threads each) ask for
one vGPU each, at the same instant, from a single T4 that holds 16, half of
them already created and free, and checks that the outcome is exactly what a
serial run would give.  Two more tests check the converse, that a race never
refuses a boot the GPU has room for, and what that rests on: the fake kernel
never shows a reader a half-written ``available_instances``.

The same races run on an L40S under NVIDIA's vendor-specific VFIO, where a
vGPU is a VF given a type: there, a VF's type list cannot count the claims
other allocations have not written yet, so some losers are only refused by
NVIDIA's driver, and must still leave nothing behind.
"""

import concurrent.futures
import multiprocessing
import os
import threading
import time
import uuid
from types import MappingProxyType

from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver import mdevs
from vgpu_driver import reconcile
from vgpu_driver.conf.mdev_settings import MdevConfig
from vgpu_driver.conf.mdev_settings import TypeConfig
from vgpu_driver.fake import domains
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles
from vgpu_driver.sysfs import linux

GPU = "0000:18:00.0"
TYPE = "nvidia-222"  # GRID T4-1B: 16 per GPU
SLOTS = 16
PRE_EXISTING = 8
THREADS = 32
PROCESSES = 4
PER_PROCESS = 4
TIMEOUT = 60.0

CONFIG = MdevConfig(types=(TypeConfig(TYPE),), default_type=TYPE, by_address=MappingProxyType({}))

L40S = "0000:c1:00.0"
VF_TYPE = "nvidia-1156"  # NVIDIA L40S-8Q: 6 per GPU, on any of its 16 VFs
VF_ROOM = 6
# Without max_instances, nothing but NVIDIA's driver knows the GPU's room.
CONFIGS = {
    "t4": CONFIG,
    "l40s": MdevConfig(
        types=(TypeConfig(VF_TYPE),), default_type=VF_TYPE, by_address=MappingProxyType({})
    ),
    "l40s-capped": MdevConfig(
        types=(TypeConfig(VF_TYPE, max_instances=VF_ROOM),),
        default_type=VF_TYPE,
        by_address=MappingProxyType({}),
    ),
}

# Spawned, not forked: the parent runs threads when the processes start.
CONTEXT = multiprocessing.get_context("spawn")


def one_t4(mdev_uuids):
    """The first GPU of t4x8 alone, with free mdevs of TYPE already made."""
    profile = profiles.load("t4x8")
    return {
        **profile,
        "gpus": profile["gpus"][:1],
        "mdevs": [{"parent": GPU, "type": TYPE, "uuid": u} for u in mdev_uuids],
    }


def placement_allocation(host, config="t4", total=SLOTS):
    """What Placement hands the driver: one VGPU on the GPU's provider."""
    snapshot = discovery.discover(host)
    # With what NVML says of vendor-VFIO boards, as nova-compute's update reads it.
    tree = inventory.compute(
        snapshot,
        CONFIGS[config],
        "cn1",
        rooms=inventory.read_rooms(host, snapshot, CONFIGS[config]),
    )
    providers = {str(uuid.uuid5(uuid.NAMESPACE_URL, p.name)): p for p in tree.providers}
    (rp_uuid,) = providers
    assert providers[rp_uuid].total == total
    return {rp_uuid: {"resources": {"VGPU": 1}}}, providers


def new_manager(root, state_dir, config="t4"):
    """A driver's view of the host, as each process builds its own."""
    return mdevs.MdevManager(
        fakekernel.FakeKernel(root),
        claims_journal.Journal(state_dir),
        domains.InProcessDomains(),
        CONFIGS[config],
    )


def contend(manager, instance, allocations, providers, go):
    """One boot: wait for the start signal, then allocate; never raises."""
    if not go.wait(TIMEOUT):
        return instance, "no start signal", []
    try:
        return instance, "ok", manager.allocate(instance, allocations, providers)
    except Exception as exc:
        return instance, f"{type(exc).__name__}: {exc}", []


def race(manager, instances, allocations, providers, go, on_ready):
    """Run one contender per instance on its own thread; their outcomes."""
    ready = threading.Barrier(len(instances) + 1, timeout=TIMEOUT)

    def run(instance):
        ready.wait()
        return contend(manager, instance, allocations, providers, go)

    with concurrent.futures.ThreadPoolExecutor(max_workers=len(instances)) as pool:
        futures = [pool.submit(run, instance) for instance in instances]
        ready.wait()
        on_ready()
        return [f.result() for f in futures]


def process_main(root, state_dir, instances, allocations, providers, go, ready, results, config):
    """A second driver process: its own kernel view, journal and manager."""
    manager = new_manager(root, state_dir, config)
    outcomes = race(
        manager, instances, allocations, providers, go, on_ready=lambda: ready.put(len(instances))
    )
    results.put(outcomes)


def run_race(
    root,
    state_dir,
    allocations,
    providers,
    threads=THREADS,
    processes=PROCESSES,
    per_process=PER_PROCESS,
    config="t4",
):
    """Start everybody, let them go at once, and collect every outcome."""
    instances = [str(uuid.uuid4()) for _ in range(threads + processes * per_process)]
    go, ready, results = CONTEXT.Event(), CONTEXT.Queue(), CONTEXT.Queue()
    procs = []
    for n in range(processes):
        mine = instances[threads + n * per_process : threads + (n + 1) * per_process]
        procs.append(
            CONTEXT.Process(
                target=process_main,
                args=(root, state_dir, mine, allocations, providers, go, ready, results, config),
            )
        )
    try:
        for proc in procs:
            proc.start()

        def start_when_all_wait():
            try:
                for _ in procs:
                    ready.get(timeout=TIMEOUT)
            finally:
                go.set()

        outcomes = race(
            new_manager(root, state_dir, config),
            instances[:threads],
            allocations,
            providers,
            go,
            on_ready=start_when_all_wait,
        )
        for _ in procs:
            outcomes += results.get(timeout=TIMEOUT)
    finally:
        go.set()
        exitcodes = []
        for proc in procs:
            proc.join(TIMEOUT)
            if proc.is_alive():
                proc.kill()
                proc.join()
            exitcodes.append(proc.exitcode)
            proc.close()
        for q in (ready, results):
            q.close()
            q.join_thread()
    assert exitcodes == [0] * processes, f"contender processes exited with {exitcodes}"
    return instances, outcomes


def test_contenders_get_exactly_the_gpu_capacity_and_never_the_same_mdev(tmp_path):
    """16 of 48 racing boots win, each with its own mdev; the rest are refused.

    The 8 free mdevs are all reused before any new one is created, the
    journal records exactly the winners, and nothing is left behind.
    """
    pre_existing = sorted(str(uuid.uuid4()) for _ in range(PRE_EXISTING))
    host, root, state_dir = fresh_host(tmp_path, "host", pre_existing)
    allocations, providers = placement_allocation(host)
    journal = claims_journal.Journal(state_dir)

    started = time.monotonic()
    instances, outcomes = run_race(root, state_dir, allocations, providers)
    elapsed = time.monotonic() - started

    assert sorted(i for i, _, _ in outcomes) == sorted(instances)
    won = {instance: got for instance, result, got in outcomes if result == "ok"}
    lost = {instance: result for instance, result, _ in outcomes if result != "ok"}
    refusals = sorted({result.split(":")[0] for result in lost.values()})
    assert len(won) == SLOTS, (len(won), refusals)
    assert refusals == [exception.NoGpuCapacity.__name__], sorted(set(lost.values()))
    assert all(len(got) == 1 for got in won.values()), won
    given = [got[0] for got in won.values()]
    assert len(set(given)) == len(given) == SLOTS, "an mdev was handed out twice"

    # The journal holds one claim per winner, for the mdev it was given.
    recorded = journal.claims()
    assert {c.mdev_uuid: c.instance_uuid for c in recorded} == {
        got[0]: instance for instance, got in won.items()
    }
    assert {(c.gpu, c.parent, c.type_id, c.state) for c in recorded} == {
        (GPU, GPU, TYPE, claims.CLAIMED)
    }

    # sysfs: exactly the 16 given out, all on the GPU, the free ones reused.
    present = host.list_mdevs()
    assert sorted(m.uuid for m in present) == sorted(given)
    assert {(m.parent, m.type_id) for m in present} == {(GPU, TYPE)}
    assert set(pre_existing) <= set(given)
    assert host.available_instances(GPU, TYPE) == 0
    manager = new_manager(root, state_dir)
    assert reconcile.Reconciler(manager).orphans() == []
    assert elapsed < 30, f"the race took {elapsed:.1f}s"


def fresh_host(tmp_path, name, pre_existing=()):
    root, state_dir = str(tmp_path / name / "sys"), str(tmp_path / name / "state")
    host = fakekernel.FakeKernel.build(root, one_t4(pre_existing))
    claims_journal.Journal(state_dir)
    return host, root, state_dir


def test_as_many_contenders_as_slots_all_win(tmp_path):
    """16 racing boots on an empty GPU that holds 16: none may be refused.

    Placement gave each of them a unit of the provider's 16; a refusal here
    fails a boot the host had room for.  One race may pass by luck, so it
    runs a few rounds, each on a fresh host.
    """
    for n in range(5):
        host, root, state_dir = fresh_host(tmp_path, f"round{n}")
        allocations, providers = placement_allocation(host)
        _, outcomes = run_race(
            root, state_dir, allocations, providers, threads=8, processes=2, per_process=4
        )
        refused = sorted(result for _, result, _ in outcomes if result != "ok")
        assert refused == [], f"round {n}: {len(refused)} refused, first: {refused[0]}"
        assert len({m.uuid for m in host.list_mdevs()}) == SLOTS
        assert host.available_instances(GPU, TYPE) == 0


def test_readers_never_see_a_half_written_available_instances(tmp_path):
    """While mdevs come and go, ``available_instances`` always reads a number.

    The kernel computes an attribute on each read, so a reader never sees
    it empty; allocations read it without the fake kernel's write lock,
    and an empty read counts as no room left.
    """
    host, _, _ = fresh_host(tmp_path, "host")
    path = os.path.join(host.paths.parent_type(GPU, TYPE), "available_instances")
    done = threading.Event()

    def churn():
        try:
            for _ in range(2):
                made = [str(uuid.uuid4()) for _ in range(SLOTS)]
                for mdev_uuid in made:
                    host.create_mdev(GPU, TYPE, mdev_uuid)
                for mdev_uuid in made:
                    host.remove_mdev(mdev_uuid)
        finally:
            done.set()

    writer = threading.Thread(target=churn)
    writer.start()
    reads = []
    while not done.is_set():
        reads.append(linux.read_attr(path))
    writer.join()
    assert reads, "the writer finished before any read"
    bad = sorted({r for r in reads if r is None or not r.isdigit()}, key=repr)
    assert bad == [], f"{sum(r in bad for r in reads)} of {len(reads)} reads gave {bad}"
    assert {int(r) for r in reads} <= set(range(SLOTS + 1))


def fresh_l40s(tmp_path, name, pre_typed=()):
    """One L40S whose VFs ``pre_typed`` are already L40S-8Q vGPUs (free)."""
    root, state_dir = str(tmp_path / name / "sys"), str(tmp_path / name / "state")
    host = fakekernel.FakeKernel.build(root, profiles.load("l40s-vfio"))
    for vf in pre_typed:
        host.set_vendor_vgpu_type(vf, int(VF_TYPE.split("-")[1]))
    claims_journal.Journal(state_dir)
    return host, root, state_dir, *placement_allocation(host, "l40s-capped", VF_ROOM)


def typed_vfs(host):
    return sorted(str(vf.address) for vf in host.list_vendor_vfio() if vf.current_type)


def test_vf_contenders_get_exactly_the_gpus_room_and_never_the_same_vf(tmp_path):
    """6 of 48 racing boots win an L40S-8Q, each its own VF; nothing else stays.

    The 3 VFs already typed and free are reused before any other is typed.
    Losers are refused at planning or by the driver's answer to their write,
    both as NoGpuCapacity, and leave no claim and no typed VF behind.
    """
    vfs = [
        str(vf.address)
        for vf in fakekernel.FakeKernel.build(
            str(tmp_path / "probe"), profiles.load("l40s-vfio")
        ).list_vendor_vfio()
    ]
    pre_typed = vfs[5:8]
    host, root, state_dir, allocations, providers = fresh_l40s(tmp_path, "host", pre_typed)
    journal = claims_journal.Journal(state_dir)

    instances, outcomes = run_race(root, state_dir, allocations, providers, config="l40s")

    assert sorted(i for i, _, _ in outcomes) == sorted(instances)
    won = {instance: got for instance, result, got in outcomes if result == "ok"}
    lost = sorted({result.split(":")[0] for _, result, _ in outcomes if result != "ok"})
    assert len(won) == VF_ROOM, (len(won), lost)
    assert set(lost) <= {exception.NoGpuCapacity.__name__, exception.VfTypeRefused.__name__}, lost
    given = [vf for got in won.values() for vf in got]
    assert len(set(given)) == len(given) == VF_ROOM, "a VF was handed out twice"
    assert set(pre_typed) <= set(given)
    assert {c.mdev_uuid: c.instance_uuid for c in journal.claims()} == {
        got[0]: instance for instance, got in won.items()
    }
    assert {(c.gpu, c.type_id, c.mdev_uuid == c.parent) for c in journal.claims()} == {
        (L40S, VF_TYPE, True)
    }
    assert typed_vfs(host) == sorted(given)
    assert reconcile.Reconciler(new_manager(root, state_dir, "l40s")).orphans() == []


def test_as_many_vf_contenders_as_room_all_win(tmp_path):
    """6 racing boots on an empty L40S that holds 6 L40S-8Q: none refused."""
    for n in range(3):
        host, root, state_dir, allocations, providers = fresh_l40s(tmp_path, f"round{n}")
        _, outcomes = run_race(
            root,
            state_dir,
            allocations,
            providers,
            threads=2,
            processes=2,
            per_process=2,
            config="l40s-capped",
        )
        refused = sorted(result for _, result, _ in outcomes if result != "ok")
        assert refused == [], f"round {n}: {len(refused)} refused, first: {refused[0]}"
        assert len(typed_vfs(host)) == VF_ROOM
