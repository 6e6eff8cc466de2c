"""What a failed step leaves behind, through nova's own services.

Each test injects a fault at one step of a nova operation (an exception in
our code or nova's, Placement answering 500) and then checks what the
driver controls, on every host:

* the guest's domain holds exactly its current flavor's vGPUs, of the type
  the flavor asks for, each claimed; or the guest has no domain and no claim;
* a host the guest left keeps no domain, claim or vGPU of it (once a
  periodic update has run: nothing tells it the guest left);
* Placement's usage on each GPU is the number of vGPUs held there;
* with every server deleted, nothing is left.

nova's own outcomes (a server's state, an allocation nova keeps or leaks)
are the docstrings'; the driver cannot change them.  nova's functional
harness runs RPC casts as calls, so a failure on a destination also unwinds
the source's and the conductor's handlers, as the tests' notes say.
"""

import collections

import fixtures
import nova.conf
from nova.tests import fixtures as nova_fixtures
from nova.tests.functional.api import client as api_client
from placement import deploy as placement_deploy

from tests import placement_faults
from tests.functional_nova import test_vgpu
from vgpu_driver import claims
from vgpu_driver import discovery
from vgpu_driver import inventory

L40S, L40S_TYPE = "0000:c1:00.0", "nvidia-1155"  # NVIDIA L40S-4Q, vendor VFIO
T4, T4_TYPE = "0000:18:00.0", "nvidia-231"  # GRID T4-2Q, mdevs
_real_loadapp = placement_deploy.loadapp
TYPE_OF_TRAIT = {"CUSTOM_VGPU_NVIDIA_L40S_4Q": L40S_TYPE, "CUSTOM_VGPU_GRID_T4_2Q": T4_TYPE}


def _fail_once(real, error):
    """``real`` (a method), raising ``error`` at its first call only."""
    calls = []

    def method(this, *args, **kwargs):
        if not calls:
            calls.append(1)
            raise error
        return real(this, *args, **kwargs)

    return method


def _always_fail(error):
    def method(this, *args, **kwargs):
        raise error

    return method


class FaultyPlacementMixin:
    """Before a nova functional base: its Placement behind a FaultInjector
    (``self.placement_faults``), and guests without disk files to move."""

    def setUp(self):
        # Placement is built inside the base's setUp: the injector goes in first.
        self.useFixture(
            fixtures.MonkeyPatch("placement.deploy.loadapp", self._placement_with_faults)
        )
        super().setUp()
        # As ResizeTests: the fake guests have no disk files to move.
        self.useFixture(
            fixtures.MockPatch(
                "nova.virt.libvirt.LibvirtDriver._get_instance_disk_info", return_value=[]
            )
        )
        self.useFixture(fixtures.MockPatch("os.rename"))

    def _placement_with_faults(self, conf):
        self.placement_faults = placement_faults.FaultInjector(_real_loadapp(conf))
        return self.placement_faults


