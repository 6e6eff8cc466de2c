"""Make ``compute_driver = vgpu_driver.nova.LibvirtVGPUDriver`` loadable.

nova-compute imports its driver as ``nova.virt.<compute_driver>``, so only
modules under ``nova.virt`` can be drivers.  :func:`install` adds an import
alias: ``nova.virt.vgpu_driver[.x]`` is ``vgpu_driver[.x]`` itself (the same
module objects, nothing copied).  ``vgpu-nova-compute`` installs it, then
runs nova-compute unchanged.  This module imports no nova.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from collections.abc import Sequence

PREFIX = "nova.virt.vgpu_driver"


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != PREFIX and not fullname.startswith(PREFIX + "."):
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        # The real module: its name and state stay its own.
        module = importlib.import_module("vgpu_driver" + spec.name[len(PREFIX) :])
        spec.loader_state = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # Already executed under its real name.  The import system has just
        # given it the alias's spec: give it back its own, which relative
        # imports, importlib.resources and reload go by.
        module.__spec__ = module.__spec__.loader_state  # type: ignore[union-attr]  # set


def install() -> None:
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


def compute_main() -> object:
    """``vgpu-nova-compute``: nova-compute, able to load vgpu-driver."""
    install()
    from nova.cmd import compute

    return compute.main()
