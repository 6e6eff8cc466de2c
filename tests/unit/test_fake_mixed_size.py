"""The fake vendor driver's two modes of a vendor-VFIO board: equal-size
(the default) and mixed-size, with NVIDIA's placements; each rule is read
back the way the driver reads it (``creatable_vgpu_types`` through
LinuxSysfs) or asked the way NVML is asked."""

import copy
import errno

import pytest

from vgpu_driver import exception
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import nvml
from vgpu_driver.fake import profiles

L40S = "0000:c1:00.0"
Q4, Q8, Q12, Q16, Q24, Q48 = 1155, 1156, 1157, 1158, 1159, 1160
A4 = 1161


def l40s(**gpu):
    """The shipped L40S profile, with an L40S-4A beside its Q types."""
    profile = copy.deepcopy(profiles.load("l40s-vfio"))
    board = profile["gpus"][0]
    board["types"].append(
        {"id": f"nvidia-{A4}", "name": "NVIDIA L40S-4A", "framebuffer_mb": 4096, "max": 12}
    )
    board.update(gpu)
    return profile


def creatable(host, vf):
    return {
        number
        for vfio in host.list_vendor_vfio()
        if str(vfio.address) == vf
        for number, _name in vfio.creatable
    }


def vfs(host):
    return [str(vf.address) for vf in host.list_vendor_vfio()]


def refused(host, vf, number):
    with pytest.raises(exception.MdevWriteError) as caught:
        host.set_vendor_vgpu_type(vf, number)
    return caught.value.errno


class TestEqualSize:
    def test_the_first_vgpu_leaves_only_its_size_of_any_series(self, make_host):
        host = make_host(l40s())
        first, second, third = vfs(host)[:3]
        assert creatable(host, second) == {Q4, Q8, Q12, Q16, Q24, Q48, A4}
        host.set_vendor_vgpu_type(first, Q4)
        assert creatable(host, second) == {Q4, A4}
        host.set_vendor_vgpu_type(second, A4)  # same size, another series
        assert refused(host, third, Q8) == errno.EINVAL
        assert creatable(host, first) == set()  # one vGPU per VF
        assert host.placement_of(first) is None  # placements are mixed-size mode's
        host.set_vendor_vgpu_type(first, 0)
        host.set_vendor_vgpu_type(second, 0)
        assert creatable(host, third) == {Q4, Q8, Q12, Q16, Q24, Q48, A4}


class TestMixedSize:
    def test_sizes_mix_at_nvidias_placements_and_a_removal_frees_its_slots(self, make_host):
        host = make_host(l40s())
        host.set_heterogeneous_mode(L40S, True)
        assert host.heterogeneous_mode(L40S)
        one, two, three, four, free = vfs(host)[:5]
        host.set_vendor_vgpu_type(one, Q4)  # 4 GB at 0: slots 0-3
        host.set_vendor_vgpu_type(two, Q12)  # 12 GB: 0 overlaps, so 12: slots 12-23
        host.set_vendor_vgpu_type(three, Q8)  # 8 GB: 0 and 16 overlap, so 24: 24-31
        assert [host.placement_of(vf) for vf in (one, two, three)] == [0, 12, 24]
        # 24 GB would need 0 or 24; 48 GB all of it.  16 GB still fits at 32.
        assert creatable(host, free) == {Q4, Q8, Q12, Q16, A4}
        assert host.placements(L40S, Q16) == (16, (0, 32), (32,))
        host.set_vendor_vgpu_type(four, Q16)
        assert host.placement_of(four) == 32
        # 4+12+8+16 GB: 8 GB are left, but only in slots no table offers
        # to a vGPU that big: fragmentation.
        assert creatable(host, free) == {Q4, A4}
        assert host.placements(L40S, Q4)[2] == (8,)
        assert refused(host, free, Q8) == errno.EINVAL
        host.set_vendor_vgpu_type(two, 0)
        assert host.placement_of(two) is None
        assert creatable(host, free) == {Q4, Q8, Q12, A4}
        assert host.placements(L40S, Q12)[2] == (12,)

    def test_the_mode_is_refused_while_a_vgpu_exists_or_where_sizes_cannot_mix(self, make_host):
        host = make_host(l40s(), "a100-sriov")
        host.set_vendor_vgpu_type(vfs(host)[0], Q4)
        with pytest.raises(nvml.NVMLError) as caught:
            host.set_heterogeneous_mode(L40S, True)
        assert caught.value.value == nvml.NVML_ERROR_IN_USE
        assert not host.heterogeneous_mode(L40S)
        for board in ("0000:41:00.0",):  # an mdev SR-IOV board
            with pytest.raises(nvml.NVMLError) as caught:
                host.set_heterogeneous_mode(board, True)
            assert caught.value.value == nvml.NVML_ERROR_NOT_SUPPORTED
        with pytest.raises(nvml.NVMLError) as caught:
            host.set_heterogeneous_mode("0000:c2:00.0", True)
        assert caught.value.value == nvml.NVML_ERROR_NOT_FOUND

    @pytest.mark.parametrize(
        "gpu", [{"heterogeneous_sizes": False}, {"architecture": None}]
    )  # a family no rule knows
    def test_a_board_without_the_capability_or_its_rules_stays_equal_size(self, make_host, gpu):
        host = make_host(l40s(**gpu))
        with pytest.raises(nvml.NVMLError) as caught:
            host.set_heterogeneous_mode(L40S, True)
        assert caught.value.value == nvml.NVML_ERROR_NOT_SUPPORTED

    def test_disabling_or_enabling_the_vfs_and_a_reboot_clear_the_mode(self, make_host):
        host = make_host(l40s())
        host.set_heterogeneous_mode(L40S, True)
        host.set_vfs(L40S, 0)
        assert not host.heterogeneous_mode(L40S)
        # Set while the VFs are off, it reads back enabled, then the
        # enablement clears it: it must be set after the VFs come.
        host.set_heterogeneous_mode(L40S, True)
        assert host.heterogeneous_mode(L40S)
        host.set_vfs(L40S, 16)
        assert not host.heterogeneous_mode(L40S)
        host.set_heterogeneous_mode(L40S, True)
        host.set_vendor_vgpu_type(vfs(host)[0], Q24)
        host.reboot()
        host.set_vfs(L40S, 16)
        assert not host.heterogeneous_mode(L40S)
        assert host.placement_of(vfs(host)[0]) is None

    def test_another_process_sees_the_mode_and_the_placements(self, make_host):
        host = make_host(l40s())
        host.set_heterogeneous_mode(L40S, True)
        other = fakekernel.FakeKernel(host.paths.root)
        other.set_vendor_vgpu_type(vfs(other)[0], Q24)
        assert host.heterogeneous_mode(L40S) and host.placement_of(vfs(host)[0]) == 0
        assert creatable(host, vfs(host)[1]) == {Q4, Q8, Q12, Q16, Q24, A4}
