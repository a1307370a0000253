"""The listening TCP sockets of `/proc/net/tcp` and `/proc/net/tcp6`: where each is bound and who
created it (the CLI sends the admin token to a loopback port only when its listeners are the agent's)."""

from __future__ import annotations

import ipaddress
import sys
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import ProbeError
from probes.linux.procfs import HOST_ROOT, malformed, proc_path, read_raw

TCP_LISTEN = 0x0A  # the `st` column of a listening socket
MAX_NET_TCP_BYTES = 64 * 2**20  # about 400 000 sockets: a host with more is not read whole


@dataclass(frozen=True, slots=True)
class TcpListener:
    """One listening TCP socket: where it is bound and the uid that created it."""

    address: ipaddress.IPv4Address | ipaddress.IPv6Address
    port: int
    uid: int


def _net_address(hex_address: bytes) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} prints it: 32-bit words in the host's byte order."""
    raw = bytes.fromhex(hex_address.decode("ascii"))
    if len(raw) not in (4, 16):
        raise ValueError("neither 4 nor 16 bytes")
    if sys.byteorder == "little":
        raw = b"".join(raw[index : index + 4][::-1] for index in range(0, len(raw), 4))
    return ipaddress.ip_address(raw)


def parse_tcp_listeners(data: bytes) -> list[TcpListener]:
    """The LISTEN sockets of one `/proc/net/tcp` or `/proc/net/tcp6` (header line first)."""
    listeners = []
    for number, line in enumerate(data.splitlines()[1:], start=2):
        fields = line.split()
        if len(fields) < 8:
            raise malformed("/proc/net/tcp", f"line {number} has {len(fields)} fields, not 8 or more", data)
        try:
            if int(fields[3], 16) != TCP_LISTEN:
                continue
            host, _, port = fields[1].partition(b":")
            listeners.append(TcpListener(_net_address(host), int(port, 16), int(fields[7])))
        except (ValueError, UnicodeDecodeError) as exc:
            raise malformed("/proc/net/tcp", f"line {number}: {exc}", data) from None
    return listeners


def read_tcp_listeners(root: Path = HOST_ROOT) -> list[TcpListener]:
    """Every LISTEN TCP socket of medic's network namespace, IPv4 and IPv6; a missing tcp6 (IPv6
    disabled) is none. OSError on tcp passes through: the caller decides what unknown means."""
    listeners = []
    for name in ("tcp", "tcp6"):
        path = proc_path(root, "net", name)
        try:
            data = read_raw(path)
        except FileNotFoundError:
            if name == "tcp6":
                continue
            raise
        if len(data) > MAX_NET_TCP_BYTES:
            raise ProbeError(f"{path} is over {MAX_NET_TCP_BYTES // 2**20} MiB: not read")
        listeners.extend(parse_tcp_listeners(data))
    return listeners
