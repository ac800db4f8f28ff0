"""Settings of the router's proxied Generate: stage timeouts, retry limits
and the routing policy it follows. `ServiceConfig.proxy` holds them; they
are set in the config file's `[proxy]` table, by `--proxy FIELD=VALUE` or
by `KVROUTER_PROXY_<FIELD>` (e.g. `KVROUTER_PROXY_PREFILL_TIMEOUT_S=10`);
see kvrouter/service/config.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Deprecated, for one release: the policy is `[policy] policy`, for every
# routing call. An old setting here still chooses it, under its new name.
LEGACY_POLICIES = {"": "", "kv": "kvrouter", "round_robin": "round_robin"}


@dataclass
class ProxyConfig:
    # Deprecated alias of `[policy] policy` ("kv" is "kvrouter"); "" defers to it.
    policy: str = ""
    # The deadline of a request whose client set none.
    default_timeout_s: float = 300.0
    # Longest a prefill (or the first token of an aggregated request) may take.
    prefill_timeout_s: float = 60.0
    # From the Decode call to the decode worker's hand-off acknowledgement.
    handoff_timeout_s: float = 30.0
    # Longest gap between two token chunks before the worker is taken as failed.
    token_timeout_s: float = 30.0
    # Prefill workers tried before falling back to prefilling on the decode worker.
    max_prefill_attempts: int = 2
    # Decode workers tried (hand-off retries and continuations together).
    max_decode_attempts: int = 3
    # A worker that failed a call is tried last for this long.
    failure_cooldown_s: float = 5.0
    # A worker that failed the same request (same namespace, sampling and
    # prompt) this many times is not sent it again (service/breaker.py) ...
    breaker_trip_after: int = 2
    # ... remembered for this many requests, the most recently failed.
    breaker_max_requests: int = 10_000
    release_timeout_s: float = 2.0

    def validate(self) -> None:
        if self.policy not in LEGACY_POLICIES:
            raise ValueError("proxy policy must be kv or round_robin; set [policy] policy instead")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "policy" and value <= 0:
                raise ValueError(f"ProxyConfig.{f.name} must be > 0, got {value}")
