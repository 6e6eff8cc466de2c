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
class SudoRule:
    path: str
    expected: str | None = None     # what install-units renders; None: not rendered
    actual: str | None = None       # the installed text; None: absent or unreadable
    unreadable: str | None = None
    mode: int | None = None
    owner_uid: int | None = None
    render_error: str | None = None
    not_needed: str | None = None   # why no sudo rule is used
    settings: str = ""              # the values it was rendered with, for the message


@dataclasses.dataclass(frozen=True)
class HelperConf:
    """The helper's own file (``/etc/vgpu-driver/privsep.conf``), which the
    sudo rule names: the helper reads it as root, and refuses it unless
    only root can change it."""

    path: str
    expected: str | None = None     # what install-units renders
    actual: str | None = None       # the installed text; None: absent or unreadable
    unreadable: str | None = None
    changeable: tuple[str, ...] = ()    # root_only.problems of the path
    render_error: str | None = None
    not_needed: str | None = None   # why no privileged helper is started by sudo
    settings: str = ""


@dataclasses.dataclass(frozen=True)
class StateDir:
    path: str
    user: str
    user_uid: int | None            # None: no such user
    exists: bool = False
    is_dir: bool = False
    owner_uid: int | None = None
    mode: int | None = None


@dataclasses.dataclass(frozen=True)
class ServiceFacts:
    libvirt: Reached
    sudo: SudoRule
    helper_conf: HelperConf
    state_dir: StateDir
    placement: Reached | None       # None: no Placement configured


def check(facts: ServiceFacts) -> list[Finding]:
    return [check_libvirt(facts.libvirt), check_sudo_rule(facts.sudo),
            check_helper_conf(facts.helper_conf), check_state_dir(facts.state_dir),
            check_placement(facts.placement)]


def check_libvirt(reached: Reached) -> Finding:
    if reached.error is None:
        return Finding("libvirt", OK, f"libvirt {reached.detail} answers at {reached.target}")
    return Finding("libvirt", ERROR, f"cannot reach libvirt at {reached.target}: "
                   f"{reached.error}", "start libvirtd (systemctl start libvirtd), or set "
                   "[vgpu] libvirt_uri (--libvirt-uri) to the URI nova-compute uses")


def check_sudo_rule(rule: SudoRule) -> Finding:
    """The rule is installed, root's, 0440, and what install-units renders."""
    install = "vgpu-manage --config-file <nova-compute's files> install-units"
    if rule.not_needed:
        return Finding("sudo-rule", OK, f"not used: {rule.not_needed}")
    if rule.render_error:
        return Finding("sudo-rule", ERROR, f"the rule cannot be rendered: {rule.render_error}",
                       "give host check nova-compute's files (--config-file) and its "
                       "--user, --bin-dir and --tmpdir")
    if rule.unreadable:
        return Finding("sudo-rule", WARNING, f"{rule.path} cannot be read "
                       f"({rule.unreadable})", "run host check as root")
    if rule.actual is None:
        return Finding("sudo-rule", ERROR, f"{rule.path} is missing, so nova-compute cannot "
                       "start its privileged helpers", install)
    if rule.owner_uid != 0 or rule.mode != SUDOERS_MODE:
        return Finding("sudo-rule", ERROR, f"{rule.path} is mode {rule.mode:04o}, owner uid "
                       f"{rule.owner_uid}: sudo needs root's, 0440",
                       f"chown root:root {rule.path}; chmod 0440 {rule.path}")
    if rule.actual != rule.expected:
        return Finding("sudo-rule", ERROR, f"{rule.path} differs from what install-units "
                       f"renders for {rule.settings}", f"{install} --force (with nova-compute's "
                       "--user, --bin-dir and --tmpdir)")
    return Finding("sudo-rule", OK, f"{rule.path} matches what install-units renders for "
                   f"{rule.settings}")


def check_helper_conf(conf: HelperConf) -> Finding:
    """The helper's file is installed, root's alone, and what install-units
    renders: the helper refuses to start otherwise, and so does every write."""
    install = "vgpu-manage --config-file <nova-compute's files> install-units"
    if conf.not_needed:
        return Finding("helper-conf", OK, f"not used: {conf.not_needed}")
    if conf.render_error:
        return Finding("helper-conf", ERROR, f"the file cannot be rendered: "
                       f"{conf.render_error}", "give host check nova-compute's files "
                       "(--config-file) and its --user, --bin-dir and --tmpdir")
    if conf.changeable:
        return Finding("helper-conf", ERROR, f"the privileged helper refuses {conf.path}: "
                       f"{'; '.join(conf.changeable)}",
                       "chown root:root and chmod go-w what is named")
    if conf.unreadable:
        return Finding("helper-conf", WARNING, f"{conf.path} cannot be read "
                       f"({conf.unreadable})", "run host check as root")
    if conf.actual is None:
        return Finding("helper-conf", ERROR, f"{conf.path} is missing, so the privileged "
                       "helper cannot start", install)
    if conf.actual != conf.expected:
        return Finding("helper-conf", ERROR, f"{conf.path} differs from what install-units "
                       f"renders for {conf.settings}", f"{install} --force (with "
                       "nova-compute's --user, --bin-dir and --tmpdir)")
    return Finding("helper-conf", OK, f"{conf.path} matches what install-units renders for "
                   f"{conf.settings}")


def check_state_dir(state: StateDir) -> Finding:
    """The state directory as production.rst asks: nova's user's, 0750."""
    make = f"install -d -o {state.user} -g {state.user} -m 0750 {state.path}"
    if state.user_uid is None:
        return Finding("state-dir", ERROR, f"no user {state.user} on this host",
                       "give host check --user: the user nova-compute runs as")
    if not state.exists or state.mode is None:     # a mode is read with the directory
        return Finding("state-dir", ERROR, f"[vgpu] state_dir {state.path} does not exist",
                       make)
    if not state.is_dir:
        return Finding("state-dir", ERROR, f"[vgpu] state_dir {state.path} is not a "
                       "directory", f"set [vgpu] state_dir to a directory, or remove it and: "
                       f"{make}")
    if state.owner_uid != state.user_uid:
        return Finding("state-dir", ERROR, f"{state.path} is owned by uid {state.owner_uid}, "
                       f"not by {state.user}", f"chown {state.user}:{state.user} {state.path}")
    if state.mode & (stat.S_IWGRP | stat.S_IWOTH):
        return Finding("state-dir", ERROR, f"{state.path} is mode {state.mode:04o}: others "
                       "may write the claims journal", f"chmod 0750 {state.path}")
    if state.mode != STATE_DIR_MODE:
        return Finding("state-dir", WARNING, f"{state.path} is mode {state.mode:04o}, not "
                       "0750", f"chmod 0750 {state.path}")
    return Finding("state-dir", OK, f"{state.path}: {state.user}'s, mode 0750")


def check_placement(reached: Reached | None) -> Finding:
    if reached is None:
        return Finding("placement", WARNING, "not checked: no Placement is configured (no "
                       "[placement] auth_type, no OS_* variables)", "set [placement] as for "
                       "nova-compute (auth_type, auth_url, username, ...) to check it")
    if reached.error is None:
        return Finding("placement", OK, f"Placement answers at {reached.target}")
    return Finding("placement", ERROR, f"Placement does not answer: {reached.error}",
                   "check the [placement] options and that Placement is up")
