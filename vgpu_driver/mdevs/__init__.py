"""Allocations -> vGPUs: reuse a free one or create one, claims first.

For each GPU provider in an instance's Placement allocation and each unit
asked for, :meth:`MdevManager.allocate` takes a free vGPU of the GPU's type
(free: referenced by no domain and no claim) or creates one on a parent that
can take it.  The decision and its claims are written in one journal
transaction before any vGPU is created or handed out; the creations follow.

GPUs on NVIDIA's vendor-specific VFIO framework have no mdevs: each VF is a
parent that hosts at most one vGPU, the VF itself, once its
``current_vgpu_type`` is set.  They go through the same steps, a VF standing
for both parent and vGPU (named by its PCI address, see
:func:`vgpu_driver.names.check_vgpu_id`): a free VF already set to the type
is reused, else an untyped VF that lists the type and no domain references
is claimed, then given the type.

Per allocation, only the parents of the GPUs asked for are read (their mdev
directories and one ``available_instances`` each, or each VF's two
``nvidia/`` files), so the cost does not grow with the host or with the
number of guests.

The package's parts:

- :mod:`~vgpu_driver.mdevs.planner`: the decision, over plain data;
- :mod:`~vgpu_driver.mdevs.strategies`: reading, creating and removing the
  vGPUs of one GPU mode (mdev parent, vendor-VFIO VF);
- :mod:`~vgpu_driver.mdevs.manager`: :class:`MdevManager`, the claims
  transaction around both and its undo.
"""

from vgpu_driver.mdevs.manager import MdevManager
from vgpu_driver.mdevs.planner import GpuState
from vgpu_driver.mdevs.planner import ParentState
from vgpu_driver.mdevs.planner import Planned
from vgpu_driver.mdevs.planner import Request
from vgpu_driver.mdevs.strategies import MdevParentStrategy
from vgpu_driver.mdevs.strategies import VendorVfioStrategy

__all__ = [
    "GpuState",
    "MdevManager",
    "MdevParentStrategy",
    "ParentState",
    "Planned",
    "Request",
    "VendorVfioStrategy",
]
