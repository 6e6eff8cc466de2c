"""The soak's default run: one seed, a hundred and fifty random operations.

The seed is printed first; a failure lists every violation with the seed
and the operations that led to it (see :mod:`tests.functional_nova.soak`).
The functional-nova lane replays a fixed seed (``VGPU_SOAK_SEED`` in
tox.ini); run by hand without it, each run draws a new one.
"""

import sys

from tests.functional_nova import soak


class SoakTest(soak.SoakTestBase):
    def test_random_operations_keep_the_invariants(self):
        result = self.run_soak()
        print(result.report(), file=sys.stderr)
        if result.violations:
            self.fail(result.report())
