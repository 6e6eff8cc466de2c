"""Removals in flight: one writer per vGPU, a bound on writers, no pile-up."""

import errno
import threading
import time

from vgpu_driver import exception
from vgpu_driver import removals


class Kernel:
    """Removals that block until let go, as the kernel's do while QEMU
    holds the device; counts the writes it was given."""

    def __init__(self):
        self.released = threading.Event()
        self.writes = []
        self.lock = threading.Lock()

    def destroy(self, vgpu):
        with self.lock:
            self.writes.append(vgpu)
        self.released.wait(10)


def test_a_blocked_removal_is_one_writer_however_often_asked():
    kernel = Kernel()
    writers = removals.Removals(limit=2)
    threads_before = threading.active_count()
    for _ in range(5):
        removal = writers.remove("mdev-1", kernel.destroy, 0.05)
        assert removal.state == removals.IN_FLIGHT
    assert kernel.writes == ["mdev-1"]
    assert threading.active_count() - threads_before == 1
    assert list(writers.in_flight()) == ["mdev-1"]
    kernel.released.set()
    assert writers.remove("mdev-1", kernel.destroy, 5).state == removals.DONE
    assert writers.in_flight() == {}
    assert kernel.writes == ["mdev-1"]


def test_at_most_limit_writers_the_rest_wait_their_turn():
    kernel = Kernel()
    writers = removals.Removals(limit=2)
    got = [writers.remove(v, kernel.destroy, 0) for v in ("a", "b", "c")]
    assert [g.state if g else None for g in got] == [removals.IN_FLIGHT] * 2 + [None]
    assert sorted(kernel.writes) == ["a", "b"]
    kernel.released.set()
    assert writers.remove("c", kernel.destroy, 5).state == removals.DONE
    assert sorted(kernel.writes) == ["a", "b", "c"]


def test_a_finished_writer_tells_and_is_collected_once():
    told = []
    writers = removals.Removals()
    writers.on_done = told.append
    kernel = Kernel()
    assert writers.remove("x", kernel.destroy, 0).state == removals.IN_FLIGHT
    kernel.released.set()
    deadline = time.monotonic() + 5
    while not told and time.monotonic() < deadline:
        time.sleep(0.01)
    assert told == ["x"]
    assert writers.remove("x", kernel.destroy, 0).state == removals.DONE
    # The next call is a new removal (the kernel said it is gone already).
    assert writers.remove("x", kernel.destroy, 5).state == removals.DONE
    assert kernel.writes == ["x", "x"]


def test_a_refused_or_broken_removal_is_failed_and_retried_by_a_new_writer():
    calls = []

    def refuse(vgpu):
        calls.append(vgpu)
        if len(calls) == 1:
            raise exception.MdevWriteError.from_os_error(
                "remove", vgpu, OSError(errno.EBUSY, "busy")
            )
        raise RuntimeError("a bug")

    writers = removals.Removals()
    first = writers.remove("v", refuse, 5)
    assert first.state == removals.FAILED and "busy" in first.error
    second = writers.remove("v", refuse, 5)
    assert second.state == removals.FAILED and second.error == "RuntimeError: a bug"
    assert writers.in_flight() == {} and calls == ["v", "v"]
