"""libvirt's own RelaxNG schema for domain XML (Debian's libvirt0 ships it)."""

import functools
import pathlib

from lxml import etree

DOMAIN_RNG = pathlib.Path("/usr/share/libvirt/schemas/domain.rng")


@functools.cache
def _domain_schema():
    return etree.RelaxNG(etree.parse(str(DOMAIN_RNG)))


def assert_valid_domain(xml):
    """Fail with libvirt's own complaint if ``xml`` is not a valid domain."""
    document = etree.fromstring(xml.encode() if isinstance(xml, str) else xml)
    schema = _domain_schema()
    assert schema.validate(document), str(schema.error_log)
