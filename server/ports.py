"""Public ports: one server's front ends may share them, nobody else may.

`claim(host, port)` takes an exclusive lock on host:port for this server — an abstract unix
socket named after it, held for the server's life and released by the kernel when the process
ends, however it ends — so a second doppelchip on the same port fails with one clear line
instead of silently splitting traffic (gRPC sets SO_REUSEPORT by default). A port some other
program already listens on is refused the same way. With several front ends the supervisor
also reserves the port itself (`reserve`), so that port 0 resolves to one port all of them
then bind with SO_REUSEPORT.
"""

from __future__ import annotations

import contextlib
import errno
import socket


class PortInUse(OSError):
    """The port is taken (by another doppelchip server or another program)."""


def claim(host: str, port: int, what: str) -> socket.socket:
    """The lock for host:port (keep it open); PortInUse if another server holds it."""
    lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        lock.bind(f"\0doppelchip-port-{host}-{port}")
    except OSError as e:
        lock.close()
        if e.errno == errno.EADDRINUSE:
            raise PortInUse(f"{what} port {host}:{port} is already used by another doppelchip "
                            "server") from None
        raise
    return lock


def check_free(host: str, port: int, what: str) -> None:
    """PortInUse if something already listens on host:port (no SO_REUSEPORT: exclusive)."""
    probe = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET,
                          socket.SOCK_STREAM)
    # SO_REUSEADDR, as the servers that then bind it: only a listener makes the port taken,
    # not a client connection that happens to use it as its local port, nor TIME_WAIT
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise PortInUse(f"{what} port {host}:{port} is already in use") from None
        raise
    finally:
        with contextlib.suppress(OSError):
            probe.close()


def reserve(host: str, port: int, what: str) -> socket.socket:
    """A bound (not listening) SO_REUSEPORT socket on host:port (port 0: a free one), kept
    open so the port stays this server's while its front ends bind it with SO_REUSEPORT."""
    if port:
        check_free(host, port, what)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise PortInUse(f"{what} port {host}:{port} is already in use") from None
        raise
    return sock


def claim_server_ports(host: str, port: int, http_port: int, num_frontends: int
                       ) -> tuple[list[socket.socket], int, int]:
    """The supervisor's ports before any child starts: (the sockets held for the server's
    life, the gRPC port, the HTTP port). A given port is claimed (PortInUse when taken);
    several front ends share a reserved gRPC port; the HTTP port is always reserved, so port
    0 becomes one concrete port every front end binds."""
    locks: list[socket.socket] = []
    if port:
        locks.append(claim(host, port, "gRPC"))
    if num_frontends > 1:
        held = reserve(host, port, "gRPC")
        locks.append(held)
        if not port:
            port = held.getsockname()[1]
            locks.append(claim(host, port, "gRPC"))
    elif port:
        check_free(host, port, "gRPC")
    if http_port:
        locks.append(claim(host, http_port, "HTTP"))
    held = reserve(host, http_port, "HTTP")
    locks.append(held)
    if not http_port:
        http_port = held.getsockname()[1]
        locks.append(claim(host, http_port, "HTTP"))
    return locks, port, http_port
