"""``status`` on a screen narrower than its table: one block per GPU.

The table puts addresses, UUIDs and reasons side by side, thirteen columns
200 characters wide or more.  Squeezed into a terminal, every cell would be
cut mid-address.  Here each GPU is a head line (address, type, use,
reserved units, SR-IOV state) and one indented line per provider, reason,
guest and claim; a line longer than the screen wraps between words, never
inside an address or a UUID.  The selected columns (``-c``) choose what is
shown, as in the table.
"""

import collections
import os
import sys
import textwrap

INDENT = "    "
LABEL_WIDTH = 10


def screen_width(parsed_args, stdout=sys.stdout):
    """The width the table must fit, as cliff's table formatter decides it
    (``--max-width``, else the terminal's on a tty or with ``--fit-width``);
    None when it may be as wide as it likes (a pipe, a file)."""
    if parsed_args.max_width > 0:
        return parsed_args.max_width
    if not (parsed_args.fit_width or stdout.isatty()):
        return None
    try:
        return os.get_terminal_size(stdout.fileno()).columns
    except (OSError, ValueError):
        return None


def table_width(column_names, rows):
    """Characters in each line of cliff's table of ``rows`` (no wrapping)."""
    widths = [len(name) for name in column_names]
    for row in rows:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], *(len(line) for line in _text(value).split("\n")))
    return sum(widths) + 3 * len(widths) + 1


def guest_lines(guests):
    """``instance (domain)``, one per guest, ``x2`` for two of its vGPUs."""
    held = collections.Counter((g.domain, g.instance) for g in guests)
    return [
        f"{instance} ({domain})" + (f" x{count}" if count > 1 else "")
        for (domain, instance), count in sorted(held.items())
    ]


def claim_lines(claims):
    """``instance: state``, one per claim in flight, with a stuck removal's age."""
    return [
        f"{c.instance}: {c.state}"
        + (f" (removal stuck {c.stuck_for:.0f}s)" if c.stuck_for is not None else "")
        for c in claims
    ]


def type_lines(types):
    """``type: used/capacity used, R reserved, F free``, one per type, in vGPUs."""
    return [
        f"{t.type_id}: {t.used}/{t.capacity} used, {t.reserved} reserved, {t.free} free"
        for t in types
    ]


def reserved_lines(reserved_for, unit):
    """``kind: units``, one per reason any of the GPU's units are held back."""
    return [f"{kind}: {units} {unit}" for kind, units in reserved_for if units]


def map_lines(board_map):
    """A mixed-size board's map: its slots, then each vGPU's mark, type and
    placement ID, and the vGPUs NVML did not place; none elsewhere."""
    if board_map is None:
        return []
    if board_map.error:
        return [f"unknown: {board_map.error}"]
    lines = [board_map.slots]
    if board_map.vgpus:
        lines.append(board_map.legend())
    if board_map.unlocated:
        lines.append(f"{board_map.unlocated} vGPU(s) not placed by NVML")
    return lines


def render(gpus, selected, width):
    """The block layout's lines for ``gpus`` (GpuStatus), wrapped to ``width``."""
    lines = []
    for gpu in gpus:
        lines += _flow(_head(gpu, selected), "  ", width)
        for label, text in _details(gpu, selected):
            line = f"{INDENT}{label:<{LABEL_WIDTH}}{text}"
            lines += _wrap(line, width, INDENT + " " * LABEL_WIDTH)
    return lines


def wrap_summary(summary, width):
    """The table's closing lines, wrapped between words to ``width``."""
    lines = []
    for line in summary.split("\n"):
        lines += _flow(line.split("; "), "; ", width)
    return lines


def _head(gpu, selected):
    parts = [gpu.gpu] if "gpu" in selected else []
    kind = _kind(gpu, selected)
    if kind:
        parts.append(kind)
    if "bar" in selected:
        parts.append(gpu.bar)
    elif "used" in selected or "total" in selected:
        parts.append(f"{gpu.used}/{gpu.total} used" if "total" in selected else f"{gpu.used} used")
    if "reserved" in selected and gpu.reserved:
        parts.append(f"{gpu.reserved} reserved")
    if "sriov" in selected and gpu.sriov is not None:
        parts.append(f"SR-IOV {gpu.sriov.state} {gpu.sriov.numvfs}/{gpu.sriov.totalvfs}")
    return parts


def _kind(gpu, selected):
    name = gpu.type_name if "name" in selected else None
    type_id = gpu.type_id if "type" in selected else None
    if name and type_id:
        return f"{name} ({type_id})"
    return name or type_id or ""


def _details(gpu, selected):
    if "provider" in selected and gpu.provider:
        yield "provider", gpu.provider
    if "reason" in selected and gpu.reason:
        yield "reason", gpu.reason
    yield from _counts(gpu, selected)
    if "guests" in selected:
        if gpu.guests is None:
            yield "guests", "unknown"
        else:
            for line in guest_lines(gpu.guests):
                yield "guest", line
    if "claims" in selected:
        for line in claim_lines(gpu.claims):
            yield "claim", line
    if "framebuffer" in selected:
        for line in map_lines(gpu.board_map):
            yield "map", line


def _counts(gpu, selected):
    """The ``vgpus`` and ``held`` lines of a GPU's block."""
    if "vgpus" in selected:
        for line in type_lines(gpu.types):
            yield "vgpus", line
    if "reserved_for" in selected:
        for line in reserved_lines(gpu.reserved_for, gpu.unit):
            yield "held", line


def _flow(parts, separator, width):
    """``parts`` joined by ``separator``, a new indented line wherever the
    next part would not fit: a part is split only if it alone is too long."""
    lines = []
    for part in parts:
        joined = f"{lines[-1]}{separator}{part}" if lines else part
        if lines and (width is None or len(joined) <= width):
            lines[-1] = joined
        else:
            if lines:
                lines[-1] += separator.rstrip()
            lines.append(INDENT + part if lines else part)
    return [out for line in lines for out in _wrap(line, width, INDENT)]


def _wrap(line, width, indent):
    if width is None or len(line) <= width:
        return [line]
    return textwrap.wrap(
        line,
        width,
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
        drop_whitespace=True,
    ) or [line]


def _text(value):
    human = getattr(value, "human_readable", None)
    return str(human() if human else value)
