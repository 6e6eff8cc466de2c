"""The demo's working directory: made, and the domains' XML saved into it.

Everything a run writes (fake ``/sys``, claims journal, Placement's
database, nova.conf, the domains' XML) lives in one directory, so that
``--dir`` can keep all of it for whoever looks afterwards and a plain run
can remove all of it.
"""

import os
import tempfile

from vgpu_driver.exception import DemoDirNotEmpty


def make(wanted):
    """``wanted`` (new or empty, kept), else a temporary directory."""
    if not wanted:
        return tempfile.mkdtemp(prefix="vgpu-demo-")
    if os.path.isdir(wanted) and os.listdir(wanted):
        raise DemoDirNotEmpty(path=wanted)
    os.makedirs(wanted, exist_ok=True)
    return os.path.abspath(wanted)


def save_domains(node, root):
    """The domains' XML as libvirt holds it, for whoever looks afterwards."""
    target = os.path.join(root, "domains")
    os.makedirs(target, exist_ok=True)
    for name, xml in node.domain_xmls().items():
        with open(os.path.join(target, f"{name}.xml"), "w") as f:
            f.write(xml)
