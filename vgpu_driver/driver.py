"""VGPUDriver: the core facade a compute driver calls.

It wires config, sysfs, the claims journal and the domain source together,
and says in one place what happens when: at start-up (``init_host``), when
inventory is reported, when an instance is spawned or deleted.  It imports
no nova; :mod:`vgpu_driver.nova` adapts it.
"""

import time

from oslo_log import log as logging

from vgpu_driver import audit
from vgpu_driver import claims
from vgpu_driver import claims_journal
from vgpu_driver import discovery_cache
from vgpu_driver import exception
from vgpu_driver import guest
from vgpu_driver import host_reconciler
from vgpu_driver import host_tree
from vgpu_driver import hosts
from vgpu_driver import mdevs
from vgpu_driver import metrics
from vgpu_driver import metrics_textfile
from vgpu_driver import migration
from vgpu_driver import names
from vgpu_driver import reconcile
from vgpu_driver import removals
from vgpu_driver import status_assembly
from vgpu_driver.conf import mdev_types
from vgpu_driver.sysfs import udev

LOG = logging.getLogger(__name__)


class VGPUDriver:
    def __init__(self, conf, domains, host=None, mdev_config=None, journal=None):
        """``conf``: a ConfigOpts with vgpu-driver's options registered and
        parsed; ``domains``: a DomainReferences (libvirt on a host);
        ``mdev_config``: the validated types, read from ``conf`` if not given;
        ``journal``: an open Journal (else opened, and created if missing)."""
        self.conf = conf
        self.mdev_config = mdev_config or mdev_types.from_conf(conf)
        self.metrics_file = (
            metrics_textfile.TextfileWriter(conf.vgpu.metrics_textfile)
            if conf.vgpu.metrics_textfile
            else None
        )
        self.host = host or hosts.open_host(conf)
        self.journal = journal or claims_journal.Journal(conf.vgpu.state_dir)
        self.domains = domains
        self.manager = mdevs.MdevManager(
            self.host,
            self.journal,
            domains,
            self.mdev_config,
            remove_on_release=conf.vgpu.remove_mdevs_on_release,
            remove_timeout=conf.vgpu.mdev_remove_timeout,
            removals=removals.Removals(conf.vgpu.max_removals_in_flight),
        )
        self.reconciler = reconcile.Reconciler(self.manager)
        self.migrations = migration.Migrations(self.manager)
        #: What udev says changed (or the polling stand-in), and the
        #: discovery it lets re-read only that.
        self.changes = udev.start(self.host, conf.vgpu.hotplug_events)
        # The inventory and the reconciler look at the configured types
        # only: the others' attributes are not read at each update.
        self.discovery = discovery_cache.CachedDiscovery(
            self.host,
            self.changes,
            full_every=conf.vgpu.full_refresh_interval,
            wanted=frozenset(self.mdev_config.enabled),
        )
        #: The one worker for everything the host changes on its own.
        self.worker = host_reconciler.HostReconciler(
            self.reconciler,
            conf,
            changes=self.changes,
            discovery=self.discovery,
            state_dir=conf.vgpu.state_dir,
        )
        # A removal the kernel blocked past its caller's wait is finished
        # as soon as it returns; the GPU it was on is read again then.
        self.manager.vgpu_removed = self.discovery.vgpu_removed
        self.manager.removals.on_done = lambda vgpu: self.worker.poke(host_reconciler.REMOVAL_DONE)

    def close(self):
        """Stop the host reconciler and udev (nova-compute's exit does as much)."""
        self.worker.stop()
        self.changes.stop()

    def init_host(self):
        """Put the host right after a (re)start; returns the restore outcomes.

        The host reconciler's start-up pass runs now, in order: finish
        interrupted removals; drop claims nobody came for (else they would
        be re-created for nothing); claim the mdevs guests use without a
        claim (made by nova's driver before a switch); re-create what guests
        and claims still reference; free GPUs of unused mdevs of types they
        no longer serve.  Then the reconciler works on in the background,
        re-creating what was not back yet (VFs the vendor enables later) as
        soon as it appears.
        """
        return list(self.worker.start_up().restore)

    def provider_tree(self, nodename, allocations_on=None):
        """The desired providers, after reclaiming unused stale-type mdevs.

        ``allocations_on(provider name)`` -> ``{consumer: {class: units}}`` (None when
        Placement could not say) lets the inventory reserve claims no
        allocation covers; without it, claims reserve nothing.
        """
        began, started = time.monotonic(), time.time()
        # The host reconciler's pass for this update first (removals,
        # stale claims and stale types), then one read for the inventory
        # (and the metrics file, when one is written).
        self.worker.run_now(host_reconciler.PERIODIC)
        tree, snapshot, claim_list, users = self._read_tree(nodename, allocations_on)
        self.worker.note_update(started, time.monotonic() - began)
        if self.metrics_file is not None:
            self._write_metrics(nodename, snapshot, tree, claim_list, users)
        return tree

    def inventory_now(self, nodename, allocations_on=None):
        """The desired providers as the host is now, without the host
        reconciler's pass or the metrics of :meth:`provider_tree`: for an
        inventory that must follow a change at once (a vGPU just placed
        on a mixed-size board), in the path of the operation that made it."""
        return self._read_tree(nodename, allocations_on)[0]

    def _read_tree(self, nodename, allocations_on):
        """``(tree, snapshot, claims, users)`` of one read of the host."""
        snapshot = self.manager.use_snapshot(self.discovery.snapshot())
        # Guests before claims: a vGPU being handed out (claim, then domain)
        # or given back (domain, then claim) is seen in one or the other.
        users = self.manager.domains.mdev_users()
        claim_list = self.journal.claims()
        in_use = self.reconciler.referenced(snapshot, claim_list, users)
        tree = host_tree.desired(
            self.manager.host,
            snapshot,
            self.mdev_config,
            nodename,
            in_use,
            claim_list,
            allocations_on,
        )
        return tree, snapshot, claim_list, users

    def _write_metrics(self, nodename, snapshot, tree, claim_list, users):
        """The metrics of what this update read, into ``[vgpu] metrics_textfile``.

        Whatever goes wrong here is logged and the update goes on: the
        inventory it computed still reaches Placement."""
        try:
            now = time.time()
            state = self.worker.state()
            view = status_assembly.of_host(nodename, snapshot, tree, claim_list, users, state, now)
            reading = metrics.build_reading(
                view,
                snapshot,
                self.mdev_config,
                tree,
                claim_list,
                users,
                state,
                audit.read_record(self.conf.vgpu.state_dir),
                self.conf.vgpu,
                now,
            )
        except Exception:
            LOG.exception(
                "Cannot compute the metrics for %s; the inventory update goes on without them",
                self.metrics_file.path,  # type: ignore[union-attr]  # only called with one
            )
            return
        self.metrics_file.write(reading)  # type: ignore[union-attr]  # only called with one

    def reconcile_claims(self):
        """A host reconciler's pass now: finish removals the kernel refused
        before, drop ``claimed`` claims no guest came for and ``migrating_in``
        ones no guest arrived for within ``migration_claim_timeout``, and
        the rest of the pass.  Claims of guests whose domain is gone
        (``attached``) wait for a start-up: a resize or a hard reboot
        undefines the domain for a while and keeps its claims."""
        return self.worker.run_now(host_reconciler.PERIODIC)

    def allocate(self, instance_uuid, allocations, providers, type_traits=None):
        """vGPU ids for an instance (mdev UUIDs; VF addresses on vendor-VFIO
        GPUs); see :meth:`MdevManager.allocate`."""
        return self.manager.allocate(instance_uuid, allocations, providers, type_traits=type_traits)

    def instance_claims(self, instance_uuid):
        """``{mdev_uuid: Claim}`` the instance holds here (not those going away)."""
        return self.reconciler.wanted_mdevs(instance_uuid)

    def restore_instance(self, instance_uuid):
        """Re-create, now, the instance's claimed mdevs that sysfs lacks
        (a host reboot since its domain last started); returns the outcomes."""
        return self.reconciler.restore(instance_uuid=instance_uuid)

    def mdev_types(self, mdev_uuids):
        """``{uuid: type id}`` of mdevs on this host; raises if one is missing."""
        return self.migrations.source_mdev_types(mdev_uuids)

    def instance_defined(self, instance_uuid):
        """The guest's domain now references its mdevs."""
        self.manager.mark_attached(instance_uuid)

    def release(self, instance_uuid):
        return self.manager.release(instance_uuid)

    def release_unused(self, instance_uuid, keep):
        """Release the instance's claims on vGPUs not in ``keep``, as
        :meth:`release` does (their vGPUs removed if so configured).

        After a resize is confirmed or reverted, one host keeps the guest and
        the other does not: each keeps exactly the claims its domain needs.
        Before a guest is defined again from its allocation, the claims the
        allocation does not cover (a failed step's) go.
        """
        keep = set(keep)
        with self.journal.transaction() as txn:
            stale = [
                c
                for c in txn.claims(instance_uuid)
                if c.mdev_uuid not in keep and c.state != claims.RELEASING
            ]
            if not stale or not self.manager.remove_on_release:
                return [c.mdev_uuid for c in txn.remove_exact(stale)]
            txn.set_state(instance_uuid, claims.RELEASING, [c.mdev_uuid for c in stale])
        return self.manager.finish_release([c.mdev_uuid for c in stale])

    def add_hostdevs(self, domain_xml, mdev_uuids):
        """The domain XML with a hostdev per vGPU (:meth:`hostdevs`)."""
        root = guest.parse(domain_xml)
        for hostdev in self.hostdevs(mdev_uuids):
            guest.add_hostdev(root, hostdev)
        return guest.to_string(root)

    def hostdevs(self, mdev_uuids):
        """A ``<hostdev>`` element per vGPU, as each one's type wants it: the
        one writer of them, nova's path (:mod:`vgpu_driver.nova.hostdevs`)
        and the demo alike.

        An mdev gets an mdev hostdev, its model from the type's
        ``device_api`` and ``display``/``ramfb`` from ``[mdev_<type>]``; a
        vendor-VFIO vGPU is its VF, passed through as an unmanaged PCI
        hostdev (the VF stays bound to NVIDIA's driver, which serves it).
        """
        snapshot = self.manager.snapshot(refresh=True)
        by_uuid = {m.uuid: m for m in snapshot.mdevs}
        elements = []
        for uuid in mdev_uuids:
            if names.is_vf_vgpu_id(uuid):
                if snapshot.gpu_of_parent(names.check_vgpu_id(uuid)) is None:
                    raise exception.UnknownVgpu(vgpu=uuid)
                elements.append(guest.pci_hostdev(uuid))
                continue
            mdev = by_uuid.get(uuid)
            if mdev is None:
                raise exception.UnknownVgpu(vgpu=uuid)
            gpu = snapshot.gpu_of_parent(mdev.parent)
            info = gpu.type_info(mdev.type_id) if gpu else None
            type_config = self.mdev_config.type_config(mdev.type_id)
            elements.append(
                guest.mdev_hostdev(
                    uuid,
                    device_api=(info.device_api if info else None) or "vfio-pci",
                    display=type_config.display if type_config else None,
                    ramfb=type_config.ramfb if type_config else None,
                )
            )
        return elements
