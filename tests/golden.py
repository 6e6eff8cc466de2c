"""Golden files: expected output kept as files under ``tests/golden/``.

A test hands its output to :func:`assert_golden`; it fails on any
difference, naming the file.  After a deliberate change of output, every
golden file is written again from what the tests produce now with
``tools/regen-golden.sh`` (each module that calls :func:`assert_golden`,
run in its lane with ``VGPU_REGENERATE_GOLDEN=1``), and the diff is
reviewed and committed like code.
"""

import difflib
import os

GOLDEN_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden")
REGENERATE = "VGPU_REGENERATE_GOLDEN"


def path_of(name):
    return os.path.join(GOLDEN_DIR, name)


def assert_golden(name, text):
    """``text`` equals ``tests/golden/<name>``; with ``VGPU_REGENERATE_GOLDEN``
    set (not empty, not 0), the file is written from ``text`` instead."""
    path = path_of(name)
    if os.environ.get(REGENERATE, "") not in ("", "0"):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return
    try:
        with open(path, encoding="utf-8") as f:
            expected = f.read()
    except FileNotFoundError:
        raise AssertionError(
            f"no golden file {path}; write it with {REGENERATE}=1 and review it"
        ) from None
    if text != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                text.splitlines(keepends=True),
                f"tests/golden/{name}",
                "produced",
            )
        )
        raise AssertionError(
            f"output differs from tests/golden/{name} (if the change "
            f"is meant, regenerate with {REGENERATE}=1):\n{diff}"
        )
