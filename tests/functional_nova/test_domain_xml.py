"""The demo's domain XML and nova's path write the same hostdevs.

Both are checked against one golden file per allocation: the demo's
``MiniCompute`` puts :meth:`VGPUDriver.add_hostdevs` into its domain XML,
``LibvirtVGPUDriver._guest_add_mdevs`` hands the core's elements to nova's
guest config, formatted by nova's ``to_xml``.  Regenerate with
``VGPU_REGENERATE_GOLDEN=1`` (see ``tests/golden.py``).
"""

import os
import textwrap
import types

import fixtures
from lxml import etree
from nova.virt.libvirt import config as vconfig
from oslo_config import cfg

from tests import golden
from tests.functional_nova import deadline
from vgpu_driver import conf as vgpu_conf
from vgpu_driver import driver as core
from vgpu_driver.cmd.demo import compute
from vgpu_driver.fake import domains
from vgpu_driver.fake import fakekernel
from vgpu_driver.fake import profiles
from vgpu_driver.nova import driver as nova_driver

MDEVS = ["6f3c2a8e-1d4b-4c5e-9a7f-0b1c2d3e4f50", "7a4d3b9f-2e5c-4d6f-8b80-1c2d3e4f5061"]
MTTY = (
    "mtty",
    "mtty-2",
    "[mdev_mtty-2]\ndisplay = true\nramfb = true",
    [{"parent": "mtty", "type": "mtty-2", "uuid": u} for u in MDEVS],
)
L40S = ("l40s-vfio", "nvidia-1156", "[mdev_nvidia-1156]\nmax_instances = 6", [])


def hostdevs(xml):
    """The domain's hostdevs, canonical (C14N, blanks dropped), one a line."""
    root = etree.fromstring(xml.encode())
    return "".join(
        etree.canonicalize(etree.tostring(h, encoding="unicode", with_tail=False), strip_text=True)
        + "\n"
        for h in root.findall("devices/hostdev")
    )


class DomainXmlTest(deadline.TestCase):
    def vgpu(self, profile, types_, extra, mdevs):
        tmp = self.useFixture(fixtures.TempDir()).path
        host = fakekernel.FakeKernel.build(
            os.path.join(tmp, "sys"), {**profiles.load(profile), "mdevs": mdevs}
        )
        path = os.path.join(tmp, "nova.conf")
        with open(path, "w") as f:
            f.write(
                textwrap.dedent(f"""\
                [devices]
                enabled_mdev_types = {types_}
                [vgpu]
                sysfs_root = {host.paths.root}
                state_dir = {tmp}/state
                """)
                + extra
                + "\n"
            )
        conf = cfg.ConfigOpts()
        vgpu_conf.register_opts(conf)
        conf([], project="nova", default_config_files=[path])
        vgpu = core.VGPUDriver(
            conf, domains.InProcessDomains(), host=fakekernel.FakeKernel(host.paths.root)
        )
        self.addCleanup(vgpu.close)
        provider = vgpu.provider_tree("cn1").providers[0]
        return vgpu, vgpu.allocate("i-1", {"rp": {"resources": {"VGPU": 2}}}, {"rp": provider})

    def check(self, name, case):
        vgpu, got = self.vgpu(*case)
        flavor = compute.Flavor("f", 1, 512, 1, 2, "CUSTOM_X")
        demo = vgpu.add_hostdevs(compute.domain_xml("g", compute.instance_uuid("g"), flavor), got)
        guest = vconfig.LibvirtConfigGuest()
        guest.virt_type, guest.memory, guest.vcpus = "kvm", 524288, 1
        # The method nova-compute runs, on the core driver it runs it with.
        nova_driver.LibvirtVGPUDriver._guest_add_mdevs(types.SimpleNamespace(vgpu=vgpu), guest, got)
        golden.assert_golden(name, hostdevs(demo))
        self.assertEqual(hostdevs(demo), hostdevs(guest.to_xml()))

    def test_mdevs_with_display(self):
        self.check("domain-hostdevs-mdev.xml", MTTY)

    def test_vendor_vfio_vfs(self):
        self.check("domain-hostdevs-vf.xml", L40S)
