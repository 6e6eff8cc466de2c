"""The fake kernel's uevents, broadcast as udev broadcasts them.

On a host the kernel sends a uevent for each device added, bound, unbound
or removed; udevd processes it and re-broadcasts it to udev's netlink group
(2) with libudev's header, and that is what ``pyudev`` monitors with
``source="udev"`` read.  A fake device has no kernel uevent, so the fake
kernel sends the second message itself: the same header (prefix
``libudev``, magic ``0xfeedcafe``, the subsystem's MurmurHash2 for
in-kernel socket filters) and the device's properties as ``KEY=value``
strings, NUL-terminated.  (libudev drops messages on the kernel's group
that a user-space PID sent, so the kernel's own format would not reach
a monitor.)  Only root (CAP_NET_ADMIN) may send to the group; anyone else
gets EPERM and the fake kernel goes on quietly, as a host without udev.
"""

import itertools
import os
import socket
import struct

NETLINK_KOBJECT_UEVENT = 15
UDEV_GROUP = 2
_MAGIC = 0xFEEDCAFE
# Only the magic and the filter hashes are in network order (the kernel's
# socket filters compare them); sizes and offsets are the host's.
_HEADER = struct.Struct("=8s4sIII4s4s4s4s")
_BE32 = struct.Struct("!I")
_seqnum = itertools.count(int.from_bytes(os.urandom(3), "big") + 1)


def murmurhash2(data, seed=0):
    """The 32-bit MurmurHash2 libudev hashes subsystem names with."""
    m, length = 0x5BD1E995, len(data)
    h = (seed ^ length) & 0xFFFFFFFF
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[whole:]
    if tail:
        for index in reversed(range(len(tail))):
            h ^= tail[index] << (8 * index)
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h


def message(action, devpath, subsystem, properties=()):
    """One udev netlink message for a device event."""
    props = {
        "ACTION": action,
        "DEVPATH": devpath,
        "SUBSYSTEM": subsystem,
        "SEQNUM": str(next(_seqnum)),
        **dict(properties),
    }
    body = b"".join(f"{k}={v}".encode() + b"\0" for k, v in props.items())
    zero = _BE32.pack(0)
    header = _HEADER.pack(
        b"libudev",
        _BE32.pack(_MAGIC),
        _HEADER.size,
        _HEADER.size,
        len(body),
        _BE32.pack(murmurhash2(subsystem.encode())),
        zero,
        zero,
        zero,
    )
    return header + body


def broadcast(action, devpath, subsystem, properties=()):
    """Send one event to udev's group; False when this process may not."""
    data = message(action, devpath, subsystem, properties)
    try:
        with socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_KOBJECT_UEVENT
        ) as sock:
            sock.sendto(data, (0, UDEV_GROUP))
    except OSError:
        return False
    return True
