"""``host check``'s findings on the GPUs and what drives them: each NVIDIA
GPU and its driver, whether NVML says NVIDIA's vGPU manager drives it, the
IOMMU, the kernel's mdev or vendor-specific VFIO support and NVIDIA's
``sriov-manage``.

Apart from :mod:`vgpu_driver.host_check_config`: these say what the host
can offer whatever nova.conf asks, the first things an operator fixes.
Pure, over :class:`vgpu_driver.host_check.HostFacts`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vgpu_driver import nvml
from vgpu_driver import service_check

if TYPE_CHECKING:
    from vgpu_driver.host_check import HostFacts
    from vgpu_driver.sysfs.host_reads import PciFunction

OK, WARNING, ERROR = service_check.OK, service_check.WARNING, service_check.ERROR
INSTALL_VGPU_MANAGER = "install NVIDIA's vGPU manager (host driver)"
IOMMU_FIX = (
    "turn the IOMMU on: VT-d (Intel) or AMD-Vi in the firmware, and intel_iommu=on "
    "on an Intel host's kernel command line; then reboot"
)


Finding = service_check.Finding


def _gpu_model(gpu: PciFunction, facts: HostFacts) -> str:
    nvml_facts = (facts.nvml or {}).get(gpu.address)
    name = nvml_facts.name if nvml_facts else None
    return f"{name} ({gpu.device_id})" if name else f"device {gpu.device_id or 'unknown'}"


def check_gpus(facts: HostFacts) -> list[Finding]:
    """Each NVIDIA GPU: its address, model and driver."""
    if not facts.gpus:
        if facts.snapshot.gpus:
            return [
                Finding(
                    "gpu",
                    WARNING,
                    "no NVIDIA GPU on this host; "
                    f"{len(facts.snapshot.gpus)} other mdev parent(s) offer types",
                )
            ]
        return [
            Finding(
                "gpu",
                ERROR,
                "no NVIDIA GPU on this host (no display controller of "
                "vendor 10de under bus/pci/devices)",
                "check that the kernel sees the GPU: lspci -d 10de:",
            )
        ]
    found = []
    for gpu in facts.gpus:
        sriov = f", SR-IOV ({gpu.sriov_totalvfs} VFs at most)" if gpu.sriov_totalvfs else ""
        described = f"{gpu.address}: {_gpu_model(gpu, facts)}, driver {gpu.driver or 'none'}{sriov}"
        if gpu.driver == "nvidia":
            found.append(Finding("gpu", OK, described))
        elif gpu.driver is None:
            found.append(
                Finding(
                    "gpu",
                    ERROR,
                    f"{described}: no driver is bound to it",
                    f"{INSTALL_VGPU_MANAGER} and load it (modprobe nvidia)",
                )
            )
        else:
            found.append(
                Finding(
                    "gpu",
                    ERROR,
                    f"{described}: bound to {gpu.driver}, not to NVIDIA's driver",
                    f"unbind it from {gpu.driver} (driverctl unset-override {gpu.address}, or "
                    "drop it from vfio-pci.ids) so that NVIDIA's vGPU manager drives it",
                )
            )
    return found


def _offers_vgpus(facts: HostFacts) -> bool:
    return any(p.types for g in facts.snapshot.gpus for p in g.parents)


def _without_nvml(facts: HostFacts) -> list[Finding]:
    """What can be told from sysfs alone when NVML cannot be asked."""
    version = facts.nvidia_module
    if version is None:
        return [
            Finding(
                "vgpu-manager",
                ERROR,
                "NVIDIA's kernel module is not loaded (no module/nvidia/version)",
                f"{INSTALL_VGPU_MANAGER} and load it",
            )
        ]
    if _offers_vgpus(facts):
        return [
            Finding(
                "vgpu-manager",
                OK,
                f"NVIDIA's vGPU manager {version} is loaded (its GPUs offer vGPU types)",
            )
        ]
    return [
        Finding(
            "vgpu-manager",
            ERROR,
            f"NVIDIA's driver {version} is loaded but no GPU "
            "offers a vGPU type, and NVML cannot tell whether it is the vGPU manager",
            "install nvidia-ml-py (pip install 'vgpu-driver[nvml]') to tell; if "
            f"NVIDIA's data-center driver is loaded, {INSTALL_VGPU_MANAGER}",
        )
    ]


def _manager_finding(gpu: PciFunction, gpu_facts: nvml.GpuFacts, version: str) -> Finding:
    mode = gpu_facts.virtualization
    mode_name = nvml.VIRTUALIZATION_NAMES.get(
        mode, "not supported" if mode is None else f"unknown ({mode})"
    )
    if mode == nvml.VIRTUALIZATION_HOST_VGPU:
        host_mode = nvml.HOST_VGPU_MODE_NAMES.get(gpu_facts.host_vgpu_mode, "unknown")
        return Finding(
            "vgpu-manager",
            OK,
            f"{gpu.address}: NVIDIA's vGPU manager {version} "
            f"drives it (host vGPU mode {host_mode})",
        )
    if (
        mode in (nvml.VIRTUALIZATION_NONE, nvml.VIRTUALIZATION_PASSTHROUGH)
        and gpu_facts.host_vgpu_mode is None
    ):
        return Finding(
            "vgpu-manager",
            ERROR,
            "NVIDIA's data-center driver is loaded, not the "
            f"vGPU manager ({gpu.address}: NVML says virtualization mode "
            f"{mode_name}, host vGPU mode not supported)",
            INSTALL_VGPU_MANAGER,
        )
    if mode == nvml.VIRTUALIZATION_VGPU:
        return Finding(
            "vgpu-manager",
            ERROR,
            f"{gpu.address} is a vGPU: this machine is a guest of a vGPU host, not one",
            "run vgpu-driver on the hypervisor host that has the physical GPU",
        )
    return Finding(
        "vgpu-manager",
        ERROR,
        f"{gpu.address}: NVML says virtualization mode {mode_name}, not host vGPU",
        INSTALL_VGPU_MANAGER,
    )


def check_vgpu_manager(facts: HostFacts) -> list[Finding]:
    """Whether NVIDIA's vGPU manager drives the GPUs, as NVML tells it."""
    if not facts.gpus:
        return []
    if facts.nvml is None:
        return [
            Finding(
                "nvml",
                WARNING,
                f"NVML cannot be asked: {facts.nvml_error}",
                "pip install 'vgpu-driver[nvml]' (nvidia-ml-py); NVIDIA's "
                "libnvidia-ml.so.1 comes with its driver",
            ),
            *_without_nvml(facts),
        ]
    found = []
    for gpu in facts.gpus:
        gpu_facts = facts.nvml.get(gpu.address)
        if gpu_facts is None or gpu.driver != "nvidia":
            continue  # no NVIDIA driver: check_gpus says what to do
        if gpu_facts.error:
            found.append(
                Finding(
                    "vgpu-manager",
                    WARNING,
                    f"{gpu.address}: NVML cannot answer for it ({gpu_facts.error})",
                    "nvidia-smi -q shows what NVIDIA's driver says of it",
                )
            )
            continue
        found.append(_manager_finding(gpu, gpu_facts, facts.nvidia_module or "(unknown)"))
    return found


