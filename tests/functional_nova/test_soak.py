"""The soak's default run: one seed, 150 random operations (fewer in CI).

The seed is printed first; a failure lists every violation with the seed
and the operations that led to it (see :mod:`tests.functional_nova.soak`).
The functional-nova lane replays a fixed seed, 80 operations on native
threads and 30 on eventlet (``VGPU_SOAK_SEED`` and ``VGPU_SOAK_OPS`` in
tox.ini); run by hand without them, each run draws a new seed and runs 150.
"""

import sys

from tests.functional_nova import soak


class SoakTest(soak.SoakTestBase):
    def test_random_operations_keep_the_invariants(self):
        result = self.run_soak()
        print(result.report(), file=sys.stderr)
        if result.violations:
            self.fail(result.report())
