"""Shared fixtures: fake hosts built by the fake kernel, and nova.conf files."""

import os
import sys
import textwrap
import threading

import pytest
from oslo_config import cfg

from tests import collector
from vgpu_driver import conf as vgpu_conf
from vgpu_driver import driver
from vgpu_driver import privsep
from vgpu_driver.cmd import manage
from vgpu_driver.fake import domains as domains_mod
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles
from vgpu_driver.privsep import beneath


def pytest_collection_finish(session):
    """Every test module is imported: what lives now lives to the end."""
    collector.tune()
    collector.freeze_what_lives()


@pytest.fixture(autouse=True)
def no_host_reconciler_left_running():
    """Each driver a test makes is closed by the test: a host reconciler
    left running goes on writing into the test's removed directory, and
    its warnings land in the output of the tests after it."""
    before = set(threading.enumerate())
    yield
    left = sorted(
        t.name
        for t in threading.enumerate()
        if t not in before and t.name.startswith("vgpu-reconciler") and t.is_alive()
    )
    assert not left, f"the test left {left} running: close its driver"


@pytest.fixture(autouse=True)
def privileged_writes_back_to_the_daemon():
    """vgpu-manage, run as root, writes in-process under its sysfs root from
    then on; the next test starts from the default again."""
    yield
    privsep.use_daemon()


@pytest.fixture(params=["openat2", "components"])
def walk(request, monkeypatch):
    """The privileged side's two walks: the kernel's openat2 and the walk by
    components kept for kernels without it."""
    if request.param == "openat2" and not beneath.HAVE_OPENAT2:
        pytest.skip("this kernel has no openat2")
    monkeypatch.setattr(beneath, "HAVE_OPENAT2", request.param == "openat2")
    return request.param


@pytest.fixture
def fake_kernel_cli(monkeypatch):
    """vgpu-manage run in-process answers its writes with the fake kernel."""
    monkeypatch.setattr(manage.ManageApp, "host_factory", fakekernel.FakeKernel)


FAKE_SRIOV_MANAGE = os.path.join(os.path.dirname(sys.executable), "vgpu-fake-sriov-manage")


@pytest.fixture
def sriov_manage(monkeypatch):
    """NVIDIA's sriov-manage for a fake host: ``sriov_manage(root)`` points
    the stand-in at ``root`` (for this process and the ones it starts) and
    gives the nova.conf lines that make vgpu-manage run it."""

    def point_at(root):
        monkeypatch.setenv("VGPU_FAKE_SYSFS_ROOT", str(root))
        return f"\n[vgpu]\nsriov_manage_path = {FAKE_SRIOV_MANAGE}\n"

    return point_at


@pytest.fixture
def make_host(tmp_path):
    """Build a fake host from one or more profile names (or profile dicts)."""
    counter = iter(range(1000))

    def make(*specs, mdevs=()):
        loaded = [profiles.load(s) if isinstance(s, str) else s for s in specs]
        profile = loaded[0] if len(loaded) == 1 else profiles.combine("combined", *loaded)
        if mdevs:
            profile = {**profile, "mdevs": [*profile.get("mdevs", ()), *mdevs]}
        return fakekernel.FakeKernel.build(str(tmp_path / f"sys{next(counter)}"), profile)

    return make


@pytest.fixture
def make_conf(tmp_path):
    """A registered ConfigOpts loaded from an INI text."""

    def make(text=""):
        path = tmp_path / "nova.conf"
        path.write_text(textwrap.dedent(text))
        conf = cfg.ConfigOpts()
        vgpu_conf.register_opts(conf)
        conf([], project="nova", default_config_files=[str(path)])
        return conf

    return make


@pytest.fixture
def make_driver(make_conf, tmp_path):
    """A core VGPUDriver on a fake host (its writes answered by the fake
    kernel), state in ``tmp_path/state``; ``extra``: more ``[vgpu]`` lines.
    Each one made is closed (its host reconciler stopped) when the test ends."""
    made = []

    def make(host, extra="", domains=None, types="nvidia-468"):
        conf = make_conf(
            "\n".join(
                (
                    "[devices]",
                    f"enabled_mdev_types = {types}",
                    "[vgpu]",
                    f"sysfs_root = {host.paths.root}",
                    f"state_dir = {tmp_path / 'state'}",
                    *(extra.splitlines() if isinstance(extra, str) else extra),
                )
            )
        )
        vgpu = driver.VGPUDriver(
            conf,
            domains or domains_mod.InProcessDomains(),
            host=fakekernel.FakeKernel(host.paths.root),
        )
        made.append(vgpu)
        return vgpu

    yield make
    for vgpu in made:
        vgpu.close()
