"""Cell types for cliff listings: readable in tables, typed in JSON/YAML."""

from cliff import columns

from vgpu_driver import names


class ListColumn(columns.FormattableColumn):
    def human_readable(self):
        return ", ".join(self._value or ())

    def machine_readable(self):
        return list(self._value or ())


class PciRangesColumn(ListColumn):
    """PCI functions (an SR-IOV board's VFs): runs of consecutive addresses
    as ranges in tables, every address in JSON/YAML."""

    def human_readable(self):
        found = sorted(names.parse_pci_address(str(a)) for a in self._value or ())
        runs = []
        for address in found:
            if runs and runs[-1][-1].offset(1) == address:
                runs[-1].append(address)
            else:
                runs.append([address])
        text = ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)
        return f"{text} ({len(found)})" if len(found) > 1 else text

    def machine_readable(self):
        return [str(a) for a in self._value or ()]


class SizeClassesColumn(columns.FormattableColumn):
    """A mixed-size board's size classes, ``((class, inventory record), ...)``:
    one line each in tables, the records' counts in JSON/YAML."""

    def human_readable(self):
        return "\n".join(
            f"{rc} {r['total']} (reserved {r['reserved']}, max {r['max_unit']})"
            for rc, r in self._value or ()
        )

    def machine_readable(self):
        return [
            {
                "resource_class": rc,
                "total": r["total"],
                "reserved": r["reserved"],
                "max_unit": r["max_unit"],
            }
            for rc, r in self._value or ()
        ]


class OptionalColumn(columns.FormattableColumn):
    """A value that may be absent: blank in tables, null in JSON/YAML."""

    def human_readable(self):
        return "" if self._value is None else str(self._value)

    def machine_readable(self):
        return self._value


def optional(row):
    """Wrap a row's absent values so that they read as blank in tables."""
    return tuple(OptionalColumn(None) if v is None else v for v in row)
