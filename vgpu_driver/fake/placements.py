"""NVIDIA's mixed-size vGPU placements, as the fake vendor driver applies them.

In mixed-size (heterogeneous) mode a GPU's framebuffer is a *placement
region* of slots of about 1 GB, as many as the board's framebuffer in GB; a
vGPU whose type has N GB of framebuffer has a *placement size* of N slots
and sits at a *placement ID*.  The IDs a size may take are not multiples of
it (a 16 GB vGPU on a 48 GB board sits at 0 or 32, never at 16): NVIDIA
publishes them per board framebuffer.  The tables below are those of the
*Virtual GPU Software User Guide*, release 17.0, appendix A.3 "vGPU
Placements for GPUs in Mixed-Size Mode" (A.3.4: 48 GB boards such as L40S,
L40, A40; A.3.7: 24 GB boards such as L4, A10).  "The number of supported
placement IDs is the maximum number of vGPUs of the type that are allowed
on the GPU in mixed-size mode" (ibid., 2.12); on Ada boards fewer 1 GB
vGPUs fit than on others (ibid., A.3.4).

Where the guide is silent the fake takes the conservative reading, and
says so:

* That a vGPU at ID ``p`` of size ``s`` takes slots ``[p, p + s)`` and that
  no two vGPUs share a slot is inferred: every row of the tables is
  consistent with it, and the guide draws placements that way.
* Which ID the Virtual GPU Manager takes when none is asked for is not
  documented; the fake takes the lowest creatable one.
* A board whose framebuffer has no table here (96 GB boards: no table in
  release 17.0) does not get mixed-size mode in the fake.
"""

# {board framebuffer GB: {vGPU framebuffer GB: supported placement IDs}}
_EVERY_3_OF_48 = tuple(range(0, 46, 3))
TABLES = {
    48: {
        48: (0,),
        24: (0, 24),
        16: (0, 32),
        12: (0, 12, 24, 36),
        8: (0, 16, 24, 40),
        6: (0, 6, 12, 18, 24, 30, 36, 42),
        4: (0, 8, 12, 20, 24, 32, 36, 44),
        3: _EVERY_3_OF_48,
        2: (0, 4, 6, 10, 12, 16, 18, 22, 24, 28, 30, 34, 36, 40, 42, 46),
        1: (0, 2, 3, 5, 6, 9, 11, 12, 14, 15, 17, 18, 20, 21, 23, 24, 26, 27, 29, 30, 33,
            35, 36, 38, 39, 41, 42, 44, 45, 47),
    },
    24: {
        24: (0,),
        12: (0, 12),
        8: (0, 16),
        6: (0, 6, 12, 18),
        4: (0, 8, 12, 20),
        3: (0, 3, 6, 9, 12, 15, 18, 21),
        2: (0, 4, 6, 10, 12, 16, 18, 22),
        1: (0, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 23),
    },
}
# Ada Lovelace boards take fewer 1 GB vGPUs (A.3.4's note on the 1024 MB row).
ADA_48_1GB = (0, 5, 6, 11, 12, 17, 18, 23, 24, 29, 30, 35, 36, 41, 42, 47)


def slots(framebuffer_mb):
    """A framebuffer's size in placement slots (GB, as NVIDIA rounds it)."""
    return max(round(framebuffer_mb / 1024), 1)


def has_table(board_mb):
    return slots(board_mb) in TABLES


def supported(board_mb, vgpu_mb, architecture=None):
    """The placement IDs a vGPU of ``vgpu_mb`` may take on a board of
    ``board_mb`` in mixed-size mode (empty: that size is not offered)."""
    board, size = slots(board_mb), slots(vgpu_mb)
    if board == 48 and size == 1 and architecture == "ada":
        return ADA_48_1GB
    return TABLES.get(board, {}).get(size, ())


def occupied(placed):
    """The slots taken by ``placed``: ``(placement ID, size in slots)`` pairs."""
    return {slot for start, size in placed for slot in range(start, start + size)}


def creatable(board_mb, vgpu_mb, placed, architecture=None):
    """The supported IDs whose slots no vGPU of ``placed`` takes, lowest first."""
    taken, size = occupied(placed), slots(vgpu_mb)
    return tuple(p for p in supported(board_mb, vgpu_mb, architecture)
                 if taken.isdisjoint(range(p, p + size)))
