"""Captures real vLLM KV events as test fixtures.

Drives vLLM's own `KVCacheManager` (prefix caching on, CPU only) through
scenarios, publishes each step's events with vLLM's own `ZmqEventPublisher`,
records the exact ZMQ frames it sends (live, and its answer to a replay
request from batch 0) and the prefix hit vLLM itself computes for a set of
probe prompts. One JSON file per scenario goes to
`tests/fixtures/vllm-<version>/`; tests/adapters/test_vllm_captures.py
replays them without vLLM.

    /work/vllm-venv/bin/python scripts/capture_engine_events.py [out_dir]

Offloaded-tier events cannot be produced without a GPU worker: the offload
scenario builds them with vLLM's own `OffloadingEventsTracker` (placeholder
mode) and its `BlockStored`/`BlockRemoved` classes with the values the
self-describing tracker sends (one announcement per chunk, shared hashes
repeated), and records what the tiers hold by construction.
"""

from __future__ import annotations

import base64
import json
import random
import socket
import sys
import time
from pathlib import Path

try:
    import torch
    import vllm
    import zmq
    from vllm.distributed.kv_events import (
        BlockRemoved,
        BlockStored,
        KVEventBatch,
        ZmqEventPublisher,
    )
    from vllm.lora.request import LoRARequest
    from vllm.multimodal.inputs import (
        MultiModalFeatureSpec,
        MultiModalKwargsItem,
        PlaceholderRange,
    )
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )
    from vllm.v1.request import Request
except ImportError as exc:
    sys.exit(f"capture_engine_events: vLLM is not importable here ({exc}); run it with vLLM's venv")

BS = 4
TOPIC = "kv"
TAIL = [9999]  # a partial block after every prompt: vLLM never counts the last token


def tokens(seed: int, blocks: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 + 1 for i in range(blocks * BS)]


def attention_spec(kind, **extra):
    """A one-head attention group's spec of `kind`, on blocks of BS tokens."""
    return kind(block_size=BS, num_kv_heads=1, head_size=1, dtype=torch.float32, **extra)


def manager(
    num_blocks: int,
    *,
    sliding_window_blocks: int = 0,
    chunk_blocks: int = 0,
    lookahead: int = 0,
    mamba: bool = False,
):
    groups = [KVCacheGroupSpec(["full"], attention_spec(FullAttentionSpec))]
    if chunk_blocks:
        chunked = attention_spec(ChunkedLocalAttentionSpec, attention_chunk_size=chunk_blocks * BS)
        groups.append(KVCacheGroupSpec(["chunked"], chunked))
    if mamba:
        # Prefix caching of mamba states needs vLLM's "align" mode: a state is
        # kept where a scheduled chunk ends on a block boundary.
        state = MambaSpec(
            block_size=BS, shapes=((2,),), dtypes=(torch.float32,), mamba_cache_mode="align"
        )
        groups.append(KVCacheGroupSpec(["mamba"], state))
    if sliding_window_blocks:
        window = attention_spec(SlidingWindowSpec, sliding_window=sliding_window_blocks * BS)
        groups.append(KVCacheGroupSpec(["window"], window))
    config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    kv = KVCacheManager(
        config,
        max_model_len=4096,
        scheduler_block_size=BS,
        hash_block_size=BS,
        enable_caching=True,
        enable_kv_cache_events=True,
        use_eagle=bool(lookahead),
        num_hash_lookahead_tokens=lookahead,
    )
    kv.lookahead = lookahead
    return kv


_ids = iter(range(1_000_000))


def request(kv, prompt, *, lora=None, salt=None, mm=None) -> Request:
    params = SamplingParams(max_tokens=4)
    params.update_from_generation_config({}, eos_token_id=100)
    features = None
    if mm is not None:
        offset, length, identifier = mm
        features = [
            MultiModalFeatureSpec(
                data=MultiModalKwargsItem.dummy(),
                mm_position=PlaceholderRange(offset=offset, length=length),
                identifier=identifier,
                modality="image",
            )
        ]
    return Request(
        str(next(_ids)),
        prompt,
        params,
        None,
        mm_features=features,
        lora_request=lora,
        cache_salt=salt,
        block_hasher=get_request_block_hasher(BS, sha256, kv.lookahead),
    )


