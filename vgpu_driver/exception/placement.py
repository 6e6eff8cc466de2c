"""Placement: its requests, its credentials, and the providers a sync would write."""

from vgpu_driver.exception import base


class ProviderNotOurs(base.VgpuDriverError):
    """A provider a Placement sync would write holds a name of this host's
    tree but is not vgpu-driver's; found before anything is written."""

    msg_fmt = (
        "Refusing to write provider %(name)s: %(reason)s (%(where)s, traits "
        "%(traits)s); nothing was written. A provider vgpu-driver does not own is "
        "left to its owner."
    )


class PlacementError(base.VgpuDriverError):
    msg_fmt = "Placement refused %(method)s %(url)s: HTTP %(status)s %(detail)s"


class PlacementUnavailable(base.VgpuDriverError):
    msg_fmt = (
        "Placement did not answer %(method)s %(url)s after %(attempts)d attempts "
        "(%(reason)s); nothing more was written. Check the [placement] options "
        "and that Placement is up."
    )


class Conflict(base.VgpuDriverError):
    """HTTP 409: a generation moved under us (retried), or a name is taken."""

    msg_fmt = "Placement refused %(method)s %(url)s: HTTP 409 %(detail)s"


class PlacementAuthUnavailable(base.VgpuDriverError):
    """Keystone, asked for Placement's token, did not answer."""

    msg_fmt = (
        "Keystone did not answer at %(auth_url)s (%(reason)s); nothing was sent to "
        "Placement. Check [placement] auth_url and that Keystone is up."
    )


class PlacementAuthRefused(base.VgpuDriverError):
    """Keystone refused Placement's credentials."""

    msg_fmt = (
        "Keystone refused the credentials for Placement at %(auth_url)s (%(reason)s); "
        "check the [placement] auth options (username, password, project)."
    )


class MissingCredentials(base.VgpuDriverError):
    msg_fmt = (
        "No usable credentials for Placement (%(reason)s): set [placement] auth_type, "
        "auth_url, username, password, project_name ... as for nova-compute, or the "
        "OS_* variables / OS_CLOUD."
    )
