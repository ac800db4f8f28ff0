"""The router's own input paths under hostile input: protobuf event batches
(ingestion and conversion) and routing requests (validation).

Each input is accepted, or refused with INVALID_ARGUMENT and a message, and
a refused input leaves the index and the load book as they were."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvrouter._core import RouteRefused
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.service.errors import ServiceError

from .conftest import fuzz_settings
from .service_state import BLOCK, ServiceState

u64 = st.integers(min_value=0, max_value=2**64 - 1)
small_ids = st.integers(min_value=0, max_value=12)
ids = st.one_of(small_ids, u64)
tiers = st.one_of(st.integers(0, 2), st.integers(-5, 2**31 - 1))
namespaces = st.one_of(st.just(""), st.text(max_size=6))
stored = st.builds(
    pb.StoredEvent,
    parent_block_id=st.one_of(st.none(), ids),
    block_ids=st.lists(ids, max_size=5),
    token_ids=st.lists(st.integers(0, 2**32 - 1), max_size=5 * BLOCK + 2),
    local_hashes=st.one_of(st.just([]), st.lists(u64, max_size=5)),
    tier=tiers,
    namespace=namespaces,
)
removed = st.builds(pb.RemovedEvent, block_ids=st.lists(ids, max_size=5), tier=tiers)
ends = st.builds(pb.EndsReusableEvent, block_ids=st.lists(ids, max_size=5), reusable=st.booleans())
kv_events = st.one_of(
    stored.map(lambda s: pb.KvEvent(stored=s)),
    removed.map(lambda r: pb.KvEvent(removed=r)),
    ends.map(lambda e: pb.KvEvent(ends_reusable=e)),
    st.just(pb.KvEvent(cleared=pb.ClearedEvent())),
    st.just(pb.KvEvent()),
)
batches = st.builds(
    pb.EventBatch,
    seq=st.one_of(st.integers(0, 6), u64),
    events=st.lists(kv_events, max_size=4),
    resync=st.booleans(),
    emitted_at=st.floats(allow_nan=True),
)


def expect_accepted_or_invalid(state: ServiceState, call) -> None:
    before = state.snapshot()
    try:
        call()
    except ServiceError as e:
        assert e.code == grpc.StatusCode.INVALID_ARGUMENT, (e.code, e.message)
        assert e.message
        assert state.snapshot() == before
    except RouteRefused as e:
        code, message, _ = e.args
        assert code == "INVALID_ARGUMENT", (code, message)
        assert message
        assert state.snapshot() == before


@fuzz_settings
@given(st.lists(batches, min_size=1, max_size=8))
def test_event_batches(sequence):
    state = ServiceState()
    for batch in sequence:
        expect_accepted_or_invalid(state, lambda b=batch: state.ingest(b))


@fuzz_settings
@given(st.binary(max_size=300))
def test_event_batch_bytes(data):
    state = ServiceState()
    expect_accepted_or_invalid(state, lambda: state.ingest(data))


route_requests = st.builds(
    pb.RouteRequest,
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=80),
    tokens_u32le=st.one_of(st.just(b""), st.binary(max_size=300)),
    namespace=st.one_of(st.just(""), st.text(max_size=300)),
    request_id=st.one_of(st.just(""), st.text(max_size=300)),
    explain=st.booleans(),
)


@fuzz_settings
@given(st.lists(route_requests, min_size=1, max_size=4))
def test_route_requests(requests):
    state = ServiceState()
    for request in requests:
        payload = request.SerializeToString()
        expect_accepted_or_invalid(state, lambda p=payload: state.routing.decide(p))


@fuzz_settings
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=4))
def test_route_request_bytes(payloads):
    state = ServiceState()
    for payload in payloads:
        expect_accepted_or_invalid(state, lambda p=payload: state.routing.decide(p))


@pytest.mark.parametrize("count", [65, 1_000_000])
def test_huge_prompts_are_refused_by_the_limit(count):
    state = ServiceState(max_prompt_tokens=64)
    request = pb.RouteRequest(tokens_u32le=b"\0\0\0\0" * count)
    with pytest.raises(RouteRefused, match="at most 64") as refused:
        state.routing.decide(request.SerializeToString())
    assert refused.value.args[0] == "INVALID_ARGUMENT"
