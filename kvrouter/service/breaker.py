"""A circuit breaker per request: a worker that failed the same request
`trip_after` times is not sent it again, so one request that breaks workers
cannot take them down over and over as its client retries. A request is
known by what it asks (model, namespace, sampling, prompt), so a retry under a
new request id still matches. Bounded: past `max_requests`, the requests
that failed longest ago are forgotten first."""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from kvrouter.proto_gen import generation_pb2 as gen


def fingerprint(request: gen.GenerateRequest, prompt: Sequence[int]) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    for part in (
        request.model.encode(),
        request.namespace.encode(),
        request.sampling.SerializeToString(deterministic=True),
        array("I", prompt).tobytes(),
    ):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.digest()


class RequestBreaker:
    def __init__(self, trip_after: int, max_requests: int) -> None:
        self.trip_after = trip_after
        self.max_requests = max_requests
        # fingerprint -> {worker id: failures}, least recently failed first.
        self._failures: OrderedDict[bytes, dict[int, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def record(self, request: bytes, worker_id: int) -> None:
        failures = self._failures.pop(request, {})
        failures[worker_id] = failures.get(worker_id, 0) + 1
        self._failures[request] = failures
        while len(self._failures) > self.max_requests:
            self._failures.popitem(last=False)

    def tripped(self, request: bytes) -> frozenset[int]:
        """The workers this request is no longer sent to."""
        failures = self._failures.get(request, {})
        return frozenset(w for w, n in failures.items() if n >= self.trip_after)
