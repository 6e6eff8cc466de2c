"""NVIDIA's mixed-size placements by board framebuffer, in GB.

The rules and the boards are :mod:`vgpu_driver.fake.board_tables`'s; this
module keeps the older view of them by size alone: the placement IDs of
each vGPU size on the pre-Blackwell board of each framebuffer the guide
publishes (*Virtual GPU Software User Guide* 17, appendix A.3), Ampere's
by default, and the 1 GB row of Ada and Hopper boards with ``architecture``.
"""

from vgpu_driver.fake import board_tables

_REFERENCE = {
    b.framebuffer_gb: b
    for b in board_tables.BOARDS.values()
    if b.architecture in (board_tables.AMPERE, board_tables.HOPPER)
}
_GSP = {
    b.framebuffer_gb: b
    for b in board_tables.BOARDS.values()
    if b.architecture in (board_tables.ADA, board_tables.HOPPER)
}


def _by_size(board):
    return {e.type.framebuffer_gb: e.placements for e in board_tables.supported(board).values()}


# {board framebuffer GB: {vGPU framebuffer GB: supported placement IDs}}
TABLES = {gb: _by_size(board) for gb, board in sorted(_REFERENCE.items())}


def slots(framebuffer_mb):
    """A framebuffer's size in placement slots (GB, as NVIDIA rounds it)."""
    return board_tables.gb(framebuffer_mb)


def has_table(board_mb):
    return slots(board_mb) in TABLES


def supported(board_mb, vgpu_mb, architecture=None):
    """The placement IDs a vGPU of ``vgpu_mb`` may take on a board of
    ``board_mb`` in mixed-size mode (empty: that size is not offered)."""
    board, size = slots(board_mb), slots(vgpu_mb)
    if architecture in (board_tables.ADA, board_tables.HOPPER) and board in _GSP:
        return _by_size(_GSP[board]).get(size, ())
    return TABLES.get(board, {}).get(size, ())
