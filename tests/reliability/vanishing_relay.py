"""A TCP relay in front of a router that can make the router vanish as a
powered-off host or a partition does: no connection is closed, nothing
more arrives on any, and nothing is acknowledged. New connections then
reach the router that takes over, as a Service's address would."""

from __future__ import annotations

import socket
import threading


class VanishingRelay:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.target = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = []
        # Set for the connections made before the router vanished.
        self._vanished = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def vanish(self, next_upstream: str) -> None:
        """The connections open now go silent, left open; new ones reach
        `next_upstream`."""
        self.upstream = next_upstream
        self._vanished.set()
        self._vanished = threading.Event()

    def close(self) -> None:
        self._listener.close()
        for sock in self._sockets:
            sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            host, port = self.upstream.rsplit(":", 1)
            server = socket.create_connection((host, int(port)))
            self._sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(
                    target=self._pump, args=(src, dst, self._vanished), daemon=True
                ).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, vanished: threading.Event) -> None:
        try:
            while data := src.recv(65536):
                if vanished.is_set():
                    return  # dropped; the socket stays open and is read no more
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
