"""A hung test fails its lane, with every thread's stack, instead of holding
it until CI's own limit.

``OS_TEST_TIMEOUT`` (tox.ini) is the limit oslotest's base class already
applies to nova's test classes, by a gentle alarm in the main thread.  An
alarm lands only when that thread runs Python again; one blocked in a C call
(libvirt, a lock, a socket) never sees it.  So a watchdog thread also
prints every thread's stack a little later and ends the process: stestr
then reports the test that never returned and fails the run.
"""

import faulthandler
import os
import sys

import fixtures
import testtools

# Time left to the gentle alarm before the watchdog ends the process.
GRACE = 30


class Deadline(fixtures.Fixture):
    def _setUp(self):
        seconds = int(os.environ.get("OS_TEST_TIMEOUT") or 0)
        if seconds <= 0:
            return
        self.useFixture(fixtures.Timeout(seconds, gentle=True))
        faulthandler.dump_traceback_later(seconds + GRACE, exit=True, file=sys.__stderr__)
        self.addCleanup(faulthandler.cancel_dump_traceback_later)


class TestCase(testtools.TestCase):
    """testtools' test case under the lane's deadline (nova's own base
    classes take :class:`Deadline` in ``VGPUDriverTestBase``)."""

    def setUp(self):
        super().setUp()
        self.useFixture(Deadline())
