"""Every typed error has its own words: a ``msg_fmt`` that formats."""

import collections
import errno
import inspect
import re

import pytest

from vgpu_driver import exception

GENERIC = exception.VgpuDriverError.msg_fmt
PLACEHOLDER = re.compile(r"%\((\w+)\)")


def error_classes():
    return [
        cls
        for _, cls in inspect.getmembers(exception, inspect.isclass)
        if issubclass(cls, exception.VgpuDriverError) and cls.__module__ == exception.__name__
    ]


class _Any(collections.UserDict):
    """A value for every key a format asks for, fit for %s, %r and %d."""

    def __missing__(self, key):
        self.data[key] = 7
        return 7


def test_there_are_errors_to_check():
    assert {exception.NoGpuCapacity, exception.VfTypeRefused, exception.MdevBusy} <= set(
        error_classes()
    )


@pytest.mark.parametrize("cls", error_classes(), ids=lambda cls: cls.__name__)
def test_each_error_has_a_specific_message_that_formats(cls):
    if cls is not exception.VgpuDriverError:
        assert cls.msg_fmt != GENERIC, f"{cls.__name__} says only {GENERIC!r}"
    values = _Any()
    text = cls.msg_fmt % values
    assert set(values) == set(PLACEHOLDER.findall(cls.msg_fmt))
    assert "%(" not in text


@pytest.mark.parametrize("cls", error_classes(), ids=lambda cls: cls.__name__)
def test_the_module_docstring_tree_lists_each_error(cls):
    assert re.search(rf"[─ ]{cls.__name__}\b", exception.__doc__), cls.__name__


def test_an_error_built_from_keywords_says_what_happened():
    error = exception.NoGpuCapacity(
        instance="i-1",
        gpu="0000:18:00.0",
        type_id="nvidia-222",
        wanted=2,
        free=0,
        creatable=1,
        claimed=3,
    )
    assert str(error) == (
        "Cannot give i-1 2 x nvidia-222 on 0000:18:00.0: 0 free and "
        "1 creatable (3 already claimed)."
    )


def test_a_kernel_refusal_subclass_keeps_the_write_errors_words():
    error = exception.MdevWriteError.from_os_error(
        "remove", "mdev 1", OSError(errno.EBUSY, "Device or resource busy")
    )
    assert type(error) is exception.MdevBusy
    assert str(error).startswith("remove failed on mdev 1: [EBUSY] Device or resource busy.")
