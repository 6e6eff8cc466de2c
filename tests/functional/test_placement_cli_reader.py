"""The official ``openstack`` CLI reads back what the sync wrote.

Our own tests read Placement through our own code, which could agree with
itself while disagreeing with everyone else.  An operator checks vGPUs the
way nova's admin guide ("Attaching virtual GPU devices to guests") shows:
``openstack resource provider list``, ``... inventory list``, ``... trait
list`` and ``openstack allocation candidate list``.  So this test syncs two
fake hosts into a real Placement and runs exactly those commands
(python-openstackclient with osc-placement, in subprocesses, as an operator
would), then checks their JSON output against the guide: one child provider
per physical GPU named ``<nodename>_pci_<address>`` under the compute node's
root, with the GPU's own VGPU capacity, and scheduling by a type's trait
landing only on GPUs of that type.

The hosts: the guide's M60 example (nvidia-35 on 0000:84:00.0 and
0000:85:00.0, nvidia-36 on 0000:86:00.0; 0000:87:00.0 listed nowhere, so it
gets no provider), and an A100 on SR-IOV serving A100-4C (nvidia-468), whose
16 VFs must not be mistaken for 16 vGPUs: the type allows 10 per GPU.
"""

import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import confs
from vgpu_driver import discovery
from vgpu_driver import inventory
from vgpu_driver import placement
from vgpu_driver.conf import mdev_types
from vgpu_driver.placement_service import EmbeddedPlacement

# Next to this interpreter, not resolved: a venv's python is a symlink.
OPENSTACK = Path(sys.executable).parent / "openstack"
CLI_TIMEOUT = 120
A100_4C = """
    [devices]
    enabled_mdev_types = nvidia-468
    """
M60 = "compute1"
A100 = "compute2"
A100_TRAIT = "CUSTOM_VGPU_NVIDIA_A100_4C"
OWNER = "CUSTOM_OWNER_VGPU_DRIVER"
MANAGER = "CUSTOM_NVIDIA_VGPU_MANAGER_550_127_06"  # the shipped NVIDIA profiles'
M60_0B = {"CUSTOM_MDEV_NVIDIA_35", "CUSTOM_VGPU_GRID_M60_0B", OWNER, MANAGER}
# What the guide's inventory list shows for each GPU, our capacities plugged in.
EXPECTED = {
    f"{M60}_pci_0000_84_00_0": (16, M60_0B),
    f"{M60}_pci_0000_85_00_0": (16, M60_0B),
    f"{M60}_pci_0000_86_00_0": (
        8,
        {"CUSTOM_MDEV_NVIDIA_36", "CUSTOM_VGPU_GRID_M60_1B", OWNER, MANAGER},
    ),
    f"{A100}_pci_0000_41_00_0": (10, {"CUSTOM_MDEV_NVIDIA_468", A100_TRAIT, OWNER, MANAGER}),
}


def openstack_cli():
    """The ``openstack`` executable of this venv, or a clear failure."""
    if not os.access(OPENSTACK, os.X_OK):
        pytest.fail(
            f"{OPENSTACK} not found: this test needs python-openstackclient and "
            "osc-placement installed in the same environment as pytest (they are "
            "in test-requirements.txt; run it through tox or pip install them)"
        )
    return str(OPENSTACK)


class Cli:
    """Runs ``openstack ... -f json`` against one Placement, as an operator."""

    def __init__(self, executable, placement_env, home):
        self.executable = executable
        # Only the embedded Placement's settings: no OS_CLOUD or clouds.yaml
        # of whoever runs the tests may point the CLI elsewhere.
        self.env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("OS_") and k != "XDG_CONFIG_HOME"
        }
        self.env.update(placement_env, HOME=str(home))

    def __call__(self, *args):
        command = [self.executable, *args, "-f", "json"]
        done = subprocess.run(
            command, env=self.env, capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False
        )
        assert done.returncode == 0, (
            f"{' '.join(command[1:])} exited {done.returncode}:\n{done.stderr}"
        )
        return json.loads(done.stdout)

    def run_all(self, commands):
        """``{key: output}`` of ``{key: args}``, run side by side (each takes ~1 s)."""
        workers = min(len(commands), max(2, os.cpu_count() or 2))
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = {key: pool.submit(self, *args) for key, args in commands.items()}
            return {key: future.result() for key, future in futures.items()}


