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

import os
import shutil

from vgpu_driver import driver
from vgpu_driver import guest
from vgpu_driver import libvirt_host
from vgpu_driver.cmd import base
from vgpu_driver.cmd.demo import compute
from vgpu_driver.cmd.demo import operator
from vgpu_driver.cmd.demo import progress
from vgpu_driver.cmd.demo import scenario
from vgpu_driver.cmd.demo import workdir
from vgpu_driver.conf import placement as placement_conf
from vgpu_driver.fake import fakekernel


class Demo(progress.Progress, base.Command):
    """Run vgpu-driver end to end on a fake host, with nothing to set up.

    The host is a fake one, Placement a real one run in-process, and libvirt
    its test driver.
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "--dir",
            help="Work in this new or empty directory and keep it "
            "(default: a temporary directory, removed).",
        )
        return parser

    # -- the flow -----------------------------------------------------------------------

    def take_action(self, parsed_args):
        root = workdir.make(parsed_args.dir)
        self.placement = self.node = None
        with self._quiet_libraries():
            try:
                self._run(root)
            finally:
                self._tear_down(root, keep=bool(parsed_args.dir))
        return base.EXIT_OK

    def _run(self, root):
        with self.step(f"writing a fake host (1 A100 with 16 VFs, 8 T4) to {root}/sys"):
            kernel = scenario.write_host(root)
        self.detail(
            f"and an unused {scenario.ORPHAN[1]} mdev on the T4 {scenario.ORPHAN[0]}, "
            f"as a change of type leaves behind: {scenario.ORPHAN[2]}"
        )
        conf = self._start_placement(root, kernel.paths.root)
        self.node = self._start_driver(conf)
        with self.step(f"creating the compute node's provider {scenario.NODENAME}, as nova does"):
            self.node.create_compute_node()
        self._report_inventory()
        booted = [self._boot(name, scenario.FLAVORS[flavor]) for name, flavor in scenario.BOOTS]
        self._show_usage()
        self._show_instances(booted)
        operator.run(
            self,
            conf,
            "mdev",
            "list",
            "-c",
            "uuid",
            "-c",
            "parent",
            "-c",
            "instance",
            "-c",
            "state",
        )
        operator.run(self, conf, "audit")
        operator.run(
            self,
            conf,
            "status",
            "-c",
            "gpu",
            "-c",
            "name",
            "-c",
            "bar",
            "-c",
            "reserved",
            "-c",
            "reason",
            "-c",
            "sriov",
            "-c",
            "guests",
            "-c",
            "claims",
        )

    def _start_placement(self, root, sys_root):
        from vgpu_driver import placement_service

        database = os.path.join(root, "placement.sqlite")
        with self.step("starting Placement (openstack-placement in this process, sqlite)"):
            self.placement = placement_service.EmbeddedPlacement(f"sqlite:///{database}").start()
        self.detail(f"serving on {self.placement.endpoint}, database {database}")
        path, text = scenario.write_nova_conf(root, sys_root, self.placement.endpoint)
        self.say(
            f"==> nova.conf: the demo's, shipped in the package, and this run's "
            f"[vgpu] and [placement] ({path})\n"
        )
        self.detail(text)
        return path

    def _start_driver(self, conf_path):
        """As nova-compute starts: the driver on libvirt, then its init_host."""
        from vgpu_driver import placement

        with self.step(
            "starting the driver (init_host): unused mdevs of types their GPU "
            "no longer serves are removed"
        ):
            conf = scenario.load_conf(conf_path)
            domains = libvirt_host.LibvirtHost(conf.vgpu.libvirt_uri)
            node = compute.MiniCompute(
                driver.VGPUDriver(conf, domains, host=fakekernel.FakeKernel(conf.vgpu.sysfs_root)),
                placement.Client(placement_conf.connection(conf)),
                domains.conn,
                scenario.NODENAME,
            )
            node.vgpu.init_host()
            gone = scenario.ORPHAN[2] not in {m.uuid for m in node.vgpu.host.list_mdevs()}
        self.detail(
            f"{scenario.ORPHAN[2]} ({scenario.ORPHAN[1]} on {scenario.ORPHAN[0]}): "
            f"{'removed' if gone else 'still there'}"
        )
        return node

    def _report_inventory(self):
        with self.step("reporting the inventory: one provider per physical GPU"):
            report = self.node.update_provider_tree()
        self.detail(
            f"{len(report.created)} provider(s) created under {scenario.NODENAME}, "
            f"{report.writes} write(s) after {report.reads} read(s)"
        )
        rows = [
            (p.name, p.type_id, p.total, p.reserved, p.reason or "\n".join(p.traits))
            for p in self.node.tree.providers
        ]
        self.say(
            progress.table(("provider", "type", "total", "reserved", "traits or reason"), rows)
        )

    def _boot(self, name, flavor):
        with self.step(f"booting {name} (flavor {flavor.name})"):
            booted = self.node.boot(name, flavor)
        names = self.node.provider_names()
        spread = "; ".join(
            f"{', '.join(f'{rc}:{n}' for rc, n in sorted(a['resources'].items()))} on "
            f"{names.get(rp, rp)}"
            for rp, a in sorted(booted.allocations.items(), key=lambda i: names.get(i[0], i[0]))
        )
        parents = {m.uuid: m.parent for m in self.node.vgpu.host.list_mdevs()}
        self.detail(
            f"GET /allocation_candidates?{booted.query}\n"
            f"    {booted.candidates} candidate(s); the one whose providers' names "
            f"sort first is taken (nova's scheduler weighs them)\n"
            f"PUT /allocations/{booted.uuid}\n    {spread}\n"
            "VGPUDriver.allocate\n"
            + "".join(f"    mdev {m} on {parents.get(m)}\n" for m in booted.mdevs)
            + f"libvirt: domain {name} defined with VGPUDriver.add_hostdevs's "
            "hostdevs, started;\n    VGPUDriver.instance_defined"
        )
        return booted

    def _show_usage(self):
        with self.step("reading usage back from Placement"):
            rows = [
                (p.name, p.type_id, used, total, reserved)
                for p, used, total, reserved in self.node.usage()
            ]
        self.say(progress.table(("provider", "type", "used", "total", "reserved"), rows))

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
                    rows.append(
                        (
                            instance.name,
                            mdev_uuid,
                            gpu,
                            mdev.type_id,
                            self.node.tree.by_gpu(gpu).name,
                        )
                    )
        self.say(progress.table(("instance", "mdev", "gpu", "type", "provider"), rows))

    def _tear_down(self, root, keep):
        """Stop what was started; keep or remove the working directory."""
        failures = []
        if self.node is not None:
            try:
                workdir.save_domains(self.node, root)
                self.node.shut_down()
            except Exception as exc:  # reported; the rest of the clean-up goes on
                failures.append(f"saving and undefining the domains: {progress.reason(exc)}")
        if self.placement is not None:
            try:
                with self.step("stopping Placement"):
                    self.placement.stop()
            except progress.DemoFailed as exc:
                failures.append(str(exc))
        if keep:
            self.say(
                f"==> kept {root}: sys/ (the fake host), state/ (claims), "
                "placement.sqlite, nova.conf, domains/*.xml\n"
            )
        else:
            shutil.rmtree(root, ignore_errors=True)
            self.say(f"==> removed {root} (--dir DIR keeps it)\n")
        for failure in failures:
            self.app.stderr.write(f"warning: {failure}\n")
