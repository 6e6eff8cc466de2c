"""A soak: random operations through nova's own services, invariants after each.

Each functional test drives one path; what breaks in a cloud is the order
nobody wrote down (a resize pending while its compute restarts, a removal
the kernel blocks while the guest is deleted, Placement failing in the
middle of a periodic update).  :class:`SoakTestBase` plays such orders:
two computes running ``LibvirtVGPUDriver`` on fake hosts with mixed boards
(time-sliced T4s and an SR-IOV A100), flavors of one and two vGPUs of either
type, and a seeded random mix of what users, operators and hosts do,
faults included.  After every operation it compares nova's servers, the
guests' domain XML, each host's fake sysfs, the claims journals and
Placement, and expects no step of a host reconciler's passes to have
failed (each logs its traceback and the worker goes on); at checkpoints
it also runs the audit (``vgpu-manage audit``'s comparison) after a
periodic update; at the end it deletes everything and expects nothing
left behind.

A violation names the seed and the operation after which it was first
seen; the run goes on, so one run lists every class it finds.  Rerun a
seed with ``VGPU_SOAK_SEED``, stop it right after a violation with
``VGPU_SOAK_OPS``, and watch the operations with ``VGPU_SOAK_TRACE=1``;
:meth:`SoakTestBase.run_script` replays a sequence shrunk by hand.
Operations pin their hosts from the seed, so a seed replays the same
sequence; only thread timing differs from run to run.
"""

import collections
import contextlib
import dataclasses
import os
import random
import re
import sys
import time
import weakref

from nova import context as nova_context
from nova import objects
from nova.tests.functional.api import client as api_client
from nova.virt.libvirt import utils as libvirt_utils
from oslo_config import cfg

from tests.functional_nova import crash_points
from tests.functional_nova import host_audit
from tests.functional_nova import test_fault_outcomes
from tests.functional_nova import test_live_migration
from tests.functional_nova import test_suspend
from vgpu_driver import audit
from vgpu_driver import claims as claims_mod
from vgpu_driver import discovery
from vgpu_driver import guest as guest_xml
from vgpu_driver import inventory
from vgpu_driver import names
from vgpu_driver import restore
from vgpu_driver.fake import fakekernel

SEED_ENV = "VGPU_SOAK_SEED"
OPS_ENV = "VGPU_SOAK_OPS"
TRACE_ENV = "VGPU_SOAK_TRACE"
DEFAULT_OPS = 150
CHECKPOINT_EVERY = 50  # operations between two audits
OP_TIMEOUT = 30.0  # seconds an operation may take to settle
SETTLE_TIMEOUT = 3.0  # seconds a new finding may take to go away
POLL = 0.05
SETTLE_PAUSE_MAX = 0.4  # seconds between two looks at findings still new

HOSTS = ("src", "dest")  # the names LiveMigrationTestBase gives them
PROFILES = ("t4x8", "a100-sriov")
T4 = "0000:18:00.0"  # the one T4 of eight that serves a vGPU type
A100 = "0000:41:00.0"
A100_VFS = 16
T4_TYPE, A100_TYPE = "nvidia-231", "nvidia-468"  # GRID T4-2Q (8), A100-4C (10)
A100_CAP = 6  # [mdev_nvidia-468] max_instances: a partial cap
IMAGE = "155d900f-4e14-4e4c-a73d-069cbf4541e6"  # nova's fake Glance default

STABLE = {"ACTIVE", "SHUTOFF", "SUSPENDED", "VERIFY_RESIZE", "SHELVED_OFFLOADED", "ERROR"}
RUNNING = {"ACTIVE", "VERIFY_RESIZE"}
MIGRATION_DONE = {
    "finished",
    "confirmed",
    "reverted",
    "completed",
    "error",
    "failed",
    "cancelled",
    "done",
}
# What nova says when it refuses, rather than fails.
REFUSALS = ("No valid host", "NoValidHost", "MigrationPreCheckError")
# A finding whose cause is an allocation nova itself leaked or keeps: one of
# a server it deleted, of a migration that ended in error or of a deleted
# server, or of a server nova left with no domain anywhere (a delete that
# Placement's 503 interrupted leaves it in ERROR, and a stop then makes it
# SHUTOFF, domainless still: its allocation waits for a start, a hard
# reboot or another delete, which define the domain again).  A migration
# whose finish a kill interrupted stays unfinished for good, its allocation
# on the source with it, once the source's old domain and vGPU have gone
# (the server deleted, defined there again by a later move, or its claims
# let go by the host reconciler after ``[vgpu] claim_grace``); until then
# that allocation pays for them, another leak on the same GPU or not, but
# for those a move back reuses for the server's new domain there (its units
# beyond the old claims left are then nova's).  nova never frees those by
# itself; they are reported, not counted.
NOVA_LEAK = "nova-leak:"
# A request nova's own code failed, told by its traceback in nova's log;
# reported with the leaks, not counted.  Those known:
# - a compute started while Placement failed has no provider tree in its
#   resource tracker until a periodic update succeeds (the tree is read from
#   Placement before the virt driver is asked anything), so an instance claim
#   there meanwhile fails with AttributeError in _claim_resources (an
#   unshelve's 500, or a build rescheduled until it ends in ERROR);
# - a shelve snapshots the guest's domain, and of a server nova itself left
#   without one (see NOVA_LEAK) fails with InstanceNotRunning: counted as
#   nova's only when the server is one of those;
# - a revert that fails after nova's API has put the old flavor back in the
#   server's request spec leaves the server on the new flavor; an unshelve
#   is then scheduled for the old one, and the driver refuses to define a
#   guest with vGPUs its flavor does not ask for: counted as nova's only
#   when the server's request spec names another flavor than the server.
NOVA_ERROR = "nova-error:"
NOVA_ERRORS = {
    "resource-tracker-without-provider-tree": re.compile(
        r'resource_tracker\.py", line \d+, in _claim_resources\n(?:.*\n){0,3}'
        r"AttributeError: 'NoneType' object has no attribute 'data'"
    ),
    "snapshot-of-a-domainless-server": re.compile(
        r"in _shelve_instance\n\s+self\.driver\.snapshot\(.*\n"
        r'.*libvirt/driver\.py", line \d+, in snapshot\n'
        r"\s+raise exception\.InstanceNotRunning\("
    ),
    "request-spec-of-another-flavor": re.compile(
        r"ComputeResourcesUnavailable: .* gets no vGPU here: the (flavor asks|allocation holds)"
    ),
}
# nova's errors that are nova's only for a server it left without a domain.
OF_DOMAINLESS = frozenset({"snapshot-of-a-domainless-server"})
# ... only for a server whose request spec names another flavor.
OF_ANOTHER_SPEC = frozenset({"request-spec-of-another-flavor"})
# What a guest leaves on a host it left, for the next periodic update.
GUEST_LEFT = frozenset({"claim-without-guest", "domain-without-guest"})
MIGRATION_FAILED = frozenset({"error", "failed"})
_USAGE = re.compile(r"Placement usage (\d+), (\d+) vGPU")


@dataclasses.dataclass(frozen=True)
class VgpuFlavor:
    label: str
    type_id: str
    trait: str
    count: int


FLAVORS = (
    VgpuFlavor("t4x1", T4_TYPE, "CUSTOM_VGPU_GRID_T4_2Q", 1),
    VgpuFlavor("t4x2", T4_TYPE, "CUSTOM_VGPU_GRID_T4_2Q", 2),
    VgpuFlavor("a100x1", A100_TYPE, "CUSTOM_VGPU_NVIDIA_A100_4C", 1),
    VgpuFlavor("a100x2", A100_TYPE, "CUSTOM_VGPU_NVIDIA_A100_4C", 2),
)

