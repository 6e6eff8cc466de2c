"""nova.conf texts shared by several test modules."""

# The multi-type example of nova's vGPU guide, on its four-GPU M60 host.
NOVA_GUIDE_M60 = """
    [devices]
    enabled_mdev_types = nvidia-35, nvidia-36
    [mdev_nvidia-35]
    device_addresses = 0000:84:00.0,0000:85:00.0
    [mdev_nvidia-36]
    device_addresses = 0000:86:00.0
    """

# One nova.conf for a whole fleet: GPUs chosen by model, not by address.
# Eight T4 split 4 x T4-4C and the rest T4-8C; A100 boards serve A100-4C.
FLEET = """
    [devices]
    enabled_mdev_types = nvidia-319, nvidia-320, nvidia-468
    [mdev_nvidia-319]
    device_ids = 10de:1eb8
    gpu_count = 4
    [mdev_nvidia-320]
    device_ids = 10de:1eb8
    [mdev_nvidia-468]
    device_ids = 10de:20f1
    mdev_class = CUSTOM_A100_4C
    """

# The t4x8 + a100-sriov + l40s-vfio host: the T4s serve nvidia-222 (no
# addresses: every GPU not listed), the A100 nvidia-468, the L40S nvidia-1156.
MIXED_HOST = """
    [devices]
    enabled_mdev_types = nvidia-222, nvidia-468, nvidia-1156
    [mdev_nvidia-468]
    device_addresses = 0000:41:00.0
    [mdev_nvidia-1156]
    device_addresses = 0000:c1:00.0
    """

# nvidia-222 on the first T4 alone: every other GPU is given no type.
FIRST_T4_ONLY = """
    [devices]
    enabled_mdev_types = nvidia-222
    [mdev_nvidia-222]
    device_addresses = 0000:18:00.0
    """
