"""The fake kernel's host with NVIDIA's data-center driver, and its IOMMU
groups: laid out as the real host's facts say, nothing more."""

import os

import pytest

from vgpu_driver import discovery
from vgpu_driver import exception
from vgpu_driver import nvml
from vgpu_driver.fake import nvml as fake_nvml
from vgpu_driver.sysfs import host_reads

H100 = "0000:00:06.0"


def test_the_h100_host_has_only_what_the_real_one_has(make_host):
    host = make_host("h100-datacenter")
    dev = host.paths.pci_device(H100)
    assert os.readlink(host.paths.pci_driver(H100)).endswith("bus/pci/drivers/nvidia")
    for absent in (
        "sriov_totalvfs",
        "sriov_numvfs",
        "nvidia",
        "mdev_supported_types",
        "iommu_group",
    ):
        assert not os.path.lexists(os.path.join(dev, absent)), absent
    assert not os.path.exists(host.paths.parent_base())
    assert not os.path.exists(os.path.dirname(host.paths.mdev_base()))
    assert os.listdir(host.paths.iommu_groups()) == []
    assert host.vgpu_manager_version() == "580.159.04"
    assert discovery.discover(host).gpus == ()
    [gpu] = host_reads.nvidia_gpus(host.paths)
    assert (gpu.address, gpu.device_id, gpu.driver, gpu.iommu_group) == (
        H100,
        "10de:2330",
        "nvidia",
        None,
    )


def test_nvml_says_pass_through_and_refuses_every_vgpu_call(make_host):
    host = make_host("h100-datacenter")
    bindings = fake_nvml.Bindings(host.paths.root)
    handle = bindings.nvmlDeviceGetHandleByPciBusId(H100)
    assert bindings.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    assert (
        bindings.nvmlDeviceGetVirtualizationMode(handle)
        == fake_nvml.NVML_GPU_VIRTUALIZATION_MODE_PASSTHROUGH
    )
    for call, args in (
        (bindings.nvmlDeviceGetHostVgpuMode, ()),
        (bindings.nvmlDeviceGetVgpuHeterogeneousMode, ()),
        (bindings.nvmlDeviceGetActiveVgpus, ()),
        (bindings.nvmlDeviceGetVgpuTypeSupportedPlacements, (1155,)),
    ):
        with pytest.raises(fake_nvml.NVMLError) as caught:
            call(handle, *args)
        assert caught.value.value == fake_nvml.NVML_ERROR_NOT_SUPPORTED, call.__name__
    assert nvml.gpu_facts([H100], bindings) == {
        H100: nvml.GpuFacts("NVIDIA H100 80GB HBM3", nvml.VIRTUALIZATION_PASSTHROUGH, None, None)
    }


def test_a_vgpu_manager_host_answers_host_vgpu(make_host):
    host = make_host("a100-sriov", "t4x8")
    facts = nvml.gpu_facts(["0000:41:00.0", "0000:18:00.0"], fake_nvml.Bindings(host.paths.root))
    assert facts["0000:41:00.0"] == nvml.GpuFacts(
        "NVIDIA A100-PCIE-40GB", nvml.VIRTUALIZATION_HOST_VGPU, 1, None
    )
    assert facts["0000:18:00.0"].host_vgpu_mode == 0


def test_each_function_has_its_iommu_group_and_vfs_take_theirs_away(make_host):
    host = make_host("a100-sriov")
    [gpu] = host_reads.nvidia_gpus(host.paths)
    vfs = host_reads.nvidia_vfs(host.paths, gpu)
    assert len(vfs) == 16 and all(vf.iommu_group for vf in vfs)
    assert len(set(host_reads.iommu_groups(host.paths))) == 17
    members = os.listdir(os.path.join(host.paths.iommu_groups(), gpu.iommu_group, "devices"))
    assert members == ["0000:41:00.0"]
    host.reboot()  # the VFs go, and their groups with them
    assert host_reads.nvidia_vfs(host.paths, gpu) == []
    assert host_reads.iommu_groups(host.paths) == (gpu.iommu_group,)


def test_a_vgpu_types_read_says_no_vgpu_manager(make_host):
    """As read on an H200 under the data-center driver 580.159.04: the
    maximum NOT_SUPPORTED, the size INVALID_ARGUMENT, for every type."""
    host = make_host("h100-datacenter")
    bindings = fake_nvml.Bindings(host.paths.root)
    handle = bindings.nvmlDeviceGetHandleByPciBusId(H100)
    for call, args, code in (
        (bindings.nvmlVgpuTypeGetMaxInstances, (handle, 1155), fake_nvml.NVML_ERROR_NOT_SUPPORTED),
        (bindings.nvmlVgpuTypeGetFramebufferSize, (1155,), fake_nvml.NVML_ERROR_INVALID_ARGUMENT),
    ):
        with pytest.raises(fake_nvml.NVMLError) as caught:
            call(*args)
        assert caught.value.value == code, call.__name__
    with pytest.raises(exception.VgpuTypesUnreadable) as refused:
        nvml.equal_size_types(H100, [1155], bindings)
    assert str(refused.value) == (
        f"Cannot read the vGPU sizes and maxima of GPU {H100}: NVML reports no vGPU on it "
        "(NVIDIA's vGPU manager is not loaded: its data-center driver answers so)."
    )
