"""The files a compute host needs beside the package, with its own paths.

nova-compute must run as ``vgpu-nova-compute`` (a systemd drop-in), SR-IOV
boards need their VFs enabled at boot (a unit), the privileged helper
starts through sudo (a sudoers rule) with a root-owned file of its own
(``privsep.conf``), and ``vgpu-manage metrics serve`` may answer
Prometheus (a unit, enabled by the operator).  Each names absolute
paths (where pip put the scripts, nova-compute's configuration files,
Python's temporary directory) and the sudo rule must match oslo.privsep's
command exactly, so they are rendered from templates
(``vgpu_driver/templates``) rather than copied and edited by hand.  The
examples in ``etc/`` are these templates rendered with :data:`EXAMPLE` (a
test keeps them so).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import os
import re
import string
import sys
from typing import TYPE_CHECKING

from vgpu_driver import exception

if TYPE_CHECKING:
    from oslo_config import cfg

SUDOERS = "etc/sudoers.d/vgpu-driver"
SRIOV_UNIT = "etc/systemd/system/vgpu-driver-sriov.service"
COMPUTE_DROPIN = "etc/systemd/system/nova-compute.service.d/vgpu-driver.conf"
METRICS_UNIT = "etc/systemd/system/vgpu-driver-metrics.service"
PRIVSEP_CONF = "etc/vgpu-driver/privsep.conf"

# The scripts the files run, which must be in ``bin_dir``.
SCRIPTS = ("vgpu-privsep-helper", "vgpu-manage", "vgpu-nova-compute")

_USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# What a path may hold to be written into a unit's command line and into
# sudo's regular expression unquoted.
_PATH = re.compile(r"/[A-Za-z0-9._/+-]*")


@dataclasses.dataclass(frozen=True)
class HostFile:
    path: str  # relative to the root it is installed under
    mode: int
    text: str


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the files name: see :func:`check`."""

    bin_dir: str
    user: str
    config_files: tuple[str, ...]
    config_dirs: tuple[str, ...] = ()
    tmpdir: str = "/tmp"
    # NVIDIA's sriov-manage ([vgpu] sriov_manage_path), which the SR-IOV
    # unit's vgpu-manage runs as root; None where the configuration has none.
    sriov_manage_path: str | None = None


EXAMPLE = Settings(bin_dir="/usr/bin", user="nova", config_files=("/etc/nova/nova.conf",))


def settings_for(
    conf: cfg.ConfigOpts, user: str, bin_dir: str | None = None, tmpdir: str = "/tmp"
) -> Settings:
    """The settings of the files for the configuration ``conf`` was read
    from: its files and directory, as absolute paths; ``bin_dir`` defaults
    to the running command's directory (pip puts the scripts together);
    ``tmpdir`` loses a trailing "/", as Python's tempfile drops it."""
    if tmpdir.startswith("/"):
        tmpdir = tmpdir.rstrip("/") or "/"
    return Settings(
        bin_dir=bin_dir or default_bin_dir(),
        user=user,
        config_files=tuple(os.path.abspath(f) for f in conf.config_file or ()),
        config_dirs=(os.path.abspath(conf.config_dir),) if conf.config_dir else (),
        tmpdir=tmpdir,
        sriov_manage_path=conf.vgpu.sriov_manage_path,
    )


def default_bin_dir() -> str:
    """The directory of the running command (pip put the others beside it)."""
    return os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv[0] else "/usr/bin"


def check(settings: Settings) -> None:
    """Refuse settings the files cannot carry; nothing is rendered before."""
    if not _USER.fullmatch(settings.user):
        raise exception.InvalidOption(
            option="--user",
            value=settings.user,
            reason="not a user name (lower-case letters, digits, _ and -, at most 32)",
        )
    if not settings.config_files:
        raise exception.InvalidOption(
            option="--config-file",
            value="",
            reason="name nova-compute's configuration files (vgpu-manage --config-file F)",
        )
    for option, paths in (
        ("--bin-dir", (settings.bin_dir,)),
        ("--tmpdir", (settings.tmpdir,)),
        ("--config-file", settings.config_files),
        ("--config-dir", settings.config_dirs),
    ):
        for path in paths:
            if not _PATH.fullmatch(path) or "/../" in f"{path}/" or "//" in path:
                raise exception.InvalidOption(
                    option=option,
                    value=path,
                    reason="not an absolute, normalised path of letters, digits and "
                    "._/+- only (it goes into a command line and a sudo rule)",
                )


def _config_args(settings: Settings) -> list[str]:
    return [f"--config-file {f}" for f in settings.config_files] + [
        f"--config-dir {d}" for d in settings.config_dirs
    ]


def _template(name: str) -> string.Template:
    return string.Template(
        importlib.resources.files("vgpu_driver.templates")
        .joinpath(name)
        .read_text(encoding="utf-8")
    )


def render(settings: Settings) -> list[HostFile]:
    """The five files, as :class:`HostFile`, the sudo rule first (checked
    settings only)."""
    check(settings)
    args = " ".join(_config_args(settings))
    values = {
        "bin_dir": settings.bin_dir,
        "user": settings.user,
        "config_args": args,
        "config_files": ",".join(settings.config_files),
        "config_dirs": "".join(f" {d}" for d in settings.config_dirs[:1])
        + "".join(f",{d}" for d in settings.config_dirs[1:]),
        "tmpdir": settings.tmpdir,
        # mkdtemp() joins the directory and the name: "/" + "tmp..."
        "tmpdir_regex": _sudo_regex(settings.tmpdir.rstrip("/")),
    }
    return [
        HostFile(SUDOERS, 0o440, _template("sudoers.tmpl").substitute(values)),
        HostFile(PRIVSEP_CONF, 0o644, _template("privsep.conf.tmpl").substitute(values)),
        HostFile(SRIOV_UNIT, 0o644, _template("vgpu-driver-sriov.service.tmpl").substitute(values)),
        HostFile(
            COMPUTE_DROPIN, 0o644, _template("nova-compute-dropin.conf.tmpl").substitute(values)
        ),
        HostFile(
            METRICS_UNIT, 0o644, _template("vgpu-driver-metrics.service.tmpl").substitute(values)
        ),
    ]


def _sudo_regex(text: str) -> str:
    """``text`` as a literal in sudo's regular expressions (paths hold only
    the characters :func:`check` allows: ``.`` and ``+`` need escaping)."""
    return re.sub(r"([.+])", r"\\\1", text)


def root_reads(settings: Settings) -> list[str]:
    """What root runs or reads because of these files, which only root may
    be able to change: the scripts (the helper's through sudo, vgpu-manage
    as the SR-IOV unit, and NVIDIA's sriov-manage, which that unit runs) and
    the configuration the SR-IOV unit reads as root.  The helper's own file
    is written by install-units."""
    paths = [os.path.join(settings.bin_dir, s) for s in SCRIPTS]
    if settings.sriov_manage_path:
        paths.append(settings.sriov_manage_path)
    paths += list(settings.config_files) + list(settings.config_dirs)
    for directory in settings.config_dirs:
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            continue
        paths += [os.path.join(directory, n) for n in names if n.endswith(".conf")]
    return paths


def missing_scripts(bin_dir: str) -> list[str]:
    """The scripts the files run that ``bin_dir`` lacks."""
    return [s for s in SCRIPTS if not os.access(os.path.join(bin_dir, s), os.X_OK)]
