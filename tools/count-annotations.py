#!/usr/bin/env python3
"""Count the functions of a package and those annotated in full.

A function counts as annotated as mypy's disallow_untyped_defs sees it:
every parameter has an annotation (a method's self or cls excepted) and
the return has one (an __init__ with an annotated parameter may leave its
return out).  Nested functions and lambdas' parents count; lambdas do not.

Usage: tools/count-annotations.py [--by-module] [PATH...]
(default path: vgpu_driver).  Prints "annotated/total", then, with
--by-module, one line per module that is not annotated in full.
"""

import argparse
import ast
import pathlib
import sys

Function = ast.FunctionDef | ast.AsyncFunctionDef
Parents = dict[ast.AST, ast.AST]


def _params(fn: Function) -> list[ast.arg]:
    args = fn.args
    params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    if args.vararg:
        params.append(args.vararg)
    if args.kwarg:
        params.append(args.kwarg)
    return params


def _is_method(fn: Function, parents: Parents) -> bool:
    parent = parents.get(fn)
    # A class body's "if TYPE_CHECKING:" or "try:" holds methods too.
    while isinstance(parent, ast.If | ast.Try | ast.With):
        parent = parents.get(parent)
    if not isinstance(parent, ast.ClassDef):
        return False
    decorators = {getattr(d, "id", None) for d in fn.decorator_list}
    return "staticmethod" not in decorators


def annotated(fn: Function, parents: Parents) -> bool:
    """True when mypy's disallow_untyped_defs accepts fn."""
    params = _params(fn)
    positional = [*fn.args.posonlyargs, *fn.args.args]
    if _is_method(fn, parents) and positional:
        params = [p for p in params if p is not positional[0]]
    if any(p.annotation is None for p in params):
        return False
    if fn.returns is not None:
        return True
    return fn.name == "__init__" and bool(params)


def count(path: pathlib.Path) -> tuple[int, int]:
    tree = ast.parse(path.read_text(), filename=str(path))
    parents: Parents = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    funcs = [n for n in ast.walk(tree) if isinstance(n, Function)]
    return sum(annotated(f, parents) for f in funcs), len(funcs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["vgpu_driver"])
    parser.add_argument("--by-module", action="store_true")
    opts = parser.parse_args(argv)
    files = []
    for name in opts.paths:
        root = pathlib.Path(name)
        files.extend(sorted(root.rglob("*.py")) if root.is_dir() else [root])
    done = total = 0
    partial: list[tuple[pathlib.Path, int, int]] = []
    for path in files:
        n_done, n_total = count(path)
        done += n_done
        total += n_total
        if n_done < n_total:
            partial.append((path, n_done, n_total))
    print(f"{done}/{total} functions annotated")
    if opts.by_module:
        for path, n_done, n_total in partial:
            print(f"{path}: {n_done}/{n_total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
