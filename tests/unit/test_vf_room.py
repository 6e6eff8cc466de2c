"""A vendor-VFIO board serving one type: Placement grants a request of N
vGPUs if and only if the board takes N, one request at a time.

Every free VF lists the type while one more vGPU of it fits, so the VFs
listing it are not what fits; the board's maximum (NVML's, here the fake
vendor driver's) less the vGPUs it holds is.
"""

import pytest

from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import inventory
from vgpu_driver import names
from vgpu_driver.conf import mdev_types

PF = "0000:c1:00.0"
REQUESTS = (1, 2, 3, 5)


def _config(make_conf, type_id):
    return mdev_types.from_conf(
        make_conf(f"""
        [devices]
        enabled_mdev_types = {type_id}
        [mdev_{type_id}]
        device_addresses = {PF}
        """)
    )


def _provider(host, config, read_rooms=True):
    snapshot = discovery.discover(host)
    rooms = inventory.read_rooms(host, snapshot, config) if read_rooms else None
    (provider,) = inventory.compute(snapshot, config, "cn1", rooms=rooms).providers
    return provider, snapshot


def _granted(provider, used, count):
    """Placement's check of one resource class for ``count`` units."""
    return (
        provider.min_unit <= count <= provider.max_unit
        and count % provider.step_size == 0
        and used + count <= (provider.total - provider.reserved) * provider.allocation_ratio
    )


def _free_vf(host, number):
    gpu = discovery.discover(host).gpu(PF)
    for parent in gpu.parents:
        if not parent.current_vgpu_type and parent.lists(names.vendor_type_id(number)):
            return parent.name
    return None


def _takes(host, number, count):
    """Whether the board takes ``count`` vGPUs, typed one VF after another
    as the vendor-VFIO strategy does; what was typed is cleared again."""
    typed = []
    try:
        for _ in range(count):
            vf = _free_vf(host, number)
            if vf is None:
                return False
            host.set_vendor_vgpu_type(vf, number)
            typed.append(vf)
        return True
    except exception.MdevWriteError:
        return False
    finally:
        for vf in typed:
            host.set_vendor_vgpu_type(vf, 0)


@pytest.mark.parametrize("type_id", ["nvidia-1155", "nvidia-1157", "nvidia-1159"])
def test_a_request_passes_placement_iff_the_board_takes_it(make_host, make_conf, type_id):
    host = make_host("l40s-vfio")
    config = _config(make_conf, type_id)
    number = names.vendor_type_number(type_id)
    held = 0
    while True:
        provider, _snapshot = _provider(host, config)
        for count in REQUESTS:
            assert _granted(provider, held, count) == _takes(host, number, count), (
                f"{count} x {type_id} with {held} on the board: total {provider.total}"
            )
        vf = _free_vf(host, number)
        if vf is None:
            break
        host.set_vendor_vgpu_type(vf, number)
        held += 1
    # The walk went up to the type's maximum (4 x 12 GB on a 48 GB board).
    assert held == {"nvidia-1155": 12, "nvidia-1157": 4, "nvidia-1159": 2}[type_id]
    assert provider.total == held


def test_the_total_is_the_maximum_less_what_the_board_holds(make_host, make_conf):
    host = make_host("l40s-vfio")
    config = _config(make_conf, "nvidia-1157")
    host.set_vendor_vgpu_type("0000:c1:00.4", 1157)
    provider, _snapshot = _provider(host, config)
    # 1 held and 3 more (4 x 12 GB), though 15 free VFs list the type.
    assert (provider.total, provider.reserved, provider.max_unit) == (4, 0, 4)


def test_without_nvml_the_board_offers_one_more_at_a_time(make_host, make_conf):
    """Where NVML cannot tell the maximum, only what the VFs' lists promise
    is offered: never a grant the board refuses."""
    host = make_host("l40s-vfio")
    config = _config(make_conf, "nvidia-1157")
    number = names.vendor_type_number("nvidia-1157")
    for held in range(4):
        provider, _snapshot = _provider(host, config, read_rooms=False)
        assert provider.total == held + 1
        for count in REQUESTS:
            if _granted(provider, held, count):
                assert _takes(host, number, count)
        host.set_vendor_vgpu_type(_free_vf(host, number), number)


def test_a_mixed_size_board_serving_one_type_counts_its_placements(make_host, make_conf):
    """In mixed-size mode a board has its mixed-size maximum (8 x 4 GB on a
    48 GB board, not 12): the creatable placements say what fits."""
    host = make_host("l40s-vfio")
    host.set_mixed_sizes(PF, True)
    config = _config(make_conf, "nvidia-1155")
    held = 0
    while (vf := _free_vf(host, 1155)) is not None:
        provider, _snapshot = _provider(host, config)
        for count in REQUESTS:
            assert _granted(provider, held, count) == _takes(host, 1155, count)
        host.set_vendor_vgpu_type(vf, 1155)
        held += 1
    assert held == 8
