"""The troubleshooting page is keyed by the messages the code prints: every
error's fixed text is on it, so a new or reworded message fails here until
the page says what it means and what to do."""

import inspect
import pathlib
import re

import pytest

from vgpu_driver import exception

PAGE = pathlib.Path(__file__).parents[2] / "doc" / "source" / "admin" / "troubleshooting.rst"
# A placeholder as msg_fmt writes it: %(name)s, %(name)r, %(name).0f, %(name)d.
PLACEHOLDER = re.compile(r"%\(\w+\)[-#0 +]*\d*(?:\.\d+)?[sdrfi]")
# Shorter runs of fixed text ("Keystone: ") say too little to look up.
MIN_TEXT = 12


def _errors():
    """Every error with its own text; all are in the exception package
    (tests/unit/test_error_tree.py)."""
    return {
        f"{cls.__module__}.{cls.__qualname__}": cls
        for _, cls in inspect.getmembers(exception, inspect.isclass)
        if issubclass(cls, exception.VgpuDriverError) and "msg_fmt" in vars(cls)
    }


def _words(text):
    return " ".join(text.replace("``", "").split())


def _fixed_texts(msg_fmt):
    return [
        _words(part)
        for part in PLACEHOLDER.split(msg_fmt.replace("%%", "%"))
        if len(part.strip()) >= MIN_TEXT
    ]


@pytest.mark.parametrize("name, cls", sorted(_errors().items()))
def test_the_page_explains_the_message(name, cls):
    page = _words(PAGE.read_text())
    texts = _fixed_texts(cls.msg_fmt)
    if not texts:
        # All placeholders (the kernel-write family, "Keystone: <reason>"):
        # the page names the class or the shape.
        assert cls.__name__ in page or _words(PLACEHOLDER.sub("<x>", cls.msg_fmt)) in re.sub(
            r"<[^>]*>", "<x>", page
        ), f"{name}: {cls.msg_fmt!r}"
        return
    missing = [t for t in texts if t not in page]
    assert not missing, f"{name}: not on {PAGE.name}: {missing}"
