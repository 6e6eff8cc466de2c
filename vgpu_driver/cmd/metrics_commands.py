"""``metrics`` and ``metrics serve``: the host in Prometheus' text format.

Both read what ``status`` reads (each source once per scrape) and print it
through prometheus_client.  ``metrics --output FILE`` is for
node_exporter's textfile collector (the file is replaced whole, never seen
half-written); ``metrics serve`` answers scrapes itself, on the loopback
address unless told otherwise.
"""

import dataclasses
import os
import signal
import threading
import time

import prometheus_client

from vgpu_driver import audit
from vgpu_driver import exception
from vgpu_driver import metrics
from vgpu_driver import metrics_textfile
from vgpu_driver.cmd import base
from vgpu_driver.cmd import status_commands

DEFAULT_LISTEN = "127.0.0.1:9839"


def reading(app):
    """A :class:`vgpu_driver.metrics.Reading` of this host, and the warnings
    about what it left out (libvirt unreachable, a state file unreadable)."""
    sources = status_commands.read_sources(app)
    record = audit.read_record(app.conf.vgpu.state_dir)
    return metrics.build_reading(
        sources.view,
        sources.snapshot,
        sources.config,
        sources.tree,
        sources.claims,
        sources.users,
        sources.reconciler,
        record,
        app.conf.vgpu,
        sources.now,
    ), _warnings(sources, record)


def _warnings(sources, record):
    found = []
    if sources.warning:
        found.append(f"{sources.warning} Guests are unknown (vgpu_guests_known 0).")
    if sources.reconciler and "unreadable" in sources.reconciler:
        found.append(
            f"The host reconciler's state is unreadable "
            f"({sources.reconciler['unreadable']}): vgpu_reconciler_up is 0."
        )
    if record and "unreadable" in record:
        found.append(
            f"The last audit's record is unreadable ({record['unreadable']}): "
            f"vgpu_placement_drift is left out until the next audit."
        )
    return found


def _write(path, scrape):
    """``path`` replaced whole by the scrape (a temporary file beside it,
    renamed over it); an error names ``path``, not the temporary file."""
    try:
        metrics.write_textfile(path, scrape)
    except OSError as exc:
        raise exception.MetricsNotWritten(path=path, reason=exc.strerror or exc) from exc


def parse_listen(text):
    """``(address, port)`` of ``ADDR:PORT`` (``[ADDR]:PORT`` for IPv6)."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise exception.InvalidOption(
            option="--listen",
            value=text,
            reason="give ADDR:PORT, such as 127.0.0.1:9839 ([ADDR]:PORT for IPv6; port 0 "
            "picks a free one)",
        )
    return host, int(port)


class PrintMetrics(base.Command):
    """Print this host's metrics in Prometheus' text format.

    Per GPU: vGPUs offered, used and reserved, guests and SR-IOV VFs; for
    the host: SR-IOV boards, claims by state and age, orphan vGPUs, stuck
    removals and the host reconciler.  With --output, the file is written
    whole (a temporary file renamed over it), as node_exporter's textfile
    collector needs.  Without libvirt, ``vgpu_guests_known`` is 0, a
    ``warning:`` line says why and the exit code is still 0.
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "--output", metavar="FILE", help="Write to FILE (replaced whole) instead of stdout."
        )
        return parser

    def take_action(self, parsed_args):
        output = parsed_args.output
        if output and not (
            output.endswith(metrics_textfile.SUFFIX)
            and os.path.basename(output) != metrics_textfile.SUFFIX
        ):
            raise exception.InvalidOption(
                option="--output",
                value=output,
                reason=f"node_exporter's textfile collector reads only files named "
                f"*{metrics_textfile.SUFFIX}",
            )
        started = time.monotonic()
        found, warnings = reading(self.app)
        found = dataclasses.replace(found, read_seconds=time.monotonic() - started)
        self.app.stderr.write("".join(f"warning: {w}\n" for w in warnings))
        scrape = metrics.registry_of(lambda: found)
        if parsed_args.output:
            _write(parsed_args.output, scrape)
        else:
            self.app.stdout.write(prometheus_client.generate_latest(scrape).decode())
        return base.EXIT_OK


class ServeMetrics(base.Command):
    """Answer Prometheus' scrapes of this host's metrics until SIGTERM or Ctrl-C.

    Each scrape of ``/metrics`` reads the host again (what ``metrics``
    prints).  It listens on 127.0.0.1 unless --listen says otherwise; the
    host is read once before it listens, so a bad configuration is an
    ``error:`` line, not a server that answers nothing.  A scrape that
    cannot read the host holds ``vgpu_scrape_success 0``, and the reason
    is logged.
    """

    def get_parser(self, prog_name):
        parser = super().get_parser(prog_name)
        parser.add_argument(
            "--listen",
            default=DEFAULT_LISTEN,
            metavar="ADDR:PORT",
            help=f"Where to listen (default: {DEFAULT_LISTEN}).",
        )
        return parser

    def take_action(self, parsed_args):
        address, port = parse_listen(parsed_args.listen)
        _found, warnings = reading(self.app)
        self.app.stderr.write("".join(f"warning: {w}\n" for w in warnings))
        scrape = metrics.registry_of(
            lambda: reading(self.app)[0], base.EXPECTED_ERRORS, self._failed
        )
        try:
            server, thread = prometheus_client.start_http_server(port, address, scrape)
        except OSError as exc:
            raise exception.MetricsNotServed(
                listen=parsed_args.listen, reason=exc.strerror or exc
            ) from exc
        bound = server.server_address
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.app.stdout.write(f"serving metrics on http://{shown}:{bound[1]}/metrics\n")
        self.app.stdout.flush()
        try:
            _wait_for_stop()
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
        return base.EXIT_OK

    def _failed(self, exc, expected):
        if expected:
            self.app.LOG.error("A scrape could not read the host: %s", base.one_line(exc))
        else:
            self.app.LOG.exception("A scrape failed unexpectedly: %s", base.one_line(exc))


def _wait_for_stop():
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        while not stop.wait(1.0):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
