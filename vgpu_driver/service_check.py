"""What nova-compute needs beside the GPUs, checked for ``host check``:
libvirt, the sudo rule of the privileged helpers, the state directory and
Placement.

Pure: :mod:`vgpu_driver.host_probe` reads the facts; each check turns them
into :class:`Finding` lines that name the option or command that fixes
what is wrong.
"""

from __future__ import annotations

import dataclasses
import stat

OK, WARNING, ERROR = "ok", "warning", "error"
# What production.rst asks of the state directory.
STATE_DIR_MODE = 0o750
SUDOERS_MODE = 0o440


@dataclasses.dataclass(frozen=True)
class Finding:
    """One line of ``host check``: a check's name, ok/warning/error, what
    was found and what to do."""

    check: str
    level: str
    message: str
    fix: str = ""


@dataclasses.dataclass(frozen=True)
class Reached:
    """A service asked once: ``error`` is None when it answered."""

    target: str
    error: str | None = None
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class RootOnlyFile:
    """A file install-units renders that its reader takes only as root's:
    the sudo rule (sudo wants it root's, 0440) and the helper's own file
    (``/etc/vgpu-driver/privsep.conf``, which the sudo rule names: the
    helper reads it as root and refuses it unless only root can change it)."""

    check: str  # the finding's name
    path: str
    noun: str  # "rule", "file": "the rule cannot be rendered"
    missing: str  # what its absence stops
    expected: str | None = None  # what install-units renders; None: not rendered
    actual: str | None = None  # the installed text; None: absent or unreadable
    unreadable: str | None = None
    refused: tuple[str, ...] = ()  # (message, fix) when its reader refuses it as it is
    render_error: str | None = None
    not_needed: str | None = None  # why no privileged helper is started by sudo
    settings: str = ""  # the values it was rendered with, for the message


def sudoers_refused(path: str, mode: int, owner_uid: int) -> tuple[str, ...]:
    """``RootOnlyFile.refused`` of a sudo rule of this mode and owner."""
    if owner_uid == 0 and mode == SUDOERS_MODE:
        return ()
    return (
        f"{path} is mode {mode:04o}, owner uid {owner_uid}: sudo needs root's, 0440",
        f"chown root:root {path}; chmod 0440 {path}",
    )


def helper_conf_refused(path: str, changeable: tuple[str, ...]) -> tuple[str, ...]:
    """``RootOnlyFile.refused`` of the helper's file, given what others
    could change (:func:`vgpu_driver.root_only.problems`)."""
    if not changeable:
        return ()
    return (
        f"the privileged helper refuses {path}: {'; '.join(changeable)}",
        "chown root:root and chmod go-w what is named",
    )


@dataclasses.dataclass(frozen=True)
class StateDir:
    path: str
    user: str
    user_uid: int | None  # None: no such user
    exists: bool = False
    is_dir: bool = False
    owner_uid: int | None = None
    mode: int | None = None


@dataclasses.dataclass(frozen=True)
class ServiceFacts:
    libvirt: Reached
    sudo: RootOnlyFile
    helper_conf: RootOnlyFile
    state_dir: StateDir
    placement: Reached | None  # None: no Placement configured


def check(facts: ServiceFacts) -> list[Finding]:
    return [
        check_libvirt(facts.libvirt),
        check_root_only_file(facts.sudo),
        check_root_only_file(facts.helper_conf),
        check_state_dir(facts.state_dir),
        check_placement(facts.placement),
    ]


def check_libvirt(reached: Reached) -> Finding:
    if reached.error is None:
        return Finding("libvirt", OK, f"libvirt {reached.detail} answers at {reached.target}")
    return Finding(
        "libvirt",
        ERROR,
        f"cannot reach libvirt at {reached.target}: {reached.error}",
        "start libvirtd (systemctl start libvirtd), or set "
        "[vgpu] libvirt_uri (--libvirt-uri) to the URI nova-compute uses",
    )


def check_root_only_file(found: RootOnlyFile) -> Finding:
    """The file is installed, as its reader takes it, and what
    install-units renders: otherwise the privileged helpers do not start."""
    install = "vgpu-manage --config-file <nova-compute's files> install-units"
    if found.not_needed:
        return Finding(found.check, OK, f"not used: {found.not_needed}")
    if found.render_error:
        return Finding(
            found.check,
            ERROR,
            f"the {found.noun} cannot be rendered: {found.render_error}",
            "give host check nova-compute's files "
            "(--config-file) and its --user, --bin-dir and --tmpdir",
        )
    if found.refused:
        return Finding(found.check, ERROR, *found.refused)
    if found.unreadable:
        return Finding(
            found.check,
            WARNING,
            f"{found.path} cannot be read ({found.unreadable})",
            "run host check as root",
        )
    if found.actual is None:
        return Finding(found.check, ERROR, f"{found.path} is missing, so {found.missing}", install)
    if found.actual != found.expected:
        return Finding(
            found.check,
            ERROR,
            f"{found.path} differs from what install-units renders for {found.settings}",
            f"{install} --force (with nova-compute's --user, --bin-dir and --tmpdir)",
        )
    return Finding(
        found.check, OK, f"{found.path} matches what install-units renders for {found.settings}"
    )


def check_state_dir(state: StateDir) -> Finding:
    """The state directory as production.rst asks: nova's user's, 0750."""
    make = f"install -d -o {state.user} -g {state.user} -m 0750 {state.path}"
    if state.user_uid is None:
        return Finding(
            "state-dir",
            ERROR,
            f"no user {state.user} on this host",
            "give host check --user: the user nova-compute runs as",
        )
    if not state.exists or state.mode is None:  # a mode is read with the directory
        return Finding("state-dir", ERROR, f"[vgpu] state_dir {state.path} does not exist", make)
    if not state.is_dir:
        return Finding(
            "state-dir",
            ERROR,
            f"[vgpu] state_dir {state.path} is not a directory",
            f"set [vgpu] state_dir to a directory, or remove it and: {make}",
        )
    if state.owner_uid != state.user_uid:
        return Finding(
            "state-dir",
            ERROR,
            f"{state.path} is owned by uid {state.owner_uid}, not by {state.user}",
            f"chown {state.user}:{state.user} {state.path}",
        )
    if state.mode & (stat.S_IWGRP | stat.S_IWOTH):
        return Finding(
            "state-dir",
            ERROR,
            f"{state.path} is mode {state.mode:04o}: others may write the claims journal",
            f"chmod 0750 {state.path}",
        )
    if state.mode != STATE_DIR_MODE:
        return Finding(
            "state-dir",
            WARNING,
            f"{state.path} is mode {state.mode:04o}, not 0750",
            f"chmod 0750 {state.path}",
        )
    return Finding("state-dir", OK, f"{state.path}: {state.user}'s, mode 0750")


def check_placement(reached: Reached | None) -> Finding:
    if reached is None:
        return Finding(
            "placement",
            WARNING,
            "not checked: no Placement is configured (no [placement] auth_type, no OS_* variables)",
            "set [placement] as for nova-compute (auth_type, auth_url, username, ...) to check it",
        )
    if reached.error is None:
        return Finding("placement", OK, f"Placement answers at {reached.target}")
    return Finding(
        "placement",
        ERROR,
        f"Placement does not answer: {reached.error}",
        "check the [placement] options and that Placement is up",
    )
