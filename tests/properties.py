"""How many examples the slow property tests draw.

Each example of these tests builds a host and replays up to 25 steps
against it (seconds each); the default run draws a few, and
``VGPU_PROPERTY_EXAMPLES=<n>`` draws more when hunting for a case.
Hypothesis keeps the failing examples it found and replays them first.
"""

import os


def examples(default):
    value = os.environ.get("VGPU_PROPERTY_EXAMPLES")
    return int(value) if value else default
