"""What vgpu-manage's own commands refuse: fake hosts and metrics."""

from vgpu_driver.exception import base


class UnknownProfile(base.VgpuDriverError):
    msg_fmt = "No fake-host profile named %(name)r; known profiles: %(known)s."


class FakeHostExists(base.VgpuDriverError):
    msg_fmt = ("%(path)s is not empty; choose an empty or new directory for the "
               "fake host.")


class FakeHostNotWritten(base.VgpuDriverError):
    msg_fmt = "Cannot write the fake host at %(path)s: %(reason)s."


class FakeHostMountPointInUse(base.VgpuDriverError):
    msg_fmt = ("Cannot serve the fake host at %(path)s: %(why)s; choose an empty "
               "directory that nothing is mounted on.")


class MetricsNotWritten(base.VgpuDriverError):
    msg_fmt = "Cannot write the metrics to %(path)s: %(reason)s."


class MetricsNotServed(base.VgpuDriverError):
    msg_fmt = "Cannot serve the metrics on %(listen)s: %(reason)s."
