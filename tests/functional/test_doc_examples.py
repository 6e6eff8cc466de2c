"""Every console example in the docs runs, and prints what the page shows.

Each ``.. code-block:: console`` block of ``doc/source`` says where it runs
in the comment just above it, ``.. example: <setup>``:

``demo``
    the commands the demo runs itself (``vgpu-manage --config-file
    /dev/null demo``): the page shows a part of its transcript, and the
    test runs the demo and finds that part in it;
``a100-vfs-off``, ``a100-guest-and-claim``, ``l40s-mixed``, ``l40s-pool``
    a fake host (the fake kernel's ``a100-sriov`` profile, or for
    ``l40s-mixed`` and ``l40s-pool`` its ``l40s-vfio`` one) in a working directory, with
    ``nova.conf``, ``sys`` and ``state`` there; the commands run there as an
    operator would type them.  One that names no
    ``--config-file`` runs as on a host, the directory's files standing for
    ``/etc/nova/nova.conf``, ``/sys`` and the state directory, and
    libvirt's test driver for the host's libvirt.

Output is compared exactly, once both sides' UUIDs are numbered in order of
appearance (kept 36 characters wide, so tables keep their layout), the
temporary paths put back, and the seconds and milliseconds of timings
masked.  A console block with a ``$ vgpu-manage`` command and without its
setup comment fails the test; blocks of root's install steps (``# ...``)
are not examples.
"""

import dataclasses
import os
import pathlib
import re
import shlex
import subprocess
import sys
import uuid

import pytest

from tests import libvirt_domains
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import discovery
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

DOC = pathlib.Path(__file__).resolve().parents[2] / "doc" / "source"
SETUP = re.compile(r"^\.\. example: (\S+)\s*$")
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
TIMINGS = (
    re.compile(r"\b\d+s ago\b"),
    re.compile(r"\bin \d+ ms\b"),
    re.compile(r"\(\d+(\.\d+)? s\)"),
)
A100 = "0000:41:00.0"


@dataclasses.dataclass(frozen=True)
class Command:
    line: str  # as typed, continuation lines joined
    expected: str  # what the page shows after it


@dataclasses.dataclass(frozen=True)
class Example:
    page: str
    line: int
    setup: str | None
    commands: tuple[Command, ...]

    def __str__(self):
        return f"{self.page}:{self.line}"


def _block(lines, start):
    """The indented lines of the block whose directive is at ``start``."""
    body = []
    for line in lines[start + 1 :]:
        if line.strip() and not line.startswith(" "):
            break
        body.append(line)
    while body and not body[-1].strip():
        body.pop()
    while body and not body[0].strip():
        body.pop(0)
    indent = min(len(line) - len(line.lstrip()) for line in body if line.strip())
    return [line[indent:] for line in body]


def _commands(body):
    commands, typed, output = [], None, []
    lines = iter(body)
    for line in lines:
        if line.startswith("$ "):
            if typed is not None:
                commands.append(Command(typed, "\n".join(output).strip("\n")))
            typed, output = line[2:], []
            while typed.endswith("\\"):
                typed = typed[:-1].rstrip() + " " + next(lines).strip()
        elif typed is not None:
            output.append(line)
    if typed is not None:
        commands.append(Command(typed, "\n".join(output).strip("\n")))
    return tuple(commands)


def examples():
    found = []
    for page in sorted(DOC.rglob("*.rst")):
        lines = page.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.strip() != ".. code-block:: console":
                continue
            commands = _commands(_block(lines, number))
            if not commands:
                continue
            above = [text for text in lines[max(number - 3, 0) : number] if text.strip()]
            setup = SETUP.match(above[-1]) if above else None
            found.append(
                Example(
                    str(page.relative_to(DOC)),
                    number + 1,
                    setup.group(1) if setup else None,
                    commands,
                )
            )
    return found


def normalise(text, paths):
    """UUIDs numbered in order of appearance, paths and timings masked."""
    for real, shown in paths.items():
        text = text.replace(real, shown)
    numbers = {}

    def number(match):
        numbers.setdefault(match.group(0), len(numbers) + 1)
        return f"00000000-0000-0000-0000-{numbers[match.group(0)]:012d}"

    text = UUID.sub(number, text)
    for timing in TIMINGS:
        text = timing.sub("<time>", text)
    return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")


def vgpu_manage(args, cwd):
    result = subprocess.run(
        [sys.executable, "-m", "vgpu_driver.cmd.manage", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "250"},
    )
    return result.returncode, result.stderr + result.stdout


# -- setups ---------------------------------------------------------------------------------


def _a100_host(workdir, numvfs=16):
    profile = profiles.load("a100-sriov")
    kernel = fakekernel.FakeKernel.build(str(workdir / "sys"), profile)
    if not numvfs:
        kernel.set_vfs(A100, 0)
    (workdir / "nova.conf").write_text(
        "[devices]\nenabled_mdev_types = nvidia-468\n"
        f"[mdev_nvidia-468]\ndevice_addresses = {A100}\n"
    )
    return kernel


def setup_a100_vfs_off(workdir):
    _a100_host(workdir, numvfs=0)


def setup_a100_guest_and_claim(workdir):
    """One guest in a libvirt node file, one vGPU claimed for an instance
    still being built, as status.rst describes."""
    kernel = _a100_host(workdir)
    vfs = [p.name for p in discovery.discover(kernel).gpu(A100).parents]
    used, claimed = str(uuid.uuid4()), str(uuid.uuid4())
    kernel.create_mdev(vfs[0], "nvidia-468", used)
    kernel.create_mdev(vfs[1], "nvidia-468", claimed)
    journal = claims_journal.Journal(str(workdir / "state"))
    with journal.transaction() as txn:
        txn.add(
            str(uuid.uuid4()), claimed, A100, vfs[1], "nvidia-468", claims.CLAIMED, created=True
        )
    libvirt_domains.node_file(
        workdir / "node.xml",
        [libvirt_domains.domain_xml("instance-0000002a", [used], domain_uuid=str(uuid.uuid4()))],
    )


