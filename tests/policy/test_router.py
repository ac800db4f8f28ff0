"""The routing policy through its Python face: contract, load book, cache
affinity, hot-prefix fairness, disaggregation and calibration."""

import json
from collections import Counter

import pytest

from kvrouter._core import PrefixIndex, Stored, hash_tokens
from kvrouter.policy import Decision, NoWorkerAvailable, PolicyConfig, Router

BS = 16


def router(n=4, role="both", **config) -> Router:
    r = Router(PrefixIndex(BS), PolicyConfig(**config))
    for w in range(n):
        r.upsert_worker(w, role, 10_000)
    return r


def prompt(prefix: int, length: int, tag: int = 0) -> list[int]:
    """`length` tokens: a prefix shared by all prompts with the same `prefix`
    id, then tokens unique to `tag`."""
    shared = [prefix * 100_000 + i for i in range(length // 2)]
    return shared + [tag * 1_000 + i + 50_000_000 for i in range(length - len(shared))]


def cache_on(r: Router, worker: int, tokens: list[int]) -> None:
    blocks = hash_tokens(tokens, BS)
    r.index.apply(worker, 0, [Stored(blocks, tokens[: len(blocks) * BS])])


def test_contract_and_explanation():
    r = router(2)
    d = r.route("a", list(range(100)))
    assert isinstance(d, Decision)
    assert d.request_id == "a" and d.prefill_worker is None and not d.disaggregated
    assert d.decode_worker in (0, 1)
    out = json.loads(json.dumps(d.to_dict()))
    cands = out["explanation"]["decode_candidates"]
    assert {c["worker_id"] for c in cands} == {0, 1}
    parts = {"queue_ms", "prefill_ms", "reload_ms", "decode_ms", "transfer_ms", "overflow_ms"}
    priced = {"congestion_ms", "stall_ms", "slowdown_ms", "pollution_ms", "tail_ms"}
    fields = {"overlap_device", "overlap_host", "overlap_disk", "cost_ms"} | parts | priced
    assert all(fields <= set(c) for c in cands)
    # The cost is its parts' sum: the explanation leaves no term out.
    for c in cands:
        assert c["cost_ms"] == pytest.approx(sum(c[k] for k in parts | priced))
    assert out["explanation"]["reason"]


def test_no_worker_available_and_bad_input():
    r = Router(PrefixIndex(BS))
    with pytest.raises(NoWorkerAvailable):
        r.route("a", list(range(64)))
    r.upsert_worker(1, "decode", 2)
    with pytest.raises(NoWorkerAvailable):
        r.route("a", list(range(64)))  # 4 blocks do not fit in 2
    with pytest.raises(ValueError):
        r.upsert_worker(2, "leader", 10)
    with pytest.raises(KeyError):
        r.set_healthy(99, False)
    r.set_healthy(1, False)
    with pytest.raises(NoWorkerAvailable):
        r.route("b", list(range(16)))


def test_spreads_when_no_load_is_reported():
    r = router(4)
    counts = Counter(r.route(f"r{i}", prompt(0, 320, i)).decode_worker for i in range(40))
    assert sorted(counts.values()) == [10, 10, 10, 10]


def test_load_book_charges_and_frees():
    r = router(1)
    r.route("a", list(range(320)))
    queued, blocks, active = r.load(0)
    assert (queued, blocks, active) == (320, 20, 1)
    r.prefill_done("a")
    assert r.load(0) == (0, 20, 1)
    r.finished("a")
    assert r.load(0) == (0, 0, 0) and len(r) == 0
    r.route("b", list(range(32)))
    r.cancelled("b")
    assert r.load(0) == (0, 0, 0)
    with pytest.raises(ValueError):
        r.route("c", [1] * 32) and r.route("c", [1] * 32)


def test_follows_the_cache():
    r = router(4)
    tokens = prompt(7, 640)
    cache_on(r, 2, tokens)
    d = r.route("a", tokens)
    assert d.decode_worker == 2
    chosen = next(c for c in d.explanation.decode_candidates if c.worker_id == 2)
    assert chosen.overlap_device == 40


def test_hot_prefix_gets_replicated_not_piled_on():
    # A burst of requests sharing a long cached prefix: its owner must not take
    # more than twice a fair share while the others sit idle.
    r = router(4, approximate_ttl_s=60.0)
    cache_on(r, 0, prompt(3, 2048))
    counts = Counter(r.route(f"h{i}", prompt(3, 2048, i)).decode_worker for i in range(200))
    assert max(counts.values()) <= 2 * 200 / 4, counts
    assert len(counts) == 4, counts


def test_disaggregates_only_long_uncached_prefills():
    r = Router(PrefixIndex(BS))
    r.upsert_worker(0, "prefill", 10_000)
    r.upsert_worker(1, "decode", 10_000)
    long = r.route("long", prompt(1, 20_000))
    assert long.disaggregated and (long.prefill_worker, long.decode_worker) == (0, 1)
    assert long.explanation.prefill_candidates[0].worker_id == 0
    tokens = prompt(2, 20_000)
    cache_on(r, 1, tokens)
    local = r.route("cached", tokens)
    assert not local.disaggregated and local.prefill_worker is None


def test_calibration_moves_coefficients():
    r = router(1)
    before = r.coefficients()["prefill_ms_per_token"]
    for n in range(1, 40):
        r.report_prefill_timing(n * 300, (n * 7) % 11 * 500, 5 + 0.05 * n * 300)
    after = r.coefficients()["prefill_ms_per_token"]
    assert abs(after - 0.05) < abs(before - 0.05)


def test_temperature_sampling_is_seeded():
    def picks(seed):
        r = router(4, temperature=1.0, seed=seed)
        return [r.route(f"r{i}", prompt(0, 320, i)).decode_worker for i in range(30)]

    assert picks(5) == picks(5)
    assert len(set(picks(5))) > 1


def test_a_backlogged_worker_gets_the_prompt_predicted_an_idle_one_does_not():
    # The prediction bridges the wait for the worker's KV events, which come
    # late only when it is backlogged.
    r = router(2, approximate_ttl_s=30.0)
    tokens = prompt(4, 320)
    r.route("idle", tokens)
    assert r.index.stats()["approximate"] == 0
    r.finished("idle")
    for w in range(2):
        r.report_load(w, queued_prefill_tokens=5_000, active_decode_blocks=0, active_requests=1)
    second = r.route("busy", tokens)
    assert r.index.find_matches(hash_tokens(tokens, BS)).scores == {second.decode_worker: 20}


def test_dynamo_baseline_counts_a_prompt_shared_by_active_requests_once():
    """As Dynamo's KV router: a hot prompt held by worker 1 and shared by
    its active requests is one set of blocks there, so requests keep
    following its cache instead of being pushed away by their own count."""
    r = router(2, policy="dynamo")
    hot = list(range(64 * BS))
    cache_on(r, 1, hot)
    for i in range(6):
        tail = [1_000_000 + 32 * i + t for t in range(2 * BS)]
        assert r.route(f"t{i}", hot + tail).decode_worker == 1, i
        r.prefill_done(f"t{i}")
    assert r.route("cold", [5_000_000 + t for t in range(4 * BS)]).decode_worker == 0


def test_the_index_is_sized_for_the_registered_workers_capacity():
    """Registering workers sizes the index's tables for all the blocks they can
    hold, one home per block, so that applying their events does not double a
    table in one stalling step while at most 7/8 of those blocks are distinct:
    the sequence table at once, the engine-id table with the first id of an
    engine's own, as vLLM's are. Workers leaving let the tables shrink again.
    A bounded index reserves no more than its bound, whatever a worker
    declares."""
    index = PrefixIndex(BS)
    r = Router(index)
    for worker in range(4):
        r.upsert_worker(worker, "both", 16_384)
    index.wait_sized()
    table = (65_536 + 64) * 8
    assert index.stats()["table_bytes"] == table
    for worker in range(4):
        for batch in range(2):
            ids = [(worker * 2 + batch) * 7_000 + i + 1 for i in range(7_000)]
            index.apply(worker, batch, [Stored(ids, local_hashes=ids)])
            index.wait_sized()
            assert index.stats()["table_bytes"] == 2 * table
    assert index.stats()["blocks"] == 56_000

    for worker in (1, 2, 3):
        r.remove_worker(worker)
        index.remove_worker(worker)
    index.wait_sized()
    assert index.stats()["blocks"] == 14_000
    assert index.stats()["table_bytes"] == 2 * (16_384 + 64) * 8
    index.remove_worker(0)
    # The name table goes with the last node; the sequence table keeps its room.
    assert index.stats()["table_bytes"] == (16_384 + 64) * 8

    bounded = PrefixIndex(BS, 1_000)
    Router(bounded).upsert_worker(0, "both", 2**62)
    bounded.wait_sized()
    assert bounded.stats()["table_bytes"] < 64 * 1024

    grown = PrefixIndex(BS)
    Router(grown, size_index=False).upsert_worker(0, "both", 16_384)
    grown.wait_sized()
    assert grown.stats()["table_bytes"] == 0
