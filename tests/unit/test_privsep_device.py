"""The privileged side's read of one GPU agrees with discovery's.

The write policy reads, beneath the root, only the GPU a write is on
(:mod:`vgpu_driver.privsep.device`); discovery reads the whole host.  On
hosts of every kind of board, each parent and each GPU must come out the
same (address, mode and the addresses the configuration may name it by),
or the policy would decide on another GPU than the inventory reports.
"""

import posixpath

import pytest

from vgpu_driver import discovery
from vgpu_driver import host_snapshot
from vgpu_driver.privsep import beneath
from vgpu_driver.privsep import device

HOSTS = [
    ("t4x8", "a100-sriov", "l40s-vfio", "mtty"),
    ("a100-sriov-off", "t4x8"),
    ("h100-datacenter",),
    ("m60-multi",),
]


def _expected(gpu):
    return device.Gpu(gpu.address, gpu.mode, tuple(gpu.addresses))


def _gpu(found):
    return (
        None
        if found is None
        else found._replace(addresses=(found.addresses[0], *sorted(found.addresses[1:])))
    )


@pytest.mark.parametrize("profiles", HOSTS, ids="+".join)
def test_each_parent_is_on_the_gpu_discovery_puts_it_on(make_host, walk, profiles):
    host = make_host(*profiles)
    snapshot = discovery.discover(host)
    parents = [(p.name, gpu) for gpu in snapshot.gpus for p in gpu.parents]
    assert parents or "t4x8" not in profiles
    with beneath.SysfsRoot(host.paths.root, allow_fake=True) as root:
        for name, gpu in parents:
            link = (
                posixpath.join("class", "mdev_bus", name)
                if name in host.parent_names()
                else posixpath.join("bus", "pci", "devices", name)
            )
            found = device.gpu_of_parent(root, name, root.follow(link, name))
            expected = _expected(gpu)
            assert _gpu(found) == expected._replace(
                addresses=(expected.addresses[0], *sorted(expected.addresses[1:]))
            )


@pytest.mark.parametrize("profiles", HOSTS, ids="+".join)
def test_each_pci_gpu_is_read_as_discovery_reads_it(make_host, walk, profiles):
    host = make_host(*profiles)
    snapshot = discovery.discover(host)
    with beneath.SysfsRoot(host.paths.root, allow_fake=True) as root:
        for gpu in snapshot.gpus:
            if gpu.mode == host_snapshot.MODE_VIRTUAL:
                continue
            pf = root.follow(posixpath.join("bus", "pci", "devices", gpu.address), gpu.address)
            expected = _expected(gpu)
            assert _gpu(device.physical_gpu(root, gpu.address, pf)) == expected._replace(
                addresses=(expected.addresses[0], *sorted(expected.addresses[1:]))
            )


def test_a_function_that_is_no_parent_is_on_no_gpu(make_host, walk):
    host = make_host("a100-sriov-off", "t4x8")
    pf = "0000:41:00.0"
    with beneath.SysfsRoot(host.paths.root, allow_fake=True) as root:
        found = root.follow(posixpath.join("bus", "pci", "devices", pf), pf)
        # The PF of a board with its VFs off is no parent, though it is a GPU.
        assert device.gpu_of_parent(root, pf, found) is None
        assert device.physical_gpu(root, pf, found).mode == host_snapshot.MODE_VFS_PENDING


@pytest.mark.parametrize("profiles", HOSTS, ids="+".join)
def test_a_read_among_named_addresses_finds_exactly_those_of_the_gpu(make_host, walk, profiles):
    """What the policy reads for a write: of the addresses a configuration
    names, exactly those discovery gives the parent's GPU (its PF's and
    the parent's always), whatever else is named."""
    host = make_host(*profiles)
    snapshot = discovery.discover(host)
    every = [a for gpu in snapshot.gpus for a in gpu.addresses]
    with beneath.SysfsRoot(host.paths.root, allow_fake=True) as root:
        for gpu in snapshot.gpus:
            for parent in gpu.parents:
                link = (
                    posixpath.join("class", "mdev_bus", parent.name)
                    if parent.name in host.parent_names()
                    else posixpath.join("bus", "pci", "devices", parent.name)
                )
                found = root.follow(link, parent.name)
                whole = device.gpu_of_parent(root, parent.name, found)
                named = device.gpu_of_parent(root, parent.name, found, among=every)
                assert named.address == whole.address
                assert set(named.addresses) == set(whole.addresses)
                alone = device.gpu_of_parent(root, parent.name, found, among=())
                assert set(alone.addresses) == {gpu.address, parent.name}
                others = [a for a in every if a not in gpu.addresses]
                assert device.gpu_of_parent(root, parent.name, found, among=others) == alone
