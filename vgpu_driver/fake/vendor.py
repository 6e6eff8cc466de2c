"""What the fake kernel's vendor drivers know: each GPU model's capacity rules.

A host profile becomes a *host model*: per GPU its model and, per type, the
limits its driver enforces.  :func:`available` answers "how many more of this
type can this parent take now?" from what exists on the GPU, as the driver
would; the fake kernel writes the answer to ``available_instances`` (or
``creatable_vgpu_types``) and refuses creates beyond it.

Models:

* ``mtty``: the kernel sample; a pool of serial ports, types take 1 or 2.
* ``nvidia-timesliced`` (Turing and older): the GPU is the parent, one type
  at a time, up to the type's ``max_instance``.
* ``nvidia-sriov`` and ``nvidia-vfio`` (Ampere and later): each VF hosts one
  vGPU.  By default a GPU is in *equal-size mode*: once it hosts a vGPU,
  its VFs offer only types of the same framebuffer size, of any series
  ("When a time-sliced vGPU is created on a GPU in equal-size mode, the
  content of the creatable_vgpu_types for all virtual functions on the
  physical GPU is set to only the vGPU types with the same amount of frame
  buffer", *Virtual GPU Software User Guide* 17.0, 2.10.8.2; a 2B beside a
  2Q is valid, 2.1.4), up to the type's per-GPU maximum.
* ``nvidia-datacenter``: a GPU under NVIDIA's data-center driver (no vGPU
  manager): a PCI function bound to ``nvidia``, no mdev parent, no SR-IOV
  files, no ``nvidia/`` directory, and NVML's vGPU calls NOT_SUPPORTED (as
  read on such a host with an H100 and driver 580).
* SR-IOV boards (``nvidia-sriov`` over mdev, ``nvidia-vfio`` over vendor
  VFIO) that report "Heterogeneous Time-Slice Sizes" (the profile's
  ``heterogeneous_sizes``) and whose family the rules know (``architecture``
  and ``framebuffer_mb``) can be put in *mixed-size mode*
  (:meth:`FakeKernel.set_heterogeneous_mode`): vGPUs of any sizes share the
  board, each at a placement of :mod:`vgpu_driver.fake.board_tables`.  The
  vGPU manager offers the mode on SR-IOV GPUs under its VFIO framework, over
  mdev and over vendor VFIO alike (``kvgpumgrSetSupportedPlacementIds``:
  ``gpuIsSriovEnabled`` and ``osIsVgpuVfioPresent``).
* Each vGPU takes the lowest creatable placement of its type ("Allocate
  either the first available placementId or the placementId specified by
  the user", ``kvgpumgrSetPlacementId``), in mixed-size mode, and in
  equal-size mode on boards with homogeneous placements (Ada and later,
  from R565: :func:`homogeneous_placements`); elsewhere it has none
  (``NVA081_PLACEMENT_ID_INVALID``).
"""

from vgpu_driver.fake import board_tables
from vgpu_driver.sysfs import base

SRIOV_MODELS = ("nvidia-sriov", "nvidia-vfio")
# The first vGPU manager branch whose NVML reports homogeneous placements
# (nvmlVgpuPlacementList_v2_t's mode, NVML_VGPU_PGPU_HOMOGENEOUS_MODE).
HOMOGENEOUS_FROM_BRANCH = 565


def type_spec(gpu, type_id):
    for spec in gpu["types"]:
        if spec["id"] == type_id:
            return spec
    return None


