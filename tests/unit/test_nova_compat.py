"""vgpu_driver.nova.compat lists every hook the adapter has on nova.

compat imports no nova (it is loaded here from its file: the package
``vgpu_driver.nova`` imports nova), so this runs without it: it reads the adapter's
source and checks that each ``super().X(...)`` and each ``Host`` member the
adapter calls (``self._host.X``, ``host.X``) is a hook compat checks at
start-up.  A hook added to the adapter without its line in compat fails here.
"""

import ast
import importlib.util
import pathlib

import pytest

import vgpu_driver

ADAPTER = pathlib.Path(vgpu_driver.__file__).parent / "nova"


def _load_compat():
    spec = importlib.util.spec_from_file_location("vgpu_driver_nova_compat", ADAPTER / "compat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


compat = _load_compat()
SOURCES = sorted(p for p in ADAPTER.glob("*.py") if p.name != "compat.py")


def _uses(tree):
    """``(kind, name)`` of super() calls and Host members read in ``tree``."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        value = node.value
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "super"
        ):
            yield "driver", node.attr
        elif isinstance(value, ast.Attribute) and value.attr == "_host":
            yield "host", node.attr
        elif isinstance(value, ast.Name) and value.id == "host":
            yield "host", node.attr
    # Host callbacks are wrapped by name, through a variable.
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("_event_")
        ):
            yield "host", node.value


def _methods_of_the_adapter_between():
    """Methods of LiveMigration and Allocation, the adapter's classes between
    nova's driver and LibvirtVGPUDriver: a super() call to one of them from
    driver.py lands there (whose own super() calls are scanned in its file)."""
    trees = [
        ast.parse((ADAPTER / name).read_text(encoding="utf-8"))
        for name in ("live_migration.py", "allocation.py")
    ]
    return {
        f.name
        for tree in trees
        for c in tree.body
        if isinstance(c, ast.ClassDef)
        for f in c.body
        if isinstance(f, ast.FunctionDef)
    }


def _declared(owner):
    return {h.name for h in compat.HOOKS if h.owner == owner}


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_every_hook_of_the_adapter_is_checked_at_start_up(source):
    tree = ast.parse(source.read_text(encoding="utf-8"))
    missing = set()
    between = _methods_of_the_adapter_between() if source.name == "driver.py" else set()
    for kind, name in _uses(tree):
        if kind == "driver" and name in between:
            continue
        owner = compat._DRIVER if kind == "driver" else compat._HOST
        if name not in _declared(owner):
            missing.add(f"{kind}: {name}")
    assert not missing, f"{source.name} hooks nova where compat does not check: {missing}"


def test_the_driver_hooks_are_all_found_by_the_scan():
    """The scan itself sees the hooks: it is no test if it finds nothing."""
    found = set()
    for source in SOURCES:
        found |= set(_uses(ast.parse(source.read_text(encoding="utf-8"))))
    assert ("driver", "_allocate_mdevs") not in found  # replaced, never called
    assert ("driver", "_hard_reboot") in found
    assert ("host", "_get_new_connection") in found
    assert ("host", "_event_lifecycle_callback") in found


def test_hooks_are_unique():
    keys = [(h.owner, h.name) for h in compat.HOOKS]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(
    "requires, expected",
    [
        (['nova<35,>=31.0.0; extra == "nova"'], "nova<35,>=31.0.0"),
        (['nova (>=31,<35) ; extra == "nova"'], "nova>=31,<35"),
        (['novaclient>=1; extra == "nova"', 'nova>=31; extra == "nova"'], "nova>=31"),
        (["nova>=31"], "unknown"),  # not the nova extra
        ([], "unknown"),
    ],
)
def test_the_supported_range_is_read_from_the_nova_extra(monkeypatch, requires, expected):
    monkeypatch.setattr(compat.importlib.metadata, "requires", lambda name: requires)
    assert compat.supported_range() == expected
