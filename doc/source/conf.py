"""Sphinx configuration of vgpu-driver's documentation.

The configuration and CLI references are generated from the code (the
options' declarations, the commands' parsers), so they cannot drift from it.
"""

import vgpu_driver

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
