"""Reading one sysfs attribute or link, the way every sysfs reader needs it.

Kept apart from the readers of parents, mdevs and PCI functions because all
of them (and the fake kernel, which keeps its state in the same tree) read
attributes and links alike: lexically resolved links (the kernel writes
relative ones), absent files as None, and values never guessed at.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from oslo_log import log as logging

LOG = logging.getLogger(__name__)
_T = TypeVar("_T")


def read_attr(path: str) -> str | None:
    """The stripped text of a sysfs attribute, or None when it is absent."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return os.read(fd, 65536).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)


def resolve_link(path: str) -> str | None:
    """Where a sysfs link points, resolved lexically; None if not a link."""
    try:
        target = os.readlink(path)
    except (FileNotFoundError, OSError):
        return None
    return os.path.normpath(os.path.join(os.path.dirname(path), target))


def link_name(path: str) -> str | None:
    """The last component of a sysfs link's target (an mdev's type id, say);
    None if not a link.  One readlink and no path arithmetic: allocation
    reads one per mdev of the GPU."""
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def parse_count(text: str) -> int:
    """A kernel-printed count: decimal digits only."""
    if not text.isdigit():
        raise ValueError("not a count")
    return int(text)


def parse_printable(text: str) -> str:
    if not text.isprintable():
        raise ValueError("holds control characters")
    return text


def read_parsed(path: str, parse: Callable[[str], _T], unreadable: list[str]) -> _T | None:
    """``parse`` of an attribute's text; None when absent.  Bytes that are not
    UTF-8, or text ``parse`` refuses, are never guessed at: None, and
    ``"<path>: <why>"`` is appended to ``unreadable`` (and logged)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        raw = os.read(fd, 65536)
    finally:
        os.close(fd)
    try:
        return parse(raw.decode("utf-8").strip())
    except ValueError as exc:
        reason = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else str(exc)
        problem = f"{path}: {raw[:40]!r} is unreadable ({reason})"
        LOG.warning("Unreadable sysfs value: %s", problem)
        unreadable.append(problem)
        return None


def int_or_none(text: str | None) -> int | None:
    try:
        return int(text, 0) if text is not None else None
    except ValueError:
        return None


def sorted_entries(path: str) -> list[str]:
    """A directory's entries, sorted; none when the directory is gone."""
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return []
