"""The Worker service over real gRPC: aggregated and split generation give
the reference's greedy tokens, hand-offs move only missing blocks, and
every path leaves no request running and no block pinned."""

from __future__ import annotations

import grpc
import pytest
from waiting import wait_until

from kvrouter.engine.llm_engine import default_hash_tokens
from kvrouter.proto_gen import generation_pb2 as gen
from kvrouter.proto_gen import worker_pb2 as wpb

from .helpers import BLOCK, collect, idle, prompt, request


def test_generate_matches_the_reference(start_worker, reference):
    worker = start_worker()
    for length in (5, 16, 100):
        tokens = prompt(length, length)
        out, messages = collect(worker.stub.Generate(request(tokens, 12)))
        assert out == reference(tokens, 12)
        last = messages[-1]
        assert last.finish_reason == gen.FINISH_REASON_LENGTH
        assert last.stats.prompt_tokens == length and last.stats.output_tokens == 12
        assert all(not m.finish_reason for m in messages[:-1])
    assert idle(worker.status())


def test_prefill_then_decode_matches_the_reference(start_worker, reference):
    prefill, decode = start_worker(role="prefill"), start_worker(role="decode")
    tokens = prompt(1, 150)
    response = prefill.stub.Prefill(wpb.PrefillRequest(request=request(tokens, 10, "r1")))
    handoff = response.handoff
    assert list(handoff.block_ids) == default_hash_tokens(BLOCK, "")(tokens)
    assert handoff.num_tokens == 150 and handoff.prefill_address == prefill.address
    assert response.finish_reason == gen.FINISH_REASON_UNSPECIFIED
    status = prefill.status()
    assert status.leases == 1 and status.leased_blocks == 150 // BLOCK == status.blocks_in_use

    out, messages = collect(
        decode.stub.Decode(wpb.DecodeRequest(request=request(tokens, 10, "r1"), handoff=handoff))
    )
    assert [handoff.first_token, *out] == reference(tokens, 10)
    ack = messages[0]
    assert ack.HasField("handoff") and not ack.token_ids
    assert ack.handoff.blocks_transferred == 150 // BLOCK and ack.handoff.blocks_reused == 0
    assert (
        ack.handoff.bytes_transferred
        == 150 // BLOCK * decode.server.engine_loop.engine.kv_layout.bytes_per_block
    )
    assert messages[-1].stats.disaggregated and messages[-1].stats.output_tokens == 10

    prefill.stub.Release(wpb.ReleaseRequest(request_id="r1"))
    assert idle(prefill.status()) and idle(decode.status())


def test_decode_fetches_only_the_blocks_it_lacks(start_worker, reference):
    prefill, decode = start_worker(), start_worker()
    shared = prompt(2, 96)
    first = [*shared, *prompt(3, 40)]
    second = [*shared, *prompt(4, 70)]
    for request_id, tokens, reused in (("a", first, 0), ("b", second, 96 // BLOCK)):
        handoff = prefill.stub.Prefill(
            wpb.PrefillRequest(request=request(tokens, 4, request_id))
        ).handoff
        out, messages = collect(
            decode.stub.Decode(
                wpb.DecodeRequest(request=request(tokens, 4, request_id), handoff=handoff)
            )
        )
        assert [handoff.first_token, *out] == reference(tokens, 4)
        assert messages[0].handoff.blocks_reused == reused
        assert messages[0].handoff.blocks_transferred == len(tokens) // BLOCK - reused
        prefill.stub.Release(wpb.ReleaseRequest(request_id=request_id))
    assert idle(prefill.status()) and idle(decode.status())


def test_first_token_can_finish_the_request(start_worker, reference):
    worker = start_worker()
    tokens = prompt(5, 64)
    response = worker.stub.Prefill(wpb.PrefillRequest(request=request(tokens, 1)))
    assert response.finish_reason == gen.FINISH_REASON_LENGTH
    assert response.handoff.first_token == reference(tokens, 1)[0]
    assert not response.handoff.block_ids
    assert idle(worker.status())


def test_lease_lapses_without_release(start_worker):
    worker = start_worker(lease_ms=200)
    worker.stub.Prefill(wpb.PrefillRequest(request=request(prompt(6, 64), 8, "lapsing")))
    wait_until(lambda: idle(worker.status()), what="the lease to lapse")
    with pytest.raises(grpc.RpcError) as e:
        list(worker.stub.FetchBlocks(wpb.FetchBlocksRequest(request_id="lapsing", block_ids=[1])))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_decode_from_a_dead_prefill_worker_is_aborted(start_worker):
    prefill, decode = start_worker(), start_worker(fetch_timeout_s=5.0)
    tokens = prompt(7, 80)
    handoff = prefill.stub.Prefill(wpb.PrefillRequest(request=request(tokens, 6, "orphan"))).handoff
    prefill.stop()
    with pytest.raises(grpc.RpcError) as e:
        collect(
            decode.stub.Decode(
                wpb.DecodeRequest(request=request(tokens, 6, "orphan"), handoff=handoff)
            )
        )
    assert e.value.code() == grpc.StatusCode.ABORTED
    assert prefill.address in e.value.details()
    assert idle(decode.status())


def test_bad_requests_are_refused_and_leave_nothing_behind(start_worker):
    worker = start_worker(namespace="tiny")
    cases = [
        gen.GenerateRequest(namespace="tiny", sampling=gen.SamplingParams(max_tokens=4)),
        gen.GenerateRequest(tokens=[1, 2], namespace="tiny"),
        gen.GenerateRequest(
            tokens=[1, 999], namespace="tiny", sampling=gen.SamplingParams(max_tokens=4)
        ),
        gen.GenerateRequest(
            tokens=[1, 2], namespace="other", sampling=gen.SamplingParams(max_tokens=4)
        ),
    ]
    for bad in cases:
        with pytest.raises(grpc.RpcError) as e:
            collect(worker.stub.Generate(bad))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, bad
    with pytest.raises(grpc.RpcError) as e:
        worker.stub.Release(wpb.ReleaseRequest(request_id="never"))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_request_for_another_model_is_refused(start_worker):
    worker = start_worker(served_model_name="llama")
    sampling = gen.SamplingParams(max_tokens=4, ignore_eos=True)
    for model in ("qwen", ""):
        with pytest.raises(grpc.RpcError) as e:
            collect(
                worker.stub.Generate(
                    gen.GenerateRequest(tokens=[1, 2], model=model, sampling=sampling)
                )
            )
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'llama'" in e.value.details()
    served = gen.GenerateRequest(tokens=[1, 2], model="llama", sampling=sampling)
    assert len(collect(worker.stub.Generate(served))[0]) == 4
    assert idle(worker.status())


def test_decode_refuses_a_foreign_handoff(start_worker):
    prefill, decode = start_worker(namespace="a"), start_worker(namespace="b")
    tokens = prompt(8, 64)
    inner = request(tokens, 4, "foreign")
    inner.namespace = "a"
    handoff = prefill.stub.Prefill(wpb.PrefillRequest(request=inner)).handoff
    inner.namespace = "b"
    with pytest.raises(grpc.RpcError) as e:
        collect(decode.stub.Decode(wpb.DecodeRequest(request=inner, handoff=handoff)))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "hashes" in e.value.details()
    assert idle(decode.status())


def test_cancelled_stream_aborts_the_request(start_worker):
    worker = start_worker()
    call = worker.stub.Generate(request(prompt(9, 40), 1000))
    next(call)
    call.cancel()
    wait_until(lambda: idle(worker.status()), what="the request to be aborted")
