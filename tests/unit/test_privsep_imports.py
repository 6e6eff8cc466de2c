"""What the privileged helper loads: the modules its daemons run with.

``vgpu-privsep-helper`` runs as root; every module it imports is code that
runs there.  A fresh interpreter loads the helper as its console script
does, computes the entry points of both contexts as it does at start, and
lists the package's modules it then holds.
"""

import json
import subprocess
import sys

LOADED = """
import json, sys
from vgpu_driver.privsep import context, helper, policy
for privileged in helper.CONTEXTS.values():
    helper.exported(privileged)
print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] == 'vgpu_driver')))
"""

# What the daemon needs: its own package, the configuration it reads
# (vgpu_driver.conf registers every option group), names and errors, NVML
# for the one mode switch, and the sysfs root's path checks.
ALLOWED = {
    "vgpu_driver",
    "vgpu_driver.conf",
    "vgpu_driver.conf.devices",
    "vgpu_driver.conf.fleet",
    "vgpu_driver.conf.limits",
    "vgpu_driver.conf.mdev_settings",
    "vgpu_driver.conf.mdev_types",
    "vgpu_driver.conf.placement",
    "vgpu_driver.conf.type_group",
    "vgpu_driver.conf.vgpu",
    "vgpu_driver.exception",
    "vgpu_driver.exception.allocation",
    "vgpu_driver.exception.base",
    "vgpu_driver.exception.commands",
    "vgpu_driver.exception.compute",
    "vgpu_driver.exception.config",
    "vgpu_driver.exception.host",
    "vgpu_driver.exception.journal",
    "vgpu_driver.exception.limits",
    "vgpu_driver.exception.placement",
    "vgpu_driver.exception.writes",
    "vgpu_driver.framebuffer",
    "vgpu_driver.names",
    "vgpu_driver.nvml",
    "vgpu_driver.privsep",
    "vgpu_driver.privsep.beneath",
    "vgpu_driver.privsep.conf_data",
    "vgpu_driver.privsep.context",
    "vgpu_driver.privsep.device",
    "vgpu_driver.privsep.entrypoints",
    "vgpu_driver.privsep.helper",
    "vgpu_driver.privsep.helper_conf",
    "vgpu_driver.privsep.policy",
    "vgpu_driver.root_only",
    "vgpu_driver.sysfs",
    "vgpu_driver.sysfs.paths",
}
NEVER = (
    "vgpu_driver.fake",
    "vgpu_driver.nova",
    "vgpu_driver.placement",
    "vgpu_driver.inventory",
    "vgpu_driver.discovery",
    "vgpu_driver.sysfs.linux",
    "vgpu_driver.claims",
    "nova",
)


def _loaded():
    out = subprocess.run([sys.executable, "-c", LOADED], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout))


def test_the_helper_loads_only_what_it_needs():
    loaded = _loaded()
    assert loaded - ALLOWED == set()
    assert "vgpu_driver.privsep.entrypoints" in loaded


def test_the_helper_loads_no_fake_nova_placement_or_discovery():
    loaded = _loaded()
    assert [m for m in loaded if m.startswith(NEVER)] == []
