"""Names are validated before they are ever joined into a sysfs path."""

import pytest

from vgpu_driver import exception
from vgpu_driver import names


def test_pci_address_round_trip_and_provider_suffix():
    address = names.parse_pci_address("0000:E7:1f.7")
    assert str(address) == "0000:e7:1f.7"
    assert address.provider_suffix == "pci_0000_e7_1f_7"


def test_vf_offsets_carry_into_slot_and_bus():
    pf = names.parse_pci_address("0000:41:00.0")
    assert [str(pf.offset(n)) for n in (4, 8, 255, 256)] == [
        "0000:41:00.4", "0000:41:01.0", "0000:41:1f.7", "0000:42:00.0"]


@pytest.mark.parametrize("value", ["../0000:41:00.0", "0000:41:00.0/..", "", None, 7])
def test_unsafe_parent_names(value):
    with pytest.raises(exception.InvalidSysfsName):
        names.check_parent_name(value)


@pytest.mark.parametrize("value", ["..", "a/b", ".hidden", "nvidia 35", "x" * 200])
def test_unsafe_type_ids(value):
    with pytest.raises(exception.InvalidSysfsName):
        names.check_type_id(value)


def test_type_ids_of_the_field_are_accepted():
    for value in ("nvidia-35", "i915-GVTg_V5_4", "mtty-1", "vfio_ap-passthrough"):
        assert names.check_type_id(value) == value


def test_mdev_uuids_must_be_canonical():
    names.check_mdev_uuid("5cc67126-fb04-47ed-a7de-0f3eec7335f7")
    for value in ("5CC67126-FB04-47ED-A7DE-0F3EEC7335F7", "5cc67126fb0447eda7de0f3eec7335f7"):
        with pytest.raises(exception.InvalidSysfsName):
            names.check_mdev_uuid(value)


def test_virtual_device_names():
    assert names.parse_device_address("mtty_mtty") == "mtty_mtty"
    assert names.virtual_device_path("mtty_mtty") == ("mtty", "mtty")
    with pytest.raises(exception.InvalidSysfsName):
        names.parse_device_address("mtty/../x")


def test_trait_fragment():
    assert names.trait_fragment("NVIDIA A100-4C") == "NVIDIA_A100_4C"
    assert names.trait_fragment(" GRID  T4-1B4 ") == "GRID_T4_1B4"