# The server states each operation is meant for (with ANY_TARGET it picks
# any server, and nova refuses what the state does not allow).
SERVER_OPS = {
    "delete": STABLE - {"ERROR"},
    "resize": {"ACTIVE", "SHUTOFF"},
    "cold_migrate": {"ACTIVE", "SHUTOFF"},
    "confirm_resize": {"VERIFY_RESIZE"},
    "revert_resize": {"VERIFY_RESIZE"},
    "live_migrate": {"ACTIVE"},
    "stop": {"ACTIVE"},
    "start": {"SHUTOFF"},
    "hard_reboot": {"ACTIVE", "SHUTOFF"},
    "shelve": {"ACTIVE", "SHUTOFF"},
    "unshelve": {"SHELVED_OFFLOADED"},
    "suspend": {"ACTIVE"},
    "resume": {"SUSPENDED"},
}
# The operations the kill in a define interrupts, by the server's status:
# run in the compute as nova's API casts them (crash_points.OPERATIONS), or
# through the API, the compute killed in the cast that defines (CAST_KILLS:
# a resize's or a cold migration's finish on the destination, a revert's
# finish on the source, an unshelve's spawn).  A shelve defines nothing (its
# offload destroys and undefines the domain): its crash point is the
# unshelve's define.
KILLABLE = {
    "ACTIVE": {"hard_reboot", "rescue", "resize", "cold_migrate"},
    "SHUTOFF": {"hard_reboot", "start", "resize", "cold_migrate"},
    "SUSPENDED": {"resume"},
    "VERIFY_RESIZE": {"revert_resize"},
    "SHELVED_OFFLOADED": {"unshelve"},
}
CAST_KILLS = {
    "resize": "finish_resize",
    "cold_migrate": "finish_resize",
    "revert_resize": "finish_revert_resize",
    "unshelve": "unshelve_instance",
}
WEIGHTS = {
    "boot": 12,
    "delete": 6,
    "resize": 6,
    "cold_migrate": 4,
    "confirm_resize": 5,
    "revert_resize": 4,
    "live_migrate": 7,
    "stop": 4,
    "start": 5,
    "hard_reboot": 4,
    "shelve": 3,
    "unshelve": 4,
    "suspend": 2,
    "resume": 2,
    "restart_compute": 1.5,
    "periodic_update": 2,
    "fault_remove_vgpu": 1.5,
    "fault_hold_vgpu": 1.5,
    "fault_vfs_off": 1,
    "fault_placement_5xx": 1,
    "fault_lost_udev_event": 1,
    "fault_killed_in_define": 1.5,
}
FAULTS = frozenset(k for k in WEIGHTS if k.startswith("fault_"))
WINDOWED_FAULTS = frozenset({"fault_vfs_off", "fault_placement_5xx"})
WANTED_SERVERS = 10  # boots grow rarer, and deletes likelier, past this
ANY_TARGET = 0.1  # how often a server operation picks any server
MAX_HOLD_OPS = 8


class Refused(Exception):
    """nova (or the host) refused the operation, as it may."""


class Stuck(Exception):
    """The operation did not settle in time."""


class ServerError(Exception):
    """A server went to ERROR for a reason that is no refusal."""

    def __init__(self, server):
        super().__init__(f"{server['name']} went to ERROR: {_fault(server)}")


@dataclasses.dataclass(frozen=True)
class Op:
    kind: str
    server: str | None = None  # the server's name
    flavor: str | None = None  # a VgpuFlavor label
    host: str | None = None
    vgpu: str | None = None
    hold_ops: int = 0
    inner: "Op | None" = None  # what runs while a fault lasts

    def __str__(self):
        args = [a for a in (self.server, self.flavor, self.host, self.vgpu) if a]
        if self.hold_ops:
            args.append(f"for {self.hold_ops} ops")
        if self.inner is not None:
            args.append(f"during {self.inner}")
        return f"{self.kind}({', '.join(args)})"


@dataclasses.dataclass(frozen=True)
class Finding:
    """One invariant broken now; ``subject`` tells repeated sightings apart."""

    category: str
    subject: str
    detail: str

    @property
    def key(self):
        return (self.category, self.subject)


@dataclasses.dataclass
class Violation:
    category: str
    subject: str
    detail: str
    first_op: int
    last_op: int
    seen: int = 1
    ops_before: tuple = ()


@dataclasses.dataclass
class SoakResult:
    seed: int
    ops: int
    elapsed: float = 0.0
    done: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    refused: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    failed_in_fault: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    faults: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    skipped_faults: dict = dataclasses.field(default_factory=dict)
    seconds: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    violations: dict = dataclasses.field(default_factory=dict)
    nova_leaks: dict = dataclasses.field(default_factory=dict)
    # Servers nova deleted though no delete of theirs succeeded (one that
    # failed was finished later, at a compute's start): name -> Violation.
    gone: dict = dataclasses.field(default_factory=dict)
    log: list = dataclasses.field(default_factory=list)

    def record(self, index, findings):
        for finding in findings:
            book = (
                self.nova_leaks
                if finding.category.startswith((NOVA_LEAK, NOVA_ERROR))
                else self.violations
            )
            known = book.get(finding.key)
            if known is None:
                book[finding.key] = Violation(
                    finding.category,
                    finding.subject,
                    finding.detail,
                    index,
                    index,
                    ops_before=tuple(self.log[-8:]),
                )
            elif known.last_op != index:
                known.seen += 1
                known.last_op = index

    def report(self):
        """What ran, what was refused, and every violation with its first op."""
        per_op = 1000 * self.elapsed / max(self.ops, 1)
        lines = [
            f"soak seed {self.seed}: {self.ops} operations in {self.elapsed:.1f} s "
            f"({per_op:.0f} ms per operation, checks included)",
            f"{'operation':24} {'done':>6} {'refused':>8} {'in-fault':>9} {'ms':>7}",
        ]
        for kind in sorted(set(self.done) | set(self.refused) | set(self.failed_in_fault)):
            runs = self.done[kind] + self.refused[kind] + self.failed_in_fault[kind]
            lines.append(
                f"{kind:24} {self.done[kind]:6} {self.refused[kind]:8} "
                f"{self.failed_in_fault[kind]:9} "
                f"{1000 * self.seconds[kind] / max(runs, 1):7.0f}"
            )
        lines.append(
            "faults injected: "
            + (", ".join(f"{k} {n}" for k, n in sorted(self.faults.items())) or "none")
        )
        for kind, why in sorted(self.skipped_faults.items()):
            lines.append(f"fault {kind} not injected: {why}")
        lines.append(f"nova's own leaks and errors, not counted: {len(self.nova_leaks)}")
        lines += [
            f"  [{v.category}] {v.subject}: {v.detail} (first after op {v.first_op}, "
            f"last after op {v.last_op})"
            for v in self.nova_leaks.values()
        ]
        if self.gone:
            lines.append(f"servers nova deleted after a failed delete: {len(self.gone)}")
        for name, v in self.gone.items():
            lines.append(f"  {name}: {v.detail}, seen after op {v.first_op}; the ops before:")
            lines += [f"      {line}" for line in v.ops_before]
        lines.append(f"violations: {len(self.violations)} (seed {self.seed})")
        for v in sorted(self.violations.values(), key=lambda v: (v.first_op, v.category)):
            lines.append(f"  [{v.category}] {v.subject}: {v.detail}")
            lines.append(
                f"    first after op {v.first_op}, last after op {v.last_op}, "
                f"after {v.seen} op(s); the ops before it:"
            )
            lines += [f"      {line}" for line in v.ops_before]
        return "\n".join(lines)


def seed_from_env():
    value = os.environ.get(SEED_ENV)
    return int(value) if value else random.SystemRandom().randrange(1, 10**6)


def ops_from_env():
    return int(os.environ.get(OPS_ENV) or DEFAULT_OPS)


