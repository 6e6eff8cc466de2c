"""A hung test fails its lane, with every thread's stack, instead of holding
it until CI's own limit.

``OS_TEST_TIMEOUT`` (tox.ini) is the limit oslotest's base class already
applies to nova's test classes, by a gentle alarm in the main thread, from
its own set-up to its own clean-up.  An alarm lands only when that thread
runs Python again; one blocked in a C call (libvirt, a lock, a socket)
never sees it.  So a watchdog thread also prints every thread's stack a
little later and ends the process: stestr then reports the test that never
returned and fails the run.  It is armed before anything else of the test
is set up, so that nova's fixtures' own clean-ups are watched too.
"""

import faulthandler
import os
import sys
import time

import fixtures
import testtools

from tests import collector

# Time left to the gentle alarm before the watchdog ends the process.
GRACE = 30


def seconds():
    return int(os.environ.get("OS_TEST_TIMEOUT") or 0)


_expired = False


def arm_watchdog(test):
    """Call first in ``setUp``, before ``super().setUp()``: its clean-up is
    then the test's last.

    A test that ran past the limit leaves its watchdog armed, and no later
    test of the process arms another: what a hung test leaves behind (a
    greenthread holding a lock) hung the next test too, so the process ends
    within ``GRACE`` seconds instead of losing the limit again per test.
    """
    if seconds() <= 0 or _expired:
        return
    started = time.monotonic()
    faulthandler.dump_traceback_later(seconds() + GRACE, exit=True, file=sys.__stderr__)

    def disarm():
        global _expired
        if time.monotonic() - started >= seconds():
            _expired = True
        else:
            faulthandler.cancel_dump_traceback_later()

    test.addCleanup(disarm)


class TestCase(testtools.TestCase):
    """testtools' test case under the lane's deadline: the watchdog, and the
    gentle alarm oslotest's base class would give."""

    def setUp(self):
        arm_watchdog(self)
        collector.tune_for_nova(self)
        super().setUp()
        if seconds() > 0:
            self.useFixture(fixtures.Timeout(seconds(), gentle=True))
