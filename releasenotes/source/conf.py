"""Sphinx configuration of vgpu-driver's release notes (reno).

reno reads the notes from git history, so the build needs a clone with its
history (a fresh clone has it), and a note shows once it is committed.  Until
a release is tagged, reno files every note under version 0.0.0.
"""

project = "vgpu-driver release notes"
copyright = "vgpu-driver developers"
release = ""
version = ""

extensions = ["reno.sphinxext"]

master_doc = "index"
html_theme = "alabaster"
html_static_path = ["_static"]
