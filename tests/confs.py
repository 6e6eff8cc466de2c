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
