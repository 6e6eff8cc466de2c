"""The package's import graph, read statically: production never reaches the
fake kernel, and production modules import each other without a loop.

Every ``import`` and ``from ... import`` of a module counts, those inside
functions (lazy ones) included, and so does ``importlib.import_module``
with a literal name: a lazy import is an import all the same, made when the
function first runs.  Imports under ``if TYPE_CHECKING:`` never run: they
count toward the fake (production names nothing of it, even for the type
checker) but not toward loops (annotations may name each other's types).
"""

import ast
import pathlib

import vgpu_driver

PACKAGE = "vgpu_driver"
FAKE = "vgpu_driver.fake"
ROOT = pathlib.Path(vgpu_driver.__file__).parent

# The only production modules allowed to import the fake: the demo and the
# fake-host commands build and serve a fake kernel by design (they are the
# entries ``./tools/run-demo.sh`` and ``vgpu-manage fake-host`` run, loaded
# by cliff from their own entry points: ``demo``, ``fake-host_*`` in
# setup.cfg); nothing else may import them, and each of them does import
# the fake (the list says no more than it must).
FAKE_ENTRIES = frozenset(
    {
        "vgpu_driver.cmd.demo_commands",
        "vgpu_driver.cmd.demo.operator",
        "vgpu_driver.cmd.demo.scenario",
        "vgpu_driver.cmd.fake_host_commands",
    }
)


def _module_name(path):
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in ROOT.rglob("*.py")}


def _absolute(name, node, current, is_package):
    if not node.level:
        return node.module if name is None else name
    base = current.split(".")
    drop = node.level - 1 if is_package else node.level
    base = base[: len(base) - drop]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_only(tree):
    """The nodes under ``if TYPE_CHECKING:`` blocks."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.update(id(n) for block in node.body for n in ast.walk(block))
    return found


def _imported(tree, current, is_package, known, at_run_time=False):
    """The package's modules ``tree`` imports, lazily or not; only those
    imported when it runs with ``at_run_time``."""
    found = set()
    skipped = _type_checking_only(tree) if at_run_time else set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            # ``from a import b`` imports the module a.b where there is one,
            # else a name of a (and a's parents, see _with_packages).
            module = _absolute(None, node, current, is_package)
            for alias in node.names:
                submodule = f"{module}.{alias.name}"
                found.add(submodule if submodule in known else module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", None) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            found.add(node.args[0].value)
    return {_known_prefix(name, known) for name in found} - {None, current}


def _known_prefix(name, known):
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _graph(at_run_time=False):
    modules = _modules()
    return {
        name: _imported(
            ast.parse(path.read_text()), name, path.name == "__init__.py", modules, at_run_time
        )
        for name, path in modules.items()
    }


def _is_fake(name):
    return name == FAKE or name.startswith(FAKE + ".")


def _with_packages(graph):
    """Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first."""
    full = {}
    for name, edges in graph.items():
        parents = set()
        for target in edges:
            parts = target.split(".")
            parents.update(".".join(parts[:i]) for i in range(1, len(parts)))
        full[name] = (edges | parents) & set(graph)
    return full


def _path_to_fake(graph, start):
    """The first chain of imports from ``start`` into the fake, or None."""
    seen = {start: None}
    queue = [start]
    while queue:
        current = queue.pop(0)
        for target in sorted(graph[current]):
            if target in seen:
                continue
            seen[target] = current
            if _is_fake(target) or target in FAKE_ENTRIES:
                chain = [target]
                while seen[chain[-1]] is not None:
                    chain.append(seen[chain[-1]])
                return " -> ".join(reversed(chain))
            queue.append(target)
    return None


def _cycles(graph):
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_lazy_imports():
    graph = _graph()
    # sysfs.open_host imports its backend inside the function.
    assert "vgpu_driver.sysfs.linux" in graph["vgpu_driver.sysfs"]
    assert "vgpu_driver.fake.fakekernel" in graph["vgpu_driver.fake.served"]


def test_production_never_reaches_the_fake():
    graph = _with_packages(_graph())
    production = [name for name in graph if not _is_fake(name) and name not in FAKE_ENTRIES]
    paths = [p for p in (_path_to_fake(graph, name) for name in sorted(production)) if p]
    assert paths == []


def test_the_fake_entries_are_what_imports_the_fake():
    graph = _graph()
    importers = {
        name for name, edges in graph.items() if not _is_fake(name) and any(map(_is_fake, edges))
    }
    assert importers == FAKE_ENTRIES


def test_the_graph_tells_imports_for_the_type_checker_apart():
    # framebuffer names the inventory's types only for the type checker.
    assert "vgpu_driver.inventory" in _graph()["vgpu_driver.framebuffer"]
    assert "vgpu_driver.inventory" not in _graph(at_run_time=True)["vgpu_driver.framebuffer"]


def test_no_import_loop_outside_the_fake():
    graph = _graph(at_run_time=True)
    production = {
        name: {t for t in edges if not _is_fake(t)}
        for name, edges in graph.items()
        if not _is_fake(name)
    }
    assert _cycles(production) == []
