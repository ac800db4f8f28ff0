"""The per-request breaker trips after `trip_after` failures on one worker,
knows a request by what it asks, and forgets the oldest past its bound."""

from __future__ import annotations

from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.service.breaker import RequestBreaker, fingerprint


def request(request_id: str, temperature: float = 0.0) -> gen.GenerateRequest:
    return gen.GenerateRequest(
        request_id=request_id, sampling=gen.SamplingParams(max_tokens=4, temperature=temperature)
    )


def test_a_retry_under_another_id_matches():
    assert fingerprint(request("a"), [1, 2]) == fingerprint(request("b"), [1, 2])
    assert fingerprint(request("a"), [1, 2]) != fingerprint(request("a"), [1, 3])
    assert fingerprint(request("a"), [1, 2]) != fingerprint(request("a", 1.0), [1, 2])


def test_trips_per_worker_and_stays_bounded():
    breaker = RequestBreaker(trip_after=2, max_requests=3)
    breaker.record(b"p", 1)
    assert breaker.tripped(b"p") == frozenset()
    breaker.record(b"p", 1)
    breaker.record(b"p", 2)
    assert breaker.tripped(b"p") == {1}
    for other in (b"q", b"r", b"s"):
        breaker.record(other, 1)
    assert len(breaker) == 3 and breaker.tripped(b"p") == frozenset()
