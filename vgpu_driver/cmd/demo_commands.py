"""``demo``: the whole flow on one fake host, with nothing to set up.

A newcomer should see in one command what vgpu-driver does between
Placement, the kernel and libvirt, and an operator what to look at
afterwards.  So the demo writes a fake host (an A100 SR-IOV board and eight
T4, with an unused mdev of an old type left on one T4), starts the real
Placement in this process (sqlite, 127.0.0.1), and then does what
nova-compute does (:mod:`vgpu_driver.cmd.demo.compute`): it creates the
compute node's provider, starts the driver, reports one provider per GPU,
and boots a few instances through Placement, the driver and libvirt's test
driver.  It ends with the views an operator checks: usage in Placement,
each instance's mdevs and GPU, and ``vgpu-manage mdev list``, ``audit`` and
``status`` run against the same host.

Every step prints one progress line with its duration; the first failure
ends the demo with one ``error:`` line naming the step.  The working
directory (fake ``/sys``, claims journal, Placement's database, nova.conf,
the domains' XML) is removed at the end unless ``--dir`` names it.
"""

import argparse
import contextlib
import importlib.resources
import io
import logging
import os
import re
import shlex
import shutil
import tempfile
import time

from cliff.formatters import table as cliff_table
from oslo_config import cfg

from vgpu_driver import conf as vgpu_conf
from vgpu_driver import driver
from vgpu_driver import exception
from vgpu_driver import guest
from vgpu_driver import libvirt_host
from vgpu_driver.cmd import base
from vgpu_driver.cmd import manage
from vgpu_driver.cmd.demo import compute
from vgpu_driver.conf import placement as placement_conf
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles

NODENAME = "demo-host"
LIBVIRT_URI = "test:///default"
ORPHAN = ("0000:35:00.0", "nvidia-222", "7f5a0e0c-3a59-4b7e-9f65-2bb1d1f1e0aa")

A100_4C = "CUSTOM_VGPU_NVIDIA_A100_4C"
T4_2Q = "CUSTOM_VGPU_GRID_T4_2Q"
FLAVORS = {f.name: f for f in (
    compute.Flavor("vdi.t4-2q", 4, 8192, 40, 1, T4_2Q),
    compute.Flavor("render.2x-t4-2q", 8, 16384, 80, 2, T4_2Q),
    compute.Flavor("ml.a100-4c", 8, 32768, 80, 1, A100_4C),
    compute.Flavor("train.2x-a100-4c", 16, 65536, 160, 2, A100_4C),
)}
# (instance, flavor): booted in this order.
BOOTS = (("vdi-1", "vdi.t4-2q"), ("render-1", "render.2x-t4-2q"),
         ("ml-1", "ml.a100-4c"), ("train-1", "train.2x-a100-4c"))

# Loggers whose INFO lines (migrations, each HTTP request) would bury the story.
CHATTY_LOGGERS = ("alembic", "placement", "oslo_db", "keystoneauth", "openstack",
                  "stevedore", "vgpu_driver")

# A missing module, and the extra that brings it.
EXTRAS = {"placement": "embedded-placement", "openstack": "placement",
          "libvirt": "libvirt"}


class DemoFailed(exception.VgpuDriverError):
    msg_fmt = "demo step '%(step)s' failed: %(reason)s"


class DemoDirNotEmpty(exception.VgpuDriverError):
    msg_fmt = "--dir %(path)s is not empty; give a new or empty directory"


def _reason(exc):
    """One line saying what went wrong, with the pip extra when one is missing."""
    if isinstance(exc, ImportError) and exc.name:
        extra = EXTRAS.get(exc.name.split(".")[0])
        if extra:
            return (f"Python module {exc.name!r} is missing "
                    f"(pip install 'vgpu-driver[{extra}]')")
    text = str(exc) or type(exc).__name__
    if not isinstance(exc, exception.VgpuDriverError):
        text = f"{type(exc).__name__}: {text}"
    return re.sub(r"\s+", " ", text).strip()


