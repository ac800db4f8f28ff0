"""Long fuzz run of the router's input paths; prints a table and writes
bench/results/fuzz.json.

Two kinds of input, both held to the contract of tests/fuzz (accepted, or
refused with a clear error, and a refusal leaves the state as it was):

  * hypothesis: the tests in tests/fuzz with KVROUTER_FUZZ_EXAMPLES inputs
    per test (structure-aware: near-valid batches, wild field types);
  * mutation: valid payloads (a vLLM msgpack batch, a protobuf EventBatch,
    a RouteRequest as the core parses it) with random byte flips,
    insertions, deletions and truncations, fed through the same checks at a
    far higher rate.

    .venv/bin/python bench/fuzz.py                       # ~20k + 300k inputs
    .venv/bin/python bench/fuzz.py --examples 300 --mutations 5000   # smoke
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fuzz.service_state import BLOCK, ServiceState  # noqa: E402
from fuzz.test_service_inputs import expect_accepted_or_invalid  # noqa: E402
from fuzz.test_vllm_wire import check_payload  # noqa: E402

from kvrouter.proto_gen import router_pb2 as pb  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "fuzz.json"


def hypothesis_run(examples: int) -> dict[str, int]:
    """Runs tests/fuzz; returns passing examples per test."""
    env = {**os.environ, "KVROUTER_FUZZ_EXAMPLES": str(examples)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/fuzz"]
    out = subprocess.run(
        [*cmd, "--hypothesis-show-statistics"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        print(out.stdout[-4000:], out.stderr[-2000:])
        raise SystemExit("the hypothesis fuzz tests failed")
    counts: dict[str, int] = {}
    test = None
    for line in out.stdout.splitlines():
        if m := re.match(r"tests/fuzz/\S+::(\w+)", line):
            test = m.group(1)
        elif test and (m := re.search(r"(\d+) passing", line)):
            counts[test] = counts.get(test, 0) + int(m.group(1))
    return counts


def mutate(data: bytes, rng: random.Random) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(4)
        at = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(at, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[at:at] = rng.randbytes(rng.randint(1, 4))
        elif op == 2:
            del buf[at : at + rng.randint(1, 4)]
        else:
            del buf[at:]
    return bytes(buf)


def vllm_seed() -> bytes:
    tokens = list(range(3 * BLOCK))
    stored = ["BlockStored", [11, 12, 13], None, tokens, BLOCK, None, "GPU", None, None, 0]
    return msgspec.msgpack.encode([1.5, [stored, ["BlockRemoved", [12], "GPU"]], 0])


def protobuf_seed() -> bytes:
    stored = pb.StoredEvent(block_ids=[1, 2], token_ids=list(range(2 * BLOCK)), namespace="m")
    batch = pb.EventBatch(seq=0, events=[pb.KvEvent(stored=stored)], emitted_at=1.0)
    batch.events.add(removed=pb.RemovedEvent(block_ids=[2]))
    return batch.SerializeToString()


def protobuf_check(data: bytes) -> None:
    state = ServiceState()
    expect_accepted_or_invalid(state, lambda: state.ingest(data))


def route_seed() -> bytes:
    tokens = b"".join(t.to_bytes(4, "little") for t in range(3 * BLOCK))
    return pb.RouteRequest(
        request_id="r1", tokens_u32le=tokens, namespace="m", explain=True
    ).SerializeToString()


def route_check(data: bytes) -> None:
    """The Route path parses the bytes in the core: no exception but a
    clear refusal, and a refusal changes nothing."""
    state = ServiceState()
    expect_accepted_or_invalid(state, lambda: state.routing.decide(data))


def mutation_run(check, seed: bytes, count: int, rng: random.Random) -> float:
    started = time.perf_counter()
    for _ in range(count):
        check(mutate(seed, rng))
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=3000, help="hypothesis inputs per test")
    parser.add_argument("--mutations", type=int, default=100_000, help="mutated inputs per path")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    logging.disable(logging.WARNING)  # skipped-event notices, by the thousand
    started = time.perf_counter()
    rows = {f"hypothesis {k}": v for k, v in hypothesis_run(args.examples).items()}
    rng = random.Random(args.seed)
    for name, check, seed in (
        ("mutation vLLM msgpack", check_payload, vllm_seed()),
        ("mutation protobuf EventBatch", protobuf_check, protobuf_seed()),
        ("mutation RouteRequest (parsed in the core)", route_check, route_seed()),
    ):
        mutation_run(check, seed, args.mutations, rng)
        rows[name] = args.mutations
    total = sum(rows.values())
    print(f"{'target':<45} {'inputs':>10}")
    for name, count in rows.items():
        print(f"{name:<45} {count:>10,}")
    print(f"{'total (no crash, every refusal clear)':<45} {total:>10,}")
    result = {
        "inputs": rows,
        "total": total,
        "failures": 0,
        "seconds": time.perf_counter() - started,
    }
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
