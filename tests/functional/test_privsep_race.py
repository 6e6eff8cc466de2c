"""The privileged writer cannot be raced out of its root.

While the entry points run, another process swaps a directory on their path
(``devices/pci0000:18``) with a symbolic link to a copy of it outside the
root, with ``renameat2(RENAME_EXCHANGE)``, tens of thousands of times.  A
writer that checked a path by string and then opened it would now and then
write into the copy; one that opens every component by fd beneath the root,
following no link, never does.  Both of the writer's walks are tried: the
kernel's ``openat2`` and the walk by components kept for kernels without it.
"""

import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid

from vgpu_driver import exception
from vgpu_driver import privsep
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

T4 = "0000:18:00.0"
SWAPS = 20_000
MIN_WRITES = 150
MEET_WITHIN = 60.0

# Exchanges the directory and the link until it has made at least SWAPS
# exchanges and is told to stop (a line on stdin), always stopping with the
# directory back in place; prints how many it made.
SWAPPER = textwrap.dedent("""
    import ctypes, os, select, sys
    libc = ctypes.CDLL(None, use_errno=True)
    RENAME_EXCHANGE = 2
    a, b, least = os.fsencode(sys.argv[1]), os.fsencode(sys.argv[2]), int(sys.argv[3])
    print("ready", flush=True)
    swaps = 0
    while True:
        for _ in range(200):
            if libc.renameat2(-100, a, -100, b, RENAME_EXCHANGE) != 0:
                raise OSError(ctypes.get_errno(), "renameat2")
            swaps += 1
        if swaps >= least and select.select([sys.stdin], [], [], 0)[0]:
            break
    print(swaps, flush=True)
""")


def one_t4():
    profile = profiles.load("t4x8")
    return {**profile, "gpus": profile["gpus"][:1]}


def files_with_bytes(top):
    found = {}
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            path = os.path.join(dirpath, name)
            if name in ("create", "remove") and os.path.getsize(path):
                found[path] = os.path.getsize(path)
    return found


def test_a_directory_swapped_for_a_link_never_moves_a_write(tmp_path, make_conf, walk):
    kernel = fakekernel.FakeKernel.build(str(tmp_path / "sys"), one_t4())
    root = kernel.paths.root
    held = str(uuid.uuid4())
    kernel.create_mdev(T4, "nvidia-222", held)
    bus_dir = os.path.join(root, "devices", "pci0000:18")
    decoy = tmp_path / "decoy" / "pci0000:18"
    shutil.copytree(bus_dir, decoy, symlinks=True)
    swap_link = os.path.join(root, "devices", "swap")
    os.symlink(str(decoy), swap_link)
    privsep.run_in_process(
        make_conf(f"""
        [devices]
        enabled_mdev_types = nvidia-222
        [vgpu]
        sysfs_root = {root}
        test_only_fake_sysfs_root = true
        """)
    )
    assert files_with_bytes(decoy) == {}

    swapper = subprocess.Popen(
        [sys.executable, "-c", SWAPPER, bus_dir, swap_link, str(SWAPS)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    outcomes = {"written": 0, "refused": 0}
    try:
        assert swapper.stdout.readline().strip() == "ready"
        # On busy cores (the other test worker, other runs) the swapper may
        # not be scheduled during the first MIN_WRITES writes: go on until
        # it has met the writer, for at most MEET_WITHIN seconds.
        deadline = time.monotonic() + MEET_WITHIN
        while (
            sum(outcomes.values()) < MIN_WRITES
            or outcomes["written"] < 10
            or (outcomes["refused"] == 0 and time.monotonic() < deadline)
        ):
            for call in (
                (privsep.create_mdev, T4, "nvidia-222", str(uuid.uuid4())),
                (privsep.remove_mdev, held),
            ):
                try:
                    call[0](*call[1:])
                    outcomes["written"] += 1
                except (exception.VgpuDriverError, OSError):
                    outcomes["refused"] += 1
        swapper.stdin.write("stop\n")
        swapper.stdin.flush()
        swaps = int(swapper.stdout.readline())
        assert swapper.wait(timeout=60) == 0
    finally:
        if swapper.poll() is None:
            swapper.kill()
            swapper.wait()
        swapper.stdin.close()
        swapper.stdout.close()
        privsep.use_daemon()

    print(f"{walk}: {swaps} swaps, {outcomes}")
    assert swaps >= SWAPS and os.path.isdir(bus_dir) and not os.path.islink(bus_dir)
    assert outcomes["refused"] > 0, "the swaps never met the writer"
    assert outcomes["written"] >= 10
    assert files_with_bytes(decoy) == {}, "a write left the root"
    # What was written landed in the root, in the device's own files.
    assert set(files_with_bytes(bus_dir)) <= {
        os.path.join(bus_dir, T4, "mdev_supported_types", "nvidia-222", "create"),
        os.path.join(bus_dir, T4, held, "remove"),
    }
