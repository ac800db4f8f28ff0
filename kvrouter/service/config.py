"""Service configuration: defaults, then a TOML file, then `KVROUTER_*`
environment variables, then command-line flags (each overrides the last).

Every field of `ServiceConfig` is a knob: `--heartbeat-ttl-s 3`,
`KVROUTER_HEARTBEAT_TTL_S=3` or `heartbeat_ttl_s = 3` in the file. Policy
knobs (`kvrouter.policy.PolicyConfig`) go in the file's `[policy]` table,
in `KVROUTER_POLICY_<FIELD>` or in `--policy FIELD=VALUE`; proxied
generation's (`kvrouter.service.proxy_config.ProxyConfig`) in `[proxy]`,
`KVROUTER_PROXY_<FIELD>` or `--proxy FIELD=VALUE`. A list (`nats`) is a
TOML array, or comma-separated in a variable or flag.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvrouter.net import auth, logs, tls
from kvrouter.net.addresses import check_listen
from kvrouter.policy import PolicyConfig
from kvrouter.service.proxy_config import ProxyConfig

ENV_PREFIX = "KVROUTER_"
# Settings kept in a table of their own: field name -> environment prefix.
TABLES = {"policy": "KVROUTER_POLICY_", "proxy": "KVROUTER_PROXY_"}


@dataclass
class ServiceConfig:
    # gRPC listen address.
    listen: str = "0.0.0.0:50051"
    # Prometheus /metrics listen address; empty disables the endpoint. The
    # loopback by default: set 0.0.0.0:9464 (or the pod IP) for a scraper
    # elsewhere. With tokens on it needs a `metrics` (or `admin`) token, with
    # TLS on it is HTTPS.
    metrics_listen: str = "127.0.0.1:9464"
    # Tokens per KV block; every worker must use the same.
    block_size: int = 16
    # Bound on the index size (least recently used blocks go first); 0: none.
    max_index_blocks: int = 0
    # Size the index's hash tables for the registered workers' capacity, one
    # 8-byte home a table per block, so that they do not double (a stall of
    # up to a few hundred ms) while events apply; off, they grow with the
    # index, which takes up to half their memory where workers share blocks.
    size_index: bool = True
    # Longer prompts are refused with INVALID_ARGUMENT.
    max_prompt_tokens: int = 262_144
    # Longest accepted hashing namespace, in characters.
    max_namespace_chars: int = 256
    # Open RouteStream calls at once; one more is RESOURCE_EXHAUSTED. A
    # gateway needs one stream per connection, not one per request, and each
    # open stream holds about 20 KB.
    max_route_streams: int = 1024
    # What workers are told to use, and how long a silent worker is kept.
    heartbeat_interval_s: float = 1.0
    heartbeat_ttl_s: float = 5.0
    # How long a worker with index entries may go without an event stream
    # (its publisher down while its heartbeats go on) before it stops being
    # routable; it is routable again once a stream returns level or resyncs.
    event_stream_ttl_s: float = 5.0
    # A Publish stream whose worker leaves the router's reply unread this
    # long (its transport takes no more data) is closed.
    event_ack_timeout_s: float = 30.0
    # Events in one batch; a bigger batch is refused (INVALID_ARGUMENT).
    # Batches are bounded by the message size too; this bounds the work.
    max_batch_events: int = 65_536
    # The OpenAI-compatible HTTP front door (`/v1/chat/completions`,
    # `/v1/completions`, `/v1/models`, `/health`, `/ready`); empty: off.
    http_listen: str = ""
    # The models the front door serves, each `NAME=DIRECTORY`: the directory
    # holds the model's tokenizer files (tokenizer.json, tokenizer_config.json);
    # the model's workers register NAME (`--served-model-name`).
    served_models: tuple[str, ...] = ()
    # Front-door requests running at once; more wait in the admission queue.
    http_max_requests: int = 256
    # A model whose every healthy worker has more than this much predicted
    # prefill queued (ms) is saturated: its new front-door requests wait.
    http_max_backlog_ms: float = 2_000.0
    # Requests waiting for admission, all models together; one more is 429.
    http_max_queued: int = 1_024
    # A request that waits longer for admission is 503; both carry Retry-After.
    http_queue_timeout_s: float = 30.0
    # A request body that takes longer to arrive is 408.
    http_body_timeout_s: float = 30.0
    # Tokens of prompt text the front door keeps per model, so that text it
    # has encoded before (a chat's earlier turns) is not encoded again; 0: off.
    http_tokenizer_cache_tokens: int = 4_000_000
    # On SIGTERM: how long in-flight calls may take to finish.
    drain_grace_s: float = 10.0
    # Index snapshot file: restored at start, written at shutdown; empty: none.
    # Its directory must exist and be writable when the router starts.
    snapshot_path: str = ""
    # A snapshot that is truncated or corrupt: "empty" starts with an empty
    # index (workers' resyncs refill it) and moves the file aside; "exit"
    # refuses to start.
    on_bad_snapshot: str = "empty"
    # "debug", "info", "warning" or "error".
    log_level: str = "info"
    # "json" (one object per line) or "text".
    log_format: str = "json"
    # Log every routing decision (at info level) with its request id.
    log_decisions: bool = True
    # NATS server URLs. Set, the router runs as one replica of several: KV
    # events come from the JetStream stream and the load book is shared with
    # the other replicas. Empty: one router, events over gRPC.
    nats: tuple[str, ...] = ()
    # The replica's name, unique and stable across restarts (its durable
    # consumer's name); required with `nats`.
    replica_name: str = ""
    # Where the replicas meet: the stream of event batches and the subject
    # prefix (batches on `<prefix>.events.<worker>`, bookings on `<prefix>.load`).
    nats_stream: str = "KVROUTER_EVENTS"
    nats_subject_prefix: str = "kvrouter"
    # Bearer tokens, one `ROLE TOKEN` per line (kvrouter/net/auth.py);
    # empty: no authentication.
    auth_tokens_file: str = ""
    # With authentication on: whether health and reflection answer without a token.
    health_open: bool = True
    reflection_open: bool = True
    # PEM files. Cert and key turn TLS on; a client CA as well requires client
    # certificates signed by it (mTLS).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    # What the router presents when it calls workers with authentication or
    # TLS on: a file holding its token (role `router`), the CA that signed
    # the workers' certificates, and its client certificate and key (mTLS).
    worker_token_file: str = ""
    worker_ca_file: str = ""
    worker_cert_file: str = ""
    worker_key_file: str = ""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    proxy: ProxyConfig = field(default_factory=ProxyConfig)

    def validate(self) -> None:
        if self.block_size <= 0:
            raise ValueError("block_size must be positive")
        if self.max_index_blocks < 0:
            raise ValueError("max_index_blocks must be >= 0")
        if self.max_route_streams <= 0:
            raise ValueError("max_route_streams must be positive")
        if self.max_prompt_tokens <= 0:
            raise ValueError("max_prompt_tokens must be positive")
        if not 0 < self.heartbeat_interval_s < self.heartbeat_ttl_s:
            raise ValueError("need 0 < heartbeat_interval_s < heartbeat_ttl_s")
        if self.event_stream_ttl_s <= 0:
            raise ValueError("event_stream_ttl_s must be positive")
        if self.event_ack_timeout_s <= 0:
            raise ValueError("event_ack_timeout_s must be positive")
        if self.max_batch_events <= 0:
            raise ValueError("max_batch_events must be positive")
        if self.drain_grace_s < 0:
            raise ValueError("drain_grace_s must be >= 0")
        if isinstance(self.nats, str):
            raise ValueError("nats is a tuple of server URLs, not a string")
        if self.nats and not self.replica_name:
            raise ValueError(
                "nats needs replica_name: a name unique to this replica and stable across restarts"
            )
        if self.on_bad_snapshot not in ("empty", "exit"):
            raise ValueError("on_bad_snapshot must be 'empty' or 'exit'")
        if self.log_format not in ("json", "text"):
            raise ValueError("log_format must be 'json' or 'text'")
        logs.check_level(self.log_level)
        check_listen("--listen", self.listen)
        if self.metrics_listen:
            check_listen("--metrics-listen", self.metrics_listen)
        if self.http_listen:
            check_listen("--http-listen", self.http_listen)
            if not self.served_models:
                raise ValueError("--http-listen needs --served-models NAME=TOKENIZER_DIR[,...]")
        served_model_dirs(self.served_models)
        for name in ("http_max_requests", "http_max_queued"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in ("http_queue_timeout_s", "http_body_timeout_s"):
            if not 0 < getattr(self, name) < math.inf:
                raise ValueError(f"{name} must be a positive number of seconds")
        if self.http_tokenizer_cache_tokens < 0:
            raise ValueError("http_tokenizer_cache_tokens must be 0 (off) or more")
        if not 0 <= self.http_max_backlog_ms < math.inf:
            raise ValueError("http_max_backlog_ms must be a number of ms, 0 or more")
        tls.check(self)
        if self.auth_tokens_file:
            tls.check_readable("auth_tokens_file", self.auth_tokens_file)
            auth.load_tokens(self.auth_tokens_file)
        if bool(self.worker_cert_file) != bool(self.worker_key_file):
            raise ValueError("worker_cert_file and worker_key_file must be set together")
        self.policy.validate()
        self.proxy.validate()

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "policy": self.policy.to_dict()}


def served_model_dirs(served: tuple[str, ...]) -> dict[str, Path]:
    """`served_models` as {name: tokenizer directory}; ValueError naming the
    entry that is not NAME=DIRECTORY or whose directory does not exist."""
    models: dict[str, Path] = {}
    for entry in served:
        name, _, directory = entry.partition("=")
        if not name or not directory:
            raise ValueError(f"--served-models {entry!r}: expected NAME=TOKENIZER_DIR")
        if not Path(directory, "tokenizer.json").is_file():
            raise ValueError(f"--served-models {entry!r}: no tokenizer.json in {directory}")
        models[name] = Path(directory)
    return models


def _knobs(cls: type) -> dict[str, Any]:
    if cls is PolicyConfig:
        return dict(PolicyConfig.fields())
    tables = TABLES if cls is ServiceConfig else {}
    return {f.name: f.type for f in dataclasses.fields(cls) if f.name not in tables}


def split_list(text: str) -> tuple[str, ...]:
    """The items of a comma-separated list, blanks dropped."""
    return tuple(item.strip() for item in text.split(",") if item.strip())


def _parse(kind: str, raw: Any, name: str) -> Any:
    """Converts a string (env, flag) or TOML value to the field's type."""
    if "tuple" in kind:
        if isinstance(raw, str):
            return split_list(raw)
        if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
            raise ValueError(f"{name}: expected a list of strings, got {raw!r}")
        return tuple(raw)
    if not isinstance(raw, str):
        return raw
    try:
        if "bool" in kind:
            if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                raise ValueError(raw)
            return raw.lower() in ("1", "true", "yes", "on")
        if "None" in kind and raw.lower() in ("", "none"):
            return None
        if "int" in kind:
            return int(raw)
        if "float" in kind:
            return float(raw)
    except ValueError:
        raise ValueError(f"{name}: cannot read {raw!r} as {kind}") from None
    return raw