def run_chunked(kv, prompt, chunk_tokens: int) -> None:
    """Prefills `prompt` in chunks of `chunk_tokens` (as a scheduler with
    chunked prefill does) and frees it."""
    req = request(kv, prompt)
    blocks, computed, _ = kv.get_computed_blocks(req)
    step = min(chunk_tokens, len(prompt) - computed)
    assert kv.allocate_slots(req, step, computed, blocks) is not None
    req.num_computed_tokens = computed + step
    while req.num_computed_tokens < len(prompt):
        step = min(chunk_tokens, len(prompt) - req.num_computed_tokens)
        assert kv.allocate_slots(req, step) is not None
        req.num_computed_tokens += step
    kv.free(req)


def run_request(kv, prompt, **keys) -> None:
    """Prefills `prompt` (reusing what vLLM finds cached) and frees it: its
    full blocks stay cached until evicted."""
    req = request(kv, prompt, **keys)
    blocks, computed, _ = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, len(prompt) - computed, computed, blocks) is not None
    kv.free(req)


def hit_blocks(kv, prompt, **keys) -> int:
    _, computed, _ = kv.get_computed_blocks(request(kv, prompt, **keys))
    return computed // BS


def b64(frames) -> list[str]:
    return [base64.b64encode(bytes(f)).decode() for f in frames]


class Capture:
    """vLLM's publishers for the given global DP ranks, on consecutive ports
    from a free base (rank r on base + r, as vLLM offsets them), with a SUB
    socket recording each one's frames."""

    def __init__(self, ranks: list[int]) -> None:
        self.ctx = zmq.Context()
        self.ranks = ranks
        self.pub_base, self.replay_base = _free_base(), _free_base()
        self.publishers = {
            rank: ZmqEventPublisher(
                rank,
                endpoint=f"tcp://*:{self.pub_base}",
                replay_endpoint=f"tcp://*:{self.replay_base}",
                topic=TOPIC,
            )
            for rank in ranks
        }
        self.subs = {}
        for rank in ranks:
            sub = self.ctx.socket(zmq.SUB)
            sub.subscribe(b"")
            sub.connect(f"tcp://127.0.0.1:{self.pub_base + rank}")
            self.subs[rank] = sub
        time.sleep(1.0)  # PUB drops what it sends before a subscriber has joined
        self.sent = dict.fromkeys(ranks, 0)

    def publish(self, rank: int, events: list) -> None:
        self.publishers[rank].publish(KVEventBatch(ts=time.time(), events=events))
        self.sent[rank] += 1

    def step(self, kv, rank: int = 0) -> None:
        self.publish(rank, kv.take_events())

    def finish(self) -> list[dict]:
        out = []
        for rank in self.ranks:
            sub = self.subs[rank]
            live = []
            while len(live) < self.sent[rank]:
                if not sub.poll(10_000):
                    sys.exit(
                        f"capture_engine_events: rank {rank} sent fewer batches than published"
                    )
                live.append(b64(sub.recv_multipart()))
            dealer = self.ctx.socket(zmq.DEALER)
            dealer.connect(f"tcp://127.0.0.1:{self.replay_base + rank}")
            dealer.send_multipart([b"", (0).to_bytes(8, "big")])
            replay = []
            while True:
                if not dealer.poll(10_000):
                    sys.exit(f"capture_engine_events: rank {rank}'s replay socket did not answer")
                frames = dealer.recv_multipart()
                replay.append(b64(frames))
                if int.from_bytes(frames[-2], "big", signed=True) == -1:
                    break
            dealer.close(linger=0)
            out.append({"dp_rank": rank, "pub": live, "replay_from_0": replay})
        for publisher in self.publishers.values():
            publisher.shutdown()
        for sub in self.subs.values():
            sub.close(linger=0)
        self.ctx.destroy(linger=0)
        return out


def _free_base() -> int:
    """A base port with the next few free too (vLLM binds base + rank)."""
    while True:
        base = random.randrange(20_000, 60_000, 8)
        try:
            for offset in range(4):
                with socket.socket() as sock:
                    sock.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue


