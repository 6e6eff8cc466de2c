"""The fake vendor driver's placements against NVIDIA's published tables.

Each table below is one of NVIDIA's "vGPU Placements for GPUs in Mixed-Size
Mode" (one section per board framebuffer; the number of IDs of a row is the
type's maximum in mixed-size mode, as the guide's per-board type tables give
it), written out row by row: {vGPU framebuffer in GB: placement IDs}.  The
48 and 24 GB tables are the *Virtual GPU Software User Guide*'s (release 17,
appendix A.3); the 94, 80 and 40 GB ones the *NVIDIA AI Enterprise User
Guide*'s (v5.0, on vGPU software 17, appendix B, whose B.7 gives the same
24 GB table), and so are the boards' type lists (its appendix A).  The 96 GB Blackwell
board has no table in release 17: its row is the open kernel modules'
(``_kvgpumgrSetHeterogeneousResources_GB100``), spelled out.  Each table is
asked of a fake host built from the board, through NVML as the driver asks.
"""

import pytest

from vgpu_driver.fake import board_tables
from vgpu_driver.fake import nvml as fake_nvml

PF = "0000:c1:00.0"
EVERY_3_OF_48 = tuple(range(0, 46, 3))

# A.3.4, 48 GB (A40; the 1 GB row is Ampere's).
TABLE_48 = {
    48: (0,),
    24: (0, 24),
    16: (0, 32),
    12: (0, 12, 24, 36),
    8: (0, 16, 24, 40),
    6: (0, 6, 12, 18, 24, 30, 36, 42),
    4: (0, 8, 12, 20, 24, 32, 36, 44),
    3: EVERY_3_OF_48,
    2: (0, 4, 6, 10, 12, 16, 18, 22, 24, 28, 30, 34, 36, 40, 42, 46),
    1: (
        0,
        2,
        3,
        5,
        6,
        9,
        11,
        12,
        14,
        15,
        17,
        18,
        20,
        21,
        23,
        24,
        26,
        27,
        29,
        30,
        33,
        35,
        36,
        38,
        39,
        41,
        42,
        44,
        45,
        47,
    ),
}
# A.3.4's note: Ada Lovelace boards (L40S, L40) take fewer 1 GB vGPUs.
TABLE_48_ADA = {**TABLE_48, 1: (0, 5, 6, 11, 12, 17, 18, 23, 24, 29, 30, 35, 36, 41, 42, 47)}
# A.3.7, 24 GB (A10, L4).
TABLE_24 = {
    24: (0,),
    12: (0, 12),
    8: (0, 16),
    6: (0, 6, 12, 18),
    4: (0, 8, 12, 20),
    3: (0, 3, 6, 9, 12, 15, 18, 21),
    2: (0, 4, 6, 10, 12, 16, 18, 22),
    1: (0, 2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18, 20, 21, 23),
}
# AI Enterprise 5.0 B.5, 40 GB (A100 PCIe 40GB, type table A.4).
TABLE_40 = {
    40: (0,),
    20: (0, 20),
    10: (0, 10, 20, 30),
    8: (0, 12, 20, 32),
    5: (0, 5, 10, 15, 20, 25, 30, 35),
    4: (0, 6, 10, 16, 20, 26, 30, 36),
}
# AI Enterprise 5.0 B.2, 80 GB (H100 PCIe 80GB, type table A.14; A100 PCIe
# 80GB, A.6, which has no 5 GB type).
TABLE_80 = {
    80: (0,),
    40: (0, 40),
    20: (0, 20, 40, 60),
    16: (0, 24, 40, 64),
    10: (0, 10, 20, 30, 40, 50, 60, 70),
    8: (0, 12, 20, 32, 40, 52, 60, 72),
    5: tuple(range(0, 80, 5)),
    4: (0, 6, 10, 16, 20, 26, 30, 36, 40, 46, 50, 56, 60, 66, 70, 76),
}
# AI Enterprise 5.0 B.1, 94 GB (H100 NVL, type table A.12).
TABLE_94 = {
    94: (0,),
    47: (0, 47),
    23: (0, 24, 47, 71),
    15: (0, 32, 47, 79),
    11: (0, 12, 23, 36, 47, 59, 70, 83),
    6: (0, 17, 23, 41, 47, 64, 70, 88),
    4: (0, 7, 11, 19, 23, 31, 35, 43, 47, 54, 58, 66, 70, 78, 82, 90),
}
# 96 GB Blackwell: evenly spaced, each type's equal-size maximum of them.
TABLE_96 = {
    96: (0,),
    48: (0, 48),
    32: (0, 32, 64),
    24: (0, 24, 48, 72),
    16: tuple(range(0, 96, 16)),
    12: tuple(range(0, 96, 12)),
    8: tuple(range(0, 96, 8)),
    6: tuple(range(0, 96, 6)),
    4: tuple(range(0, 96, 4)),
    3: tuple(range(0, 96, 3)),
    2: tuple(range(0, 96, 3)),
}
PUBLISHED = {
    "a40": TABLE_48,
    "l40s": TABLE_48_ADA,
    "a10": TABLE_24,
    "l4": TABLE_24,
    "a100-40gb": TABLE_40,
    "a100-80gb": {gb: ids for gb, ids in TABLE_80.items() if gb != 5},
    "h100-80gb": TABLE_80,
    "h100-nvl": TABLE_94,
    "rtx-pro-6000-blackwell-se": TABLE_96,
}
# Mixed-size maxima the guides' type tables give where they differ from
# the equal-size ones: {board: {GB: maximum}} (AI Enterprise 5.0 A.4 for the
# A100 40GB, A.6 for the A100 80GB; the A40's 4, 8 and 16 GB and the A10's
# 4 and 8 GB maxima match its A.8 and A.11 too, the A10's 1 and 2 GB its B.7).
MIXED_SIZE_MAXIMA = {
    "a40": {1: 30, 2: 16, 4: 8, 8: 4, 16: 2},
    "l40s": {1: 16, 2: 16, 4: 8, 8: 4, 16: 2},
    "a10": {1: 16, 2: 8, 4: 4, 8: 2},
    "a100-40gb": {4: 8, 8: 4},
    "a100-80gb": {4: 16, 8: 8, 16: 4},
    "rtx-pro-6000-blackwell-se": {},
}


