"""`kvrouter demo`: a router with prefill and decode workers on 127.0.0.1,
a multi-turn chat and agent workload, and the same workload under round
robin for comparison. `LocalCluster` starts such a deployment for tests and
benchmarks too.

Layer: may import the client library, `kvrouter.engine` and `kvrouter._core`;
it starts the router and the workers as `kvrouter` processes, not by import
(docs/architecture.md)."""

from kvrouter.demo.cluster import LocalCluster

__all__ = ["LocalCluster"]
