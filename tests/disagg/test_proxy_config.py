"""The proxy's settings from the environment, and the round-robin baseline's
choices."""

from __future__ import annotations

import pytest

from kvrouter._core import PrefixIndex
from kvrouter.policy import NoWorkerAvailable, Router
from kvrouter.service.config import load
from kvrouter.service.proxy_config import ProxyConfig
from kvrouter.service.round_robin import RoundRobinRouter
from kvrouter.service.workers import WorkerRecord, WorkerTable


def test_settings_come_from_the_environment():
    config = load(
        env={"KVROUTER_PROXY_PREFILL_TIMEOUT_S": "2.5", "KVROUTER_PROXY_POLICY": "round_robin"}
    ).proxy
    assert config.prefill_timeout_s == 2.5 and config.policy == "round_robin"
    assert load(env={}).proxy == ProxyConfig()


@pytest.mark.parametrize(
    "env",
    [
        {"KVROUTER_PROXY_POLICY": "random"},
        {"KVROUTER_PROXY_TOKEN_TIMEOUT_S": "0"},
        {"KVROUTER_PROXY_MAX_DECODE_ATTEMPTS": "two"},
    ],
)
def test_bad_settings_are_refused(env):
    with pytest.raises(ValueError, match="KVROUTER_PROXY|ProxyConfig|policy"):
        load(env=env)


def test_round_robin_takes_workers_in_turn():
    index = PrefixIndex(16)
    table = WorkerTable(Router(index), index, heartbeat_ttl_s=5.0)
    baseline = RoundRobinRouter(table, 16)
    with pytest.raises(NoWorkerAvailable):
        baseline.route("none", [1, 2, 3])
    for worker_id, role in [(1, "prefill"), (2, "prefill"), (3, "decode"), (4, "decode")]:
        table.register(WorkerRecord(worker_id, role, f"w{worker_id}:1", 16, 100))
    decisions = [baseline.route(f"r{i}", list(range(40))) for i in range(4)]
    assert [(d.prefill_worker, d.decode_worker) for d in decisions] == [
        (1, 3),
        (2, 4),
        (1, 3),
        (2, 4),
    ]
    assert all(d.disaggregated and d.num_blocks == 2 for d in decisions)
    # Retries go to the next worker in turn.
    assert [c.worker_id for c in decisions[0].explanation.decode_candidates] == [3, 4]