class SoakTestBase(
    test_fault_outcomes.FaultyPlacementMixin, test_live_migration.LiveMigrationTestBase
):
    """Two mixed-board computes and the soak's operations, faults, invariants."""

    ENABLED_TYPES = SOURCE_TYPES = DEST_TYPES = f"{T4_TYPE},{A100_TYPE}"

    # -- the cloud -------------------------------------------------------------------

    def setUp(self):
        super().setUp()
        self.flags(instances=-1, cores=-1, ram=-1, group="quota")
        self.flavors = {
            f.label: self._create_flavor(
                name=f.label,
                memory_mb=512,
                vcpu=1,
                disk=1,
                ephemeral=0,
                extra_spec={"resources:VGPU": str(f.count), f"trait:{f.trait}": "required"},
            )
            for f in FLAVORS
        }
        # What libvirt does with a suspended guest's mdevs.
        self.useFixture(test_suspend.LiveMdevHotplug(self._kernel_vgpus, per_host=True))

    def start_host(self, hostname, enabled_types):
        """A compute on a mixed host: one T4 and the A100 serve vGPUs."""
        self.flags(device_addresses=[T4], group=f"mdev_{T4_TYPE}")
        self.flags(device_addresses=[A100], max_instances=A100_CAP, group=f"mdev_{A100_TYPE}")
        # Removed on release, so a blocked removal is possible and the end
        # can expect no mdev left; a blocked one keeps a delete this long.
        self.flags(remove_mdevs_on_release=True, mdev_remove_timeout=0.5, group="vgpu")
        if _udev_usable():
            self.flags(hotplug_events="udev", group="vgpu")
        kernel = self.build_vgpu_host(hostname, *PROFILES)
        if _udev_usable():
            kernel.enable_uevents()
        return super().start_host(hostname, enabled_types)

    def _migrate_stub(self, domain, destination, params, flags):
        """As libvirt with VIR_MIGRATE_PERSIST_DEST, which nova always sets:
        the guest arrives defined on the destination (the mixin's stub makes
        it transient, and it would vanish at its first stop)."""
        arrived = self.dest.driver._host.get_connection().defineXML(params["destination_xml"])
        arrived.create()
        conn = self.src.driver._host.get_connection()
        conn.lookupByUUIDString(self.server["id"]).complete_job()
        self.migrate_stub_ran = True

    # -- the run ---------------------------------------------------------------------

    def run_soak(self, seed=None, ops=None, progress=None):
        """Run ``ops`` random operations from ``seed``; the SoakResult.

        ``progress(index, result)`` is called every 100 operations.
        """
        seed = seed_from_env() if seed is None else seed
        ops = ops_from_env() if ops is None else ops
        print(
            f"soak seed {seed} ({SEED_ENV}={seed} {OPS_ENV}={ops} to run it again)",
            file=sys.stderr,
            flush=True,
        )
        rng = random.Random(seed)
        self._start(SoakResult(seed, ops))
        for index in range(1, ops + 1):
            self._step(index, self._choose(rng))
            if index % CHECKPOINT_EVERY == 0:
                self._result.record(index, self._classified(self._checkpoint()))
            if progress is not None and index % 100 == 0:
                progress(index, self._result)
        return self._finish(ops + 1)

    def run_script(self, script, seed=0):
        """Run the given operations, in order (a reproduction shrunk by hand)."""
        self._start(SoakResult(seed, len(script)))
        for index, op in enumerate(script, 1):
            self._step(index, op)
        return self._finish(len(script) + 1)

    def _start(self, result):
        self._result = result
        self._holds = []  # (op index to release at, host, vGPU)
        self._lost_events = set()  # hosts where a udev event was lost
        self._ids = {}  # server name -> id
        self._created = set()  # every server id ever booted
        self._domainless = set()  # servers seen in ERROR with no domain, still without
        self._domainless_moves = {}  # migration uuid -> (server, source) of such a server
        self._explained = set()  # findings nova's leaks explained
        self._migrations_of_deleted = {}  # migration uuid -> its server, deleted since
        self._abandoned = {}  # migration uuid -> (server, source): left by a kill
        self._old_claims = {}  # such a migration -> the server's claims on its source then
        self._names = (f"soak-{n}" for n in range(1, 10**9))
        self._worker_errors = weakref.WeakKeyDictionary()  # host reconciler -> failed steps seen
        self._began = time.monotonic()
        if not _udev_usable():
            result.skipped_faults["fault_lost_udev_event"] = (
                "not root: the fake kernel cannot send udev events"
            )
        self._view = self._list_servers()

    def _step(self, index, op):
        self._release_due_holds(index)
        began = time.monotonic()
        outcome = self._execute(op, index)
        self._result.seconds[op.kind] += time.monotonic() - began
        self._log(f"op {index}: {op} -> {outcome}")
        self._result.record(index, self._classified(self._settled_findings()))
        self._result.record(index, self._reconciler_findings())
        self._note_gone(index)
        self._forget_records()

    def _reconciler_findings(self):
        """A step of a host reconciler's pass that failed since the last look
        (it logged its traceback and the next step ran): each is a bug."""
        findings = []
        for host, compute in sorted(self.computes.items()):
            worker = compute.driver.vgpu.worker
            if worker.errors > self._worker_errors.get(worker, 0):
                _at, step, message = worker.last_error
                findings.append(Finding("reconciler-error", f"{host} {step}", message[:300]))
            self._worker_errors[worker] = worker.errors
        return findings

    def _note_gone(self, index):
        """Forget the servers nova deleted by itself; the report lists them."""
        for name in [n for n in self._ids if n not in self._view]:
            self._result.gone[name] = Violation(
                "gone",
                name,
                f"{self._ids.pop(name)} deleted by nova",
                index,
                index,
                ops_before=tuple(self._result.log[-8:]),
            )

    def _finish(self, index):
        self._result.record(index, self._classified(self._end_findings()))
        self._result.elapsed = time.monotonic() - self._began
        return self._result

    def _log(self, line):
        self._result.log.append(line)
        if os.environ.get(TRACE_ENV):
            print(line, file=sys.stderr, flush=True)

    def _forget_records(self):
        """What the fixtures keep of every request would grow without end."""
        self.placement_faults.reset()
        self.notifier.reset()

    # -- choosing ----------------------------------------------------------------------

    def _list_servers(self):
        """nova's servers, by name (one API call)."""
        return {s["name"]: s for s in self.api.get_servers()}

    def _choose(self, rng, faults=True):
        servers = self._view
        kinds = [k for k in WEIGHTS if (faults or k not in FAULTS) and self._possible(k, servers)]
        kind = rng.choices(kinds, [self._weight(k, servers) for k in kinds])[0]
        return self._plan(kind, rng, servers)

    def _possible(self, kind, servers):
        if kind in SERVER_OPS:
            return any(s["status"] in SERVER_OPS[kind] for s in servers.values())
        if kind == "fault_vfs_off":
            # Claims alone: cheap, and what keeps a board busy most often.
            return any(all(c.gpu != A100 for c in self._journal(h).claims()) for h in HOSTS)
        if kind == "fault_killed_in_define":
            return any(s["status"] in KILLABLE for s in servers.values())
        return kind != "fault_lost_udev_event" or _udev_usable()

    @staticmethod
    def _weight(kind, servers):
        crowd = len(servers) / WANTED_SERVERS
        if kind == "boot":
            return WEIGHTS[kind] * max(0.1, 1.5 - crowd)
        if kind == "delete":
            return WEIGHTS[kind] * max(0.2, crowd)
        return WEIGHTS[kind]

    def _plan(self, kind, rng, servers):
        if kind == "boot":
            return Op(kind, flavor=rng.choice(FLAVORS).label, host=rng.choice(HOSTS))
        if kind in SERVER_OPS:
            return self._plan_server_op(kind, rng, servers)
        if kind == "restart_compute":
            return Op(kind, host=rng.choice(HOSTS))
        if kind in ("fault_remove_vgpu", "fault_lost_udev_event"):
            host = rng.choice(HOSTS)
            return Op(kind, host=host, vgpu=_pick(rng, self._removable_vgpus(host)))
        if kind == "fault_hold_vgpu":
            host = rng.choice(HOSTS)
            return Op(
                kind,
                host=host,
                vgpu=_pick(rng, self._kernel_vgpus(host)),
                hold_ops=rng.randint(1, MAX_HOLD_OPS),
            )
        if kind == "fault_vfs_off":
            host = _pick(rng, {h for h in HOSTS if self._board_unused(h)})
            return Op(kind, host=host, inner=self._choose(rng, faults=False))
        if kind == "fault_placement_5xx":
            return Op(kind, inner=self._choose(rng, faults=False))
        if kind == "fault_killed_in_define":
            name = rng.choice(sorted(n for n, s in servers.items() if s["status"] in KILLABLE))
            operation = rng.choice(sorted(KILLABLE[servers[name]["status"]]))
            flavor = None
            if operation == "resize":
                current = _flavor(servers[name])
                flavor = rng.choice([f for f in FLAVORS if f != current]).label
            return Op(kind, server=name, inner=Op(operation, server=name, flavor=flavor))
        return Op(kind)

    def _plan_server_op(self, kind, rng, servers):
        meant = sorted(n for n, s in servers.items() if s["status"] in SERVER_OPS[kind])
        name = rng.choice(sorted(servers) if rng.random() < ANY_TARGET else meant)
        flavor = host = None
        if kind == "resize":
            current = _flavor(servers[name])
            flavor = rng.choice([f for f in FLAVORS if f != current]).label
        if kind == "unshelve":
            host = rng.choice(HOSTS)
        return Op(kind, server=name, flavor=flavor, host=host)

    # -- running one ---------------------------------------------------------------------

    def _execute(self, op, index, in_fault=False):
        """Run ``op``; how it ended, in a word or two."""
        result = self._result
        try:
            with self._on_source_host(op.server):
                getattr(self, f"_do_{op.kind}")(op, index)
        except Refused as exc:
            (result.failed_in_fault if in_fault else result.refused)[op.kind] += 1
            return f"refused: {exc}"
        except Stuck as exc:
            result.record(index, [Finding("stuck", op.kind, str(exc))])
            return f"stuck: {exc}"
        except ServerError as exc:
            if in_fault:
                result.failed_in_fault[op.kind] += 1
                return f"error: {exc}"
            known = self._new_nova_error()
            if known is not None and self._is_nova_s(known, op.server):
                result.record(index, [Finding(NOVA_ERROR + known, op.kind, str(exc)[:300])])
                return f"nova error: {known}"
            result.record(index, [Finding("server-error", op.kind, str(exc))])
            return f"error: {exc}"
        except api_client.OpenStackApiException as exc:
            return self._api_refusal(op, index, exc, in_fault)
        result.done[op.kind] += 1
        return "done"

    def _api_refusal(self, op, index, exc, in_fault):
        status = exc.response.status_code if exc.response is not None else None
        text = str(exc)
        if status in (400, 403, 409) or any(r in text for r in REFUSALS) or in_fault:
            counter = self._result.failed_in_fault if in_fault else self._result.refused
            counter[op.kind] += 1
            return f"refused: HTTP {status}"
        known = self._new_nova_error() if status == 500 else None
        if known is not None and self._is_nova_s(known, op.server):
            self._result.record(index, [Finding(NOVA_ERROR + known, op.kind, text[:300])])
            return f"nova error: {known}"
        self._result.record(index, [Finding("api-error", op.kind, text[:300])])
        return f"api error: HTTP {status}"

    def _is_nova_s(self, known, name):
        """Whether the known nova error just logged is nova's for this
        server: some are only under a condition the server must meet."""
        server_id = self._ids.get(name)
        if known in OF_DOMAINLESS:
            return server_id in self._domainless
        if known in OF_ANOTHER_SPEC:
            return server_id is not None and self._spec_flavor(server_id) != (
                self._get(server_id) or {}
            ).get("flavor", {}).get("original_name")
        return True

    @staticmethod
    def _spec_flavor(server_id):
        """The flavor nova's request spec for the server names (what nova
        schedules its moves and unshelves for)."""
        spec = objects.RequestSpec.get_by_instance_uuid(nova_context.get_admin_context(), server_id)
        return spec.flavor.name

    def _new_nova_error(self):
        """The known nova error whose traceback nova logged since the last
        look, if any (nova's log is read only when a request failed)."""
        log = self.stdlog.logger.output
        new = log[getattr(self, "_nova_log_read", 0) :]
        self._nova_log_read = len(log)
        found = None
        for name, pattern in NOVA_ERRORS.items():
            if pattern.search(new):
                found = name
        return found

    def forget_nova_log(self):
        """Empty nova's log capture, which a long run's would grow without
        end; the look for known errors starts again at its beginning (a
        position or a count kept across would hide the next one)."""
        output = self.stdlog.logger._output
        output.seek(0)
        output.truncate()
        self._nova_log_read = 0

    @contextlib.contextmanager
    def _on_source_host(self, name):
        """While a server's resize awaits confirmation, CONF.host names its
        source: nova's libvirt driver undefines the source's domain at the
        confirmation (explicit, or the one a delete makes) only then, and
        the computes here share one CONF (as in nova's own vGPU tests)."""
        server = self._view.get(name) if name else None
        source = None
        if server is not None and server["status"] == "VERIFY_RESIZE":
            source = self._pending_source(server["id"])
        if source is None:
            yield
            return
        host = cfg.CONF.host
        self.flags(host=source)
        try:
            yield
        finally:
            self.flags(host=host)

    def _server_id(self, name):
        if name not in self._ids:
            raise Refused(f"no server {name}")
        return self._ids[name]

    def _get(self, server_id):
        try:
            return self.api.get_server(server_id)
        except api_client.OpenStackApiNotFoundException:
            return None

    def _migrations(self, server_id):
        return self.api.api_get(f"/os-migrations?instance_uuid={server_id}").body["migrations"]

    def _pending_source(self, server_id):
        for migration in self._migrations(server_id):
            if migration["status"] == "finished":
                return migration["source_compute"]
        return None

    def _settle(self, server_id, timeout=OP_TIMEOUT):
        """The server once nothing is under way for it (None once deleted)."""
        deadline = time.monotonic() + timeout
        while True:
            server = self._get(server_id)
            if server is None:
                return None
            if (
                server["status"] in STABLE
                and server["OS-EXT-STS:task_state"] is None
                and not any(
                    m["status"] not in MIGRATION_DONE and m["uuid"] not in self._abandoned
                    for m in self._migrations(server_id)
                )
            ):
                return server
            if time.monotonic() > deadline:
                raise Stuck(
                    f"{server['name']} still {server['status']}/"
                    f"{server['OS-EXT-STS:task_state']} after {timeout:.0f}s"
                )
            time.sleep(POLL)

    def _action(self, name, body, expect):
        """Post a server action and settle; Refused unless it ends in ``expect``."""
        server_id = self._server_id(name)
        self.api.post_server_action(server_id, body)
        server = self._settle(server_id)
        self._check_error(server)
        if server is None or server["status"] not in expect:
            raise Refused(
                f"{name} is {server and server['status']}: "
                f"{_fault(server) or 'nova left it as it was'}"
            )
        return server

    def _check_error(self, server):
        """An ERROR server is deleted (it would only be refused from now on);
        Refused if nova said no, else ServerError."""
        if server is None or server["status"] != "ERROR":
            return
        self._delete(server["name"])
        if _refusal(server):
            raise Refused(f"{server['name']} went to ERROR: {_fault(server)}")
        raise ServerError(server)

    def _delete(self, name):
        server_id = self._server_id(name)
        # nova forgets a server's migrations with it; their allocations it may not.
        self._migrations_of_deleted.update(
            (m["uuid"], server_id) for m in self._migrations(server_id)
        )
        self.api.delete_server(server_id)
        deadline = time.monotonic() + OP_TIMEOUT
        while self._get(server_id) is not None:
            if time.monotonic() > deadline:
                raise Stuck(f"{name} not deleted after {OP_TIMEOUT:.0f}s")
            time.sleep(POLL)
        del self._ids[name]

    # -- the operations ----------------------------------------------------------------

    def _do_boot(self, op, index):
        name = next(self._names)
        created = self.api.post_server(
            {
                "server": {
                    "name": name,
                    "imageRef": IMAGE,
                    "flavorRef": self.flavors[op.flavor],
                    "networks": "none",
                    "host": op.host,
                }
            }
        )
        self._ids[name] = created["id"]
        self._created.add(created["id"])
        self._check_error(self._settle(created["id"]))

    def _do_delete(self, op, index):
        self._delete(op.server)

    def _do_resize(self, op, index):
        self._action(op.server, self._body(op), {"VERIFY_RESIZE"})

    def _do_cold_migrate(self, op, index):
        self._action(op.server, self._body(op), {"VERIFY_RESIZE"})

    def _do_confirm_resize(self, op, index):
        self._action(op.server, {"confirmResize": None}, {"ACTIVE", "SHUTOFF"})

    def _do_revert_resize(self, op, index):
        self._action(op.server, self._body(op), {"ACTIVE", "SHUTOFF"})

    def _body(self, op):
        """The server action's request body, for the operations a kill may
        interrupt through the API."""
        if op.kind == "resize":
            return {"resize": {"flavorRef": self.flavors[op.flavor]}}
        return {
            "cold_migrate": {"migrate": None},
            "revert_resize": {"revertResize": None},
            "unshelve": {"unshelve": None},
        }[op.kind]

    def _do_live_migrate(self, op, index):
        server_id = self._server_id(op.server)
        source = self._get(server_id)["OS-EXT-SRV-ATTR:host"]
        # The migration stub moves self.server from self.src to self.dest
        # (a server on no host is nova's to refuse).
        if source in self.computes:
            self.server = {"id": server_id}
            self.src, self.dest = self.computes[source], self.computes[_other(source)]
        server = self._action(
            op.server, {"os-migrateLive": {"host": None, "block_migration": "auto"}}, {"ACTIVE"}
        )
        if server["OS-EXT-SRV-ATTR:host"] == source:
            statuses = [m["status"] for m in self._migrations(server_id)]
            raise Refused(f"still on {source}, its migration {statuses[:1]}")

    def _do_stop(self, op, index):
        self._action(op.server, {"os-stop": None}, {"SHUTOFF"})

    def _do_start(self, op, index):
        self._action(op.server, {"os-start": None}, {"ACTIVE"})

    def _do_hard_reboot(self, op, index):
        self._action(op.server, {"reboot": {"type": "HARD"}}, {"ACTIVE"})

    def _do_suspend(self, op, index):
        self._action(op.server, {"suspend": None}, {"SUSPENDED"})

    def _do_resume(self, op, index):
        self._action(op.server, {"resume": None}, {"ACTIVE"})

    def _do_shelve(self, op, index):
        self._action(op.server, {"shelve": {}}, {"SHELVED_OFFLOADED"})

    def _do_unshelve(self, op, index):
        self._action(op.server, {"unshelve": {"host": op.host}}, {"ACTIVE"})

    def _do_restart_compute(self, op, index):
        """The service stopped and started on the same state.  Inside a
        Placement fault window only the service meets the fault: the
        harness's own lookup of the compute's provider, after the start,
        reads a healthy Placement."""
        self.restart_host(op.host)

    def start_compute(self, *args, **kwargs):
        real_get = self.placement.get

        def harness_get(url, **options):
            with self.placement_faults.suspended():
                return real_get(url, **options)

        self.placement.get = harness_get
        try:
            return super().start_compute(*args, **kwargs)
        finally:
            self.placement.get = real_get

    def _do_periodic_update(self, op, index):
        self._run_periodics()

    # -- faults ----------------------------------------------------------------------------

    def _do_fault_remove_vgpu(self, op, index):
        """An mdev removed behind the driver's back (an operator's mdevctl,
        a script): only one no running guest holds, as the kernel allows."""
        if op.vgpu is None:
            raise Refused(f"no vGPU on {op.host} that no running guest holds")
        self.kernels[op.host].remove_mdev(op.vgpu)
        self._result.faults[op.kind] += 1

    def _do_fault_hold_vgpu(self, op, index):
        """A guest's QEMU keeps the device open: its removal blocks meanwhile.
        A script may name a server instead of a vGPU: its domain's on the host."""
        vgpus = [op.vgpu] if op.vgpu else []
        if op.server is not None:
            vgpus = sorted(self._domains(op.host).get(self._server_id(op.server), ()))
        if not vgpus:
            raise Refused(f"no vGPU on {op.host}")
        for vgpu in vgpus:
            self.kernels[op.host].hold(vgpu)
            self._holds.append((index + op.hold_ops, op.host, vgpu))
        self._result.faults[op.kind] += 1

    def _release_due_holds(self, index):
        for hold in [h for h in self._holds if h[0] <= index]:
            self._holds.remove(hold)
            self.kernels[hold[1]].release(hold[2])

    def _do_fault_vfs_off(self, op, index):
        """The A100's VFs disabled while no guest uses the board (an operator
        resetting it), a periodic update and something else happening, then
        enabled again."""
        if op.host is None or not self._board_unused(op.host):
            raise Refused("every A100 has a guest, a claim or a hold")
        kernel = self.kernels[op.host]
        kernel.set_vfs(A100, 0)
        self._result.faults[op.kind] += 1
        try:
            self._run_periodics()
            self._inner(op, index)
        finally:
            kernel.set_vfs(A100, A100_VFS)

    def _do_fault_placement_5xx(self, op, index):
        """Placement answers 503 to provider requests (the periodic update's
        and the driver's) while something happens and computes update."""
        self.placement_faults.fail(path=r"/resource_providers(/.*)?", status=503, times=None)
        self._result.faults[op.kind] += 1
        try:
            self._inner(op, index)
            self._run_periodics()
        finally:
            self.placement_faults.restore()

    def _do_fault_lost_udev_event(self, op, index):
        """An mdev removed behind the driver's back, and udev's event for it lost."""
        if op.vgpu is None:
            raise Refused(f"no vGPU on {op.host} that no running guest holds")
        kernel = self.kernels[op.host]
        os.unlink(os.path.join(kernel.paths.root, fakekernel.MARKER_DIR, "uevents"))
        try:
            kernel.remove_mdev(op.vgpu)
        finally:
            kernel.enable_uevents()
        self._lost_events.add(op.host)
        self._result.faults[op.kind] += 1

    def _do_fault_killed_in_define(self, op, index):
        """nova-compute killed while libvirt defines the server's domain
        (:mod:`crash_points`), then started again as systemd would.  nova's
        start-up resumes a hard reboot or a start; it leaves the task state
        of the others (and the migration of a resize's or a revert's
        finish), and the operator recovers the server as nova says: a reset
        of its state and a hard reboot, or, offloaded, a reset to ERROR (and
        the soak deletes it)."""
        server_id = self._server_id(op.server)
        context = nova_context.get_admin_context()
        instance = objects.Instance.get_by_uuid(context, server_id, expected_attrs=["flavor"])
        kind = op.inner.kind
        if kind in CAST_KILLS:
            body = self._body(op.inner)
            host = crash_points.kill_in_cast(
                self.computes,
                CAST_KILLS[kind],
                lambda: self.api.post_server_action(server_id, body),
            )
            if host is None:
                self._check_error(self._settle(server_id))
                raise Refused(f"{op.inner} ended before any define")
            killed = True
        else:
            host = instance.host
            if host not in self.computes:
                raise Refused(f"{op.server} is on no compute")
            if kind == "rescue":
                # Where rescue writes unrescue.xml; fake image creation never made it.
                os.makedirs(libvirt_utils.get_instance_path(instance), exist_ok=True)
            killed = crash_points.kill_during(self.computes[host].manager, context, instance, kind)
        self._result.faults[op.kind] += 1
        self.restart_host(host)
        self._recover(op.server, server_id)
        if not killed:
            raise Refused(f"{op.inner} ended before any define")

    def _recover(self, name, server_id):
        """What the operator does for a server nova left mid-operation."""
        server = self._get(server_id)
        if (
            server is not None
            and server["OS-EXT-STS:task_state"] is not None
            and server["OS-EXT-STS:task_state"]
            not in ("rebooting_hard", "reboot_started_hard", "powering-on")
        ):
            self._note_abandoned(server_id)
            offloaded = server["status"] == "SHELVED_OFFLOADED"
            self.api.post_server_action(
                server_id, {"os-resetState": {"state": "error" if offloaded else "active"}}
            )
            if offloaded:
                self._delete(name)
                return
            self.api.post_server_action(server_id, {"reboot": {"type": "HARD"}})
        server = self._settle(server_id)
        self._check_error(server)

    def _note_abandoned(self, server_id):
        """The server's migrations a kill left unfinished: nova never
        finishes them (nor does ``nova-manage placement audit``, which
        counts them in progress).  A resize's or cold migration's finish
        killed on the destination leaves its migration ``post-migrating``:
        the hard reboot recovers the guest there, and the source keeps the
        guest's old domain, its claim and vGPU, and the migration's
        allocation of them, until the server is deleted or defined there
        again by a later move, or the host reconciler lets them go once
        ``[vgpu] claim_grace`` has passed (the allocation then nova's alone,
        see :data:`NOVA_LEAK`; until then it pays for those claims, which
        :meth:`_pays_for_old_claims` tells).  A revert's
        finish killed on the source leaves it ``reverting``, the
        destination emptied and the allocation the instance's again."""
        for migration in self._migrations(server_id):
            if migration["status"] not in MIGRATION_DONE:
                source = migration["source_compute"]
                self._abandoned[migration["uuid"]] = (server_id, source)
                self._old_claims[migration["uuid"]] = frozenset(
                    (c.mdev_uuid, c.created_at)
                    for c in (self._journal(source).claims() if source in self.computes else ())
                    if c.instance_uuid == server_id and c.state in audit.HELD_STATES
                )

    def _inner(self, op, index):
        outcome = self._execute(op.inner, index, in_fault=True)
        self._log(f"op {index} (inside {op.kind}): {op.inner} -> {outcome}")

    # -- what faults may touch -------------------------------------------------------------

    def _kernel_vgpus(self, host):
        return {m.uuid for m in self.kernels[host].list_mdevs()}

    def _removable_vgpus(self, host):
        """mdevs no running guest's domain holds, nor a hold of ours."""
        running = {
            s["id"]
            for s in self._view.values()
            if s["status"] in RUNNING and s["OS-EXT-SRV-ATTR:host"] == host
        }
        held = {v for _at, h, v in self._holds if h == host}
        in_running = {
            m for uuid, mdevs in self._domains(host).items() if uuid in running for m in mdevs
        }
        return self._kernel_vgpus(host) - in_running - held

    def _board_unused(self, host):
        """No claim, domain or hold on the host's A100."""
        view = self._host_view(host, placement_too=False)
        on_board = {v for v, (gpu, _t) in view.vgpus.items() if gpu == A100}
        claimed = any(c.gpu == A100 for c in view.claims)
        in_domains = any(set(m) & on_board for m in view.domains.values())
        held = any(v in on_board for _at, h, v in self._holds if h == host)
        return not (claimed or in_domains or held)

    # -- nova's own leaks -----------------------------------------------------------------

    def _classified(self, findings):
        """Findings an allocation nova leaked explains, renamed ``nova-leak:``.

        A finding seen before, word for word, keeps its explanation: nova's
        leaks stay for good, and asking nova about every server and
        migration after each operation made long runs ever slower."""
        open_ = [
            f
            for f in findings
            if f not in self._explained
            and (
                f.category in ("usage-mismatch", "left-allocation")
                or f.category.startswith("audit")
            )
        ]
        leaked = self._nova_leaked_consumers() if open_ else set()
        classified = []
        for finding in findings:
            if finding in self._explained:
                finding = Finding(NOVA_LEAK + finding.category, finding.subject, finding.detail)
            elif finding in open_ and (leaked or self._abandoned):
                explained = self._as_nova_leak(finding, leaked)
                if explained is not finding:
                    self._explained.add(finding)
                finding = explained
            classified.append(finding)
        return classified

    def _nova_leaked_consumers(self):
        """Consumers nova leaves allocated (see :data:`NOVA_LEAK`)."""
        servers = {s["id"]: s for s in self.api.get_servers()}
        migrations = self.api.api_get("/os-migrations").body["migrations"]
        self._note_domainless(servers)
        return (
            (self._created - set(servers))
            | self._domainless
            | set(self._domainless_moves)
            | {uuid for uuid in self._abandoned if not self._pays_for_old_claims(uuid)}
            | {
                m["uuid"]
                for m in migrations
                if m["status"] in MIGRATION_FAILED or m["instance_uuid"] not in servers
            }
            | {
                uuid
                for uuid, server in self._migrations_of_deleted.items()
                if server not in servers
            }
        )

    def _pays_for_old_claims(self, migration_uuid):
        """Whether a migration a kill left unfinished still pays for any of
        the claims its server held on the source when the kill came."""
        return bool(self._old_claims_paid(migration_uuid))

    def _old_claims_paid(self, migration_uuid):
        """The claims a migration a kill left unfinished still pays for: of
        those its server held on the source when the kill came, the ones
        held there still (their vGPUs counted as held, so its allocation is
        no leak yet), less those the server's domain there uses once the
        server is back there.  A claim is the same one while its vGPU and
        creation time are.  A later move back to the source reuses the
        server's claims there (the driver's allocation returns an
        instance's own claims again) and defines its domain anew: the
        claims that domain uses the server's allocation pays for, not the
        migration's."""
        server_id, source = self._abandoned[migration_uuid]
        old = self._old_claims.get(migration_uuid, frozenset())
        if not old or source not in self.computes:
            return []
        here = any(
            s["id"] == server_id and s["OS-EXT-SRV-ATTR:host"] == source
            for s in self._view.values()
        )
        in_domain = set(self._domains(source).get(server_id, ())) if here else set()
        return [
            c
            for c in self._journal(source).claims()
            if c.instance_uuid == server_id
            and c.state in audit.HELD_STATES
            and (c.mdev_uuid, c.created_at) in old
            and c.mdev_uuid not in in_domain
        ]

    def _note_domainless(self, servers, defined=None):
        """Servers nova left in ERROR with no domain, until one is defined
        again (a stop in between makes them SHUTOFF, still domainless).  A
        resize or cold migration defines it on its destination, and nova
        moves the kept allocation to the migration on the source, where no
        domain ever held it: those migrations are remembered as nova's."""
        if defined is None:
            defined = {uuid for host in HOSTS for uuid in self._domains(host)}
        for uuid in self._domainless & defined & set(servers):
            self._domainless_moves.update(
                (m["uuid"], (uuid, m["source_compute"])) for m in self._migrations(uuid)
            )
        self._domainless = {
            uuid for uuid in self._domainless if uuid in servers and uuid not in defined
        } | {
            uuid
            for uuid, server in servers.items()
            if server["status"] == "ERROR" and uuid not in defined
        }

    def _as_nova_leak(self, finding, leaked):
        category = finding.category
        if category.startswith("audit"):
            # The audit names a migration's allocation by its server.
            host, consumer = finding.subject.split(" ")[0], finding.subject.rsplit(" ", 1)[-1]
            explained = consumer in leaked or any(
                (consumer, host) == moved
                for uuid, moved in (self._domainless_moves | self._abandoned).items()
                if uuid in leaked
            )
        elif category == "usage-mismatch":
            usage, held = (int(n) for n in _USAGE.match(finding.detail).groups())
            explained = usage - self._leaked_units(finding.subject, leaked) == held
        elif category == "left-allocation":
            usage = int(finding.detail.split()[-1])
            explained = self._leaked_units(finding.subject.split()[-1], leaked) == usage
        else:
            explained = False
        if not explained:
            return finding
        return Finding(NOVA_LEAK + category, finding.subject, finding.detail)

    def _leaked_units(self, provider_name, leaked):
        """VGPU units the ``leaked`` consumers hold on a GPU provider."""
        found = self.placement.get(
            f"/resource_providers?name={provider_name}", version="1.14"
        ).body["resource_providers"]
        if not found:
            return 0
        allocations = self.placement.get(
            f"/resource_providers/{found[0]['uuid']}/allocations"
        ).body["allocations"]
        return sum(
            a["resources"].get("VGPU", 0)
            if consumer in leaked
            else self._unpaid_units(consumer, provider_name, a["resources"].get("VGPU", 0))
            for consumer, a in allocations.items()
        )

    def _unpaid_units(self, consumer, provider_name, units):
        """Of a migration's units on a GPU, those no old claim of its server
        accounts for once a kill left it unfinished: nova's (see
        :meth:`_old_claims_paid`).  0 for any other consumer."""
        if consumer not in self._abandoned:
            return 0
        source = self._abandoned[consumer][1]
        paid = [
            c
            for c in self._old_claims_paid(consumer)
            if f"{source}_{names.parse_pci_address(c.gpu).provider_suffix}" == provider_name
        ]
        return max(0, units - len(paid))

    # -- what each side says -----------------------------------------------------------------

    def _journal(self, host):
        return self.computes[host].driver.vgpu.journal

    def _domains(self, host):
        """``{instance uuid: [vGPU ids]}`` from every domain XML on the host."""
        return {
            guest.uuid: guest_xml.vgpu_ids(guest_xml.parse(guest.get_xml_desc()))
            for guest in self.computes[host].driver._host.list_guests(only_running=False)
        }

    def _gpu_usages(self, host):
        """``{GPU provider name: VGPU usage}``: the host's tree read once, then
        each GPU provider's usages (``gpu_providers`` reads thrice as much)."""
        root = self.compute_rp_uuids[host]
        tree = self.placement.get(f"/resource_providers?in_tree={root}", version="1.14").body[
            "resource_providers"
        ]
        return {
            rp["name"]: self.placement.get(f"/resource_providers/{rp['uuid']}/usages")
            .body["usages"]
            .get("VGPU", 0)
            for rp in tree
            if rp["uuid"] != root
        }

    def _host_view(self, host, placement_too=True):
        snapshot = discovery.discover(self.kernels[host])
        vgpus = {}
        for vgpu in snapshot.vgpus:
            gpu = snapshot.gpu_of_parent(vgpu.parent)
            vgpus[vgpu.id] = (gpu.address if gpu else None, vgpu.type_id)
        return HostView(
            host,
            self._domains(host),
            vgpus,
            self._journal(host).claims(),
            self._gpu_usages(host) if placement_too else {},
        )

    # -- invariants ----------------------------------------------------------------------------

    def _settled_findings(self):
        """The invariants' findings, new ones given a few seconds to go away
        (nova finishes some work after the API says an operation ended).  A
        claim or domain a guest left behind gets the next periodic update
        too: nothing else tells a host that a guest left it."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        periodic_run = False
        pause = POLL * 2
        while True:
            findings = self._findings()
            new = [
                f
                for f in findings
                if f.key not in self._result.violations
                and (NOVA_LEAK + f.category, f.subject) not in self._result.nova_leaks
            ]
            if (
                not periodic_run
                and time.monotonic() > deadline
                and any(f.category in GUEST_LEFT for f in new)
            ):
                self._periodics_after_grace()
                periodic_run, deadline = True, time.monotonic() + SETTLE_TIMEOUT
                continue
            if not new or time.monotonic() > deadline:
                return findings
            # Each look reads both hosts in full and asks nova and Placement:
            # looked at less often the longer nova takes to finish.
            time.sleep(pause)
            pause = min(pause * 2, SETTLE_PAUSE_MAX)

    def _periodics_after_grace(self):
        """A periodic update on every compute, as one that comes once
        ``[vgpu] claim_grace`` and ``unused_claim_grace`` have passed since
        the operation."""
        graces = {name: cfg.CONF.vgpu[name] for name in ("claim_grace", "unused_claim_grace")}
        self.flags(claim_grace=0, unused_claim_grace=0, group="vgpu")
        try:
            self._run_periodics()
        finally:
            self.flags(group="vgpu", **graces)

    def _findings(self):
        self._view = self._list_servers()  # what the next operation picks from
        servers = {s["id"]: s for s in self._view.values()}
        pending = self._pending_sources(servers)
        views = [self._host_view(host) for host in HOSTS]
        self._note_domainless(servers, {uuid for view in views for uuid in view.domains})
        findings = []
        for view in views:
            findings += view.running_guests_hold_their_flavor(servers)
            findings += view.no_vgpu_in_two_domains()
            findings += view.usage_matches_holders()
            findings += view.claims_and_domains_have_guests(servers, pending)
        return findings

    def _pending_sources(self, servers):
        """``{instance: {source hosts}}`` of resizes and cold migrations
        awaiting confirmation, or whose finish a kill left unfinished (nova
        keeps the source's domain and allocation)."""
        pending = {
            sid: {self._pending_source(sid)}
            for sid, s in servers.items()
            if s["status"] == "VERIFY_RESIZE"
        }
        for sid, source in self._abandoned.values():
            if sid in servers:
                pending.setdefault(sid, set()).add(source)
        return pending

    def _checkpoint(self):
        """A periodic update on every compute, then the audit of each host."""
        self._run_periodics()
        findings = self._settled_findings()
        self._settle_host_work()
        return findings + self._settled_audit_findings()

    def _settled_audit_findings(self):
        """The audit's findings; an inventory drift counts only if one more
        update leaves it.  A host's capacity may change between its update
        and the audit (a vGPU the kernel was still releasing when the update
        read the type's free count): Placement then lags by one update,
        which no operator would see twice."""
        findings = self._audit_findings()
        if not any(f.category.endswith(":inventory") for f in findings):
            return findings
        self._settle_host_work()
        again = {(f.category, f.subject) for f in self._audit_findings()}
        return [
            f
            for f in findings
            if not f.category.endswith(":inventory") or (f.category, f.subject) in again
        ]

    def _settle_host_work(self):
        """The removals the last updates started finished, and reported.

        The audit compares Placement with what the host computes now: a
        removal ending between a host's update and its audit (one the grace
        of a released claim let go) is drift no operator would see twice.
        """
        for compute in self.computes.values():
            compute.driver.vgpu.manager.removals.join(OP_TIMEOUT)
        self._run_periodics()

    def _audit_findings(self):
        servers = {s["id"]: s for s in self._list_servers().values()}
        pending = set(self._pending_sources(servers))
        for sid in list(pending):
            pending |= {m["uuid"] for m in self._migrations(sid) if m["status"] == "finished"}
        findings = []
        for host in HOSTS:
            findings += [
                Finding(
                    self._drift_category(host, d, pending),
                    f"{host} {d.provider} {d.consumer or ''}".strip(),
                    d.detail,
                )
                for d in self._audit(host)
            ]
        return findings

    def _drift_category(self, host, drift, pending):
        """Drift a pending resize explains, or a lost udev event, apart."""
        if drift.consumer in pending:
            return f"audit-pending-resize:{drift.kind}"
        if host in self._lost_events and drift.kind == "inventory":
            return f"audit-after-lost-udev-event:{drift.kind}"
        return f"audit:{drift.kind}"

    def _audit(self, host):
        return host_audit.audit_of(self, host)

    def _end_findings(self):
        """Everything deleted and each compute updated: nothing may be left
        once the periodic updates after the graces have run (what a guest
        left on a host it had left, as :meth:`_settled_findings` allows:
        the old domain a killed resize's finish left on its source)."""
        for _at, host, vgpu in self._holds:
            self.kernels[host].release(vgpu)
        self._holds = []
        stuck = self._delete_everything()
        self._settle_host_work()
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while True:
            findings = self._leftovers()
            if not findings or time.monotonic() > deadline:
                return stuck + findings + self._settled_audit_findings()
            time.sleep(POLL * 2)
            self._periodics_after_grace()

    def _delete_everything(self):
        findings = []
        for name in sorted(self._ids):
            try:
                with self._on_source_host(name):
                    self._delete(name)
            except (Stuck, api_client.OpenStackApiException) as exc:
                findings.append(Finding("end-delete", name, str(exc)[:300]))
        return findings

    def _leftovers(self):
        findings = []
        for host in HOSTS:
            view = self._host_view(host)
            findings += [
                Finding(
                    "left-claim", f"{host} {c.mdev_uuid}", f"{c.state} claim of {c.instance_uuid}"
                )
                for c in view.claims
            ]
            findings += [
                Finding("left-mdev", f"{host} {v}", f"{gpu} {type_id}")
                for v, (gpu, type_id) in view.vgpus.items()
            ]
            findings += [
                Finding("left-domain", f"{host} {u}", f"vGPUs {m}") for u, m in view.domains.items()
            ]
            findings += [
                Finding("left-allocation", f"{host} {name}", f"usage {usage}")
                for name, usage in view.usage.items()
                if usage
            ]
        return findings


@dataclasses.dataclass
class HostView:
    """One host as each side tells it, read at one moment."""

    host: str
    domains: dict  # instance uuid -> [vGPU ids]
    vgpus: dict  # vGPU id -> (gpu address, type id), from sysfs
    claims: list
    usage: dict  # GPU provider name -> VGPU usage

    def running_guests_hold_their_flavor(self, servers):
        """Each running guest here: its domain holds exactly its flavor's
        vGPUs, each in sysfs and of the flavor's type."""
        findings = []
        for sid, server in servers.items():
            if (
                server["status"] in RUNNING
                and not server["OS-EXT-STS:task_state"]
                and server["OS-EXT-SRV-ATTR:host"] == self.host
            ):
                findings += self._guest_holds(sid, server)
        return findings

    def _guest_holds(self, sid, server):
        flavor = _flavor(server)
        subject = f"{self.host} {server['name']}"
        vgpus = self.domains.get(sid)
        if vgpus is None:
            return [Finding("guest-without-domain", subject, server["status"])]
        findings = []
        if len(vgpus) != flavor.count:
            findings.append(
                Finding(
                    "guest-vgpu-count",
                    subject,
                    f"{flavor.label} wants {flavor.count}, its domain has {len(vgpus)}: {vgpus}",
                )
            )
        for vgpu in vgpus:
            found = self.vgpus.get(vgpu)
            if found is None:
                findings.append(
                    Finding(
                        "guest-vgpu-missing",
                        f"{subject} {vgpu}",
                        "in its domain, not in the host's sysfs",
                    )
                )
            elif found[1] != flavor.type_id:
                findings.append(
                    Finding(
                        "guest-vgpu-type",
                        f"{subject} {vgpu}",
                        f"{found[1]}, {flavor.label} wants {flavor.type_id}",
                    )
                )
        return findings

    def no_vgpu_in_two_domains(self):
        owners = collections.defaultdict(list)
        for uuid, vgpus in self.domains.items():
            for vgpu in vgpus:
                owners[vgpu].append(uuid)
        return [
            Finding("vgpu-shared", f"{self.host} {vgpu}", f"domains {uuids}")
            for vgpu, uuids in owners.items()
            if len(uuids) > 1
        ]

    def holders_per_gpu(self):
        """``{gpu: {vGPU ids}}`` a domain uses or a claim holds; vGPUs whose
        GPU neither sysfs nor a claim says are under ``None``."""
        claimed = {c.mdev_uuid: c for c in self.claims}
        held = collections.defaultdict(set)
        for vgpus in self.domains.values():
            for vgpu in vgpus:
                gpu = self.vgpus.get(vgpu, (None,))[0]
                if gpu is None and vgpu in claimed:
                    gpu = claimed[vgpu].gpu
                held[gpu].add(vgpu)
        for claim in self.claims:
            if claim.state in audit.HELD_STATES:
                held[claim.gpu].add(claim.mdev_uuid)
        return held

    def usage_matches_holders(self):
        """Placement's usage of each GPU provider is the number of vGPUs of
        its GPU that domains use or claims hold, whoever the consumer (a
        pending resize's source allocation is the migration's)."""
        held = self.holders_per_gpu()
        findings = [
            Finding(
                "domain-vgpu-unknown",
                f"{self.host} {v}",
                "in a domain, in no claim and not in sysfs",
            )
            for v in held.pop(None, ())
        ]
        names = {inventory.provider_name_for(self.host, gpu): gpu for gpu in held}
        for name in sorted(set(names) | set(self.usage)):
            usage, holders = self.usage.get(name, 0), held.get(names.get(name), set())
            if usage != len(holders):
                findings.append(
                    Finding(
                        "usage-mismatch",
                        name,
                        f"Placement usage {usage}, {len(holders)} vGPU(s) "
                        f"held by domains and claims: {sorted(holders)}",
                    )
                )
        return findings

    def claims_and_domains_have_guests(self, servers, pending):
        """A claim or a domain here belongs to a server nova has here (or
        whose pending resize left it here), or to a removal under way."""

        def belongs(uuid):
            server = servers.get(uuid)
            return server is not None and (
                self.host == server["OS-EXT-SRV-ATTR:host"] or self.host in pending.get(uuid, ())
            )

        findings = [
            Finding(
                "claim-without-guest",
                f"{self.host} {c.mdev_uuid}",
                f"{c.state} claim of {c.instance_uuid}",
            )
            for c in self.claims
            if c.state != claims_mod.RELEASING
            and c.instance_uuid != restore.RECLAIMER
            and not belongs(c.instance_uuid)
        ]
        findings += [
            Finding("domain-without-guest", f"{self.host} {uuid}", f"vGPUs {vgpus}")
            for uuid, vgpus in self.domains.items()
            if not belongs(uuid)
        ]
        return findings


def _udev_usable():
    """Only root may send the fake kernel's uevents (a lost one is a fault)."""
    return os.geteuid() == 0


def _other(host):
    return HOSTS[1 - HOSTS.index(host)]


def _pick(rng, items):
    return rng.choice(sorted(items)) if items else None


def _flavor(server):
    """The VgpuFlavor nova says the server has now."""
    specs = server["flavor"].get("extra_specs", {})
    for flavor in FLAVORS:
        if specs.get("resources:VGPU") == str(flavor.count) and f"trait:{flavor.trait}" in specs:
            return flavor
    raise AssertionError(f"{server['name']} has no soak flavor: {specs}")


def _fault(server):
    return ((server or {}).get("fault") or {}).get("message", "")


def _refusal(server):
    return any(r in _fault(server) for r in REFUSALS)
