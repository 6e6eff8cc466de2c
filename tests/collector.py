"""Python's cyclic garbage collector, set for test processes that live long.

A test process keeps alive, to its end, what its imports and its first
tests load: some 410,000 objects in a nova lane's process once its first
test has run nova's services, fewer in pytest's.  With CPython's default
thresholds every full collection walks all of them again, and the tests
make enough long-lived garbage (nova's and Placement's engines, RPC servers,
thread pools, versioned objects) to start one every few seconds: in the
nova lane's ``test_vgpu``, collections took 11 to 12 s of its 77 s of CPU
(25 full ones, 9 s), and a tenth of the functional lane's CPU went to
collections.  So what is alive once the imports (pytest) or the first test
(the nova lanes) are done is frozen, never walked again, and a full
collection waits for ten times as many younger collections as by default:
about 5 s for the same 16 nova tests (9 full ones, 3 s).  Garbage is still
collected, a little later.
"""

import gc

# CPython's first two thresholds; the third ten times its default.
THRESHOLDS = (700, 10, 100)


def tune():
    gc.set_threshold(*THRESHOLDS)


def freeze_what_lives():
    """Collect, then set aside for good what is still alive."""
    gc.collect()
    gc.freeze()


def tune_for_nova(test):
    """Call in a nova lane's ``setUp`` before ``super().setUp()``: its
    clean-up runs after nova's fixtures have stopped the test's services.
    The process's first test freezes what it leaves alive."""
    tune()
    test.addCleanup(_freeze_once)


def _freeze_once():
    if not gc.get_freeze_count():
        freeze_what_lives()
