"""A KV event publisher that behaves like vLLM's `ZmqEventPublisher`: a PUB
socket sending `[topic, seq, payload]` and a ROUTER socket answering replay
requests from a bounded buffer, ending each answer with seq -1."""

from __future__ import annotations

import collections
import threading
import time

import msgspec
import zmq

from . import vllm_schema

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def bind_consecutive(ctx: zmq.Context, kind: int, count: int) -> tuple[list[zmq.Socket], int]:
    """`count` sockets bound to consecutive free loopback ports (DP ranks
    publish on port + rank)."""
    while True:
        first = ctx.socket(kind)
        port = first.bind_to_random_port("tcp://127.0.0.1")
        socks = [first]
        try:
            for rank in range(1, count):
                sock = ctx.socket(kind)
                socks.append(sock)
                sock.bind(f"tcp://127.0.0.1:{port + rank}")
            return socks, port
        except zmq.ZMQError:
            for sock in socks:
                sock.close(linger=0)


class VllmStylePublisher:
    def __init__(
        self,
        pub: zmq.Socket,
        replay: zmq.Socket,
        *,
        encoding: str,
        dp_rank: int | None = 0,
        buffer_steps: int = 10_000,
        topic: str = "kv",
    ) -> None:
        self.pub, self.replay = pub, replay
        self.encoding = encoding
        self.dp_rank = dp_rank
        self.topic = topic.encode()
        self.seq = 0
        self._buffer: collections.deque[tuple[int, bytes]] = collections.deque(maxlen=buffer_steps)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._encoder = msgspec.msgpack.Encoder()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    def publish(self, events: list, *, lost: bool = False) -> int:
        """Publishes the next batch; with `lost`, only buffers it, as if the
        network had dropped it. Returns its seq."""
        payload = self._encoder.encode(
            vllm_schema.batch(self.encoding, time.time(), events, self.dp_rank)
        )
        return self.publish_raw(payload, lost=lost)

    def publish_raw(self, payload: bytes, *, lost: bool = False) -> int:
        seq, self.seq = self.seq, self.seq + 1
        with self._lock:
            self._buffer.append((seq, payload))
        if not lost:
            self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self.pub.close(linger=0)

    def _serve_replay(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.replay.poll(20):
                    continue
                frames = self.replay.recv_multipart()
                if len(frames) != 3:
                    continue
                identity, _, start = frames
                start_seq = int.from_bytes(start, "big")
                with self._lock:
                    buffered = [item for item in self._buffer if item[0] >= start_seq]
                for seq, payload in buffered:
                    self.replay.send_multipart([identity, b"", seq.to_bytes(8, "big"), payload])
                self.replay.send_multipart([identity, b"", END_SEQ, b""])
        finally:
            self.replay.close(linger=0)