def available(gpu, dev, spec, existing, placed=None):
    """Room for ``spec`` on parent ``dev`` of ``gpu``.

    ``existing`` lists ``(parent dir, uuid, type id)`` of every vGPU on the
    GPU; ``placed`` is None in equal-size mode, else (mixed-size mode) the
    ``{parent dir: placement ID}`` of those vGPUs.
    """
    model = gpu["model"]
    if model == "mtty":
        used = sum(type_spec(gpu, t)["ports"] for _, _, t in existing)
        return (gpu["ports"] - used) // spec["ports"]
    if model == "nvidia-timesliced":
        present = {t for _, _, t in existing}
        if present and present != {spec["id"]}:
            return 0
        return max(spec["max"] - len(existing), 0)
    # SR-IOV (mdev per VF, or vendor VFIO): one vGPU per VF.
    if any(d == dev for d, _, _ in existing):
        return 0
    if placed is not None:
        return 1 if creatable_placements(gpu, spec, existing, placed) else 0
    # Equal-size mode: one framebuffer size per GPU.
    sizes = {type_spec(gpu, t)["framebuffer_mb"] for _, _, t in existing}
    if sizes and sizes != {spec["framebuffer_mb"]}:
        return 0
    return 1 if len(existing) < spec["max"] else 0


def can_mix_sizes(gpu):
    """Whether the board can be put in mixed-size mode: SR-IOV under the
    vGPU manager, the capability reported, and a family the rules know."""
    return (
        gpu["model"] in SRIOV_MODELS
        and bool(gpu.get("heterogeneous_sizes"))
        and board_tables.board_of_gpu(gpu) is not None
    )


def homogeneous_placements(gpu, manager_version):
    """Whether vGPUs of the board take placements in equal-size mode: Ada
    and later under a vGPU manager of R565 or later (the branch whose NVML
    reports them); the fake gives none before, the conservative reading."""
    board = board_tables.board_of_gpu(gpu)
    branch = (manager_version or "0").split(".")[0]
    return (
        gpu["model"] in SRIOV_MODELS
        and board is not None
        and board.architecture != board_tables.AMPERE
        and branch.isdigit()
        and int(branch) >= HOMOGENEOUS_FROM_BRANCH
    )


def placement_table(gpu, spec, mixed):
    """``(size in slots, supported IDs)`` of ``spec`` on the board, in
    mixed-size mode or (``mixed`` False) equal-size mode's homogeneous ones."""
    board = board_tables.board_of_gpu(gpu)
    table = board_tables.supported(board) if mixed else board_tables.homogeneous(board)
    entry = table.get(spec["id"])
    if entry is None:
        return board_tables.placement_size(board, _as_type(spec)), ()
    return entry.size, entry.placements


def creatable_placements(gpu, spec, existing, placed, mixed=True):
    """The placement IDs a vGPU of ``spec`` could take now: ``placed`` is
    ``{parent dir: placement ID}`` of the ``existing`` vGPUs."""
    board = board_tables.board_of_gpu(gpu)
    used = [(t, placed[d]) for d, _, t in existing if d in placed]
    for entry in board_tables.creatable(board, used, mixed=mixed):
        if entry.type.name == spec["id"]:
            return entry.placements
    return ()


def _as_type(spec):
    return board_tables.VgpuType(
        spec["id"], board_tables.gb(spec["framebuffer_mb"]), int(spec.get("max") or 1)
    )


def host_model(profile):
    """The vendor drivers' knowledge of each GPU of a profile."""
    type_sets = profile.get("type_sets", {})
    gpus = []
    for gpu in profile["gpus"]:
        entry = dict(gpu)
        specs = gpu.get("types", [])
        specs = type_sets[specs] if isinstance(specs, str) else specs
        entry["types"] = [_driver_type_spec(spec) for spec in specs]
        gpus.append(entry)
    # A host with the IOMMU off, or without the mdev core's module, says so.
    return {
        "name": profile.get("name"),
        "gpus": gpus,
        "iommu": profile.get("iommu", True),
        "mdev": profile.get("mdev", True),
    }


def _driver_type_spec(spec):
    """A type with its limits made explicit (``max``, ``framebuffer_mb``),
    read from NVIDIA's description where the profile does not say."""
    entry = dict(spec)
    fields = base.parse_description(spec.get("description"))
    if "max" not in entry and fields.get("max_instance", "").isdigit():
        entry["max"] = int(fields["max_instance"])
    entry.setdefault("framebuffer_mb", base.framebuffer_mb(fields.get("framebuffer")))
    return entry
