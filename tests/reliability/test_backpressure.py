"""A router that is away or slower than the engine: the publisher's memory
stays bounded, and the dump that follows makes the index true again."""

from __future__ import annotations

from waiting import wait_until

from kvrouter.client import KvEventPublisher, WorkerRegistration
from kvrouter.demo.cluster import free_port

from .worker_process import BLOCK


def test_pending_events_are_bounded_and_a_dump_repairs_the_index(start_router):
    target = f"127.0.0.1:{free_port()}"
    cache: dict[int, list[int]] = {}  # the engine's cache: block id -> tokens

    def dump_cache(sink) -> None:
        for block_id, tokens in sorted(cache.items()):
            sink.stored(None, [block_id], tokens)

    publisher = KvEventPublisher(
        target, 1, dump_cache=dump_cache, max_pending_events=100, backoff_max_s=0.2
    ).start()
    try:
        # No router yet: an engine storing and evicting keeps only its last 8 blocks.
        for i in range(5_000):
            cache[i] = [i * BLOCK + t for t in range(BLOCK)]
            publisher.stored(None, [i], cache[i])
            if len(cache) > 8:
                evicted = min(cache)
                del cache[evicted]
                publisher.removed([evicted])
            assert publisher.pending_events <= 100
        assert publisher.overflows > 0

        router = start_router(listen=target)
        registration = WorkerRegistration(target, role="both", capacity_blocks=100, worker_id=1)
        registration.start_background()
        try:
            assert publisher.flush(timeout=20)
            wait_until(lambda: router.index_blocks() == {1: 8}, what="the dump to arrive")
            for tokens in cache.values():
                assert router.client.route(tokens).decode_worker == 1
                matches = router.on_loop(router.server.index.find_matches_for_tokens, tokens)
                assert matches.scores == {1: len(tokens) // BLOCK}
        finally:
            registration.stop_background(deregister=False)
    finally:
        publisher.close(timeout=2)
