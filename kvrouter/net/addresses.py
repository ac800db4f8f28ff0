"""Listen addresses as the router and workers take them: `HOST:PORT`, the
host a name or an address (IPv6 in brackets), the port 0-65535 (0: any free
port); and the addresses they dial, the same with a port above 0. Checked
at start-up, where gRPC would otherwise pick another port for an
out-of-range one, or a default port for a bare host."""

from __future__ import annotations

import socket


def check_listen(flag: str, address: str) -> None:
    """Raises ValueError naming `flag` unless `address` is `HOST:PORT`."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or host in ("[", "[]") or not port.isdigit():
        raise ValueError(f"{flag} {address!r}: expected HOST:PORT, e.g. 127.0.0.1:50051")
    if int(port) > 65535:
        raise ValueError(f"{flag} {address!r}: port {port} is above 65535")
    if host.startswith("[") != host.endswith("]"):
        raise ValueError(f"{flag} {address!r}: an IPv6 host goes in brackets, e.g. [::1]:50051")


def check_dial(flag: str, address: str) -> None:
    """Raises ValueError naming `flag` unless `address` is `HOST:PORT` with
    a port to dial (not 0)."""
    check_listen(flag, address)
    if int(address.rpartition(":")[2]) == 0:
        raise ValueError(f"{flag} {address!r}: port 0 cannot be dialled")


def check_bindable(flag: str, address: str) -> None:
    """Raises OSError naming `flag` when `address` (`HOST:PORT`) cannot be
    bound here, before a server tries and logs its own failure. Port 0
    always can."""
    host, _, port = address.rpartition(":")
    if int(port) == 0:
        return
    try:
        infos = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise OSError(f"{flag} {address}: {e.strerror}") from None
    family, kind, proto, _, sockaddr = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(sockaddr)
        except OSError as e:
            raise OSError(f"{flag} {address}: {e.strerror.lower()}") from None


def http_listening_socket(address: str) -> socket.socket:
    """A socket bound to and listening on `address` (`HOST:PORT`, checked;
    an IPv6 host in brackets), for an HTTP server on the caller's own loop;
    OSError when it cannot be bound. Its accepted sockets inherit
    TCP_NODELAY: each streamed event goes out as written, not held back
    for the client's delayed ACK."""
    host, _, port = address.rpartition(":")
    family = socket.AF_INET6 if host.startswith("[") else socket.AF_INET
    listening = socket.create_server((host.strip("[]"), int(port)), family=family)
    listening.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return listening