def check_iommu(facts: HostFacts) -> list[Finding]:
    """The IOMMU is on, and every GPU is in one of its groups (nothing to
    say without a GPU: an emulated parent such as mtty needs none)."""
    if not facts.gpus:
        return []
    if not facts.iommu_groups:
        return [
            Finding("iommu", ERROR, "the IOMMU is off (kernel/iommu_groups is empty)", IOMMU_FIX)
        ]
    outside = [g.address for g in facts.gpus if g.iommu_group is None]
    if outside:
        return [
            Finding("iommu", ERROR, f"GPU(s) {', '.join(outside)} in no IOMMU group", IOMMU_FIX)
        ]
    return [
        Finding(
            "iommu",
            OK,
            f"the IOMMU is on: {len(facts.iommu_groups)} group(s), every NVIDIA GPU in one",
        )
    ]


def _vfs_off(facts: HostFacts) -> list[str]:
    return [g.address for g in facts.gpus if g.sriov_totalvfs and not facts.vfs.get(g.address)]


def check_vfio(facts: HostFacts) -> list[Finding]:
    """The kernel can make vGPUs: an mdev bus with parents, or NVIDIA's
    vendor-specific VFIO (kernel 6.8 and vGPU 17 or later)."""
    if facts.mdev_parents:
        return [Finding("vfio", OK, "the kernel's mdev bus has parents (class/mdev_bus)")]
    if any(vf.vendor_vfio for vfs in facts.vfs.values() for vf in vfs):
        return [
            Finding(
                "vfio", OK, "NVIDIA's vendor-specific VFIO files are there (nvidia/ of the VFs)"
            )
        ]
    off = _vfs_off(facts)
    if off:
        return [
            Finding(
                "vfio",
                WARNING,
                f"no mdev parent, and the VFs of {', '.join(off)} "
                "are off, so their VFIO support cannot be seen yet",
                "vgpu-manage sriov enable --configured, then check again",
            )
        ]
    where = (
        "the mdev bus is loaded (bus/mdev) but no driver registered a parent (no class/mdev_bus)"
        if facts.mdev_core
        else "the kernel has no mdev bus (no class/mdev_bus, no bus/mdev)"
    )
    return [
        Finding(
            "vfio",
            ERROR,
            f"{where}, and no VF has NVIDIA's vendor-specific VFIO files (nvidia/)",
            f"{INSTALL_VGPU_MANAGER}: it registers its GPUs on the "
            "mdev bus (modprobe mdev first where the kernel builds it as a module) or, "
            "from kernel 6.8 and vGPU 17, on vendor-specific VFIO",
        )
    ]


def check_sriov_manage(facts: HostFacts) -> list[Finding]:
    """NVIDIA's sriov-manage, which enables an SR-IOV board's VFs."""
    boards = [g.address for g in facts.gpus if g.sriov_totalvfs]
    if not boards:
        return [Finding("sriov-manage", OK, "no SR-IOV board: sriov-manage is not needed")]
    path, state = facts.sriov_manage
    listed = ", ".join(boards)
    if state == "ok":
        return [Finding("sriov-manage", OK, f"{path} is there for SR-IOV board(s) {listed}")]
    fix = (
        f"chmod 0755 {path}"
        if state == "not executable"
        else "install NVIDIA's vGPU manager (it ships sriov-manage), or set "
        "[vgpu] sriov_manage_path to where it is"
    )
    return [
        Finding(
            "sriov-manage",
            ERROR,
            f"{path} is {state}; SR-IOV board(s) {listed} need it to enable their VFs",
            fix,
        )
    ]