def sync(placement_service, tree):
    """Our sync of one host's tree; ``{provider name: uuid}`` as it knows them."""
    client = placement.Client(placement_service.connection(), sleep=lambda _s: None)
    provider_sync = placement.ProviderSync(client, sleep=lambda _s: None)
    provider_sync.sync(tree)
    return {name: known.uuid for name, known in provider_sync.known.items()}


def test_openstack_cli_sees_the_guides_layout(make_host, make_conf, tmp_path):
    """Provider tree, inventories, traits and candidates, as the CLI shows them."""
    cli = openstack_cli()
    m60_tree = inventory.compute(
        discovery.discover(make_host("m60-multi")),
        mdev_types.from_conf(make_conf(confs.NOVA_GUIDE_M60)),
        M60,
    )
    a100_tree = inventory.compute(
        discovery.discover(make_host("a100-sriov")), mdev_types.from_conf(make_conf(A100_4C)), A100
    )

    with EmbeddedPlacement() as placement_service:
        uuids = {**sync(placement_service, m60_tree), **sync(placement_service, a100_tree)}
        assert sorted(uuids) == sorted([M60, A100, *EXPECTED])
        run = Cli(cli, placement_service.cli_environment(), tmp_path)
        commands = {
            "providers": ("resource", "provider", "list"),
            "candidates": (
                "allocation",
                "candidate",
                "list",
                "--resource",
                "VGPU=1",
                "--required",
                A100_TRAIT,
            ),
        }
        for name in EXPECTED:
            commands[("inventory", name)] = (
                "resource",
                "provider",
                "inventory",
                "list",
                uuids[name],
            )
            commands[("traits", name)] = ("resource", "provider", "trait", "list", uuids[name])
        out = run.run_all(commands)

    # resource provider list: the roots, and one child per served GPU under its root.
    roots = {uuids[M60], uuids[A100]}
    ours = [rp for rp in out["providers"] if rp["root_provider_uuid"] in roots]
    assert sorted(rp["name"] for rp in ours) == sorted([M60, A100, *EXPECTED])
    assert f"{M60}_pci_0000_87_00_0" not in {rp["name"] for rp in out["providers"]}
    for rp in ours:
        assert rp["uuid"] == uuids[rp["name"]]
        root = M60 if rp["name"].startswith(M60) else A100
        assert rp["root_provider_uuid"] == uuids[root]
        expected_parent = None if rp["name"] == root else uuids[root]
        assert rp["parent_provider_uuid"] == expected_parent

    # resource provider inventory list: the GPU's VGPU capacity, nothing overcommitted.
    for name, (total, traits) in EXPECTED.items():
        assert out[("inventory", name)] == [
            {
                "resource_class": "VGPU",
                "allocation_ratio": 1.0,
                "min_unit": 1,
                "max_unit": total,
                "reserved": 0,
                "step_size": 1,
                "total": total,
                "used": 0,
            }
        ], name
        # resource provider trait list: the type's traits, by id and by vendor name,
        # and the one saying the provider is vgpu-driver's.
        assert {t["name"] for t in out[("traits", name)]} == traits, name

    # allocation candidate list: asking for an A100-4C lands on the A100 only.
    a100 = uuids[f"{A100}_pci_0000_41_00_0"]
    ours_candidates = [c for c in out["candidates"] if c["resource provider"] in uuids.values()]
    assert [
        (c["resource provider"], c["allocation"], c["inventory used/capacity"])
        for c in ours_candidates
    ] == [(a100, "VGPU=1", "VGPU=0/10")]
    for candidate in out["candidates"]:
        assert A100_TRAIT in candidate["traits"].split(",")
