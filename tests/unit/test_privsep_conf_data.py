"""The helper reads nova's files as data: only the policy's options, read
strictly, never echoing a line it refuses."""

import os
import textwrap

import pytest

from vgpu_driver import exception
from vgpu_driver.privsep import conf_data
from vgpu_driver.privsep import helper_conf

# The helper accepts only files root alone can change: these tests' are
# root's when they run as root, as CI runs them.
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the helper reads only root's files")

NOVA = """\
    [DEFAULT]
    log_config_append = /tmp/evil.conf
    log_dir = /var/log/nova
    [pci]
    device_spec = {"vendor_id": "10de"}
    device_spec = {"vendor_id": "8086"}
    [devices]
    enabled_mdev_types = nvidia-222,
        nvidia-468
    [mdev_nvidia-468]
    device_addresses = "0000:41:00.0"
    unknown_key = anything
    [vgpu]
    sysfs_root = /sys
    state_dir = /srv/nova-state
    test_only_fake_sysfs_root = true
    """


@pytest.fixture
def files(tmp_path):
    def write(nova, own="[nova]\nconfig_files = {nova}\n"):
        nova_path = tmp_path / "nova.conf"
        nova_path.write_text(textwrap.dedent(nova))
        own_path = tmp_path / "privsep.conf"
        own_path.write_text(own.format(nova=nova_path))
        return str(own_path), str(nova_path)

    return write


def test_only_the_policys_options_reach_the_configuration(files):
    own, _ = files(NOVA)
    conf = helper_conf.load(own)
    assert conf.devices.enabled_mdev_types == ["nvidia-222", "nvidia-468"]
    assert conf.vgpu.sysfs_root == "/sys"
    # nova.conf cannot accept a fake root: only the helper's own file can.
    assert conf.vgpu.test_only_fake_sysfs_root is False
    assert conf.config_file == [f"/proc/self/fd/{conf.config_file[0].rsplit('/', 1)[1]}"]
    # Options the policy does not need are not even known, or keep their default.
    assert not hasattr(conf, "log_config_append") and not hasattr(conf, "log_dir")
    assert conf.vgpu.state_dir != "/srv/nova-state"


def test_the_helpers_own_file_sets_the_test_options(files):
    own, _ = files(
        "[vgpu]\nsysfs_root = /srv/fake\n",
        own="[nova]\nconfig_files = {nova}\n[vgpu]\ntest_only_fake_sysfs_root = true\n",
    )
    conf = helper_conf.load(own)
    assert (conf.vgpu.sysfs_root, conf.vgpu.test_only_fake_sysfs_root) == ("/srv/fake", True)


def test_a_later_file_wins_and_directories_are_read_in_order(tmp_path):
    first = tmp_path / "nova.conf"
    first.write_text("[devices]\nenabled_mdev_types = nvidia-1\n[vgpu]\nsysfs_root = /a\n")
    conf_d = tmp_path / "nova.conf.d"
    conf_d.mkdir()
    (conf_d / "20-b.conf").write_text("[devices]\nenabled_mdev_types = nvidia-3\n")
    (conf_d / "10-a.conf").write_text("[devices]\nenabled_mdev_types = nvidia-2\n")
    (conf_d / "ignored.txt").write_text("not read\n")
    own = tmp_path / "privsep.conf"
    own.write_text(f"[nova]\nconfig_files = {first}\nconfig_dirs = {conf_d}\n")
    conf = helper_conf.load(str(own))
    assert (conf.devices.enabled_mdev_types, conf.vgpu.sysfs_root) == (["nvidia-3"], "/a")


SECRET = "root:$y$j9T$secret-hash:19000:0:99999:7:::"


@pytest.mark.parametrize(
    "text, line, reason",
    [
        (f"{SECRET}\n", 1, "an option outside any section"),
        (f"[vgpu]\n{SECRET.replace(':', ' ')}\n", 2, "neither a section, a comment nor"),
        (f"[{SECRET}\n", 1, "not a section header"),
        (f"[vgpu]\n\n  {SECRET}\n", 3, "a continuation line without a key above it"),
        (
            "[devices]\nenabled_mdev_types = a\nenabled_mdev_types = b\n",
            3,
            "[devices] enabled_mdev_types given twice",
        ),
        ("[vgpu]\nsysfs_root = $state_path/sys\n", 0, "[vgpu] sysfs_root holds a '$'"),
    ],
)
def test_what_it_cannot_read_is_refused_by_line_never_echoed(files, text, line, reason):
    own, nova = files(text)
    with pytest.raises(exception.ConfigDataRefused) as caught:
        helper_conf.load(own)
    message = str(caught.value)
    assert message.startswith(f"The privileged helper cannot use {nova} (line {line}): {reason}"), (
        message
    )
    assert "secret" not in message and "root:" not in message


def test_a_file_that_is_not_a_regular_file_is_refused_without_blocking(files, tmp_path):
    fifo = tmp_path / "fifo.conf"
    os.mkfifo(fifo)
    own = tmp_path / "privsep.conf"
    own.write_text(f"[nova]\nconfig_files = {fifo}\n")
    with pytest.raises(exception.ConfigDataRefused, match="not a regular file"):
        helper_conf.load(str(own))


@pytest.mark.parametrize(
    "own, reason",
    [
        ("[DEFAULT]\nlog_config_append = /tmp/x\n", "[DEFAULT] log_config_append is not an option"),
        ("[nova]\nconfig_dirs = /etc/nova/nova.conf.d\n", "[nova] config_files names no file"),
    ],
)
def test_the_helpers_own_file_holds_only_its_options(files, own, reason):
    own_path, _ = files("[vgpu]\n", own=own)
    with pytest.raises(exception.ConfigDataRefused, match=reason.replace("[", r"\[")):
        helper_conf.load(own_path)


def test_oslo_config_reads_back_what_was_kept(tmp_path):
    kept = {"devices": {"enabled_mdev_types": "a,\nb"}, "vgpu": {"sysfs_root": "/sys"}}
    path = tmp_path / "x.conf"
    path.write_text(conf_data.as_ini(kept))
    assert conf_data.read(str(path)) == kept


def test_the_helpers_own_file_must_be_roots_alone(files):
    own, _ = files("[vgpu]\n")
    os.chmod(own, 0o666)
    with pytest.raises(
        exception.ConfigDataRefused,
        match=r"\(line 0\): .*privsep.conf \(owner root, mode 0666\) can be "
        "changed by another user than root",
    ):
        helper_conf.load(own)
