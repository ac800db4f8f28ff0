"""A Publish stream over raw HTTP/2 that grants the router no window to send
in: a worker whose transport takes the router's replies no more. (A gRPC
client reads replies into its own buffers whether or not the caller reads
them, so it cannot stand in for one.)"""

from __future__ import annotations

import socket
import threading

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

from kvrouter.proto_gen import router_pb2 as pb

PATH = "/kvrouter.v1.KvEvents/Publish"
ENDINGS = (h2.events.StreamReset, h2.events.StreamEnded, h2.events.ConnectionTerminated)


class UnreadPublish:
    def __init__(self, port: int, hello: pb.PublishHello) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        self.stream_id = self.conn.get_next_available_stream_id()
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", PATH),
            (":authority", f"127.0.0.1:{port}"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ]
        self.conn.send_headers(self.stream_id, headers)
        self.ended = threading.Event()
        self._window = threading.Condition()
        self.sock.sendall(self.conn.data_to_send())
        threading.Thread(target=self._receive, daemon=True).start()
        self.send(pb.PublishRequest(hello=hello))

    def send(self, request: pb.PublishRequest) -> None:
        """Writes one message, waiting for the router to grant window for it."""
        data = request.SerializeToString()
        frame = b"\0" + len(data).to_bytes(4, "big") + data
        while frame:
            with self._window:
                while not self.ended.is_set() and not self._room():
                    self._window.wait(1)
                if self.ended.is_set():
                    raise ConnectionError("the router ended the stream")
                chunk, frame = frame[: self._room()], frame[self._room() :]
                self.conn.send_data(self.stream_id, chunk)
                self.sock.sendall(self.conn.data_to_send())

    def _room(self) -> int:
        return min(
            self.conn.local_flow_control_window(self.stream_id), self.conn.max_outbound_frame_size
        )

    def _receive(self) -> None:
        while data := self._recv():
            with self._window:
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError:
                    break  # frames after the router's GOAWAY: the connection is over
                if any(isinstance(e, ENDINGS) for e in events):
                    self.ended.set()
                self.sock.sendall(self.conn.data_to_send())
                self._window.notify_all()
        with self._window:
            self.ended.set()
            self._window.notify_all()

    def _recv(self) -> bytes:
        try:
            return self.sock.recv(65536)
        except OSError:
            return b""

    def close(self) -> None:
        self.sock.close()
