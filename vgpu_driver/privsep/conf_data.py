"""nova's configuration, read by the privileged helper as data.

The helper must not take its own behaviour from files nova's user may be
able to write: oslo.config and oslo.log would obey ``log_config_append``
or ``log_dir`` there, as root.  So it reads nova-compute's files with this
parser instead, keeps only the options the write policy needs (``[vgpu]
sysfs_root``, ``[devices]`` and ``[mdev_<type>]``) and hands just those to
a private ``ConfigOpts`` that knows no other option.  The syntax is
oslo.config's (``key = value`` or ``key: value``, indented continuation
lines, ``#`` and ``;`` comments, matching quotes stripped), parsed
strictly: a line it cannot read, a key given twice in one section of one
file or a ``$`` (oslo.config's substitution) in a kept value refuses the
whole configuration.  A refusal names the file and the line, never its
text: the helper reads as root, and the file may be a link to anything.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from collections.abc import Iterable
from typing import NoReturn

from vgpu_driver import exception

MAX_BYTES = 1 << 20
_SECTION = re.compile(r"\[([^\[\]]+)\]")
# {section: {key: value}}
Sections = dict[str, dict[str, str]]
Keep = Callable[[str, str], bool]


def _any_key(section: str, key: str) -> bool:
    return True


def _reason(exc: OSError) -> str:
    """The error's own text, never the path (which may be a link to anything)."""
    return os.strerror(exc.errno) if exc.errno is not None else "cannot be read"


def _text(path: str) -> str:
    """The file's text: a regular file of at most MAX_BYTES, UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise exception.ConfigDataRefused(path=path, line=0, reason=_reason(exc)) from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise exception.ConfigDataRefused(path=path, line=0, reason="not a regular file")
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise exception.ConfigDataRefused(
            path=path, line=0, reason=f"larger than {MAX_BYTES} bytes"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise exception.ConfigDataRefused(path=path, line=0, reason="not UTF-8 text") from None


def _value(raw: str) -> str:
    raw = raw.strip()
    if len(raw) > 1 and raw[0] == raw[-1] and raw[0] in "\"'":
        return raw[1:-1]
    return raw


def _assignment(line: str) -> tuple[str, str] | None:
    """``(key, value)`` of ``key = value`` or ``key: value`` (the first of
    the two signs splits, as in oslo.config), or None."""
    cut = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
    if cut <= 0 or not line[:cut].strip():
        return None
    return line[:cut].strip(), _value(line[cut + 1 :])


class _Reader:
    """One file, line by line: ``found`` holds the kept entries."""

    def __init__(self, path: str, keep: Keep) -> None:
        self.path, self.keep = path, keep
        self.found: Sections = {}
        self.section: str | None = None
        # The key a continuation line adds to; True: a key read, not kept.
        self.key: str | bool | None = None
        self.number = 0

    def refuse(self, reason: str, number: int | None = None) -> NoReturn:
        raise exception.ConfigDataRefused(
            path=self.path, line=self.number if number is None else number, reason=reason
        )

    def line(self, line: str) -> None:
        if not line or line[0] in "#;":
            self.key = None
        elif line[0] in " \t":
            self.continuation(line.lstrip())
        elif line[0] == "[":
            match = _SECTION.fullmatch(line)
            if match is None:
                self.refuse("not a section header ([name])")
            self.section, self.key = match.group(1), None
        else:
            self.assignment(line)

    def continuation(self, text: str) -> None:
        if self.key is None:
            self.refuse("a continuation line without a key above it")
        if isinstance(self.key, str) and self.section is not None:
            self.found[self.section][self.key] += "\n" + text

    def assignment(self, line: str) -> None:
        parsed = _assignment(line)
        if parsed is None:
            self.refuse("neither a section, a comment nor 'key = value'")
        if self.section is None:
            self.refuse("an option outside any section")
        name, value = parsed
        if not self.keep(self.section, name):
            self.key = True  # read, not kept
            return
        entries = self.found.setdefault(self.section, {})
        if name in entries:
            self.refuse(f"[{self.section}] {name} given twice")
        entries[name], self.key = value, name

    def check_values(self) -> None:
        for section, entries in self.found.items():
            for name, value in entries.items():
                if "$" in value:
                    self.refuse(
                        f"[{section}] {name} holds a '$' (no substitution is made here)", number=0
                    )


def read(path: str, keep: Keep = _any_key) -> Sections:
    """``{section: {key: value}}`` of the entries ``keep(section, key)``
    accepts; every line of the file must parse."""
    reader = _Reader(path, keep)
    for reader.number, line in enumerate(_text(path).splitlines(), start=1):
        reader.line(line.rstrip())
    reader.check_values()
    return reader.found


def conf_files(files: Iterable[str], dirs: Iterable[str]) -> list[str]:
    """The files in the order oslo.config reads them: each file, then each
    directory's ``*.conf`` by name."""
    ordered = list(files)
    for directory in dirs:
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(".conf"))
        except OSError as exc:
            raise exception.ConfigDataRefused(path=directory, line=0, reason=_reason(exc)) from None
        ordered.extend(os.path.join(directory, n) for n in names)
    return ordered


def merged(paths: Iterable[str], keep: Keep) -> Sections:
    """The kept entries of several files, a later file's value winning."""
    result: Sections = {}
    for path in paths:
        for section, entries in read(path, keep).items():
            result.setdefault(section, {}).update(entries)
    return result


def as_ini(sections: Sections) -> str:
    """Text oslo.config parses back to the same values."""
    lines = []
    for section, entries in sections.items():
        lines.append(f"[{section}]")
        for key, value in entries.items():
            lines.append(f"{key} = {value}".replace("\n", "\n    "))
    return "\n".join(lines) + "\n"
