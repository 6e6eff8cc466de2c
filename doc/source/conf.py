"""Sphinx configuration of vgpu-driver's documentation.

The configuration and CLI references are generated from the code (the
options' declarations, the commands' parsers), so they cannot drift from it.
"""

import os

import yaml
from sphinx.util import logging

import vgpu_driver

logger = logging.getLogger(__name__)

project = "vgpu-driver"
copyright = "vgpu-driver developers"
release = vgpu_driver.__version__
version = release

extensions = [
    # [oslo.config] show-options: the options, from the oslo.config.opts
    # entry point the sample generator uses.
    "oslo_config.sphinxext",
    # The sample file, generated at build time and offered as a download.
    "oslo_config.sphinxconfiggen",
    # autoprogram-cliff: vgpu-manage's commands from their entry points.
    "cliff.sphinxext",
]

config_generator_config_file = [
    ("../../etc/vgpu-driver/vgpu-driver-config-generator.conf",
     "_static/vgpu-driver"),
]

# Commands are spelled as an operator types them.
autoprogram_cliff_application = "vgpu-manage"

master_doc = "index"
exclude_patterns = []
html_theme = "alabaster"
html_static_path = ["_static"]
html_title = f"vgpu-driver {release}"
pygments_style = "sphinx"


ALERT_RULES = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "prometheus",
                           "vgpu-driver-alerts.yml")


def _check_runbooks(app, env):
    """Each shipped alert's runbook_url anchor is a label of the
    troubleshooting page: a warning (an error in the docs build) if not."""
    with open(ALERT_RULES) as source:
        groups = yaml.safe_load(source)["groups"]
    labels = env.get_domain("std").labels
    for rule in (r for group in groups for r in group["rules"] if "alert" in r):
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        where = labels.get(anchor)
        if not page.endswith("/admin/troubleshooting.html") or not where \
                or where[0] != "admin/troubleshooting":
            logger.warning("alert %s: its runbook_url %s is no section of "
                           "admin/troubleshooting", rule["alert"],
                           rule["annotations"]["runbook_url"])


def setup(app):
    app.connect("env-check-consistency", _check_runbooks)
