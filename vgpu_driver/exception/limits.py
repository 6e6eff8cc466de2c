"""Unified limits in Keystone cannot be read or written."""

from vgpu_driver.exception import base


class KeystoneError(base.VgpuDriverError):
    msg_fmt = "Keystone: %(reason)s"


class LimitsNotConfigured(KeystoneError):
    msg_fmt = "Keystone: %(option)s is not set; set [oslo_limit] as nova's unified limits use it."


class KeystoneUnavailable(KeystoneError):
    msg_fmt = "Keystone at %(url)s cannot be reached: %(reason)s"


class KeystoneRefused(KeystoneError):
    msg_fmt = "Keystone refused to %(action)s: %(reason)s"
