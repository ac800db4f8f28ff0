"""Which engines to subscribe to, from a config file or a mapping.

```toml
[[engines]]
name = "llama-a"                           # stable: worker ids derive from it
endpoint = "tcp://10.0.0.5:5557"           # the engine's KV event PUB socket
replay_endpoint = "tcp://10.0.0.5:5657"    # its ROUTER replay socket (optional)
data_parallel_size = 2                     # DP ranks on this node
data_parallel_start_rank = 0               # the first one's global rank
role = "both"                              # prefill | decode | both
address = "http://10.0.0.5:8000"           # its OpenAI server: probed, and what clients call
probe_interval_s = 0.5                     # /health and /metrics every this often
probe_timeout_s = 1.0                      # a probe slower than this fails
capacity_blocks = 40000                    # optional: read from its /metrics by default
model = "llama-3-8b"                       # the model requests name to reach it
adapters = ["sql"]                         # LoRA adapters it serves: "llama-3-8b:sql"
namespace = ""                             # cache salt its blocks hash with
kv_transfer = "vllm"                       # split requests: none | vllm | sglang
bootstrap_port = 8998                      # sglang prefill: its bootstrap port
attention_chunk_size = 0                   # chunked local attention (Llama 4: 8192)
```

Global DP rank r publishes on the endpoints' ports + r, as vLLM offsets
them, and stamps its batches with r. `worker_ids = [11, 12]` pins the worker
id of each of this node's DP ranks, in rank order; by default they derive
from the name and the global rank, so every router replica, restart and node
agrees on them.
"""

from __future__ import annotations

import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kvrouter.client.convert import ROLE_VALUES
from kvrouter.net.worker_protocol import KV_TRANSFER_NONE, OPENAI, check_kv_transfer

# The KV capacity assumed for an engine whose entry and /metrics state none.
DEFAULT_CAPACITY_BLOCKS = 1_000_000
# ZMQ transports an engine's sockets may be on.
ZMQ_SCHEMES = ("tcp", "ipc", "inproc")


