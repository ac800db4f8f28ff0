"""A worker process killed while it owns blocks, and one restarted with an
empty cache."""

from __future__ import annotations

import signal

from waiting import wait_until

from .worker_process import prompt


def test_a_killed_worker_leaves_routing_and_the_index(start_router, spawn_worker):
    router = start_router(heartbeat_interval_s=0.1, heartbeat_ttl_s=0.6)
    victim = spawn_worker(router.target, 1, seed=1, blocks=8)
    spawn_worker(router.target, 2, seed=2, blocks=4)
    assert router.index_blocks() == {1: 8, 2: 4}
    assert router.client.route(prompt(1, 8)).decode_worker == 1  # it holds the prefix

    victim.send_signal(signal.SIGKILL)
    victim.wait(10)
    wait_until(lambda: 1 not in router.index_blocks(), what="worker 1's blocks to leave")
    assert [w.worker_id for w in router.client.list_workers()] == [2]
    assert router.index_blocks() == {2: 4}
    for seed in (1, 2, 3):
        assert router.client.route(prompt(seed, 8)).decode_worker == 2


def test_a_worker_restarted_with_an_empty_cache_is_resynced(start_router, spawn_worker):
    # A TTL long enough that the restart lands before the router notices the
    # absence: only the event stream tells it the cache is gone.
    router = start_router(heartbeat_interval_s=0.5, heartbeat_ttl_s=30)
    first = spawn_worker(router.target, 1, seed=1, blocks=8)
    assert router.index_blocks() == {1: 8}
    first.kill()
    first.wait(10)

    spawn_worker(router.target, 1, seed=5, blocks=3)
    wait_until(lambda: router.index_blocks() == {1: 3}, what="the index to match the new cache")
    overlap = router.client.route(prompt(1, 8), explain=True).explanation.decode_candidates[0]
    assert overlap.overlap_device == 0  # the old blocks are gone
    fresh = router.client.route(prompt(5, 3), explain=True).explanation.decode_candidates[0]
    assert fresh.overlap_device == 3
    assert all(w.routable for w in router.client.list_workers())
