"""Is the broker that answers on host:port the mosquitto this run started?

"Something listens on the port" is not enough: if another broker (anyone's, possibly anonymous)
already holds the port, our mosquitto cannot bind it, and roles that connected anyway would hand
their passwords and every activation to that broker. Two checks, the strongest available first:

- `listener(pid, host, port)` (Linux): the LISTEN sockets bound to exactly host:port, from
  /proc/net/tcp{,6}, against the sockets process `pid` holds (/proc/<pid>/fd links
  `socket:[inode]`). It tells "ours", "foreign" (some other process holds that address, even
  beside ours) or "none yet". The kernel sends a connection to host:port to the socket bound
  to exactly that address before any wildcard one, so a wildcard listener of someone else
  (0.0.0.0:port) does not take connections from ours (and on Linux ours cannot bind beside
  it anyway: it exits with "Address already in use").
- `answers_as_ours(host, port, user, password)` (elsewhere, where there is no /proc): a login
  as a probe user whose password only this run knows must be accepted AND a login with a
  wrong password refused. The second half matters: a foreign broker that admits anonymous
  clients accepts any login, so an accepted login alone proves nothing. It needs a broker with
  a password file (the private broker of a run); a broker for anonymous clients (tests) can only
  be checked on Linux.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
from pathlib import Path

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's `st` column
_TABLES = (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6))


def _address(hex_addr: str, family: int) -> str:
    """/proc/net/tcp prints an address as 32-bit words in host byte order."""
    words = [int(hex_addr[i:i + 8], 16) for i in range(0, len(hex_addr), 8)]
    return socket.inet_ntop(family, b"".join(struct.pack("=I", w) for w in words))


def listening_inodes(host: str, port: int) -> set[int] | None:
    """Inodes of the LISTEN sockets bound to exactly `host`:`port` (IPv4, or IPv4-mapped IPv6);
    None where the kernel does not show its socket tables (not Linux)."""
    wanted = {host, f"::ffff:{host}"}
    found, seen_table = set(), False
    for path, family in _TABLES:
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:  # tcp6 is missing where IPv6 is off
            continue
        seen_table = True
        for line in lines:
            f = line.split()
            if len(f) < 10 or f[3] != _LISTEN:
                continue
            addr, _, port_hex = f[1].rpartition(":")
            if int(port_hex, 16) == port and _address(addr, family) in wanted:
                found.add(int(f[9]))
    return found if seen_table else None


def socket_inodes(pid: int) -> set[int] | None:
    """The inodes of the sockets process `pid` holds open (empty once it is gone); None if its
    file descriptors cannot be read (another user's process)."""
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except PermissionError:
        return None
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def listener(pid: int, host: str, port: int) -> str | None:
    """"ours" (process `pid` listens on host:port and nobody else does), "foreign" (another
    process listens there), "none" (nobody yet), or None where this cannot be told (no /proc)."""
    bound = listening_inodes(host, port)
    if bound is None:
        return None
    if not bound:
        return "none"
    held = socket_inodes(pid)
    if held is None:
        return None
    return "ours" if bound <= held else "foreign"


def _string(b: bytes) -> bytes:
    return struct.pack("!H", len(b)) + b


def _remaining_length(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = n >> 7, n & 0x7F
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def login_code(host: str, port: int, user: str, password: str, timeout: float = 2.0) -> int | None:
    """The CONNACK return code a broker answers to an MQTT 3.1.1 CONNECT with these credentials
    (0 accepted; 4 bad user name or password, 5 not authorised), None if it answers none."""
    payload = _string(f"pipelab-probe-{secrets.token_hex(6)}".encode()) + _string(user.encode()) + _string(password.encode())
    body = _string(b"MQTT") + bytes([4, 0xC2]) + struct.pack("!H", 10) + payload  # 3.1.1; user, password, clean session
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"\x10" + _remaining_length(len(body)) + body)
            got = b""
            while len(got) < 4:
                chunk = s.recv(4 - len(got))
                if not chunk:
                    return None
                got += chunk
            if got[:2] != b"\x20\x02":
                return None
            if got[3] == 0:
                s.sendall(b"\xe0\x00")  # DISCONNECT: a clean goodbye, no will
            return got[3]
    except OSError:
        return None


def answers_as_ours(host: str, port: int, user: str, password: str) -> bool:
    """The broker on host:port knows `user`'s password, and refuses a wrong one (see above)."""
    wrong = secrets.token_urlsafe(24)
    return login_code(host, port, user, wrong) in (4, 5) and login_code(host, port, user, password) == 0
