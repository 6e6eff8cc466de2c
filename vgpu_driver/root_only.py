"""Whether only root can change what a path leads to.

A file root runs or reads is as safe as the least guarded of: the file,
every directory from ``/`` down to it, every link on the way and whatever
each link leads to.  Anyone who owns one of them, or may write one
(group- or other-writable), can put another file in its place.  A
directory root owns with the sticky bit (``/tmp``) is the exception: in it
others may add names but not rename or remove root's.  Links themselves
have no mode that matters, but an owner: in a sticky directory the link's
owner may replace it (``fs.protected_symlinks`` may stop root following
it, but is a setting, not a promise), so a link on the way must be root's.
"""

from __future__ import annotations

import os
import pwd
import stat

MAX_LINKS = 40


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _problem(path: str, st: os.stat_result) -> str | None:
    """Why ``path`` (``lstat`` ``st``) is not root's alone, or None."""
    if stat.S_ISLNK(st.st_mode):
        if st.st_uid == 0:
            return None
        return (
            f"{path} (a link owned by {_owner(st.st_uid)}) can be changed by another user than root"
        )
    writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_uid == 0 and (not writable or sticky_dir):
        return None
    return (
        f"{path} (owner {_owner(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):04o}) "
        "can be changed by another user than root"
    )


def walk(path: str) -> list[tuple[str, os.stat_result]]:
    """``[(path, lstat)]`` of everything that decides what ``path`` is,
    links followed by hand (each link listed too); the first missing
    component ends the walk."""
    if not path.startswith("/"):
        path = os.path.join(os.getcwd(), path)  # not abspath: ".." after a link
    found = [("/", os.lstat("/"))]
    current, pending, links = "/", [p for p in path.split("/") if p], 0
    while pending:
        name = pending.pop(0)
        if name == ".":
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        try:
            st = os.lstat(candidate)
        except FileNotFoundError:
            break
        if stat.S_ISLNK(st.st_mode):
            found.append((candidate, st))
            links += 1
            if links > MAX_LINKS:
                raise OSError(f"{path}: too many links")
            target = os.readlink(candidate)
            pending = [p for p in target.split("/") if p] + pending
            if target.startswith("/"):
                current = "/"
            continue
        found.append((candidate, st))
        current = candidate
    return found


def problems(path: str) -> list[str]:
    """Each component of ``path`` another user than root can change."""
    seen: list[str] = []
    for each, st in walk(path):
        problem = _problem(each, st)
        if problem is not None and problem not in seen:
            seen.append(problem)
    return seen


def interpreter_paths(script: str) -> list[str]:
    """The absolute paths of a script's ``#!`` line, and of the
    interpreter of pip's ``#!/bin/sh`` trampoline (``'''exec' PYTHON``),
    written for interpreter paths a ``#!`` line cannot hold."""
    try:
        with open(script, "rb") as f:
            head = f.read(4096).decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    if not head or not head[0].startswith("#!"):
        return []
    words = head[0][2:].split()
    if words[:1] == ["/bin/sh"] and len(head) > 1 and head[1].startswith("'''exec' "):
        words += head[1].split()[1:2]
    return [w.strip("'\"") for w in words if w.strip("'\"").startswith("/")]
