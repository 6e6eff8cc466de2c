"""nova.conf validation: every bad input gives an error naming option and value."""

import pytest

from tests import confs
from vgpu_driver import exception
from vgpu_driver.conf import mdev_settings
from vgpu_driver.conf import mdev_types


def problems(make_conf, text):
    _config, found = mdev_types.load(make_conf(text))
    return [str(p) for p in found]


def test_nova_guide_example_is_sound(make_conf):
    config = mdev_types.from_conf(make_conf(confs.NOVA_GUIDE_M60))
    assert config.enabled == ("nvidia-35", "nvidia-36")
    assert config.default_type is None
    assert dict(config.by_address) == {
        "0000:84:00.0": "nvidia-35",
        "0000:85:00.0": "nvidia-35",
        "0000:86:00.0": "nvidia-36",
    }


def test_single_type_without_addresses_is_the_default(make_conf):
    config = mdev_types.from_conf(
        make_conf("""
        [devices]
        enabled_mdev_types = nvidia-468
        [mdev_nvidia-468]
        max_instances = 10
        mdev_class = CUSTOM_A100_4C
        """)
    )
    assert config.default_type == "nvidia-468"
    assert config.type_config("nvidia-468") == mdev_settings.TypeConfig(
        "nvidia-468", (), "CUSTOM_A100_4C", 10
    )


def test_old_option_and_group_names_are_accepted(make_conf):
    config = mdev_types.from_conf(
        make_conf("""
        [devices]
        enabled_vgpu_types = nvidia-35
        [vgpu_nvidia-35]
        device_addresses = 0000:84:00.0
        """)
    )
    assert dict(config.by_address) == {"0000:84:00.0": "nvidia-35"}


def test_addresses_are_normalised(make_conf):
    config = mdev_types.from_conf(
        make_conf("""
        [devices]
        enabled_mdev_types = nvidia-35, mtty-1
        [mdev_nvidia-35]
        device_addresses = 0000:E7:00.0
        [mdev_mtty-1]
        device_addresses = mtty_mtty
        """)
    )
    assert set(config.by_address) == {"0000:e7:00.0", "mtty_mtty"}


def test_address_under_two_types_names_address_and_both_types(make_conf):
    found = problems(
        make_conf,
        """
        [devices]
        enabled_mdev_types = i915-GVTg_V5_4, i915-GVTg_V5_8
        [mdev_i915-GVTg_V5_4]
        device_addresses = 0000:00:02.0
        [mdev_i915-GVTg_V5_8]
        device_addresses = 0000:00:02.0
        """,
    )
    assert found == [
        "error: [mdev_i915-GVTg_V5_8] device_addresses = '0000:00:02.0': "
        "0000:00:02.0 is also listed under type i915-GVTg_V5_4; a device "
        "serves one type, unless every type listing it is an NVIDIA type "
        "(nvidia-<number>) of a board that mixes vGPU sizes: remove it from "
        "[mdev_i915-GVTg_V5_8] or [mdev_i915-GVTg_V5_4]"
    ]


def test_nvidia_types_may_share_an_address_the_host_then_judges(make_conf):
    """Whether a board mixes sizes is the host's to say (NVIDIA's older
    mdev types are named nvidia-<number> too): the configuration loads."""
    found = problems(
        make_conf,
        """
        [devices]
        enabled_mdev_types = nvidia-35, nvidia-36
        [mdev_nvidia-35]
        device_addresses = 0000:84:00.0
        [mdev_nvidia-36]
        device_addresses = 0000:84:00.0
        """,
    )
    assert found == []


@pytest.mark.parametrize(
    "address",
    ["0000:84:00", "84:00.0", "0000:84:00.8", "0000:84:20.0", "../../etc", "0000:84:00.0/x"],
)
def test_malformed_address_names_the_option(make_conf, address):
    found = problems(
        make_conf,
        f"""
        [devices]
        enabled_mdev_types = nvidia-35
        [mdev_nvidia-35]
        device_addresses = {address}
        """,
    )
    assert len(found) == 1
    assert found[0].startswith(
        f"error: [mdev_nvidia-35] device_addresses = '{address}': not a PCI address"
    )


@pytest.mark.parametrize(
    "option,value,reason",
    [
        *[
            (
                "mdev_class",
                value,
                f"Value '{value}' doesn't match regex '^(VGPU|CUSTOM_[A-Z0-9_]+)$'",
            )
            for value in ["vgpu", "CUSTOM_lower", "PGPU", "CUSTOM_"]
        ],
        *[
            ("max_instances", value, "Should be greater than or equal to 1")
            for value in ["0", "-3"]
        ],
    ],
)
def test_bad_value_names_the_option(make_conf, option, value, reason):
    found = problems(
        make_conf,
        f"""
        [devices]
        enabled_mdev_types = nvidia-35
        [mdev_nvidia-35]
        {option} = {value}
        """,
    )
    assert found == [f"error: [mdev_nvidia-35] {option} = '{value}': {reason}"]


def test_second_type_without_addresses_is_reported(make_conf):
    config, found = mdev_types.load(
        make_conf("""
        [devices]
        enabled_mdev_types = nvidia-35, nvidia-36
        """)
    )
    assert config.default_type == "nvidia-35"
    assert [p.severity for p in found] == ["warning"]
    assert "nvidia-36 will not be used" in found[0].reason
    assert found[0].option == "[mdev_nvidia-36] device_addresses"


def test_unsafe_type_id_is_refused(make_conf):
    found = problems(
        make_conf,
        """
        [devices]
        enabled_mdev_types = ../../bus, nvidia-35
        """,
    )
    assert found == [
        "error: [devices] enabled_mdev_types = '../../bus': "
        "not an mdev type id (see 'vgpu-manage types')"
    ]


def test_from_conf_raises_with_every_error(make_conf):
    conf = make_conf("""
        [devices]
        enabled_mdev_types = nvidia-35
        [mdev_nvidia-35]
        device_addresses = 0000:84
        max_instances = 0
        """)
    with pytest.raises(exception.InvalidConfiguration) as caught:
        mdev_types.from_conf(conf)
    assert len(caught.value.problems) == 2
    assert "[mdev_nvidia-35] device_addresses" in str(caught.value)
    assert "[mdev_nvidia-35] max_instances" in str(caught.value)


def test_every_shipped_example_is_sound(make_conf):
    """Each block of etc/vgpu-driver/nova.conf.example, uncommented, loads cleanly."""
    import pathlib

    example = pathlib.Path(__file__).resolve().parents[2] / "etc/vgpu-driver/nova.conf.example"
    blocks = example.read_text().split("# --- ")[1:]
    assert len(blocks) == 5
    for block in blocks:
        ini = "\n".join(
            line[2:]
            for line in block.splitlines()[1:]
            if line.startswith("# [") or line.startswith("# ") and "=" in line
        )
        conf = make_conf(ini)
        config, found = mdev_types.load(conf)
        assert found == [], (block, found)
        assert config.types or conf.vgpu.state_dir == "/var/lib/vgpu-driver"
    assert [t.type_id for t in config.types] == []  # the last block: [vgpu] only


def test_overrides_stay_in_their_own_config(make_conf):
    first, second = make_conf(""), make_conf("")
    first.set_override("state_dir", "/elsewhere", group="vgpu")
    first.set_override("enabled_mdev_types", ["nvidia-35"], group="devices")
    assert second.vgpu.state_dir == "/var/lib/vgpu-driver"
    assert second.devices.enabled_mdev_types == []
