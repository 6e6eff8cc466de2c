"""The core's hostdev elements, as the config objects nova's guest wants.

The core writes every vGPU's ``<hostdev>`` (:meth:`VGPUDriver.hostdevs
<vgpu_driver.driver.VGPUDriver.hostdevs>`): the demo puts them in its
domain XML, nova's path hands them to nova's ``LibvirtConfigGuest``.  Each
is wrapped in nova's own class for its kind (nova's code that looks for
mdev or PCI hostdevs in a guest config finds them, their fields read from
the element) and formats as the core's element, so what nova-compute
defines is exactly what the core wrote.
"""

import copy

from nova.virt.libvirt import config as vconfig


class _CoreHostdev:
    """Formats as the core's element, not as nova would rebuild it (nova's
    classes drop ``display`` and ``ramfb``)."""

    def __init__(self, element, **kwargs):
        super().__init__(**kwargs)
        self.parse_dom(element)
        self._element = element

    def format_dom(self):
        return copy.deepcopy(self._element)


class MdevHostdev(_CoreHostdev, vconfig.LibvirtConfigGuestHostdevMDEV):
    """An mdev hostdev the core wrote."""


class PciHostdev(_CoreHostdev, vconfig.LibvirtConfigGuestHostdevPCI):
    """A vendor-VFIO VF's PCI hostdev the core wrote."""


def config_of(element):
    """nova's config object for one core hostdev element."""
    kind = MdevHostdev if element.get("type") == "mdev" else PciHostdev
    return kind(element)
