"""What vgpu-manage's own commands refuse: fake hosts, metrics, installed files,
the demo."""

from vgpu_driver.exception import base


class UnknownProfile(base.VgpuDriverError):
    msg_fmt = "No fake-host profile named %(name)r; known profiles: %(known)s."


class FakeHostExists(base.VgpuDriverError):
    msg_fmt = "%(path)s is not empty; choose an empty or new directory for the fake host."


class FakeHostNotWritten(base.VgpuDriverError):
    msg_fmt = "Cannot write the fake host at %(path)s: %(reason)s."


class FakeHostMountPointInUse(base.VgpuDriverError):
    msg_fmt = (
        "Cannot serve the fake host at %(path)s: %(why)s; choose an empty "
        "directory that nothing is mounted on."
    )


class MetricsNotWritten(base.VgpuDriverError):
    msg_fmt = "Cannot write the metrics to %(path)s: %(reason)s."


class MetricsNotServed(base.VgpuDriverError):
    msg_fmt = "Cannot serve the metrics on %(listen)s: %(reason)s."


class InstallFilesRefused(base.VgpuDriverError):
    msg_fmt = "%(reason)s; nothing was written."


class DemoFailed(base.VgpuDriverError):
    msg_fmt = "demo step '%(step)s' failed: %(reason)s"


class DemoDirNotEmpty(base.VgpuDriverError):
    msg_fmt = "--dir %(path)s is not empty; give a new or empty directory"


class NoValidHost(base.VgpuDriverError):
    """The demo's scheduler found no allocation candidate, as nova's would."""

    msg_fmt = (
        "Placement has no allocation candidate for %(instance)s "
        "(GET /allocation_candidates?%(query)s)"
    )
