"""Every error of the package is in one tree, each name once.

The errors are read from the source (ast), not imported: an error class a
module defines is found whether or not anything imports that module.  An
error is a class whose base is a builtin exception, a name ending in
``Error`` or ``Exception`` (a library's), or an error found so far.
"""

import ast
import builtins
import collections
import pathlib

import vgpu_driver

PACKAGE = pathlib.Path(vgpu_driver.__file__).parent
TREE = "exception"
# Stand-ins for a library's own error, named as the library names it.
NOT_OURS = {("fake/nvml.py", "NVMLError")}  # pynvml.NVMLError, in the fake NVML
BUILTIN_ERRORS = {
    name
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, BaseException)
}


def _base_name(node):
    """``Error`` of ``Error``, ``exception.Error``, ``a.b.Error``; None otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _classes():
    """``(relative path, class name, base names)`` of every class in the package."""
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                yield relative, node.name, {_base_name(b) for b in node.bases} - {None}


def error_classes():
    """``[(relative path, class name)]`` of every error class the package defines."""
    classes = list(_classes())
    known = set(BUILTIN_ERRORS)
    found = []
    while True:
        more = [
            (path, name)
            for path, name, bases in classes
            if (path, name) not in found
            and any(b in known or b.endswith(("Error", "Exception")) for b in bases)
        ]
        if not more:
            return found
        found += more
        known |= {name for _path, name in more}


def in_tree(path):
    return path == f"{TREE}.py" or path.startswith(f"{TREE}/")


def test_the_walk_finds_errors_in_and_out_of_the_tree():
    found = error_classes()
    assert ("exception/writes.py", "MdevBusy") in found  # a subclass of a subclass
    assert ("exception/base.py", "VgpuDriverError") in found
    assert ("fake/nvml.py", "NVMLError") in found  # outside, allowed


def test_every_error_is_defined_in_the_exception_package():
    outside = [
        f"{path}: {name}"
        for path, name in error_classes()
        if not in_tree(path) and (path, name) not in NOT_OURS
    ]
    assert not outside, (
        "define these in vgpu_driver/exception/ and export them from "
        f"vgpu_driver.exception: {outside}"
    )


def test_no_two_errors_share_a_name():
    names = collections.Counter(name for _path, name in error_classes())
    twice = sorted(name for name, count in names.items() if count > 1)
    assert not twice, f"errors defined more than once: {twice}"


def test_no_other_class_takes_an_errors_name():
    errors = {name for path, name in error_classes() if in_tree(path)}
    clashing = sorted(
        f"{path}: {name}"
        for path, name, _bases in _classes()
        if name in errors and not in_tree(path)
    )
    assert not clashing, clashing
