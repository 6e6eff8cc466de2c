"""``install-units``: the systemd units, the sudo rule and the helper's file,
with this host's paths.

The files name nova-compute's configuration files (vgpu-manage's own
``--config-file``, which must be the ones nova-compute reads), where pip put
the scripts (this environment's ``bin/`` by default) and nova's user, who
must exist.  Before anything is written: the sudo rule is checked with
``visudo -c``, and everything root will run or read because of these files
(the scripts, each path of their ``#!`` line, the configuration the SR-IOV
unit reads, the directories the files go to, and every directory above
them) must be changeable by root alone.  A file already there with other
contents is replaced only with ``--force``.  Directories are made 0755
whatever the umask.
"""

import os
import pwd
import shutil
import stat
import subprocess
import tempfile

from vgpu_driver import exception
from vgpu_driver import host_files
from vgpu_driver import root_only
from vgpu_driver.cmd import base

COLUMNS = ("path", "mode", "result")
DIRECTORY_MODE = 0o755
NEXT_STEPS = (
    "systemctl daemon-reload; systemctl enable vgpu-driver-sriov.service; "
    "systemctl restart nova-compute (and, to answer Prometheus' scrapes: "
    "systemctl enable --now vgpu-driver-metrics.service)"
)


class InstallUnits(base.Lister):
    """Write the systemd units and the sudo rule for this host; list what was written."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "--root",
            default="/",
            help="Install under this directory instead of / (an image being built); it must exist.",
        )
        parser.add_argument(
            "--user",
            default="nova",
            help="The user nova-compute runs as (default: nova); it must "
            "exist (in --root's etc/passwd with --root).",
        )
        parser.add_argument(
            "--bin-dir",
            default=None,
            help="Where vgpu-privsep-helper, vgpu-manage and vgpu-nova-compute "
            "are (default: the directory of this vgpu-manage).",
        )
        parser.add_argument(
            "--tmpdir",
            default="/tmp",
            help="nova-compute's temporary directory, where oslo.privsep "
            "makes its socket (default: /tmp, TMPDIR unset); a trailing "
            "/ is dropped, as Python's tempfile drops it.",
        )
        parser.add_argument(
            "--force", action="store_true", help="Replace files that are there with other contents."
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="List what would be written, and write nothing."
        )
        return parser

    def take_action(self, parsed_args):
        settings = self._settings(parsed_args)
        files = host_files.render(settings)
        root = parsed_args.root
        if not os.path.isdir(root):
            raise exception.InstallFilesRefused(reason=f"--root {root} is not a directory")
        _check_user(root, settings.user)
        missing = host_files.missing_scripts(settings.bin_dir)
        if missing:
            raise exception.InstallFilesRefused(
                reason=f"{settings.bin_dir} has no {', '.join(missing)} (give --bin-dir, "
                f"the bin/ of the environment nova and vgpu-driver are in)"
            )
        _check_root_only(
            host_files.root_reads(settings)
            + [os.path.dirname(os.path.join(root, f.path)) for f in files]
        )
        plan = [
            (f, os.path.join(root, f.path), _result(os.path.join(root, f.path), f)) for f in files
        ]
        replaced = [target for _f, target, result in plan if result == "replaced"]
        if replaced and not parsed_args.force:
            verb = "differs" if len(replaced) == 1 else "differ"
            raise exception.InstallFilesRefused(
                reason=f"{', '.join(replaced)} {verb} from what would be written (--force "
                f"replaces them)"
            )
        _check_sudoers(files[0])
        rows = []
        for file, target, result in plan:
            if parsed_args.dry_run:
                result = f"would be {result}"
            elif result != "unchanged":
                _write(target, file)
            rows.append((target, f"{file.mode:04o}", result))
        if not parsed_args.dry_run:
            self.app.stderr.write(f"then: {NEXT_STEPS}\n")
        return COLUMNS, rows

    def _settings(self, parsed_args):
        return host_files.settings_for(
            self.app.conf, parsed_args.user, parsed_args.bin_dir, parsed_args.tmpdir
        )


def _check_user(root, user):
    """The user must exist where the files are used: this host, or the
    ``/etc/passwd`` of the tree under ``--root``."""
    if os.path.realpath(root) == "/":
        try:
            pwd.getpwnam(user)
            return
        except KeyError:
            pass
    else:
        try:
            with open(os.path.join(root, "etc", "passwd"), encoding="utf-8") as f:
                if any(line.split(":", 1)[0] == user for line in f):
                    return
        except OSError:
            pass
    raise exception.InvalidOption(
        option="--user", value=user, reason=f"no such user in {os.path.join(root, 'etc/passwd')}"
    )


def _check_root_only(paths):
    """Refuse when another user than root can change what root will run or
    read: each path, the paths of its ``#!`` line, their directories."""
    found = []
    for path in paths:
        for each in [path] + root_only.interpreter_paths(path):
            found += [p for p in root_only.problems(each) if p not in found]
    if found:
        raise exception.InstallFilesRefused(
            reason="root would run or read what another user can replace: "
            + "; ".join(found)
            + " (install vgpu-driver's environment and configuration as root, "
            "writable by root alone)"
        )


def _result(target, file):
    """ "unchanged" only for a root-owned regular file with the text and mode
    it would get: another owner could edit what root runs or sudo reads."""
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return "written"
    if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or stat.S_IMODE(st.st_mode) != file.mode:
        return "replaced"
    with open(target, encoding="utf-8", errors="replace") as current:
        return "unchanged" if current.read() == file.text else "replaced"


def _check_sudoers(file):
    """sudo's own parser accepts the rule, before anything is written."""
    visudo = shutil.which("visudo") or next(
        (p for p in ("/usr/sbin/visudo", "/sbin/visudo") if os.access(p, os.X_OK)), None
    )
    if visudo is None:
        raise exception.InstallFilesRefused(
            reason="visudo is not installed, so the sudo rule "
            "cannot be checked (install sudo first)"
        )
    with tempfile.NamedTemporaryFile("w", suffix=".sudoers", encoding="utf-8") as draft:
        draft.write(file.text)
        draft.flush()
        checked = subprocess.run(
            [visudo, "-c", "-q", "-f", draft.name], capture_output=True, text=True, check=False
        )
    if checked.returncode != 0:
        detail = " ".join((checked.stderr or checked.stdout).split())
        raise exception.InstallFilesRefused(reason=f"visudo refused the sudo rule: {detail}")


def _write(target, file):
    """Whole or not at all: a new file beside it, renamed over it."""
    directory = os.path.dirname(target)
    _make_directories(directory)
    descriptor, draft = tempfile.mkstemp(dir=directory, prefix=".vgpu-driver.")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as out:
            out.write(file.text)
        os.chmod(draft, file.mode)
        os.replace(draft, target)
    except BaseException:
        if os.path.exists(draft):
            os.unlink(draft)
        raise


def _make_directories(directory):
    """``directory`` and its missing parents, each 0755 whatever the umask."""
    missing = []
    while not os.path.isdir(directory):
        missing.append(directory)
        directory = os.path.dirname(directory)
    for each in reversed(missing):
        os.mkdir(each, DIRECTORY_MODE)
        os.chmod(each, DIRECTORY_MODE)