@dataclass(frozen=True)
class EngineConfig:
    name: str
    endpoint: str
    replay_endpoint: str | None = None
    data_parallel_size: int = 1
    data_parallel_start_rank: int = 0
    worker_ids: tuple[int, ...] = ()
    role: str = "both"
    # The engine's OpenAI-compatible server, its base URL: the router sends
    # it proxied requests there, and reports it with each decision; the
    # sidecar probes its /health and /metrics (heartbeats carry its load,
    # and stop while it fails). The sidecar requires it.
    address: str = ""
    probe_interval_s: float = 0.5
    probe_timeout_s: float = 1.0
    # The engine's KV capacity in blocks per DP rank: the router excludes
    # prompts that cannot fit, turns the engine's cache usage into decode
    # blocks, and sizes its prefix index for it (one table home per block).
    # None: the sidecar reads it from the engine's /metrics (vLLM's
    # `vllm:cache_config_info`, SGLang's `sglang:max_total_num_tokens`),
    # and `DEFAULT_CAPACITY_BLOCKS` until it can.
    capacity_blocks: int | None = None
    # The model it serves, as requests name it (empty: requests that name
    # none), and the LoRA adapters it serves on it (`model:adapter`). Its
    # blocks hash in the model's (or the adapter's) namespace.
    model: str = ""
    adapters: tuple[str, ...] = ()
    # Cache salt: blocks hash in the model's namespace salted by it.
    namespace: str = ""
    # ZMQ topic prefix to subscribe to ("" is every message).
    topic: str = ""
    # How it takes part in a request the router splits between a prefill
    # and a decode engine: "none", "vllm" (its --kv-transfer-config, e.g.
    # NixlConnector) or "sglang" (--disaggregation-mode), whose prefill
    # engines name their --disaggregation-bootstrap-port.
    kv_transfer: str = KV_TRANSFER_NONE
    bootstrap_port: int = 0
    # The model's chunked local attention chunk, in tokens (Llama 4's
    # `attention_chunk_size`), which vLLM's events do not carry; 0: unknown,
    # and a prefix counts only as far as a chunked group holds it whole.
    attention_chunk_size: int = 0
    streams: tuple[Stream, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("an engine needs a name")
        if self.role not in ROLE_VALUES:
            raise ValueError(
                f"engine {self.name}: role must be one of {', '.join(ROLE_VALUES)}, "
                f"got {self.role!r}"
            )
        for key in ("endpoint", "replay_endpoint"):
            if key == "endpoint" or self.replay_endpoint is not None:
                _check_endpoint(f"engine {self.name}: {key}", getattr(self, key))
        if not (0 < self.probe_interval_s < math.inf and 0 < self.probe_timeout_s < math.inf):
            raise ValueError(
                f"engine {self.name}: probe_interval_s and probe_timeout_s must be > 0"
            )
        try:
            check_kv_transfer(OPENAI, self.kv_transfer, self.role, self.bootstrap_port)
        except ValueError as e:
            raise ValueError(f"engine {self.name}: {e}") from None
        capacity = self.capacity_blocks
        if capacity is not None and (type(capacity) is not int or not 0 < capacity <= 1 << 48):
            raise ValueError(
                f"engine {self.name}: capacity_blocks must be a positive integer up to 2^48, "
                f"got {capacity!r}"
            )
        if self.attention_chunk_size < 0:
            raise ValueError(f"engine {self.name}: attention_chunk_size must be >= 0")
        if self.data_parallel_size < 1:
            raise ValueError(f"engine {self.name}: data_parallel_size must be >= 1")
        if self.data_parallel_start_rank < 0:
            raise ValueError(f"engine {self.name}: data_parallel_start_rank must be >= 0")
        if self.worker_ids and len(self.worker_ids) != self.data_parallel_size:
            raise ValueError(
                f"engine {self.name}: worker_ids needs one id per DP rank "
                f"({self.data_parallel_size}), got {len(self.worker_ids)}"
            )
        ranks = range(
            self.data_parallel_start_rank, self.data_parallel_start_rank + self.data_parallel_size
        )
        ids = self.worker_ids or tuple(stable_worker_id(self.name, r) for r in ranks)
        rank_workers = dict(zip(ranks, ids, strict=True))
        streams = tuple(
            Stream(
                self.name,
                rank,
                offset_endpoint(self.endpoint, rank),
                self.replay_endpoint and offset_endpoint(self.replay_endpoint, rank),
                rank_workers,
            )
            for rank in ranks
        )
        object.__setattr__(self, "worker_ids", ids)
        object.__setattr__(self, "streams", streams)


@dataclass(frozen=True)
class Stream:
    """One DP rank's publisher: its own sockets and its own batch numbers."""

    engine: str
    # Global: what vLLM stamps the rank's batches with.
    dp_rank: int
    endpoint: str
    replay_endpoint: str | None
    # Global DP rank -> worker id, for the ranks of this engine entry.
    rank_workers: dict[int, int]

    @property
    def worker_id(self) -> int:
        return self.rank_workers[self.dp_rank]

    def worker_for(self, dp_rank: int | None) -> int | None:
        """The worker a batch speaks for: its own DP rank when it names one;
        None for a rank this entry does not hold."""
        if dp_rank is None:
            return self.worker_id
        return self.rank_workers.get(dp_rank)


def _check_endpoint(where: str, endpoint: str) -> None:
    """Raises ValueError unless `endpoint` is a ZMQ endpoint an engine can
    publish on: `tcp://HOST:PORT`, `ipc://PATH` or `inproc://NAME`."""
    scheme, sep, rest = endpoint.partition("://") if isinstance(endpoint, str) else ("", "", "")
    _, colon, port = rest.rpartition(":")
    if (
        not sep
        or scheme not in ZMQ_SCHEMES
        or not rest
        or (scheme == "tcp" and not (colon and port.isdigit()))
    ):
        raise ValueError(f"{where} {endpoint!r}: expected a ZMQ endpoint, e.g. tcp://10.0.0.5:5557")


def stable_worker_id(name: str, dp_rank: int) -> int:
    digest = hashlib.blake2b(f"{name}/dp{dp_rank}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1  # 63 bits: safe in every signed client


def offset_endpoint(endpoint: str, dp_rank: int) -> str:
    """Where DP rank `dp_rank` publishes, by vLLM's and SGLang's convention."""
    if dp_rank == 0:
        return endpoint
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return f"{host}:{int(port) + dp_rank}"
    return f"{endpoint}_dp{dp_rank}"


def load_engines(source: str | Path | dict[str, Any]) -> list[EngineConfig]:
    """Engines from a `.toml` or `.json` file, or from a mapping with an
    `engines` list. ValueError, naming the file, for one that cannot be read
    or holds no engines or a bad one."""
    if isinstance(source, dict):
        return _engines(source)
    path = Path(source)
    try:
        text = path.read_text()
        return _engines(json.loads(text) if path.suffix == ".json" else tomllib.loads(text))
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror.lower()}") from None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _engines(source: dict[str, Any]) -> list[EngineConfig]:
    listed = source.get("engines") if isinstance(source, dict) else None
    if not listed or not isinstance(listed, list) or not all(isinstance(e, dict) for e in listed):
        raise ValueError("expected a list of engines ([[engines]] tables)")
    known = {f.name for f in fields(EngineConfig) if f.init}
    engines = []
    for entry in listed:
        unknown = set(entry) - known
        if unknown:
            raise ValueError(f"engine {entry.get('name')!r}: unknown keys {sorted(unknown)}")
        missing = [key for key in ("name", "endpoint") if key not in entry]
        if missing:
            raise ValueError(f"engine {entry.get('name')!r}: missing {', '.join(missing)}")
        try:
            for key in ("worker_ids", "adapters"):
                if key in entry:
                    entry = {**entry, key: tuple(entry[key])}
            engines.append(EngineConfig(**entry))
        except TypeError as e:
            raise ValueError(f"engine {entry['name']!r}: a value of the wrong type ({e})") from None
    names = [e.name for e in engines]
    if len(set(names)) != len(names):
        raise ValueError(f"engine names must be unique: {names}")
    return engines