class FaultOutcomeTestBase(FaultyPlacementMixin, test_vgpu.VGPUDriverTestBase):
    HOSTS = {}  # hostname: fake host profiles

    def setUp(self):
        super().setUp()
        # vGPUs are removed on release, so nothing may be left at the end.
        self.flags(remove_mdevs_on_release=True, group="vgpu")
        self.configure()
        for hostname, profiles in self.HOSTS.items():
            self.start_vgpu_compute(hostname, *profiles)

    def configure(self):
        """[devices] and [mdev_<type>] options, set before the computes start."""

    def flavor(self, name, trait, memory_mb=512, **extra_spec):
        return self._create_flavor(
            name=name,
            memory_mb=memory_mb,
            vcpu=1,
            disk=1,
            ephemeral=0,
            extra_spec={"resources:VGPU": "1", f"trait:{trait}": "required", **extra_spec},
        )

    # -- nova's operations, failures allowed ------------------------------------------

    def act(self, server, body):
        """Post a server action; nova's harness answers 500 when the operation
        failed on a compute (casts run as calls)."""
        try:
            self.api.post_server_action(server["id"], body)
        except api_client.OpenStackApiException as exc:
            if exc.response.status_code != 500:
                raise
        return self.api.get_server(server["id"])

    def confirm(self, server):
        """Confirm a resize.  nova's libvirt driver undefines the source domain
        only when CONF.host names the source, and the harness's computes share
        one CONF: point it at the source meanwhile."""
        source = [
            m["source_compute"] for m in self.migrations(server) if m["status"] == "finished"
        ][0]
        host = nova.conf.CONF.host
        self.flags(host=source)
        try:
            return self.act(server, {"confirmResize": None})
        finally:
            self.flags(host=host)

    def migrations(self, server):
        return self.api.api_get(f"/os-migrations?instance_uuid={server['id']}").body["migrations"]

    # -- what each side says -------------------------------------------------------------

    def domains(self, host):
        """``{instance uuid: [vGPU ids]}`` from the domain XML on ``host``."""
        return {
            guest.uuid: test_vgpu.guest_xml.vgpu_ids(
                test_vgpu.guest_xml.parse(guest.get_xml_desc())
            )
            for guest in self.computes[host].driver._host.list_guests(only_running=False)
        }

    def claims(self, host, server=None):
        """``[(vGPU id, state)]`` of the host's claims (of ``server`` only)."""
        journal = self.computes[host].driver.vgpu.journal
        return [(c.mdev_uuid, c.state) for c in journal.claims(server and server["id"])]

    def vgpus(self, host):
        """``{vGPU id: (GPU address, type id)}`` from the host's sysfs."""
        snapshot = discovery.discover(self.kernels[host])
        found = {}
        for vgpu in snapshot.vgpus:
            gpu = snapshot.gpu_of_parent(vgpu.parent)
            found[vgpu.id] = (gpu.address if gpu else None, vgpu.type_id)
        return found

    # -- the outcomes ----------------------------------------------------------------------

    def assert_holds_its_flavor(self, server):
        """On its host the guest holds exactly its flavor's vGPUs, claimed, or
        no domain and no claim."""
        server = self.api.get_server(server["id"])
        here = server["OS-EXT-SRV-ATTR:host"]
        mdevs = self.domains(here).get(server["id"])
        held = self.claims(here, server)
        where = f"{server['name']} ({server['status']}) on {here}"
        if mdevs is None:
            self.assertEqual([], held, where)
            return
        specs = server["flavor"]["extra_specs"]
        wanted = [TYPE_OF_TRAIT[k.split(":", 1)[1]] for k in specs if k.startswith("trait:")] * int(
            specs["resources:VGPU"]
        )
        types = [self.vgpus(here).get(m, (None, None))[1] for m in mdevs]
        self.assertEqual(wanted, types, f"{where}: vGPUs {mdevs}")
        self.assertEqual(sorted((m, claims.ATTACHED) for m in mdevs), held, where)

    def assert_left_nothing(self, server):
        """The hosts the guest is not on hold no domain and no claim of it."""
        server = self.api.get_server(server["id"])
        for host in sorted(set(self.HOSTS) - {server["OS-EXT-SRV-ATTR:host"]}):
            self.assertEqual(
                (None, []),
                (self.domains(host).get(server["id"]), self.claims(host, server)),
                f"{server['name']} ({server['status']} on "
                f"{server['OS-EXT-SRV-ATTR:host']}) on {host}",
            )

    def later(self):
        """A periodic update on every compute once ``[vgpu] claim_grace`` has
        passed: nothing else tells a host that a guest left it."""
        self.flags(claim_grace=0, group="vgpu")
        self._run_periodics()

    def assert_usage_matches_holders(self):
        """Placement's usage on each GPU is the number of vGPUs domains use or
        claims hold there."""
        for host in self.HOSTS:
            vgpus = self.vgpus(host)
            held = collections.defaultdict(set)
            for mdevs in self.domains(host).values():
                for mdev in mdevs:
                    held[vgpus.get(mdev, (None,))[0]].add(mdev)
            for claim in self.computes[host].driver.vgpu.journal.claims():
                if claim.state != claims.RELEASING:
                    held[claim.gpu].add(claim.mdev_uuid)
            usage = {
                name: used for name, (_t, _r, used) in self.gpu_providers(host).items() if used
            }
            self.assertEqual(
                usage,
                {
                    inventory.provider_name_for(host, gpu): len(mdevs)
                    for gpu, mdevs in held.items()
                    if mdevs
                },
                host,
            )

    def assert_nothing_left(self):
        for host in self.HOSTS:
            self.assertEqual(
                ({}, [], {}), (self.domains(host), self.claims(host), self.vgpus(host)), host
            )

    def delete_all(self):
        for server in self.api.get_servers():
            self._delete_server(server)
        self.later()


