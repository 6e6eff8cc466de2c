"""Option listing for oslo-config-generator (entry point ``vgpu_driver``)."""

from typing import Any

from vgpu_driver.conf import devices
from vgpu_driver.conf import limits
from vgpu_driver.conf import placement
from vgpu_driver.conf import privsep
from vgpu_driver.conf import vgpu


def list_opts() -> list[tuple[Any, list[Any]]]:
    template_group, template_opts = devices.template_group()
    return [
        (devices.devices_group(), devices.devices_opts),
        (template_group, template_opts),
        (vgpu.vgpu_group(), vgpu.vgpu_opts),
        *placement.list_opts(),
        *limits.list_opts(),
        *privsep.list_opts(),
    ]
