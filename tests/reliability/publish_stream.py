"""A bare Publish stream, written by the test batch by batch: what the tests
that send the router exactly the batches (or hellos) they choose share."""

from __future__ import annotations

import queue
import threading

import grpc

from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc


class Stream:
    """One Publish stream; replies are collected by a thread."""

    def __init__(self, target: str, hello: pb.PublishHello) -> None:
        self.channel = grpc.insecure_channel(target)
        self._out: queue.Queue = queue.Queue()
        self._out.put(pb.PublishRequest(hello=hello))
        self.replies: queue.Queue = queue.Queue()
        # Set when the call ends; `error` is how, unless it ended OK.
        self.ended = threading.Event()
        self.error: grpc.RpcError | None = None
        calls = router_pb2_grpc.KvEventsStub(self.channel).Publish(iter(self._out.get, None))
        threading.Thread(target=self._collect, args=(calls,), daemon=True).start()

    def _collect(self, calls) -> None:
        try:
            for reply in calls:
                self.replies.put(reply)
        except grpc.RpcError as e:
            self.error = e
        self.ended.set()

    def send(self, batch: pb.EventBatch) -> None:
        self._out.put(pb.PublishRequest(batch=batch))

    def close(self) -> None:
        self._out.put(None)
        self.channel.close()
