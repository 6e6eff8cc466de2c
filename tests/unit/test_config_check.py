"""``config check`` finds the mistakes a syntactically valid nova.conf holds."""

import pytest

from tests.unit.test_cli import run  # noqa: F401 - the in-process CLI fixture
from vgpu_driver.cmd import base

M60_TWO_TYPES = (
    "[devices]\nenabled_mdev_types = nvidia-35, nvidia-36\n"
    "[mdev_nvidia-35]\ndevice_addresses = 0000:84:00.0\n"
)


@pytest.mark.parametrize(
    "conf, expected",
    [
        (
            M60_TWO_TYPES + "[mdev_nvidia_36]\ndevice_addresses = 0000:86:00.0\n",
            "error: group = '[mdev_nvidia_36]': configures no enabled type (it is not in [devices] "
            "enabled_mdev_types), so its options are ignored; did you mean 'mdev_nvidia-36'?",
        ),
        (
            "[devices]\nenabled_mdev_types = nvidia-35\n[mdev_nvidia-36]\nmax_instances = 3\n",
            "error: group = '[mdev_nvidia-36]': configures no enabled type (it is not in [devices] "
            "enabled_mdev_types), so its options are ignored; enable nvidia-36 in [devices] "
            "enabled_mdev_types or remove the group",
        ),
        (
            "[devices]\nenabled_mdev_types = nvidia-3G\n",
            "error: [devices] enabled_mdev_types = 'nvidia-3G': no device on this host offers "
            "this type; did you mean 'nvidia-43'?",
        ),
        (
            "",
            "error: [devices] enabled_mdev_types = '': no type is enabled, so no GPU gets a "
            "provider (types offered on this host: nvidia-35, nvidia-36, nvidia-37, nvidia-38, "
            "nvidia-39, nvidia-40, nvidia-41, nvidia-42, nvidia-43, nvidia-44, nvidia-45)",
        ),
        (
            M60_TWO_TYPES.replace("0000:84:00.0", "0000:84:00.1"),
            "error: [mdev_nvidia-35] device_addresses = '0000:84:00.1': no mdev-capable device at "
            "this address on this host; did you mean '0000:84:00.0'?",
        ),
    ],
)
def test_each_mistake_is_one_line_and_exit_1(make_host, run, conf, expected):  # noqa: F811
    host = make_host("m60-multi")
    code, out, _ = run("--sysfs-root", host.paths.root, "config", "check", conf=conf)
    assert (code, out.splitlines()) == (base.EXIT_PROBLEMS, [expected])


def test_a_vendor_vfio_type_without_a_cap_gets_one_computed(make_host, run):  # noqa: F811
    host = make_host("l40s-vfio")
    code, out, _ = run(
        "--sysfs-root",
        host.paths.root,
        "config",
        "check",
        conf="[devices]\nenabled_mdev_types = nvidia-1156\n",
    )
    assert code == base.EXIT_PROBLEMS
    assert out == (
        "error: [mdev_nvidia-1156] max_instances = 'unset': unset for a "
        "vendor-VFIO type: each VF lists the type, so the inventory would count "
        "VFs rather than what fits in memory; set it to 6 (1 GPU(s) whose memory "
        "holds 6)\n"
    )
    code, out, _ = run(
        "--sysfs-root",
        host.paths.root,
        "config",
        "check",
        conf="[devices]\nenabled_mdev_types = nvidia-1156\n[mdev_nvidia-1156]\nmax_instances = 6\n",
    )
    assert code == 0 and out.startswith("ok: ")


def test_strict_turns_warnings_into_problems(make_host, run):  # noqa: F811
    host = make_host("m60-multi")
    conf = (
        "[devices]\nenabled_mdev_types = nvidia-35\n"
        "[mdev_nvidia-35]\ndevice_addresses = 0000:84:00.0, 0000:84:00.0\n"
    )
    code, out, _ = run("--sysfs-root", host.paths.root, "config", "check", conf=conf)
    assert code == 0 and out.splitlines()[0] == (
        "warning: [mdev_nvidia-35] device_addresses = '0000:84:00.0': listed twice"
    )
    code, out, _ = run("--sysfs-root", host.paths.root, "config", "check", "--strict", conf=conf)
    assert code == base.EXIT_PROBLEMS and "ok:" not in out


def test_the_old_name_beside_the_new_one_is_a_warning(make_host, run):  # noqa: F811
    """oslo.config takes enabled_mdev_types and drops enabled_vgpu_types
    without a word when a file sets both."""
    host = make_host("m60-multi")
    code, out, _ = run(
        "--sysfs-root",
        host.paths.root,
        "config",
        "check",
        "--strict",
        conf="[devices]\nenabled_mdev_types = nvidia-35\nenabled_vgpu_types = nvidia-36\n",
    )
    assert (code, out.splitlines()) == (
        base.EXIT_PROBLEMS,
        [
            "warning: [devices] enabled_vgpu_types = 'nvidia-36': ignored: enabled_mdev_types "
            "is set too and wins; remove the old name"
        ],
    )


@pytest.mark.parametrize("profile", ["a100-sriov", "a100-sriov-off"])
def test_one_board_under_two_types_is_an_error(make_host, run, profile):  # noqa: F811
    """A board's PF under one type and one of its VFs under another: it can
    serve only one, so it gets none (with its VFs off as well as on)."""
    host = make_host(profile)
    code, out, _ = run(
        "--sysfs-root",
        host.paths.root,
        "config",
        "check",
        conf="[devices]\nenabled_mdev_types = nvidia-468, nvidia-469\n"
        "[mdev_nvidia-468]\ndevice_addresses = 0000:41:00.0\n"
        "[mdev_nvidia-469]\ndevice_addresses = 0000:41:00.5\n",
    )
    assert code == base.EXIT_PROBLEMS
    assert (
        "error: device_addresses = '0000:41:00.0, 0000:41:00.5': addresses of one board "
        "(GPU 0000:41:00.0) are listed under different types (0000:41:00.0 under "
        "nvidia-468, 0000:41:00.5 under nvidia-469); a board serves one type, so it gets "
        "none: list it under one type"
    ) in out.splitlines()
