"""Shared fixtures: fake hosts built by the fake kernel, and nova.conf files."""

import textwrap

import pytest
from oslo_config import cfg

from vgpu_driver import conf as vgpu_conf
from vgpu_driver import privsep
from vgpu_driver.cmd import manage
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles
from vgpu_driver.privsep import beneath


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
