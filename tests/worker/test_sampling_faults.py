"""Bad sampling settings sent straight to a worker (no router in front) are
refused before anything is scheduled; and a request whose sampling fails in
the engine fails alone, with FAILED_PRECONDITION, while the other streams
on the worker run on. The fault is injected into the model, since no
request that passes validation makes sampling fail."""

from __future__ import annotations

import grpc
import pytest
from bad_sampling import BAD_SAMPLING

from kvrouter.proto_gen import worker_pb2 as wpb

from .helpers import collect, idle, prompt, request

# Not a token of helpers.prompt, whose tokens start at 3.
POISON = 2


def poison_logits(worker) -> None:
    """The embedding of POISON turns NaN in the worker's model, so the
    logits of a sequence holding it are NaN, and only of that sequence."""
    embed = worker.server.engine_loop.engine.runner.model.model.embed_tokens

    def hook(module, inputs, output):
        return output.masked_fill((inputs[0] == POISON).unsqueeze(-1), float("nan"))

    embed.register_forward_hook(hook)


def test_bad_sampling_is_refused_before_scheduling(start_worker):
    worker = start_worker()
    cases = [*BAD_SAMPLING, ({}, "sampling.max_tokens")]
    for sampling, field in cases:
        max_tokens = 0 if field == "sampling.max_tokens" else 8
        bad = request(prompt(1, 40), max_tokens, **sampling)
        with pytest.raises(grpc.RpcError) as e:
            collect(worker.stub.Generate(bad))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, sampling
        assert field in e.value.details()
        with pytest.raises(grpc.RpcError) as e:
            worker.stub.Prefill(wpb.PrefillRequest(request=bad))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, sampling
    assert idle(worker.status())


def test_a_request_whose_sampling_fails_fails_alone(start_worker, reference):
    worker = start_worker()
    poison_logits(worker)
    healthy = [prompt(20 + i, 30 + 25 * i) for i in range(6)]
    streams = [worker.stub.Generate(request(p, 160)) for p in healthy]
    firsts = [next(s) for s in streams]  # all six are running

    poisoned = [[*prompt(50 + i, 20), POISON, 7] for i in range(8)]
    # Sampled and greedy: NaN logits fail both.
    samplings = [{"temperature": 1.0}, {}, {"temperature": 0.7, "top_k": 5}, {"top_p": 0.9}]
    calls = [
        worker.stub.Generate(request(tokens, 8, **samplings[i % len(samplings)]))
        for i, tokens in enumerate(poisoned)
    ]
    for call in calls:
        with pytest.raises(grpc.RpcError) as e:
            collect(call)
        assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "not finite" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        worker.stub.Prefill(wpb.PrefillRequest(request=request(poisoned[0], 8, "p")))
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert worker.status().leases == 0

    for tokens, first, stream in zip(healthy, firsts, streams, strict=True):
        rest, _ = collect(stream)
        assert [*first.token_ids, *rest] == reference(tokens, 160)
    assert idle(worker.status())
