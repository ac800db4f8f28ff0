"""A router whose host vanishes without closing its connections: keepalive
pings go unanswered, so the worker's registration and event publisher drop
the dead connections and move to the router that now answers at the same
address, and the index there comes back to what the worker holds."""

from __future__ import annotations

from waiting import wait_until

from .vanishing_relay import VanishingRelay

BLOCKS = 20


def test_a_worker_moves_off_a_router_that_vanished(start_router, spawn_worker):
    vanishing, successor = start_router(), start_router()
    relay = VanishingRelay(vanishing.target)
    try:
        spawn_worker(relay.target, 1, seed=1, blocks=BLOCKS)
        assert vanishing.index_blocks() == {1: BLOCKS}
        relay.vanish(successor.target)

        def moved() -> bool:
            infos = successor.client.list_workers()
            return [(w.worker_id, w.routable, w.index_blocks) for w in infos] == [(1, True, BLOCKS)]

        # Keepalive: a ping unanswered for 5 s, 10 s after the last one.
        wait_until(moved, timeout=90, what="the worker to move to the successor")
    finally:
        relay.close()