class FailedResizeFinishTests(FaultOutcomeTestBase):
    """A resize from an L40S flavor to a T4 flavor fails on the destination.

    nova then gives the instance its old flavor back but leaves it on the
    destination, in ERROR, holding the new flavor's allocation there ("You
    may be able to recover the instance by hard rebooting it"), and the
    source's powered-off domain as it was; nothing tells the source.  In
    nova's harness the failure also unwinds into the source's and the
    destination's prep steps, and the conductor reschedules the resize from
    the failed destination to the other T4 host: a revert then brings the
    guest back to the failed destination, with its L40S flavor and the T4
    allocation it held there.

    A claim the failed step left there handed its T4 vGPU to the reverted
    L40S guest, and without one the guest came back with no vGPU.  The
    driver now releases what a failed finish claimed, defines a guest again
    only with the vGPUs of its allocation, and refuses an allocation whose
    vGPUs its flavor does not ask for: the guest has no domain and no claim
    (nova sets it to ERROR).  The exception is the hard reboot nova
    recommends for a guest the failed finish left in ERROR: its allocation
    is the resize's, and it gets the vGPU the resize's T4 flavor asks for.
    The source lets the guest's domain and vGPU go at its next periodic
    update.
    """

    HOSTS = {"host1": ("l40s-vfio",), "host2": ("t4x8",), "host3": ("t4x8",)}
    ENABLED_TYPES = f"{L40S_TYPE},{T4_TYPE}"

    def configure(self):
        # sysfs does not say how many L40S-4Q fit on the GPU: the operator does.
        self.flags(device_addresses=[L40S], max_instances=12, group=f"mdev_{L40S_TYPE}")
        self.flags(device_addresses=[T4], group=f"mdev_{T4_TYPE}")

    def setUp(self):
        super().setUp()
        self.l40s = self.flavor("l40s", "CUSTOM_VGPU_NVIDIA_L40S_4Q")
        self.t4 = self.flavor("t4", "CUSTOM_VGPU_GRID_T4_2Q")
        self.server = self._create_server(flavor_id=self.l40s, networks="none", host="host1")

    def resize_to_t4(self, target, fault):
        with fixtures.MonkeyPatch(target, fault):
            return self.act(self.server, {"resize": {"flavorRef": self.t4}})

    def _revert_after_a_failed_finish(self, target):
        server = self.resize_to_t4(target, _fail_once(_resolve(target), RuntimeError("injected")))
        # Rescheduled to the other T4 host after the first destination failed.
        self.assertEqual("VERIFY_RESIZE", server["status"])
        self.assertEqual(2, len(self.migrations(server)))
        server = self.act(server, {"revertResize": None})
        self.assert_holds_its_flavor(server)
        self.later()
        self.assert_left_nothing(server)
        self.delete_all()
        self.assert_nothing_left()

    def test_a_revert_after_the_domain_define_failed_gives_no_t4_to_the_l40s_guest(self):
        self._revert_after_a_failed_finish("nova.virt.libvirt.driver.LibvirtDriver._create_guest")

    def test_a_revert_after_the_mdev_create_failed_gives_no_t4_to_the_l40s_guest(self):
        self._revert_after_a_failed_finish("vgpu_driver.mdevs.strategies.MdevParentStrategy.create")

    def test_a_hard_reboot_after_a_failed_finish_recovers_the_guest_on_its_t4(self):
        # Every T4 destination fails: the instance stays in ERROR on the last.
        server = self.resize_to_t4(
            "nova.virt.libvirt.driver.LibvirtDriver._create_guest",
            _always_fail(RuntimeError("injected")),
        )
        self.assertEqual(("ERROR", "l40s"), (server["status"], server["flavor"]["original_name"]))
        self.assert_holds_its_flavor(server)
        server = self.act(server, {"reboot": {"type": "HARD"}})
        self.assertEqual("ACTIVE", server["status"])
        here = server["OS-EXT-SRV-ATTR:host"]
        vgpus = self.domains(here)[server["id"]]
        self.assertEqual([T4_TYPE], [self.vgpus(here)[v][1] for v in vgpus])
        self.assertEqual([(vgpus[0], claims.ATTACHED)], self.claims(here, server))
        self.later()
        self.assert_usage_matches_holders()
        self.assert_left_nothing(server)
        self.delete_all()
        self.assert_nothing_left()