def profile_of(board, version="550.127.06", model="nvidia-vfio"):
    """A fake host with one board of ``board``'s family under vendor VFIO."""
    return board_tables.host_profile(board, PF, version=version, model=model)


def nvml_rows(host, board, mode=fake_nvml.NVML_VGPU_PGPU_HETEROGENEOUS_MODE):
    """{GB: (placement size, IDs)} as NVML answers for each type."""
    bindings = fake_nvml.Bindings(host.paths.root)
    handle = bindings.nvmlDeviceGetHandleByPciBusId(PF)
    rows = {}
    for n, t in enumerate(board.types):
        found = bindings.nvmlDeviceGetVgpuTypeSupportedPlacements(handle, 2000 + n, mode)
        rows[t.framebuffer_gb] = (found.placementSize, tuple(found.placementIds))
    return rows


@pytest.mark.parametrize("key", sorted(PUBLISHED))
def test_the_fake_reproduces_the_published_table_row_by_row(make_host, key):
    board = board_tables.board(key)
    rows = nvml_rows(make_host(profile_of(board)), board)
    assert sorted(rows) == sorted(PUBLISHED[key])
    for gb, published in PUBLISHED[key].items():
        assert rows[gb][1] == published, (key, gb)


@pytest.mark.parametrize("key", sorted(MIXED_SIZE_MAXIMA))
def test_mixed_size_maxima_are_the_published_ones(key):
    board = board_tables.board(key)
    for entry in board_tables.supported(board).values():
        gb = entry.type.framebuffer_gb
        expected = MIXED_SIZE_MAXIMA[key].get(gb, entry.type.max_instances)
        assert len(entry.placements) == expected, (key, gb)


def test_a_96_gb_boards_2_gb_type_takes_3_slots(make_host):
    board = board_tables.board("rtx-pro-6000-blackwell-se")
    rows = nvml_rows(make_host(profile_of(board)), board)
    assert rows[2][0] == 3 and rows[3][0] == 3 and rows[4][0] == 4


def test_blackwell_placements_do_not_nest():
    """A 32 GB vGPU at 32 holds no 24 GB placement (24 and 48 straddle it)."""
    board = board_tables.board("rtx-pro-6000-blackwell-se")
    used = [("NVIDIA DC-32Q", 32)]
    creatable = {e.type.framebuffer_gb: e.placements for e in board_tables.creatable(board, used)}
    assert creatable[24] == (0, 72)
    assert creatable[32] == (0, 64)