def _update(target: Any, values: Mapping[str, Any], source: str) -> None:
    knobs = _knobs(type(target))
    for name, raw in values.items():
        if name not in knobs:
            raise ValueError(f"{source}: unknown setting {name!r}")
        setattr(target, name, _parse(str(knobs[name]), raw, f"{source} {name}"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML config file")
    for table, what in (("policy", "routing policy"), ("proxy", "proxied generation")):
        parser.add_argument(
            "--" + table,
            metavar="FIELD=VALUE",
            action="append",
            default=[],
            help=f"a {what} setting (repeatable)",
        )
    defaults = ServiceConfig()
    for name in _knobs(ServiceConfig):
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            default=None,
            help=f"default: {getattr(defaults, name)!r}",
        )


def load(
    args: argparse.Namespace | None = None, env: Mapping[str, str] | None = None
) -> ServiceConfig:
    """The effective configuration from a file, the environment and flags."""
    env = os.environ if env is None else env
    config = ServiceConfig()
    path = getattr(args, "config", None) or env.get(ENV_PREFIX + "CONFIG")
    if path:
        data = tomllib.loads(Path(path).read_text())
        for table in TABLES:
            _update(getattr(config, table), data.pop(table, {}), f"{path} [{table}]")
        _update(config, data, path)
    for table, prefix in TABLES.items():
        _update(
            getattr(config, table),
            {k[len(prefix) :].lower(): v for k, v in env.items() if k.startswith(prefix)},
            f"environment ({prefix}*)",
        )
    knobs = _knobs(ServiceConfig)
    _update(
        config,
        {
            k[len(ENV_PREFIX) :].lower(): v
            for k, v in env.items()
            if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX) :].lower() in knobs
        },
        "environment",
    )
    if args is not None:
        _update(
            config,
            {n: getattr(args, n) for n in knobs if getattr(args, n, None) is not None},
            "flag",
        )
        for table in TABLES:
            pairs = [p.partition("=") for p in getattr(args, table, [])]
            if any(not sep for _, sep, _ in pairs):
                raise ValueError(f"--{table} takes FIELD=VALUE")
            values = {k.strip(): v.strip() for k, _, v in pairs}
            _update(getattr(config, table), values, "--" + table)
    config.validate()
    return config