class TwoT4HostsTestBase(FaultOutcomeTestBase):
    """Two T4 hosts and two T4 flavors, ``small`` and ``big``."""

    HOSTS = {"host1": ("t4x8",), "host2": ("t4x8",)}
    ENABLED_TYPES = T4_TYPE

    def setUp(self):
        super().setUp()
        self.small = self.flavor("small", "CUSTOM_VGPU_GRID_T4_2Q")
        self.big = self.flavor("big", "CUSTOM_VGPU_GRID_T4_2Q", memory_mb=1024)


class PendingResizeTestBase(TwoT4HostsTestBase):
    """A T4 guest resized from host1 to host2, awaiting confirmation."""

    def setUp(self):
        super().setUp()
        server = self._create_server(flavor_id=self.small, networks="none", host="host1")
        self.server = self._resize_server(server, self.big)


class CrashWhileReleasingTests(PendingResizeTestBase):
    """The driver's release raises during a resize's confirm or revert.

    A confirm that fails on the source leaves the instance in ERROR on the
    destination, and nova deletes the source's allocation all the same: the
    source's claim stayed, a vGPU held that Placement no longer counted.  A
    revert that fails on the destination leaves the instance in ERROR there,
    its domain gone and its claim kept (nova keeps the source's allocation
    with the migration, and leaks it when the server is deleted); the source
    kept its domain and claim for good.  Nothing tells either host more, so
    the next periodic update lets them go: the claims and domain of a guest
    that left, and the claims of a guest in ERROR with no domain; a hard
    reboot gives it vGPUs again from its allocation.
    """

    def test_a_confirm_whose_release_crashes_leaves_no_vgpu_held_on_the_source(self):
        with fixtures.MonkeyPatch(
            "vgpu_driver.driver.VGPUDriver.release_unused", _always_fail(RuntimeError("injected"))
        ):
            server = self.confirm(self.server)
        self.assertEqual(("ERROR", "host2"), (server["status"], server["OS-EXT-SRV-ATTR:host"]))
        self.assert_holds_its_flavor(server)
        self.later()
        self.assert_usage_matches_holders()
        self.assert_left_nothing(server)
        server = self.act(server, {"reboot": {"type": "HARD"}})
        self.assertEqual("ACTIVE", server["status"])
        self.assert_holds_its_flavor(server)
        self.delete_all()
        self.assert_nothing_left()

    def test_a_revert_whose_release_crashes_leaves_nothing_on_the_source(self):
        with fixtures.MonkeyPatch(
            "vgpu_driver.driver.VGPUDriver.release", _always_fail(RuntimeError("injected"))
        ):
            server = self.act(self.server, {"revertResize": None})
        self.assertEqual(("ERROR", "host2"), (server["status"], server["OS-EXT-SRV-ATTR:host"]))
        self.later()
        self.assert_holds_its_flavor(server)
        self.assert_left_nothing(server)
        server = self.act(server, {"reboot": {"type": "HARD"}})
        self.assertEqual("ACTIVE", server["status"])
        self.assert_holds_its_flavor(server)
        self.delete_all()
        self.assert_nothing_left()


