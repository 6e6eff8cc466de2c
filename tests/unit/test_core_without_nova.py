"""The core never imports nova: only ``vgpu_driver.nova`` may (the [nova] extra)."""

import pkgutil
import subprocess
import sys

import vgpu_driver

PROBE = """
import importlib, sys

class NoNova:
    def find_spec(self, name, path=None, target=None):
        if name == "nova" or name.startswith("nova."):
            raise ImportError(f"{name} imported by the core")

sys.meta_path.insert(0, NoNova())
for module in sys.argv[1:]:
    importlib.import_module(module)
print(sorted(m for m in sys.modules if m == "nova" or m.startswith("nova.")))
"""


def core_modules():
    found = []
    for info in pkgutil.walk_packages(vgpu_driver.__path__, "vgpu_driver."):
        if info.name == "vgpu_driver.nova" or info.name.startswith("vgpu_driver.nova."):
            continue
        found.append(info.name)
    return found


def test_every_core_module_imports_without_nova():
    modules = core_modules()
    assert "vgpu_driver.driver" in modules and "vgpu_driver.nova_alias" in modules
    done = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True,
                          text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
