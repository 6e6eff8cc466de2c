"""What an operator gave that cannot be used: configuration, options, names."""

from __future__ import annotations

from collections.abc import Iterable

from vgpu_driver.exception import base


class ConfigProblem:
    """One actionable finding about the configuration."""

    __slots__ = ("option", "value", "reason", "severity")

    def __init__(self, option: str, value: object, reason: str, severity: str = "error") -> None:
        self.option = option
        self.value = value
        self.reason = reason
        self.severity = severity

    def __str__(self) -> str:
        return f"{self.severity}: {self.option} = {self.value!r}: {self.reason}"

    def __repr__(self) -> str:
        return f"ConfigProblem({self})"


class InvalidConfiguration(base.VgpuDriverError):
    msg_fmt = "Invalid vGPU configuration:\n%(details)s"

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems = list(problems)
        super().__init__(details="\n".join(f"  {p}" for p in self.problems))


class InvalidOption(base.VgpuDriverError):
    msg_fmt = "%(option)s %(value)r: %(reason)s"


class InvalidSysfsName(base.VgpuDriverError):
    msg_fmt = (
        "Refusing %(kind)s %(name)r%(source)s: it is not a valid %(kind)s, "
        "so it is never joined into a sysfs path."
    )

    def __init__(self, kind: str, name: object, source: str | None = None) -> None:
        super().__init__(kind=kind, name=name, source=f" from {source}" if source else "")


class InvalidSysfsRoot(base.VgpuDriverError):
    msg_fmt = (
        "Sysfs root %(root)s %(reason)s, so it cannot play /sys. Check --sysfs-root "
        "([vgpu] sysfs_root)."
    )


class InvalidNodename(base.VgpuDriverError):
    msg_fmt = (
        "Refusing nodename %(nodename)r: %(reason)s. Pass the compute node's name "
        "as nova-compute reports it (--nodename, or [DEFAULT] host)."
    )
