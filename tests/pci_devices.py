"""PCI functions that are no GPU, laid out in a fake host's tree as the
kernel lays them out (the fake kernel's profiles hold only GPUs)."""

import os

NIC = "0000:05:00.0"


def plant_nic(tree, address=NIC, vendor="0x8086", device="0x1572", totalvfs=8):
    """A network card with SR-IOV: what a VF-enabling tool must not touch."""
    bus = address.rsplit(":", 1)[0]  # devices/pci0000:05/0000:05:00.0
    dev = os.path.join(tree, "devices", f"pci{bus}", address)
    os.makedirs(dev)
    for name, text in (
        ("vendor", f"{vendor}\n"),
        ("device", f"{device}\n"),
        ("class", "0x020000\n"),
        ("sriov_totalvfs", f"{totalvfs}\n"),
        ("sriov_numvfs", "0\n"),
    ):
        with open(os.path.join(dev, name), "w") as f:
            f.write(text)
    os.symlink(
        f"../../../devices/pci{bus}/{address}", os.path.join(tree, "bus", "pci", "devices", address)
    )
    return dev


def tree_state(root):
    """Every file's content and link's target under a tree: to show that a
    refused command changed nothing."""
    state = {}
    for top, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".vgpu-fake-kernel"]
        for name in dirs + files:
            path = os.path.join(top, name)
            if os.path.islink(path):
                state[path] = ("link", os.readlink(path))
            elif os.path.isfile(path):
                with open(path, "rb") as f:
                    state[path] = ("file", f.read())
            else:
                state[path] = ("dir", None)
    return state