class RevertDuringPlacementOutageTests(PendingResizeTestBase):
    """Placement answers 503 to provider requests while a resize is reverted.

    The destination fails to move the allocations back, so nova leaves the
    instance in ERROR on the destination (its domain there destroyed, no
    claim kept) and the migration in error, and nothing reaches the source:
    its powered-off domain and its claim stay.  The next periodic update
    lets them go (the guest left it; no move is under way).  What stays is
    nova's: the migration's allocation on the source's GPU, which it leaks
    when the server is deleted (as after a revert that crashed, above).
    """

    def test_a_revert_during_a_placement_outage_leaves_no_vgpu_behind(self):
        self.placement_faults.fail(path=r"/resource_providers(/.*)?", status=503, times=None)
        try:
            server = self.act(self.server, {"revertResize": None})
        finally:
            self.placement_faults.restore()
        self.assertEqual(("ERROR", "host2"), (server["status"], server["OS-EXT-SRV-ATTR:host"]))
        self.assertEqual(["error"], [m["status"] for m in self.migrations(server)])
        self.assertEqual(1, len(self.domains("host1")))  # nothing told the source
        self.later()
        self.assert_holds_its_flavor(server)
        self.assert_left_nothing(server)
        self.delete_all()
        self.assert_nothing_left()
        # nova's leak: the errored migration keeps the source's unit allocated.
        used = {
            name: used
            for host in self.HOSTS
            for name, (_t, _r, used) in self.gpu_providers(host).items()
            if used
        }
        self.assertEqual([1], list(used.values()))


class ShelveOffloadFaultTests(TwoT4HostsTestBase):
    """Placement answers 500 while a volume-backed server is shelved.

    nova offloads such a server at once: it destroys the guest, then deletes
    its allocation, and when that fails it only reverts the task state: the
    server stays ACTIVE, on its host, with its allocation and no domain.
    The driver has released its claim and removed its vGPU with the domain,
    which is consistent; the guest must get its vGPU back from whatever
    defines it again.  A resize and a revert brought it back without any
    (nothing of it was left to reuse); a start while Placement could not say
    what it is allocated did too.
    """

    def setUp(self):
        super().setUp()
        self.server = self.shelve_failing(self.boot_from_volume())

    def boot_from_volume(self):
        body = self._build_server(flavor_id=self.small, networks="none", image_uuid="")
        body["block_device_mapping_v2"] = [
            {
                "boot_index": 0,
                "uuid": nova_fixtures.CinderFixture.IMAGE_BACKED_VOL,
                "source_type": "volume",
                "destination_type": "volume",
            }
        ]
        body["host"] = "host1"
        return self._wait_for_state_change(self.api.post_server({"server": body}), "ACTIVE")

    def shelve_failing(self, server):
        self.placement_faults.fail("DELETE", r"/allocations/.*", status=500)
        server = self.act(server, {"shelve": None})
        self.assertEqual(("ACTIVE", "host1"), (server["status"], server["OS-EXT-SRV-ATTR:host"]))
        self.assertEqual(
            ({}, [], {}), (self.domains("host1"), self.claims("host1"), self.vgpus("host1"))
        )
        self.assert_holds_its_flavor(server)
        return server

    def test_a_revert_gives_the_guest_its_vgpu_again(self):
        server = self._resize_server(self.server, self.big)
        server = self.act(server, {"revertResize": None})
        self.assertEqual(("ACTIVE", "host1"), (server["status"], server["OS-EXT-SRV-ATTR:host"]))
        self.assertEqual(1, len(self.domains("host1")[server["id"]]))
        self.assert_holds_its_flavor(server)
        self.assert_usage_matches_holders()
        self.delete_all()
        self.assert_nothing_left()

    def test_a_start_while_placement_cannot_say_defines_no_guest_without_its_vgpu(self):
        server = self.act(self.server, {"os-stop": None})
        self.assertEqual("SHUTOFF", server["status"])
        self.placement_faults.fail("GET", rf"/allocations/{server['id']}", status=500, times=None)
        server = self.act(server, {"os-start": None})
        self.placement_faults.restore()
        self.assert_holds_its_flavor(server)
        server = self.act(server, {"os-start": None})
        self.assertEqual("ACTIVE", server["status"])
        self.assert_holds_its_flavor(server)
        self.assertEqual(1, len(self.domains("host1")[server["id"]]))
        self.delete_all()
        self.assert_nothing_left()


def _resolve(target):
    """The attribute a dotted ``module.Class.method`` path names."""
    module, cls, attr = target.rsplit(".", 2)
    return getattr(getattr(__import__(module, fromlist=[cls]), cls), attr)
