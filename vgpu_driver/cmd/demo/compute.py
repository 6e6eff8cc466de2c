"""nova-compute's part around vgpu-driver, played in miniature for the demo.

The demo has to show the driver driven the way nova drives it, yet the
package imports no nova.  So this makes nova's calls itself, in nova's
order, against the real services: it creates the compute node's resource
provider, reports the GPU providers under it, and boots an instance by
asking Placement for allocation candidates, allocating one of them (the one
whose providers' names sort first, where nova's scheduler weighs them: the
demo's screens are then the same at every run), reading the instance's
allocations back, turning them into mdevs through the driver and defining a
libvirt domain with the driver's hostdevs.  Only the GPUs (the fake kernel)
and the hypervisor (libvirt's test driver) are not real.
"""

import dataclasses
import urllib.parse
import uuid

from lxml import etree

from vgpu_driver import guest
from vgpu_driver import placement
from vgpu_driver.exception import NoValidHost

PROJECT = "demo-project"
USER = "demo-user"


def _inventory(total, reserved=0, allocation_ratio=1.0):
    return {
        "total": total,
        "reserved": reserved,
        "min_unit": 1,
        "max_unit": total,
        "step_size": 1,
        "allocation_ratio": allocation_ratio,
    }


# What nova reports on the compute node itself; instances allocate from it too.
NODE_INVENTORY = {
    "VCPU": _inventory(64, allocation_ratio=4.0),
    "MEMORY_MB": _inventory(524288, reserved=512),
    "DISK_GB": _inventory(1800),
}


@dataclasses.dataclass(frozen=True)
class Flavor:
    """A flavor with ``resources:VGPU=n`` and ``trait:<type trait>=required``."""

    name: str
    vcpus: int
    memory_mb: int
    disk_gb: int
    vgpus: int
    trait: str

    def candidates_query(self):
        """The query nova's scheduler sends for this flavor (one request group)."""
        resources = (
            f"DISK_GB:{self.disk_gb},MEMORY_MB:{self.memory_mb},VCPU:{self.vcpus},VGPU:{self.vgpus}"
        )
        return urllib.parse.urlencode({"resources": resources, "required": self.trait}, safe=":,")


@dataclasses.dataclass(frozen=True)
class Booted:
    name: str
    uuid: str
    flavor: Flavor
    query: str
    candidates: int
    allocations: dict  # Placement's, as read back: {rp uuid: {"resources": ...}}
    mdevs: tuple


def instance_uuid(name):
    """A stable UUID per instance name, so runs of the demo read alike."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"vgpu-demo/{name}"))


def domain_xml(name, uuid_, flavor):
    """The guest nova would define, before any hostdev (built as a tree)."""
    root = etree.Element("domain", type="test")
    etree.SubElement(root, "name").text = name
    etree.SubElement(root, "uuid").text = uuid_
    etree.SubElement(root, "memory", unit="MiB").text = str(flavor.memory_mb)
    etree.SubElement(root, "vcpu").text = str(flavor.vcpus)
    os_el = etree.SubElement(root, "os")
    etree.SubElement(os_el, "type").text = "hvm"
    etree.SubElement(root, "devices")
    return guest.to_string(root)


class MiniCompute:
    """One compute node: the driver, Placement and a libvirt connection."""

    def __init__(self, vgpu, client, conn, nodename):
        self.vgpu = vgpu
        self.client = client
        self.conn = conn
        self.nodename = nodename
        self.node_uuid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"vgpu-demo/node/{nodename}"))
        self.sync = placement.ProviderSync(client)
        self.tree = None
        self._domains = []

    def create_compute_node(self):
        """The root provider, named after the node, with its own inventory."""
        # Placement answers the POST with the new provider (microversion >= 1.20).
        rp = self.client.request(
            "POST", "/resource_providers", {"uuid": self.node_uuid, "name": self.nodename}
        )
        self.client.request(
            "PUT",
            f"/resource_providers/{self.node_uuid}/inventories",
            {"resource_provider_generation": rp["generation"], "inventories": NODE_INVENTORY},
        )

    def update_provider_tree(self):
        """The GPU providers, reported under the node; returns the SyncReport."""
        self.tree = self.vgpu.provider_tree(self.nodename)
        return self.sync.sync(self.tree)

    def boot(self, name, flavor):
        """Schedule, allocate, claim mdevs, define and start the domain."""
        instance = instance_uuid(name)
        query = flavor.candidates_query()
        found = self.client.request("GET", f"/allocation_candidates?{query}")
        requests = found["allocation_requests"]
        if not requests:
            raise NoValidHost(instance=name, query=query)
        names = self.provider_names()
        chosen = min(requests, key=lambda r: sorted(names.get(rp, rp) for rp in r["allocations"]))
        self.client.request(
            "PUT",
            f"/allocations/{instance}",
            {
                "allocations": chosen["allocations"],
                "project_id": PROJECT,
                "user_id": USER,
                "consumer_generation": None,
                "consumer_type": "INSTANCE",
            },
        )
        allocations = self.client.request("GET", f"/allocations/{instance}")["allocations"]
        mdevs = self.vgpu.allocate(instance, allocations, self.sync.provider_uuids(self.tree))
        xml = self.vgpu.add_hostdevs(domain_xml(name, instance, flavor), mdevs)
        dom = self.conn.defineXML(xml)
        self._domains.append(dom)
        dom.create()
        self.vgpu.instance_defined(instance)
        return Booted(name, instance, flavor, query, len(requests), allocations, tuple(mdevs))

    def provider_names(self):
        """``{rp uuid: name}`` of the node and its GPU providers."""
        names = {self.node_uuid: self.nodename}
        names.update({uuid_: p.name for uuid_, p in self.sync.provider_uuids(self.tree).items()})
        return names

    def usage(self):
        """``[(GpuProvider, used, total, reserved)]`` as Placement counts them."""
        rows = []
        for uuid_, provider in sorted(
            self.sync.provider_uuids(self.tree).items(), key=lambda item: item[1].name
        ):
            base = f"/resource_providers/{uuid_}"
            used = self.client.request("GET", f"{base}/usages")["usages"]
            inventory = self.client.request("GET", f"{base}/inventories")["inventories"]
            record = inventory.get(provider.resource_class, {"total": 0, "reserved": 0})
            rows.append(
                (
                    provider,
                    used.get(provider.resource_class, 0),
                    record["total"],
                    record["reserved"],
                )
            )
        return rows

    def domain_xmls(self):
        """``{name: XML}`` of the domains booted here, as libvirt holds them now."""
        return {dom.name(): dom.XMLDesc(0) for dom in self._domains}

    def shut_down(self):
        """Stop the driver's host reconciler, then stop and undefine the
        domains booted here (the test driver is shared by everything in this
        process, so they would outlive the demo)."""
        self.vgpu.close()
        for dom in reversed(self._domains):
            if dom.isActive():
                dom.destroy()
            dom.undefine()
        self._domains = []
