"""Where a run listens. A local run (one machine: `jaxdp train --processes P`, `torch_ref train --devices N`)
listens on 127.0.0.1 alone; a cluster run's coordinator on every interface, as its peers on other hosts
must reach it. A coordinator port already taken is refused in one line before any work (exit 2), not
found by the coordination service later (a crash, a peer waiting minutes).
"""
from __future__ import annotations

import errno
import socket

from ..errors import ConfigError

LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    return host == "localhost" or host.startswith("127.") or host.strip("[]") == "::1"


def bind_address(coordinator: str) -> str | None:
    """The address JAX's coordination service should bind for `coordinator` (HOST:PORT): the coordinator
    itself when it is a loopback address, else None (JAX's default, [::]:PORT, every interface)."""
    host, _, _ = coordinator.rpartition(":")
    return coordinator if is_loopback(host) else None


def loopback_interface() -> str | None:
    """The loopback network interface's name ('lo' on Linux, 'lo0' on macOS), or None: for gloo, which
    otherwise listens on whatever address this machine's hostname resolves to (GLOO_SOCKET_IFNAME)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n in ("lo", "lo0")), None)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def listener() -> socket.socket:
    """A socket listening on a free loopback port (no race between choosing the port and binding it)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((LOOPBACK, 0))
    s.listen(128)
    return s


def check_free(coordinator: str, flag: str = "--coordinator") -> None:
    """`coordinator` (HOST:PORT)'s port can be bound here, where it would be bound; else one line."""
    host, _, port = coordinator.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed run's TIME_WAIT is no conflict
        try:
            s.bind((LOOPBACK if is_loopback(host) else "0.0.0.0", int(port)))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return  # not ours to judge (a privileged port, no IPv4 here): the coordination service will say
            raise ConfigError(f"{flag} {coordinator}: port {port} is already in use on this machine (`ss -ltnp "
                              f"'sport = :{port}'` names the holder); give a free port, e.g. {flag} "
                              f"{host}:{free_port()}") from None
