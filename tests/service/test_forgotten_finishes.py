"""A decision-only caller that never reports `finished` does not degrade
routing for long: the worker's own load reports are the truth, and a
booking they no longer count is retired after `unreported_grace_s`, not
`stale_after_s`, and counted in `kvrouter_bookings_retired_total`."""

from __future__ import annotations

import urllib.request

from waiting import wait_until

from kvrouter.client import WorkerLoad
from kvrouter.policy import PolicyConfig

from .helpers import prompt


def retired(router) -> float:
    url = f"http://127.0.0.1:{router.server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("kvrouter_bookings_retired_total "):
                return float(line.split()[1])
    return 0.0


def test_bookings_the_worker_does_not_hold_are_retired(start_router):
    router = start_router(
        heartbeat_interval_s=0.1,
        heartbeat_ttl_s=5.0,
        policy=PolicyConfig(unreported_grace_s=0.5, stale_after_s=600.0),
    )
    # An idle worker: whatever the router booked, it holds nothing.
    router.worker(1, load=lambda: WorkerLoad())
    client = router.client()
    for i in range(20):
        client.route(prompt(seed=i, blocks=8))  # and never `finished`
    assert len(router.server.policy) == 20
    wait_until(lambda: len(router.server.policy) == 0, what="the forgotten bookings to retire")
    assert router.server.policy.load(1) == (0, 0, 0)
    assert retired(router) == 20
    decision = client.route(prompt(seed=99, blocks=8), explain=True)
    assert decision.predicted_ttft_ms < 1000


def test_bookings_the_worker_still_holds_stay(start_router):
    router = start_router(
        heartbeat_interval_s=0.1,
        policy=PolicyConfig(unreported_grace_s=0.5, stale_after_s=600.0),
    )
    reports: list[int] = []

    def holding_three() -> WorkerLoad:
        reports.append(1)
        return WorkerLoad(active_requests=3)

    router.worker(1, load=holding_three)
    client = router.client()
    for i in range(3):
        client.route(prompt(seed=i, blocks=8))
    routed_at = len(reports)
    # Ten reports at 0.1 s apart: the grace is long past for every booking.
    wait_until(lambda: len(reports) >= routed_at + 10, what="ten more load reports")
    assert len(router.server.policy) == 3
    assert retired(router) == 0
