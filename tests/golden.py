"""Whole outputs compared with files under ``tests/golden/``.

``VGPU_REGENERATE_GOLDEN=1`` rewrites the files instead of comparing
(``tools/regen-golden.sh``); review the diff before committing it.
"""

import os

GOLDEN_DIR = os.path.join(os.path.dirname(__file__), "golden")


def assert_golden(name, text):
    """``text`` equals ``tests/golden/<name>``, or becomes it when
    regenerating."""
    path = os.path.join(GOLDEN_DIR, name)
    if os.environ.get("VGPU_REGENERATE_GOLDEN") == "1":
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return
    with open(path) as f:
        expected = f.read()
    assert text == expected, f"{name} differs from {path} (tools/regen-golden.sh rewrites it)"
