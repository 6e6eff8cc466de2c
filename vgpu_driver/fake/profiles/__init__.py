"""Host profiles for the fake kernel, shipped as data (one JSON file each).

A profile names its GPUs (PCI address, vendor model, SR-IOV layout), the
mdev types each offers with the vendor's descriptions, and the NVIDIA vGPU
manager version the host loads (``nvidia_vgpu_manager``); see
:meth:`vgpu_driver.fake.fakekernel.FakeKernel.build`.
"""

import importlib.resources
import json

from vgpu_driver import exception


def _files():
    return importlib.resources.files(__name__)


def names():
    return sorted(p.name[:-5] for p in _files().iterdir() if p.name.endswith(".json"))


def load(name):
    known = names()
    if name not in known:
        raise exception.UnknownProfile(name=name, known=", ".join(known))
    return json.loads(_files().joinpath(f"{name}.json").read_text())


def combine(name, *profiles, description=None):
    """One host made of several profiles' GPUs (their addresses must differ)."""
    combined = {
        "name": name,
        "description": description or name,
        "type_sets": {},
        "gpus": [],
        "mdevs": [],
    }
    for profile in profiles:
        combined["type_sets"].update(profile.get("type_sets", {}))
        combined["gpus"].extend(profile["gpus"])
        combined["mdevs"].extend(profile.get("mdevs", ()))
    # One kernel loads one NVIDIA module.
    managers = {p["nvidia_vgpu_manager"] for p in profiles if p.get("nvidia_vgpu_manager")}
    if len(managers) > 1:
        raise ValueError(
            f"profiles of {name} load NVIDIA vGPU managers "
            f"{', '.join(sorted(managers))}; one host runs one"
        )
    if managers:
        combined["nvidia_vgpu_manager"] = managers.pop()
    return combined
