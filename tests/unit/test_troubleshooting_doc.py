"""The troubleshooting page is keyed by the messages the code prints: every
error's fixed text is on it, so a new or reworded message fails here until
the page says what it means and what to do."""

import inspect
import pathlib
import re

import pytest

import vgpu_driver
from vgpu_driver import compute_api
from vgpu_driver import exception
from vgpu_driver import guest
from vgpu_driver import libvirt_host
from vgpu_driver import migration
from vgpu_driver.cmd import install_commands
from vgpu_driver.cmd.demo import compute as demo_compute
from vgpu_driver.cmd.demo import progress as demo_progress
from vgpu_driver.cmd.demo import workdir as demo_workdir
from vgpu_driver.conf import placement as placement_conf
from vgpu_driver.placement import client as placement_client

PAGE = pathlib.Path(__file__).parents[2] / "doc" / "source" / "admin" / "troubleshooting.rst"
MODULES = (exception, compute_api, guest, libvirt_host, migration, install_commands,
           demo_compute, demo_progress, demo_workdir, placement_conf, placement_client)
# A placeholder as msg_fmt writes it: %(name)s, %(name)r, %(name).0f, %(name)d.
PLACEHOLDER = re.compile(r"%\(\w+\)[-#0 +]*\d*(?:\.\d+)?[sdrfi]")
# Shorter runs of fixed text ("Keystone: ") say too little to look up.
MIN_TEXT = 12


def _errors():
    found = {}
    for module in MODULES:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, exception.VgpuDriverError) and "msg_fmt" in vars(cls):
                found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def _words(text):
    return " ".join(text.replace("``", "").split())


def _fixed_texts(msg_fmt):
    return [_words(part) for part in PLACEHOLDER.split(msg_fmt.replace("%%", "%"))
            if len(part.strip()) >= MIN_TEXT]


def test_every_module_with_errors_is_looked_at():
    package = pathlib.Path(vgpu_driver.__file__).parent
    defining = {str(p.relative_to(package.parent)).replace("/", ".")[:-3]
                for p in package.rglob("*.py") if "msg_fmt = " in p.read_text()}
    # The exception package exports every error its modules define.
    defining = {m for m in defining if not m.startswith(f"{exception.__name__}.")}
    assert defining <= {m.__name__ for m in MODULES}, "add the module to MODULES"


@pytest.mark.parametrize("name, cls", sorted(_errors().items()))
def test_the_page_explains_the_message(name, cls):
    page = _words(PAGE.read_text())
    texts = _fixed_texts(cls.msg_fmt)
    if not texts:
        # All placeholders (the kernel-write family, "Keystone: <reason>"):
        # the page names the class or the shape.
        assert cls.__name__ in page or _words(PLACEHOLDER.sub("<x>", cls.msg_fmt)) in \
            re.sub(r"<[^>]*>", "<x>", page), f"{name}: {cls.msg_fmt!r}"
        return
    missing = [t for t in texts if t not in page]
    assert not missing, f"{name}: not on {PAGE.name}: {missing}"