def table(columns, rows):
    """Rows as vgpu-manage's listings print them (cliff's table formatter:
    numbers right-aligned, fitted to a terminal's width)."""
    out = io.StringIO()
    options = argparse.Namespace(
        max_width=int(os.environ.get("CLIFF_MAX_TERM_WIDTH", 0)),
        fit_width=bool(int(os.environ.get("CLIFF_FIT_WIDTH", 0))), print_empty=False)
    cliff_table.TableFormatter().emit_list(columns, rows, out, options)
    return out.getvalue()


def write_host(root):
    """The fake host under ``root/sys``, with the old-type orphan on one T4."""
    profile = profiles.combine("a100-sriov+t4x8", profiles.load("a100-sriov"),
                               profiles.load("t4x8"))
    kernel = fakekernel.FakeKernel.build(os.path.join(root, "sys"), profile)
    kernel.create_mdev(*ORPHAN)
    return kernel


def write_nova_conf(root, sys_root, endpoint):
    """The shipped nova.conf, plus where this run's pieces are."""
    shipped = importlib.resources.files("vgpu_driver.cmd.demo").joinpath("nova.conf")
    text = shipped.read_text() + (
        "\n# Added by the demo: this run's fake /sys, state and libvirt, and the\n"
        "# Placement it started (auth_strategy noauth2: the token 'admin' is an admin).\n"
        f"[vgpu]\nsysfs_root = {sys_root}\nstate_dir = {os.path.join(root, 'state')}\n"
        f"libvirt_uri = {LIBVIRT_URI}\n\n"
        f"[placement]\nauth_type = admin_token\nendpoint = {endpoint}\ntoken = admin\n")
    path = os.path.join(root, "nova.conf")
    with open(path, "w") as f:
        f.write(text)
    return path, text


def load_conf(path):
    conf = cfg.ConfigOpts()
    vgpu_conf.register_opts(conf)
    conf([], project="nova", default_config_files=[path])
    return conf


class _InProcessManage(manage.ManageApp):
    """vgpu-manage in this process: libvirt's test driver keeps its guests per
    process, so only here does the command see the demo's domains."""

    host_factory = fakekernel.FakeKernel

    def configure_logging(self):
        pass  # the demo's own app has set logging up


