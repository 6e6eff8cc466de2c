"""Writing the fake tree as the kernel lays it out, and failing as it fails.

Every part of the fake kernel (PCI functions, mdev parents, the facade)
writes attributes and links the same way: attributes replaced at once so
lock-free readers never see half a value, links relative as the kernel makes
them, and errors as the ``OSError`` a store handler's errno gives.
"""

import contextlib
import errno
import os
import threading


def os_error(code, path):
    """The error a store handler's errno gives its writer."""
    return OSError(code, os.strerror(code), path)


def parse_int(value, attr):
    """What kstrtoul() accepts (any base), else EINVAL as the store handlers give."""
    try:
        return int(value.strip(), 0)
    except ValueError:
        raise os_error(errno.EINVAL, attr) from None


def parse_u16(value, attr):
    """What kstrtou16(buf, 0, ...) accepts, with its errnos (lib/kstrtox.c).

    ``sriov_numvfs_store`` (drivers/pci/iov.c) returns kstrtou16's error as
    is: an optional '+', a base from the prefix ("0x" + hex digit: 16, "0": 8,
    else 10), digits only (no '-', '_' or spaces) and one optional trailing
    newline, else EINVAL; a number past 65535 is ERANGE.
    """
    text = value[:-1] if value.endswith("\n") else value
    if text.startswith("+"):
        text = text[1:]
    base = 10
    if text[:2].lower() == "0x" and text[2:3] and text[2] in "0123456789abcdefABCDEF":
        base, text = 16, text[2:]
    elif text.startswith("0"):
        base = 8
    digits = "0123456789abcdef"[:base]
    if not text or any(c.lower() not in digits for c in text):
        raise os_error(errno.EINVAL, attr)
    number = int(text, base)
    if number > 0xFFFF:
        raise os_error(errno.ERANGE, attr)
    return number


def write_file(path, text="", mode=0o444):
    """Replace an attribute's content at once, never rewriting it in place.

    Readers take no lock, and the kernel never shows a reader a half-written
    value: a reader sees the old content or the new one.
    """
    write_bytes(path, text.encode(), mode)


def write_bytes(path, data, mode=0o444):
    """An attribute's bytes (a PCI function's ``config``), replaced at once.

    Through the file descriptor alone: a fake host of a few hundred
    attributes is laid out for most tests, and a buffered file object costs
    three more system calls per attribute (fstat, the tty check, a seek).
    The mode is set by fchmod, which the umask does not narrow.
    """
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)
    os.replace(tmp, path)


def link(target_abs, link_path):
    """A relative symlink, as the kernel makes them."""
    os.makedirs(os.path.dirname(link_path), exist_ok=True)
    os.symlink(os.path.relpath(target_abs, os.path.dirname(link_path)), link_path)


def remove_link(path):
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