def probe(name, kv, prompt, *, rank=0, namespace="", expect="equal", why="", **keys) -> dict:
    return {
        "name": name,
        "dp_rank": rank,
        "tokens": prompt,
        "namespace": namespace,
        "tier": "device",
        "vllm_hit_blocks": hit_blocks(kv, prompt, **keys),
        "expect": expect,
        "why": why,
    }


def prefix_caching() -> dict:
    kv, cap = manager(12), Capture([0])
    shared = tokens(1, 3)
    a, b = shared + tokens(2, 2) + TAIL, shared + tokens(3, 1) + TAIL
    run_request(kv, a)
    cap.step(kv)
    run_request(kv, b)
    cap.step(kv)
    # 8 fresh blocks need more than the 11 - 6 free ones: the oldest go.
    c = tokens(4, 8) + TAIL
    run_request(kv, c)
    cap.step(kv)
    probes = [
        probe("shared prefix, first branch", kv, a),
        probe("shared prefix, second branch", kv, b),
        probe("shared prefix only", kv, shared + TAIL),
        probe("the prompt that evicted them", kv, c),
    ]
    return {"engine": {}, "publishers": cap.finish(), "probes": probes}


def reset() -> dict:
    kv, cap = manager(12), Capture([0])
    before, after = tokens(5, 3) + TAIL, tokens(6, 2) + TAIL
    run_request(kv, before)
    cap.step(kv)
    assert kv.reset_prefix_cache()
    cap.step(kv)
    run_request(kv, after)
    cap.step(kv)
    probes = [probe("stored before the reset", kv, before), probe("stored after", kv, after)]
    return {"engine": {}, "publishers": cap.finish(), "probes": probes}


def extra_keys() -> dict:
    kv, cap = manager(40), Capture([0])
    lora = LoRARequest("sql", 1, "/adapters/sql")
    plain, salted, image = tokens(7, 3) + TAIL, tokens(8, 3) + TAIL, tokens(9, 3) + TAIL
    run_request(kv, plain)
    run_request(kv, plain, lora=lora)
    run_request(kv, salted, salt="tenant-a")
    run_request(kv, image, mm=(2, 4, "img-1"))
    cap.step(kv)
    probes = [
        probe("plain prompt", kv, plain),
        probe("the same prompt with the LoRA", kv, plain, namespace="sql", lora=lora),
        probe("salted prompt, asked without the salt", kv, salted),
        probe("image prompt's tokens, asked without the image", kv, image),
    ]
    return {"engine": {}, "publishers": cap.finish(), "probes": probes}


def cache_salt() -> dict:
    """A salted prompt, then the same salted prompt grown by two blocks (a
    later step: blocks whose parent is salted, with no salt of their own),
    then the first prompt unsalted."""
    kv, cap = manager(40), Capture([0])
    prompt, grown = tokens(10, 3), tokens(10, 3) + tokens(11, 2)
    run_request(kv, prompt + TAIL, salt="tenant-a")
    cap.step(kv)
    run_request(kv, grown + TAIL, salt="tenant-a")
    cap.step(kv)
    run_request(kv, prompt + TAIL)
    cap.step(kv)
    probes = [
        probe("grown prompt, its salt", kv, grown + TAIL, namespace="tenant-a", salt="tenant-a"),
        probe(
            "grown prompt, another salt", kv, grown + TAIL, namespace="tenant-b", salt="tenant-b"
        ),
        probe("grown prompt, no salt", kv, grown + TAIL),
    ]
    return {"engine": {}, "publishers": cap.finish(), "probes": probes}


def second_group_blocks(kv, cap: Capture, prompts: dict[str, list[int]]) -> dict[str, list]:
    """Prefills each prompt (reusing what vLLM finds cached), publishing each
    step, and frees it; the ids of the blocks it had in the second KV cache
    group, by name."""
    ids = {}
    for name, prompt in prompts.items():
        req = request(kv, prompt)
        blocks, computed, _ = kv.get_computed_blocks(req)
        kv.allocate_slots(req, len(prompt) - computed, computed, blocks)
        ids[name] = kv.get_block_ids(req.request_id)[1]
        kv.free(req)
        cap.step(kv)
    return ids


