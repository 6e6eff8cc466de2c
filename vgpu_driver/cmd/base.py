"""Base classes of vgpu-manage's commands: one exit-code contract for all.

0: done (or sound); 1: the command found problems (``config check``);
2: the command could not do its job, with one ``error:`` line that says why.
"""

import argparse
import math
import sys

from cliff import command
from cliff import lister
from keystoneauth1 import exceptions as ks_exceptions
from oslo_config import cfg

from vgpu_driver import exception

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_ERROR = 2

# What a command can meet on a sound host given bad input: each is one
# ``error:`` line.  Anything else is a bug and keeps its traceback.
EXPECTED_ERRORS = (exception.VgpuDriverError, cfg.Error, OSError, ks_exceptions.ClientException)


def one_line(exc):
    """The error's text on one line, naming the file for an OSError."""
    if isinstance(exc, OSError) and exc.strerror:
        text = f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    else:
        text = str(exc) or type(exc).__name__
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " ".join(lines[:1] + ["; ".join(lines[1:])] if len(lines) > 1 else lines)


def usage_errors_on_one_line(parser):
    """``parser`` reporting a usage error as one ``error:`` line and exit 2,
    not argparse's usage block and ``prog: error:`` line."""

    def error(message):
        sys.stderr.write(f"error: {parser.prog}: {message}\n")
        sys.exit(EXIT_ERROR)

    parser.error = error
    return parser


def seconds(text):
    """An argparse type: a finite, non-negative number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a finite, non-negative number of seconds"
        )
    return value


class _ErrorsAsExitCodes:
    def get_parser(self, prog_name):
        return usage_errors_on_one_line(super().get_parser(prog_name))

    def run(self, parsed_args):
        try:
            return super().run(parsed_args)
        except BrokenPipeError:
            raise  # the reader went away: main() ends quietly
        except EXPECTED_ERRORS as exc:
            self.app.LOG.debug("%s failed", self.cmd_name, exc_info=exc)
            self.app.stderr.write(f"error: {one_line(exc)}\n")
            return EXIT_ERROR


class Command(_ErrorsAsExitCodes, command.Command):
    pass


class Lister(_ErrorsAsExitCodes, lister.Lister):
    def produce_output(self, parsed_args, column_names, data):
        """An empty table is no output at all, not a blank line; an unknown
        ``-c`` column is a bad option, not a crash."""
        data = list(data)
        self.check_columns(parsed_args, column_names)
        if not data and parsed_args.formatter in ("table", "value"):
            return EXIT_OK
        return super().produce_output(parsed_args, column_names, data)

    @staticmethod
    def check_columns(parsed_args, column_names):
        unknown = [c for c in parsed_args.columns or () if c not in column_names]
        if unknown:
            raise exception.InvalidOption(
                option="-c",
                value=unknown[0],
                reason=f"no such column; the columns are {', '.join(column_names)}",
            )


class FailableLister(Lister):
    """A listing of outcomes: exit 1 when ``take_action`` set ``self.failed``."""

    def run(self, parsed_args):
        self.failed = False
        code = super().run(parsed_args)
        return code or (EXIT_PROBLEMS if self.failed else EXIT_OK)
