"""What changed on the host since a reader last looked, and the answer when
nothing can tell.

The periodic refresh asks ``take_changes()`` which GPUs to re-read
(:class:`Changes`), and whoever waits for devices asks ``waiter()`` for
something to block on.  :mod:`vgpu_driver.sysfs.udev` answers from udev's
events; :class:`Polling` answers where udev cannot be used: every refresh
reads everything, every wait sleeps.
"""

from __future__ import annotations

import dataclasses
import threading


@dataclasses.dataclass(frozen=True)
class Changes:
    """What changed since the last :meth:`take_changes`.

    ``everything`` means events may have been lost (none are watched, the
    socket overflowed, the monitor stopped): only a full read is right.
    ``parents`` are mdev parent (device) names, ``gpus`` physical GPU
    addresses, each as sysfs names them.
    """

    everything: bool = False
    parents: frozenset[str] = frozenset()
    gpus: frozenset[str] = frozenset()

    def __bool__(self) -> bool:
        return self.everything or bool(self.parents or self.gpus)

    def __or__(self, other: Changes) -> Changes:
        return Changes(
            everything=self.everything or other.everything,
            parents=self.parents | other.parents,
            gpus=self.gpus | other.gpus,
        )


EVERYTHING = Changes(everything=True)


class _SleepingWaiter:
    """The polling stand-in: nothing tells, so sleep the whole time."""

    def __init__(self) -> None:
        self._stop = threading.Event()

    def wait(self, timeout: float) -> bool:
        self._stop.wait(max(timeout, 0))
        return False


class Polling:
    """No events: every refresh reads everything, every wait sleeps."""

    running = False

    def __init__(self, reason: str = "") -> None:
        self.reason = reason

    def take_changes(self) -> Changes:
        return EVERYTHING

    def waiter(self) -> _SleepingWaiter:
        return _SleepingWaiter()

    def stop(self) -> None:
        pass