class Demo(base.Command):
    """Run vgpu-driver end to end on a fake host, a real Placement and libvirt's
    test driver."""

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument("--dir", help="Work in this new or empty directory and keep it "
                                          "(default: a temporary directory, removed).")
        return parser

    # -- output -------------------------------------------------------------------------

    def say(self, text=""):
        self.app.stdout.write(text)
        self.app.stdout.flush()

    def detail(self, text):
        self.say("".join(f"    {line}\n" for line in text.splitlines()))

    @contextlib.contextmanager
    def step(self, title):
        """``==> title ... done (1.2 s)``; any failure becomes one DemoFailed."""
        self.say(f"==> {title} ... ")
        start = time.monotonic()
        try:
            yield
        except DemoFailed:
            self.say("failed\n")
            raise
        except Exception as exc:
            self.say("failed\n")
            raise DemoFailed(step=title, reason=_reason(exc)) from exc
        self.say(f"done ({time.monotonic() - start:.1f} s)\n")

    # -- the flow -----------------------------------------------------------------------

    def take_action(self, parsed_args):
        root = self._workdir(parsed_args.dir)
        self.placement = self.node = None
        with self._quiet_libraries():
            try:
                self._run(root)
            finally:
                self._tear_down(root, keep=bool(parsed_args.dir))
        return base.EXIT_OK

    @contextlib.contextmanager
    def _quiet_libraries(self):
        """Their INFO lines off, unless -v asked for more; restored afterwards."""
        if self.app.options.verbose_level > 1:
            yield
            return
        loggers = [logging.getLogger(name) for name in CHATTY_LOGGERS]
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)

    def _workdir(self, wanted):
        if not wanted:
            return tempfile.mkdtemp(prefix="vgpu-demo-")
        if os.path.isdir(wanted) and os.listdir(wanted):
            raise DemoDirNotEmpty(path=wanted)
        os.makedirs(wanted, exist_ok=True)
        return os.path.abspath(wanted)

    def _run(self, root):
        with self.step(f"writing a fake host (1 A100 with 16 VFs, 8 T4) to {root}/sys"):
            kernel = write_host(root)
        self.detail(f"and an unused {ORPHAN[1]} mdev on the T4 {ORPHAN[0]}, as a change "
                    f"of type leaves behind: {ORPHAN[2]}")
        conf = self._start_placement(root, kernel.paths.root)
        self.node = self._start_driver(conf)
        with self.step(f"creating the compute node's provider {NODENAME}, as nova does"):
            self.node.create_compute_node()
        self._report_inventory()
        booted = [self._boot(name, FLAVORS[flavor]) for name, flavor in BOOTS]
        self._show_usage()
        self._show_instances(booted)
        self._operator(conf, "mdev", "list", "-c", "uuid", "-c", "parent", "-c", "instance",
                       "-c", "state")
        self._operator(conf, "audit")
        self._operator(conf, "status", "-c", "gpu", "-c", "name", "-c", "bar", "-c",
                       "reserved", "-c", "reason", "-c", "sriov", "-c", "guests", "-c",
                       "claims")

    def _start_placement(self, root, sys_root):
        from vgpu_driver import placement_service

        database = os.path.join(root, "placement.sqlite")
        with self.step("starting Placement (openstack-placement in this process, sqlite)"):
            self.placement = placement_service.EmbeddedPlacement(
                f"sqlite:///{database}").start()
        self.detail(f"serving on {self.placement.endpoint}, database {database}")
        path, text = write_nova_conf(root, sys_root, self.placement.endpoint)
        self.say(f"==> nova.conf: the demo's, shipped in the package, and this run's "
                 f"[vgpu] and [placement] ({path})\n")
        self.detail(text)
        return path

    def _start_driver(self, conf_path):
        """As nova-compute starts: the driver on libvirt, then its init_host."""
        from vgpu_driver import placement

        with self.step("starting the driver (init_host): unused mdevs of types their GPU "
                       "no longer serves are removed"):
            conf = load_conf(conf_path)
            domains = libvirt_host.LibvirtHost(conf.vgpu.libvirt_uri, use_events=False)
            node = compute.MiniCompute(
                driver.VGPUDriver(conf, domains,
                                  host=fakekernel.FakeKernel(conf.vgpu.sysfs_root)),
                placement.Client(placement_conf.connection(conf)), domains.conn, NODENAME)
            node.vgpu.init_host()
            gone = ORPHAN[2] not in {m.uuid for m in node.vgpu.host.list_mdevs()}
        self.detail(f"{ORPHAN[2]} ({ORPHAN[1]} on {ORPHAN[0]}): "
                    f"{'removed' if gone else 'still there'}")
        return node

    def _report_inventory(self):
        with self.step("reporting the inventory: one provider per physical GPU"):
            report = self.node.update_provider_tree()
        self.detail(f"{len(report.created)} provider(s) created under {NODENAME}, "
                    f"{report.writes} write(s) after {report.reads} read(s)")
        rows = [(p.name, p.type_id, p.total, p.reserved, p.reason or "\n".join(p.traits))
                for p in self.node.tree.providers]
        self.say(table(("provider", "type", "total", "reserved", "traits or reason"), rows))

    def _boot(self, name, flavor):
        with self.step(f"booting {name} (flavor {flavor.name})"):
            booted = self.node.boot(name, flavor)
        names = self.node.provider_names()
        spread = "; ".join(
            f"{', '.join(f'{rc}:{n}' for rc, n in sorted(a['resources'].items()))} on "
            f"{names.get(rp, rp)}" for rp, a in sorted(booted.allocations.items(),
                                                       key=lambda i: names.get(i[0], i[0])))
        parents = {m.uuid: m.parent for m in self.node.vgpu.host.list_mdevs()}
        self.detail(f"GET /allocation_candidates?{booted.query}\n"
                    f"    {booted.candidates} candidate(s); the first is taken, as nova's "
                    f"scheduler does\n"
                    f"PUT /allocations/{booted.uuid}\n    {spread}\n"
                    "VGPUDriver.allocate\n"
                    + "".join(f"    mdev {m} on {parents.get(m)}\n" for m in booted.mdevs)
                    + f"libvirt: domain {name} defined with VGPUDriver.add_hostdevs's "
                    "hostdevs, started;\n    VGPUDriver.instance_defined")
        return booted

    def _show_usage(self):
        with self.step("reading usage back from Placement"):
            rows = [(p.name, p.type_id, used, total, reserved)
                    for p, used, total, reserved in self.node.usage()]
        self.say(table(("provider", "type", "used", "total", "reserved"), rows))

    def _show_instances(self, booted):
        with self.step("reading each instance's mdevs from libvirt and their GPU from /sys"):
            snapshot = self.node.vgpu.manager.snapshot(refresh=True)
            by_uuid = {m.uuid: m for m in snapshot.mdevs}
            rows = []
            for instance in booted:
                xml = self.node.conn.lookupByUUIDString(instance.uuid).XMLDesc(0)
                for mdev_uuid in guest.mdev_uuids(guest.parse(xml)):
                    mdev = by_uuid[mdev_uuid]
                    gpu = snapshot.gpu_of_parent(mdev.parent).address
                    rows.append((instance.name, mdev_uuid, gpu, mdev.type_id,
                                 self.node.tree.by_gpu(gpu).name))
        self.say(table(("instance", "mdev", "gpu", "type", "provider"), rows))

    def _operator(self, conf_path, *command):
        argv = ["--config-file", conf_path, "--nodename", NODENAME, *command]
        self.say(f"==> $ vgpu-manage {shlex.join(argv)}\n")
        app = _InProcessManage()
        app.stdout, app.stderr = io.StringIO(), io.StringIO()
        code = app.run(argv)
        output = app.stdout.getvalue()
        if output.strip():
            self.say(output)
        elif command[0] == "audit" and code == base.EXIT_OK:
            self.detail("no drift: Placement's allocations and inventory match the "
                        "host's mdevs, claims and guests")
        if code != base.EXIT_OK:
            said = app.stderr.getvalue().strip().splitlines()
            why = said[-1].removeprefix("error: ") if said else (
                "drift, listed above" if command[0] == "audit" else "no message")
            raise DemoFailed(step=f"vgpu-manage {' '.join(command[:2])}",
                             reason=f"exit code {code}: {why}")

    def _tear_down(self, root, keep):
        """Stop what was started; keep or remove the working directory."""
        failures = []
        if self.node is not None:
            try:
                self._save_domains(root)
                self.node.shut_down()
            except Exception as exc:  # reported; the rest of the clean-up goes on
                failures.append(f"saving and undefining the domains: {_reason(exc)}")
        if self.placement is not None:
            try:
                with self.step("stopping Placement"):
                    self.placement.stop()
            except DemoFailed as exc:
                failures.append(str(exc))
        if keep:
            self.say(f"==> kept {root}: sys/ (the fake host), state/ (claims), "
                     "placement.sqlite, nova.conf, domains/*.xml\n")
        else:
            shutil.rmtree(root, ignore_errors=True)
            self.say(f"==> removed {root} (--dir DIR keeps it)\n")
        for failure in failures:
            self.app.stderr.write(f"warning: {failure}\n")

    def _save_domains(self, root):
        """The domains' XML as libvirt holds it, for whoever looks afterwards."""
        target = os.path.join(root, "domains")
        os.makedirs(target, exist_ok=True)
        for name, xml in self.node.domain_xmls().items():
            with open(os.path.join(target, f"{name}.xml"), "w") as f:
                f.write(xml)
