"""Cell types for cliff listings: readable in tables, typed in JSON/YAML."""

from cliff import columns


class ListColumn(columns.FormattableColumn):
    def human_readable(self):
        return ", ".join(self._value or ())

    def machine_readable(self):
        return list(self._value or ())


class OptionalColumn(columns.FormattableColumn):
    """A value that may be absent: blank in tables, null in JSON/YAML."""

    def human_readable(self):
        return "" if self._value is None else str(self._value)

    def machine_readable(self):
        return self._value


def optional(row):
    """Wrap a row's absent values so that they read as blank in tables."""
    return tuple(OptionalColumn(None) if v is None else v for v in row)
