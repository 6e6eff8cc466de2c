"""A GPU's vGPU mode through NVML: the driver's calls of NVIDIA's bindings,
answered by the fake host's vendor driver (``vgpu_driver.fake.nvml`` in
the place of ``pynvml``), and NVIDIA's own bindings where no GPU is."""

import subprocess
import sys

import pytest

from vgpu_driver import exception
from vgpu_driver import nvml
from vgpu_driver.fake import nvml as fake_nvml

L40S = "0000:c1:00.0"
A100 = "0000:41:00.0"


@pytest.fixture
def fake_bindings(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml)
    yield fake_nvml
    fake_nvml.use_host(None)


def test_the_mode_is_switched_and_read_back(make_host, fake_bindings):
    host = make_host("l40s-vfio", "a100-sriov")
    fake_bindings.use_host(host.paths.root)
    assert not nvml.heterogeneous_mode(L40S)
    nvml.set_heterogeneous_mode("0000:C1:00.0", True)  # as lspci writes it
    assert nvml.heterogeneous_mode(L40S) and host.heterogeneous_mode(L40S)
    nvml.set_heterogeneous_mode(L40S, False)
    assert not host.heterogeneous_mode(L40S)


@pytest.mark.parametrize(
    "gpu, action, reason",
    [
        (L40S, True, "vGPUs exist on it, and the mode changes only on a GPU without any"),
        (
            A100,
            True,
            "the GPU cannot mix vGPU sizes (MIG is on, or its driver does not report "
            "'Heterogeneous Time-Slice Sizes')",
        ),
        ("0000:c2:00.0", False, "NVML knows no GPU at this address"),
    ],
)
def test_nvmls_refusals_name_the_gpu_and_why(make_host, fake_bindings, gpu, action, reason):
    host = make_host("l40s-vfio", "a100-sriov")
    fake_bindings.use_host(host.paths.root)
    host.set_vendor_vgpu_type("0000:c1:00.4", 1156)
    with pytest.raises(exception.MixedSizeModeRefused) as raised:
        nvml.set_heterogeneous_mode(gpu, action)
    verb = "enable" if action else "disable"
    assert str(raised.value) == f"Cannot {verb} mixed-size mode on GPU {gpu}: {reason}."
    assert not host.heterogeneous_mode(L40S)


def test_a_host_without_nvidias_driver_is_one_typed_error(fake_bindings):
    fake_bindings.use_host(None)
    with pytest.raises(exception.NvmlUnavailable) as raised:
        nvml.heterogeneous_mode(L40S)
    assert str(raised.value) == (
        "NVIDIA's management library (NVML) cannot be used: Driver Not Loaded."
    )


def test_without_nvidia_ml_py_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(exception.NvmlUnavailable) as raised:
        nvml.set_heterogeneous_mode(L40S, True)
    assert "pip install 'vgpu-driver[nvml]'" in str(raised.value)


def test_nvidias_own_bindings_without_nvidias_library():
    """The real pynvml: no GPU and no libnvidia-ml here, so NVML's own
    'library not found' is what the operator reads."""
    with pytest.raises(exception.NvmlUnavailable) as raised:
        nvml.heterogeneous_mode(L40S)
    assert str(raised.value) == (
        "NVIDIA's management library (NVML) cannot be used: NVML Shared Library Not Found."
    )


def test_a_bad_address_is_refused_before_nvml_is_asked(fake_bindings):
    with pytest.raises(exception.InvalidSysfsName):
        nvml.set_heterogeneous_mode("../0000:c1:00.0", True)


def test_the_vgpus_nvml_places_are_read_by_placement(make_host, fake_bindings, monkeypatch):
    host = make_host("l40s-vfio")
    fake_bindings.use_host(host.paths.root)
    nvml.set_heterogeneous_mode(L40S, True)
    host.set_vendor_vgpu_type("0000:c1:00.4", 1157)  # 12 GB at 0
    host.set_vendor_vgpu_type("0000:c1:00.5", 1155)  # 4 GB at 12
    # NVML lists the active vGPUs: those whose guest runs.
    assert nvml.located_vgpus(L40S) == ()
    host.hold("0000:c1:00.4")
    host.hold("0000:c1:00.5")
    assert nvml.located_vgpus(L40S) == ((1157, 0), (1155, 12))
    # An instance gone between NVML's listing and the question (a stale
    # handle, a VF whose type was cleared) is left out.
    listed = fake_nvml.Bindings.nvmlDeviceGetActiveVgpus
    monkeypatch.setattr(
        fake_nvml,
        "nvmlDeviceGetActiveVgpus",
        lambda handle: [*listed(fake_nvml._MODULE_HOST, handle), "gone", "0000:c1:00.9"],
    )
    assert nvml.located_vgpus(L40S) == ((1157, 0), (1155, 12))
    host.release("0000:c1:00.4")
    host.set_vendor_vgpu_type("0000:c1:00.4", 0)
    assert nvml.located_vgpus(L40S) == ((1155, 12),)


def test_a_vgpu_without_a_placement_is_not_located(make_host, fake_bindings):
    """Equal-size mode before homogeneous placements: NVML answers
    NVA081_PLACEMENT_ID_INVALID, which places nothing."""
    host = make_host("l40s-vfio")
    fake_bindings.use_host(host.paths.root)
    host.set_vendor_vgpu_type("0000:c1:00.4", 1155)
    host.hold("0000:c1:00.4")
    assert fake_nvml.nvmlVgpuInstanceGetPlacementId("0000:c1:00.4") == 0xFFFF
    assert nvml.located_vgpus(L40S) == ()


FAKE_BINDINGS_ONLY_FOR_A_TEST_HOST = """
import sys
from oslo_config import cfg
from vgpu_driver import conf as vgpu_conf, hosts, nvml
conf = cfg.ConfigOpts()
vgpu_conf.register_opts(conf)
conf([], project="nova", default_config_files=[])
conf.set_override("test_only_fake_nvml_host", sys.argv[1], "vgpu")
assert nvml.bindings_for(conf) is None, "one test-only option is not enough"
assert not [m for m in sys.modules if m.startswith("vgpu_driver.fake")]
conf.set_override("test_only_fake_sysfs_root", True, "vgpu")
print(type(nvml.bindings_for(conf)).__module__)
"""


def test_the_fake_vendor_driver_loads_only_for_a_test_host(tmp_path):
    """Production (the host assembly included) imports no fake; the fake's
    NVML comes through its entry point only when both test-only options
    name a fake host."""
    out = subprocess.run(
        [sys.executable, "-c", FAKE_BINDINGS_ONLY_FOR_A_TEST_HOST, str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "vgpu_driver.fake.nvml"