def hybrid() -> dict:
    kv, cap = manager(40, sliding_window_blocks=2), Capture([0])
    first, second, third = tokens(10, 5) + TAIL, tokens(11, 5) + TAIL, tokens(12, 5) + TAIL
    run_request(kv, first)
    cap.step(kv)
    window_ids = second_group_blocks(kv, cap, {"second": second, "third": third})
    # The window group loses the second prompt's last two blocks and the
    # third's first (as a connector's failed load evicts them); the
    # full-attention group keeps all five of each.
    kv.evict_blocks(set(window_ids["second"][3:5]) | set(window_ids["third"][:1]))
    cap.step(kv)
    probes = [
        probe("hybrid, first prompt", kv, first),
        probe("hybrid, second prompt, window tail evicted", kv, second),
        probe("hybrid, third prompt, window head evicted", kv, third),
    ]
    return {"engine": {}, "publishers": cap.finish(), "probes": probes}


def lookahead() -> dict:
    kv, cap = manager(20, lookahead=1), Capture([0])
    prompt = tokens(12, 4) + TAIL
    run_request(kv, prompt)
    cap.step(kv)
    why = "lookahead-hashed blocks never match a plain prompt (docs/deployment.md)"
    probes = [probe("lookahead-hashed prompt", kv, prompt, expect="at_most", why=why)]
    return {"engine": {}, "publishers": cap.finish(), "probes": probes}


def data_parallel(start_rank: int) -> dict:
    ranks = [start_rank, start_rank + 1]
    cap = Capture(ranks)
    probes = []
    for rank in ranks:
        kv = manager(12)
        prompt = tokens(20 + rank, 2 + rank) + TAIL
        run_request(kv, prompt)
        cap.step(kv, rank)
        # A second, quiet step: the stream then has a batch 1 to probe for.
        cap.step(kv, rank)
        probes.append(probe(f"rank {rank}'s prompt", kv, prompt, rank=rank))
    engine = {"data_parallel_size": 2}
    if start_rank:
        engine["data_parallel_start_rank"] = start_rank
    return {"engine": engine, "publishers": cap.finish(), "probes": probes}


def offload(self_describing: bool) -> dict:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.events import (
        OffloadingEventsTracker,
    )
    from vllm.v1.kv_offload.base import (
        Medium,
        OffloadingEvent,
        OffloadingKVEventsConfig,
        make_offload_key,
    )

    kv, cap = manager(20), Capture([0])
    on_gpu = tokens(13, 3) + TAIL
    req = request(kv, on_gpu)
    blocks, computed, _ = kv.get_computed_blocks(req)
    kv.allocate_slots(req, len(on_gpu) - computed, computed, blocks)
    gpu_events = kv.take_events()
    probes = [probe("on the GPU", kv, on_gpu)]
    if not self_describing:
        # What the connector sends for the same blocks once offloaded.
        tracker = OffloadingEventsTracker(OffloadingKVEventsConfig(True, False))
        keys = [make_offload_key(bytes(h), 0) for h in req.block_hashes]
        offloaded = tracker.take_events([OffloadingEvent(keys, Medium.CPU, removed=False)])
        cap.publish(0, gpu_events + list(offloaded))
    else:
        # A prompt computed elsewhere on the GPU and now held on the host
        # only: its GPU events are not part of this capture.
        on_host = tokens(14, 3) + TAIL
        source = manager(20)
        run_request(source, on_host)
        (full,) = [e for e in source.take_events() if isinstance(e, BlockStored)]
        ids = full.block_hashes
        # Chunks of two blocks over three: the second re-announces block 1,
        # as the tracker does for hashes a chunk shares with the one before.
        chunks = ((0, ids[0:2]), (1, ids[1:3]))
        stored = [
            BlockStored(
                block_hashes=list(chunk),
                parent_block_hash=None if start == 0 else ids[start - 1],
                token_ids=full.token_ids[start * BS : (start + len(chunk)) * BS],
                block_size=BS,
                lora_id=None,
                medium="CPU",
                lora_name=None,
                group_idx=0,
                kv_cache_spec_kind="full_attention",
            )
            for start, chunk in chunks
        ]
        cap.publish(0, gpu_events + stored)
        # The second chunk leaves the host; block 1 stays in the first.
        cap.publish(0, [BlockRemoved(block_hashes=list(ids[1:3]), medium="CPU", group_idx=0)])
        probes.append(
            {
                "name": "held on the host after one of two announcements was removed",
                "dp_rank": 0,
                "tokens": on_host,
                "namespace": "",
                "tier": "host",
                "expected_blocks": 2,
                "expect": "equal",
                "why": "by construction: blocks 0-1 stay in the first chunk",
            }
        )
    kv.free(req)
    return {"engine": {}, "publishers": cap.finish(), "probes": probes}