@pytest.mark.parametrize(
    "key, version, expected",
    [
        ("l40s", "565.57.01", {4: (4, tuple(range(0, 48, 4))), 48: (48, (0,))}),
        ("rtx-pro-6000-blackwell-se", "570.124.03", {2: (3, TABLE_96[2]), 32: (32, TABLE_96[32])}),
    ],
)
def test_equal_size_mode_reports_homogeneous_placements_from_r565(
    make_host, key, version, expected
):
    board = board_tables.board(key)
    rows = nvml_rows(
        make_host(profile_of(board, version)), board, fake_nvml.NVML_VGPU_PGPU_HOMOGENEOUS_MODE
    )
    for gb, row in expected.items():
        assert rows[gb] == row


@pytest.mark.parametrize("key, version", [("a100-40gb", "570.124.03"), ("l40s", "550.127.06")])
def test_no_homogeneous_placements_on_ampere_or_before_r565(make_host, key, version):
    board = board_tables.board(key)
    host = make_host(profile_of(board, version))
    with pytest.raises(fake_nvml.NVMLError) as caught:
        nvml_rows(host, board, fake_nvml.NVML_VGPU_PGPU_HOMOGENEOUS_MODE)
    assert caught.value.value == fake_nvml.NVML_ERROR_NOT_SUPPORTED
    # And a vGPU created in equal-size mode has no placement.
    host.set_vendor_vgpu_type("0000:c1:00.4", 2000)
    bindings = fake_nvml.Bindings(host.paths.root)
    assert bindings.nvmlVgpuInstanceGetPlacementId("0000:c1:00.4") == 0xFFFF
    with open(f"{host.paths.pci_device('0000:c1:00.4')}/nvidia/placement_id") as f:
        assert f.read() == "Not Applicable\n"


def test_equal_size_vgpus_take_homogeneous_placements_from_r565(make_host):
    board = board_tables.board("l40s")
    host = make_host(profile_of(board, "565.57.01"))
    number_4q = 2000 + [t.framebuffer_gb for t in board.types].index(4)
    for vf in ("0000:c1:00.4", "0000:c1:00.5", "0000:c1:00.6"):
        host.set_vendor_vgpu_type(vf, number_4q)
    assert [host.placement_of(vf) for vf in ("0000:c1:00.4", "0000:c1:00.5", "0000:c1:00.6")] == [
        0,
        4,
        8,
    ]
    host.set_vendor_vgpu_type("0000:c1:00.5", 0)
    host.set_vendor_vgpu_type("0000:c1:00.7", number_4q)
    assert host.placement_of("0000:c1:00.7") == 4


def available(host, parent, type_id):
    (parent_info,) = (p for p in host.list_parents() if p.name == parent)
    (found,) = (t for t in parent_info.types if t.type_id == type_id)
    return found.available_instances


def test_an_a100_over_mdev_mixes_sizes_at_its_placements(make_host):
    """The vGPU manager offers mixed-size mode on SR-IOV boards under its
    VFIO framework, mdev included: the mode is NVML's, each mdev placed."""
    board = board_tables.board("a100-40gb")
    host = make_host(profile_of(board, model="nvidia-sriov"))
    numbers = {t.framebuffer_gb: f"nvidia-{2000 + n}" for n, t in enumerate(board.types)}
    host.create_mdev("0000:c1:00.4", numbers[10], "00000000-0000-0000-0000-000000000001")
    # Equal-size mode: only 10 GB types are left on the other VFs.
    assert available(host, "0000:c1:00.5", numbers[20]) == 0
    host.remove_mdev("00000000-0000-0000-0000-000000000001")
    host.set_heterogeneous_mode(PF, True)
    host.create_mdev("0000:c1:00.4", numbers[10], "00000000-0000-0000-0000-000000000001")
    host.create_mdev("0000:c1:00.5", numbers[20], "00000000-0000-0000-0000-000000000002")
    host.create_mdev("0000:c1:00.6", numbers[5], "00000000-0000-0000-0000-000000000003")
    assert [host.placement_of(vf) for vf in ("0000:c1:00.4", "0000:c1:00.5", "0000:c1:00.6")] == [
        0,
        20,
        10,
    ]
    with open(
        f"{host.paths.mdev('00000000-0000-0000-0000-000000000002')}/nvidia/placement_id"
    ) as f:
        assert f.read() == "20\n"
    # Slots 15-19 are left: 40 GB is gone, 8 GB fits nowhere, 4 GB at 16.
    assert available(host, "0000:c1:00.7", numbers[40]) == 0
    assert available(host, "0000:c1:00.7", numbers[8]) == 0
    assert host.placements(PF, 2000 + [t.framebuffer_gb for t in board.types].index(4)) == (
        4,
        TABLE_40[4],
        (16,),
    )
