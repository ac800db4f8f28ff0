"""Measures Dynamo's mocker (ai-dynamo-runtime 1.6.1, `run_mocker_trace_replay`)
on the small cases the replay must reproduce request by request, and writes
them to tests/replay/mocker_cases.json, which tests/replay/test_mocker_fidelity.py
replays: the engine's under round robin, and when Dynamo's KV router sees a
prompt's blocks under `kv_router` (which our `dynamo` baseline stands for).

    .venv/bin/python bench/mocker_cases.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("DYN_LOG", "warn")

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "replay" / "mocker_cases.json"
BLOCK = 512  # tokens per trace hash id


def request(at_ms: int, input_length: int, output_length: int, first_id: int) -> dict:
    ids = list(range(first_id, first_id + -(-input_length // BLOCK)))
    return {
        "timestamp": at_ms,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": ids,
    }


def long_request(at_ms: int, first_id: int) -> dict:
    return request(at_ms, 16_384, 8_192, first_id)


def prompt_again(decoding: int, prompt: int, again_ms: int) -> tuple:
    """Two workers: a request of `decoding` tokens decoding on one, a
    `prompt`-token prompt routed a millisecond later to the other, and the
    same prompt again at `again_ms`."""
    return (
        2,
        None,
        [request(0, decoding, 400, 500), request(1, prompt, 4, 0), request(again_ms, prompt, 4, 0)],
    )


# The router mode each group runs under; round robin where not named.
ROUTER_MODES = {"router_sees_a_chunk_once_computed": "kv_router"}

# group -> name -> (workers, KV blocks per worker or None for the default, requests)
CASES = {
    # Requests arriving in the same millisecond share the engine's next iteration.
    "same_instant": {
        "same_millisecond": (1, None, [request(0, 2000, 2, 0), request(0, 3000, 2, 100)]),
        "one_millisecond_apart": (1, None, [request(0, 2000, 2, 0), request(1, 3000, 2, 100)]),
        "over_the_token_budget": (
            1,
            None,
            [request(0, 2000, 2, 0), request(0, 3000, 2, 100), request(0, 6000, 2, 200)],
        ),
        "two_workers": (
            2,
            None,
            [request(0, 2000, 2, 0), request(0, 3000, 2, 100), request(0, 6000, 2, 200)],
        ),
    },
    # An iteration's prompt chunks are priced at their mean length in whole
    # tokens times their number: 523 + 2,000 tokens as 2,522, twelve prompts
    # of 34 tokens in all as 24, beside a decode or not.
    "iteration_priced_by_mean_chunk": {
        "two_prompts_of_an_odd_sum": (1, None, [request(0, 523, 2, 0), request(0, 2000, 2, 100)]),
        "twelve_short_prompts": (
            1,
            None,
            [request(0, 3, 2, 10 * k) for k in range(11)] + [request(0, 1, 2, 200)],
        ),
        "beside_a_decode": (
            1,
            None,
            [request(0, 1000, 200, 0), request(100, 523, 2, 100), request(100, 2000, 2, 200)],
        ),
    },
    # A prompt whose blocks are all cached still computes its last block.
    "prefix_hits": {
        "block_aligned_full_hit": (1, None, [request(0, 8192, 2, 0), request(1000, 8192, 2, 0)]),
        "full_hit_and_a_tail": (1, None, [request(0, 8202, 2, 0), request(1000, 8202, 2, 0)]),
        "cached_prefix_then_new_blocks": (
            1,
            None,
            [request(0, 8192, 2, 0), request(1000, 12_288, 2, 0)],
        ),
    },
    # A finished request's full output blocks stay cached, so they are
    # evicted in their turn, after older prompts, not freed at once.
    "lru_order": {
        "output_blocks_outlive_an_older_prompt": (
            1,
            64,
            [
                request(0, 1024, 2, 0),
                request(100, 512, 1280, 100),
                request(30_000, 2048, 2, 200),
                request(40_000, 1024, 2, 0),
            ],
        ),
    },
    # Output KV blocks are allocated as decode proceeds; a full cache preempts.
    "output_blocks": {
        "three_long_requests": (
            1,
            1024,
            [long_request(0, 0), long_request(0, 100), long_request(0, 200)],
        ),
        "three_long_requests_staggered": (
            1,
            1024,
            [long_request(0, 0), long_request(10, 100), long_request(20, 200)],
        ),
        "short_requests_while_preempted": (
            1,
            1024,
            [long_request(0, 0), long_request(0, 100), long_request(0, 200)]
            + [request(5000 + 50 * k, 4096, 64, 300 + 10 * k) for k in range(6)],
        ),
    },
    # A prompt's blocks are all taken when it is admitted, not chunk by
    # chunk as it is computed: a prompt whose first chunk fits beside a
    # running request but whose whole prompt does not waits for it to
    # finish; a long prompt evicts a cached prefix at admission, before its
    # later chunks need the room; and blocks still being computed are
    # shared with a request for the same prompt admitted beside it.
    "prompt_blocks_taken_at_admission": {
        "whole_prompt_must_fit": (
            1,
            1024,
            [request(0, 32_768, 2000, 0), request(10, 40_960, 2, 1000)],
        ),
        "evicts_a_prefix_at_admission": (
            1,
            1024,
            [request(0, 8192, 2, 0), request(1000, 61_440, 2, 100), request(1010, 8192, 2, 0)],
        ),
        "shared_while_computed": (1, None, [request(0, 4096, 2, 0), request(0, 4096, 2, 0)]),
    },
    # Dynamo's router sees a prompt's blocks chunk by chunk, once the
    # iteration that computed each chunk has ended, not while it is
    # computed. A request decodes on one worker; a long prompt then goes to
    # the other, and the same prompt again goes to the decoding worker while
    # none of the long one is seen (its worker looks the busier), and to the
    # long one's worker once enough of it is: a 4,096-token prompt's one
    # chunk ends at 85.8 ms; a 20,480-token prompt's chunks at 170, 339 and
    # 424 ms.
    "router_sees_a_chunk_once_computed": {
        "while_it_prefills": prompt_again(1024, 4096, 50),
        "once_its_prefill_ended": prompt_again(1024, 4096, 100),
        "one_chunk_of_three_computed": prompt_again(8192, 20_480, 300),
        "two_chunks_of_three_computed": prompt_again(8192, 20_480, 345),
    },
}


def mocker_requests(
    workers: int, blocks: int | None, requests: list[dict], mode: str, speed: float = 1.0
) -> list[dict]:
    """One run of Dynamo's mocker on `requests` (trace lines); its
    per-request records in arrival order."""
    from dynamo._core import run_mocker_trace_replay

    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        f.writelines(json.dumps(r) + "\n" for r in requests)
        path = f.name
    try:
        engine = json.dumps({"engine": {"num_gpu_blocks": blocks}}) if blocks else None
        result = run_mocker_trace_replay(
            [path],
            extra_engine_args=engine,
            num_workers=workers,
            router_mode=mode,
            arrival_speedup_ratio=speed,
            trace_block_size=BLOCK,
            capture_per_request=True,
        )
    finally:
        os.unlink(path)
    return sorted(result.per_request, key=lambda r: (r["arrival_time_ms"], r["input_length"]))


def measure(workers: int, blocks: int | None, requests: list[dict], mode: str) -> list[dict]:
    return sorted(
        (
            {
                "input_length": r["input_length"],
                "ttft_ms": r["ttft_ms"],
                "e2e_ms": r["e2e_latency_ms"],
                "readmissions": r["readmission_count"],
                "reused_tokens": r["reused_input_tokens"],
            }
            for r in mocker_requests(workers, blocks, requests, mode)
        ),
        key=lambda r: (r["ttft_ms"], r["e2e_ms"]),
    )


def main() -> int:
    fixture = {}
    for group, cases in CASES.items():
        fixture[group] = {}
        mode = ROUTER_MODES.get(group, "round_robin")
        for name, (workers, blocks, requests) in cases.items():
            measured = measure(workers, blocks, requests, mode)
            fixture[group][name] = {
                "router_mode": mode,
                "workers": workers,
                "capacity_blocks": blocks,
                "trace": requests,
                "mocker": measured,
            }
            for r in measured:
                print(group, name, r)
    FIXTURE.write_text(json.dumps(fixture, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