def hybrid_chunked() -> dict:
    """A full-attention group beside a chunked local attention group of
    2-block chunks; the chunk size comes from the engine's config."""
    kv, cap = manager(40, chunk_blocks=2), Capture([0])
    first, second, third = tokens(30, 5) + TAIL, tokens(31, 5) + TAIL, tokens(32, 5) + TAIL
    chunked_ids = second_group_blocks(kv, cap, {"first": first, "second": second, "third": third})
    # The chunked group loses the second prompt's last block (in a chunk of
    # its own) and the third's first (in an earlier chunk).
    kv.evict_blocks({chunked_ids["second"][4], chunked_ids["third"][0]})
    cap.step(kv)
    probes = [
        probe("chunked, first prompt", kv, first),
        probe("chunked, second prompt, last chunk's block evicted", kv, second),
        probe("chunked, third prompt, an earlier chunk's block evicted", kv, third),
    ]
    engine = {"attention_chunk_size": 2 * BS}
    return {"engine": engine, "publishers": cap.finish(), "probes": probes}


def hybrid_mamba() -> dict:
    """A full-attention group beside a mamba group: vLLM reuses a prefix
    only up to a block whose mamba state it kept, which in "align" mode is
    where a chunk of the prefill ended on a block boundary."""
    kv, cap = manager(40, mamba=True), Capture([0])
    shared = tokens(20, 3)
    prompt = shared + tokens(21, 2) + TAIL
    run_chunked(kv, prompt, 3 * BS)
    cap.step(kv)
    whole = tokens(22, 4) + TAIL
    run_request(kv, whole)
    cap.step(kv)
    probes = [
        probe("mamba, the chunked prompt", kv, prompt),
        probe("mamba, its first three blocks and another end", kv, shared + tokens(23, 2) + TAIL),
        probe("mamba, its first two blocks", kv, shared[: 2 * BS] + TAIL),
        probe("mamba, a prompt prefilled whole", kv, whole),
    ]
    return {"engine": {}, "publishers": cap.finish(), "probes": probes}


SCENARIOS = {
    "prefix_caching": prefix_caching,
    "reset": reset,
    "extra_keys": extra_keys,
    "cache_salt": cache_salt,
    "hybrid_sliding_window": hybrid,
    "hybrid_mamba": hybrid_mamba,
    "hybrid_chunked_local": hybrid_chunked,
    "spec_decode_lookahead": lookahead,
    "dp_ranks_0_1": lambda: data_parallel(0),
    "dp_start_rank_1": lambda: data_parallel(1),
    "offload_placeholder": lambda: offload(False),
    "offload_self_describing": lambda: offload(True),
}


def main() -> None:
    init_none_hash(sha256)
    root = Path(__file__).resolve().parent.parent
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "tests" / "fixtures"
    out = out / f"vllm-{vllm.__version__}"
    out.mkdir(parents=True, exist_ok=True)
    for name, scenario in SCENARIOS.items():
        if len(sys.argv) > 2 and name not in sys.argv[2:]:
            continue
        captured = {
            "vllm_version": vllm.__version__,
            "scenario": name,
            "block_size": BS,
            "topic": TOPIC,
            **scenario(),
        }
        (out / f"{name}.json").write_text(json.dumps(captured, indent=1) + "\n")
        print(f"wrote {out / name}.json")


if __name__ == "__main__":
    main()
