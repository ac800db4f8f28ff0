"""Mooncake-format traces: one JSON object per line with `timestamp` (ms),
`input_length`, `output_length` and `hash_ids`, one id per `trace_block_size`
tokens of the prompt, equal ids meaning equal prefixes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TraceRequest:
    arrival_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    @classmethod
    def from_record(cls, record: dict, speedup: float = 1.0) -> TraceRequest:
        """One Mooncake trace line, parsed; `speedup` > 1 compresses its
        arrival time."""
        return cls(
            float(record["timestamp"]) / speedup,
            int(record["input_length"]),
            max(int(record["output_length"]), 1),
            tuple(record["hash_ids"]),
        )


def load_mooncake(path: str | Path, speedup: float = 1.0) -> list[TraceRequest]:
    """Reads a trace; `speedup` > 1 compresses arrival times."""
    if speedup <= 0:
        raise ValueError(f"speedup must be positive, got {speedup}")
    requests = []
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                requests.append(TraceRequest.from_record(json.loads(line), speedup))
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}:{line_no}: not a Mooncake trace record ({e})") from e
    requests.sort(key=lambda r: r.arrival_ms)
    return requests


def write_mooncake(path: str | Path, requests: list[TraceRequest]) -> None:
    with open(path, "w") as f:
        for r in requests:
            record = {
                "timestamp": round(r.arrival_ms),
                "input_length": r.input_length,
                "output_length": r.output_length,
                "hash_ids": list(r.hash_ids),
            }
            f.write(json.dumps(record) + "\n")


def engine_blocks(request: TraceRequest, trace_block_size: int, block_size: int) -> list[int]:
    """Ids of the prompt's full engine blocks. Trace block `h` splits into
    `trace_block_size // block_size` engine blocks; since hash ids already
    identify whole prefixes, `h * ratio + j + 1` does too."""
    if trace_block_size % block_size:
        raise ValueError(
            f"trace block size {trace_block_size} is not a multiple of block size {block_size}"
        )
    ratio = trace_block_size // block_size
    full = min(request.input_length // block_size, len(request.hash_ids) * ratio)
    return [request.hash_ids[i // ratio] * ratio + i % ratio + 1 for i in range(full)]


def reusable_blocks(tokens: int, block_size: int) -> int:
    """The most blocks of a `tokens`-long sequence a prefix-cache hit may
    cover: the engine computes at least the last token (its logits give the
    next one), so a fully cached, block-aligned prompt recomputes its last
    block, as vLLM and Dynamo's mocker do."""
    return max(tokens - 1, 0) // block_size
