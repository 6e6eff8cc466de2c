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
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


ALIAS_PROBE = """
import importlib, importlib.resources, sys
from vgpu_driver import nova_alias

nova_alias.install()
alias = importlib.import_module("nova.virt.vgpu_driver.sysfs")
import vgpu_driver.sysfs as real
assert alias is real, (alias, real)
assert real.__spec__.name == "vgpu_driver.sysfs", real.__spec__
assert importlib.resources.files("vgpu_driver.sysfs").is_dir()
print("ok")
"""


def test_the_nova_alias_leaves_the_real_modules_spec(tmp_path):
    """``nova.virt.vgpu_driver.x`` is ``vgpu_driver.x``, still known by its own
    name.  ``nova.virt`` is an empty stand-in: only the alias's parent must exist."""
    for package in ("nova", "nova/virt"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    done = subprocess.run(
        [sys.executable, "-c", ALIAS_PROBE],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