L40S = "0000:c1:00.0"
MIXED_GUESTS = (("0000:c1:00.4", 1155), ("0000:c1:00.5", 1157), ("0000:c1:00.6", 1156))


def _l40s_host(workdir, guests, mixed):
    """An L40S serving 4, 8, 12 and 24 GB with ``guests`` (``((VF, type
    number), ...)``, each in a domain of the node file), in mixed-size
    mode or as a type pool; the fake vendor driver answers NVML."""
    kernel = fakekernel.FakeKernel.build(str(workdir / "sys"), profiles.load("l40s-vfio"))
    if mixed:
        kernel.set_heterogeneous_mode(L40S, True)
    for vf, number in guests:
        kernel.set_vendor_vgpu_type(vf, number)
    groups = "".join(
        f"[mdev_nvidia-{n}]\ndevice_addresses = {L40S}\n" for n in (1155, 1156, 1157, 1159)
    )
    mode_line = "" if mixed else "shared_board_mode = pool\n"
    (workdir / "nova.conf").write_text(
        "[devices]\nenabled_mdev_types = nvidia-1155, nvidia-1156, nvidia-1157, nvidia-1159\n"
        f"{mode_line}{groups}[vgpu]\ntest_only_fake_sysfs_root = true\n"
        f"test_only_fake_nvml_host = {workdir / 'sys'}\n"
    )
    claims_journal.Journal(str(workdir / "state")).close()
    libvirt_domains.node_file(
        workdir / "node.xml",
        [
            libvirt_domains.domain_xml(
                f"instance-0000000{number}", vfs=[vf], domain_uuid=str(uuid.uuid4())
            )
            for number, (vf, _type) in enumerate(guests, 1)
        ],
    )


def setup_l40s_mixed(workdir):
    """An L40S in mixed-size mode with three guests (4, 12 and 8 GB), as
    mixed-size.rst describes."""
    _l40s_host(workdir, MIXED_GUESTS, mixed=True)


POOL_GUESTS = (("0000:c1:00.4", 1156), ("0000:c1:00.5", 1156))


def setup_l40s_pool(workdir):
    """An L40S in equal-size mode, a type pool, with two 8 GB guests, as
    type-pools.rst describes."""
    _l40s_host(workdir, POOL_GUESTS, mixed=False)


SETUPS = {
    "a100-vfs-off": setup_a100_vfs_off,
    "l40s-pool": setup_l40s_pool,
    "a100-guest-and-claim": setup_a100_guest_and_claim,
    "l40s-mixed": setup_l40s_mixed,
}
HOST_DEFAULTS = [
    "--config-file",
    "nova.conf",
    "--sysfs-root",
    "sys",
    "--state-dir",
    "state",
    "--nodename",
    "cn1",
]


def _argv(command, workdir):
    argv = shlex.split(command)
    assert argv[0] == "vgpu-manage", f"not a vgpu-manage command: {command}"
    argv = [re.sub(r"^test:///\S*node\.xml$", f"test://{workdir}/node.xml", a) for a in argv[1:]]
    if "--config-file" not in argv:
        argv = HOST_DEFAULTS + argv
    if "--libvirt-uri" not in argv:
        argv = ["--libvirt-uri", "test:///default"] + argv  # a host's, with no guest
    return argv


# -- the tests ------------------------------------------------------------------------------

EXAMPLES = examples()


def test_every_console_example_says_where_it_runs():
    assert EXAMPLES, "no console example found"
    unknown = [str(e) for e in EXAMPLES if e.setup not in {*SETUPS, "demo"}]
    assert not unknown, f"console blocks without a known '.. example:' setup: {unknown}"


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.setup in SETUPS], ids=str)
def test_a_host_example_prints_what_the_page_shows(example, tmp_path):
    SETUPS[example.setup](tmp_path)
    for command in example.commands:
        code, output = vgpu_manage(_argv(command.line, tmp_path), tmp_path)
        paths = {str(tmp_path): "<dir>"}
        assert normalise(output, paths) == normalise(command.expected, paths), (
            f"{example}: {command.line} (exit {code})"
        )


@pytest.fixture(scope="module")
def demo_transcript(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("demo") / "run"
    code, output = vgpu_manage(
        ["--config-file", os.devnull, "demo", "--dir", str(workdir)], tmp_path_factory.getbasetemp()
    )
    assert code == 0, output
    return workdir, output


def _shown_by_demo(transcript, command):
    """The output that follows ``==> $ <command>`` in the transcript."""
    lines = transcript.splitlines()
    for number, line in enumerate(lines):
        if line == f"==> $ {command}":
            following = []
            for after in lines[number + 1 :]:
                if after.startswith("==> "):
                    break
                following.append(after)
            return "\n".join(following)
    return None


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.setup == "demo"], ids=str)
def test_a_demo_example_is_what_the_demo_prints(example, demo_transcript):
    workdir, transcript = demo_transcript
    for command in example.commands:
        shown = re.sub(r"/tmp/vgpu-demo-[^/\s]+", str(workdir), command.line)
        got = _shown_by_demo(transcript, shown)
        assert got is not None, f"{example}: the demo does not run {command.line}"
        paths = {str(workdir): "<dir>"}
        assert normalise(got, paths) == normalise(command.expected, paths), str(example)
