"""How the demo speaks: one progress line per step, one reason per failure.

A mixin of the ``demo`` command (it writes to ``self.app``'s streams), with
the table vgpu-manage's listings print and the reason a failed step gives:
a newcomer reads each step's outcome and duration, and the first failure as
one ``error:`` line naming the step and, for a missing module, the pip extra.
"""

import argparse
import contextlib
import io
import logging
import os
import re
import time

from cliff.formatters import table as cliff_table

from vgpu_driver import exception
from vgpu_driver.exception import DemoFailed

# Loggers whose INFO lines (migrations, each HTTP request) would bury the story.
CHATTY_LOGGERS = (
    "alembic",
    "placement",
    "oslo_db",
    "keystoneauth",
    "openstack",
    "stevedore",
    "vgpu_driver",
)

# A missing module, and the extra that brings it.
EXTRAS = {"placement": "embedded-placement", "openstack": "placement", "libvirt": "libvirt"}


def reason(exc):
    """One line saying what went wrong, with the pip extra when one is missing."""
    if isinstance(exc, ImportError) and exc.name:
        extra = EXTRAS.get(exc.name.split(".")[0])
        if extra:
            return f"Python module {exc.name!r} is missing (pip install 'vgpu-driver[{extra}]')"
    text = str(exc) or type(exc).__name__
    if not isinstance(exc, exception.VgpuDriverError):
        text = f"{type(exc).__name__}: {text}"
    return re.sub(r"\s+", " ", text).strip()


def table(columns, rows):
    """Rows as vgpu-manage's listings print them (cliff's table formatter:
    numbers right-aligned, fitted to a terminal's width)."""
    out = io.StringIO()
    options = argparse.Namespace(
        max_width=int(os.environ.get("CLIFF_MAX_TERM_WIDTH", 0)),
        fit_width=bool(int(os.environ.get("CLIFF_FIT_WIDTH", 0))),
        print_empty=False,
    )
    cliff_table.TableFormatter().emit_list(columns, rows, out, options)
    return out.getvalue()


class Progress:
    """``say``, ``detail`` and ``step`` for a cliff command; library logs quieted."""

    def say(self, text=""):
        self.app.stdout.write(text)
        self.app.stdout.flush()

    def detail(self, text):
        self.say("".join(f"    {line}\n" for line in text.splitlines()))

    @contextlib.contextmanager
    def step(self, title):
        """``==> title ... done (1.2 s)``; any failure becomes one DemoFailed."""
        self.say(f"==> {title} ... ")
        start = time.monotonic()
        try:
            yield
        except DemoFailed:
            self.say("failed\n")
            raise
        except Exception as exc:
            self.say("failed\n")
            raise DemoFailed(step=title, reason=reason(exc)) from exc
        self.say(f"done ({time.monotonic() - start:.1f} s)\n")

    @contextlib.contextmanager
    def _quiet_libraries(self):
        """Their INFO lines off, unless -v asked for more; restored afterwards."""
        if self.app.options.verbose_level > 1:
            yield
            return
        loggers = [logging.getLogger(name) for name in CHATTY_LOGGERS]
        levels = [logger.level for logger in loggers]
        for logger in loggers:
            logger.setLevel(logging.WARNING)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels, strict=True):
                logger.setLevel(level)
