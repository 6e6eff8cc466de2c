"""The base of every typed error: ``msg_fmt`` formatted with keyword arguments,
rebuilt whole on the far side of the privsep boundary."""

from __future__ import annotations

from typing import Any
from typing import cast

_REBUILD = "vgpu_driver.exception:rebuild"
_PLAIN = (str, int, float, bool, type(None))


def _plain(value: object) -> object:
    """``value`` made of what msgpack carries, else its text."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


class _Rebuildable(type):
    """Lets ``cls(*error.args)`` give back the error, whatever ``cls.__init__`` takes.

    oslo.privsep raises a privileged-side error on the caller's side as
    ``exc_type(*args)``; errors with their own constructor signature would
    come back as a ``TypeError`` instead.
    """

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 3 and args[0] == _REBUILD and not kwargs:
            # The class this metaclass makes: an error class.
            error_cls = cast("type[VgpuDriverError]", cls)
            error = error_cls.__new__(error_cls)
            Exception.__init__(error, args[1])
            error.__dict__.update(args[2])
            return error
        return super().__call__(*args, **kwargs)


class VgpuDriverError(Exception, metaclass=_Rebuildable):
    """Base class: formats ``msg_fmt`` with the keyword arguments."""

    msg_fmt = "An unknown error occurred."

    def __init__(self, message: str | None = None, **kwargs: Any) -> None:
        self.kwargs = kwargs
        if message is None:
            message = self.msg_fmt % kwargs
        self.message = message
        super().__init__(message)

    @property
    def args(self) -> tuple[Any, ...]:  # type: ignore[override]
        """Plain values only, from which the metaclass rebuilds the error."""
        return (_REBUILD, self.message, _plain(self.__dict__))
