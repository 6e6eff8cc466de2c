"""What the benchmarks share: their command line, how they time and report."""

import argparse
import ctypes
import ctypes.util
import gc
import importlib.util
import json
import os
import statistics


def _malloc_trim():
    """glibc's ``malloc_trim(0)``, or nothing where there is no glibc."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (AttributeError, OSError, TypeError):
        return None


MALLOC_TRIM = _malloc_trim()
SETTLE = "gc.collect()" + (" + malloc_trim(0)" if MALLOC_TRIM is not None else "")


def settle():
    """Before each timed window: collect garbage and hand freed memory back.

    Otherwise whichever side runs second pays for the heap the other left
    behind: an allocation right after a 500-domain scan took about twice as
    long as one right after another allocation.
    """
    gc.collect()
    if MALLOC_TRIM is not None:
        MALLOC_TRIM(0)


def summary(samples):
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "samples": samples,
    }


def interleaved(rounds, first, second):
    """Timed rounds of two sides, alternating which one goes first.

    ``first`` and ``second`` each run one timed window and return its
    sample.  One untimed run of each comes first, to warm the caches.
    Alternating the order inside a round means drift (CPU clock, other
    load) hits both alike, and neither side always runs second.  Returns
    ``(first samples, second samples)``.
    """
    first()
    second()
    first_samples, second_samples = [], []
    for index in range(rounds):
        if index % 2:
            second_samples.append(second())
            first_samples.append(first())
        else:
            first_samples.append(first())
            second_samples.append(second())
    return first_samples, second_samples


def fs_type(path):
    """The file-system type under ``path`` (from /proc/mounts), if known."""
    path, best, fs = os.path.realpath(path), "", "?"
    try:
        with open("/proc/mounts") as f:
            for line in f:
                mount, kind = line.split()[1:3]
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > len(
                    best
                ):
                    best, fs = mount, kind
    except OSError:
        pass
    return fs


def mark(ok):
    return "PASS" if ok else "MISS"


def parse_args(argv, description, rounds_help, tmpdir_help, cpu_option=False):
    parser = argparse.ArgumentParser(description=description)
    if cpu_option:
        parser.add_argument(
            "--cpu",
            action="store_true",
            help="Time this process's CPU time (time.process_time) "
            "instead of wall time: steadier on a loaded machine.",
        )
    parser.add_argument("--rounds", type=int, default=30, help=f"{rounds_help} (default: 30).")
    parser.add_argument("--json", metavar="FILE", help="Also write the numbers to FILE.")
    parser.add_argument("--tmpdir", metavar="DIR", help=tmpdir_help)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def write_json(path, results):
    """Write the numbers when ``--json`` asked for them."""
    if path:
        with open(path, "w") as f:
            json.dump(results, f, indent=2)
        print(f"\nNumbers written to {path}")


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_test_helper(name):
    """``tests/<name>.py``, by its path: ``tests`` is no installed package."""
    spec = importlib.util.spec_from_file_location(
        f"vgpu_bench_{name}", os.path.join(REPO, "tests", f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
