"""The worker engine's Python API: requests in, tokens and KV events out.

One `step()` schedules a batch, runs the model once and samples. Under
tensor parallelism every rank runs its own engine on the same requests (the
caller feeds them the same calls); only rank 0 publishes KV events, and
rank 0's sampled tokens are broadcast so the ranks never diverge.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from kvrouter.engine.block_manager import BlockManager
from kvrouter.engine.config import EngineConfig, ModelConfig
from kvrouter.engine.handoff import KvBlocks, KvLayout
from kvrouter.engine.model_runner import ModelRunner
from kvrouter.engine.parallel import TensorParallelGroup, init_tensor_parallel
from kvrouter.engine.sampler import TokenLogprobs, sample, token_logprobs
from kvrouter.engine.sampling_params import SamplingParams
from kvrouter.engine.scheduler import ScheduledSequence, Scheduler
from kvrouter.engine.sequence import RequestTimings, Sequence
from kvrouter.events import EventSink, NullEventSink


@dataclass
class RequestOutput:
    """A request's progress after one step."""

    request_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None
    timings: RequestTimings
    # One per new token when the request asked for log probabilities.
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)


@dataclass
class Completion:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    finish_reason: str | None
    num_cached_tokens: int
    timings: RequestTimings
    logprobs: list[TokenLogprobs] = field(default_factory=list)


@dataclass
class EngineLoad:
    """What the router weighs: queued prefill work and decode pressure."""

    num_waiting: int
    num_running: int
    waiting_prefill_tokens: int
    running_prefill_tokens: int
    decode_blocks: int
    free_blocks: int
    total_blocks: int


def default_hash_tokens(block_size: int, namespace: str) -> Callable[[list[int]], list[int]]:
    from kvrouter._core import hash_tokens

    return partial(hash_tokens, block_size=block_size, namespace=namespace)


class LLMEngine:
    def __init__(
        self,
        config: EngineConfig,
        event_sink: EventSink | None = None,
        hash_tokens: Callable[[list[int]], list[int]] | None = None,
        tp: TensorParallelGroup | None = None,
    ) -> None:
        self.config = config
        self.tp = tp or init_tensor_parallel(
            config.tp_rank, config.tp_size, torch.device(config.device)
        )
        self.model_config = ModelConfig.from_file(Path(config.model) / "config.json")
        self.max_model_len = config.max_model_len or self.model_config.max_position_embeddings
        self.runner = ModelRunner(config, self.model_config, self.tp, self.max_model_len)
        self.block_manager = BlockManager(
            config.num_kv_blocks,
            config.block_size,
            hash_tokens or default_hash_tokens(config.block_size, config.namespace),
            event_sink if self.tp.rank == 0 else NullEventSink(),
            config.enable_prefix_caching,
        )
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.enable_chunked_prefill,
            self.model_config.eos_token_ids,
        )
        self.requests: dict[str, Sequence] = {}
        self._ids = itertools.count()

    # Requests.

    def add_request(
        self,
        prompt_token_ids: Iterable[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> str:
        params = params or SamplingParams()
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        tokens = [int(token) for token in prompt_token_ids]
        vocab = self.model_config.vocab_size
        if any(not 0 <= token < vocab for token in tokens):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        total = len(tokens) + params.max_tokens
        if total > self.max_model_len:
            raise ValueError(
                f"prompt ({len(tokens)} tokens) + max_tokens ({params.max_tokens}) exceeds "
                f"max_model_len {self.max_model_len}"
            )
        if self.block_manager.blocks_for(total) > self.block_manager.num_blocks:
            raise ValueError(
                f"{total} tokens need more KV blocks than the cache holds "
                f"({self.block_manager.num_blocks} of {self.config.block_size} tokens)"
            )
        seq = Sequence(request_id, tokens, params)
        hits = self.block_manager.prefix_hits(seq)
        seq.num_cached_on_arrival = len(hits) * self.config.block_size
        self.requests[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def abort_request(self, request_id: str) -> None:
        seq = self.requests.pop(request_id, None)
        if seq is None:
            raise KeyError(f"unknown request {request_id!r}")
        if not seq.is_finished:
            self.scheduler.abort(seq)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        before = {id(item.seq): item.seq.num_tokens for item in batch}
        prepared = self.runner.prepare(batch)
        logits = self.runner.run(prepared)
        sampling = [item.seq for item in prepared.sampling]
        tokens = self._agree(sample(logits, sampling))
        for seq, found in zip(sampling, token_logprobs(logits, sampling, tokens), strict=True):
            if found is not None:
                seq.output_logprobs.append(found)
        self.scheduler.postprocess(prepared.ordered, tokens)
        outputs = []
        for item in batch:
            seq = item.seq
            new_tokens = seq.token_ids[before[id(seq)] :]
            if new_tokens or seq.is_finished:
                new_logprobs = seq.output_logprobs[before[id(seq)] - seq.num_prompt_tokens :]
                outputs.append(
                    RequestOutput(
                        seq.request_id,
                        new_tokens,
                        seq.is_finished,
                        seq.finish_reason,
                        seq.timings,
                        new_logprobs,
                    )
                )
            if seq.is_finished:
                self.requests.pop(seq.request_id, None)
        return outputs

    def generate(
        self,
        prompts: list[list[int]],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[Completion]:
        """Runs the prompts to completion, alongside any requests already queued."""
        per_prompt = params if isinstance(params, list) else [params] * len(prompts)
        seqs = []
        for prompt, prompt_params in zip(prompts, per_prompt, strict=True):
            request_id = self.add_request(prompt, prompt_params)
            seqs.append(self.requests[request_id])
        while any(not seq.is_finished for seq in seqs):
            self.step()
        return [
            Completion(
                seq.request_id,
                seq.token_ids[: seq.num_prompt_tokens],
                seq.output_token_ids,
                seq.finish_reason,
                seq.num_cached_tokens,
                seq.timings,
                seq.output_logprobs,
            )
            for seq in seqs
        ]

    def prompt_logits(self, token_ids: list[int]) -> torch.Tensor:
        """Next-token logits [len, vocab] (fp32) after every prefix of `token_ids`,
        computed in one prefill outside the scheduler and the prefix cache."""
        seq = Sequence("prompt-logits", list(token_ids), SamplingParams())
        if self.block_manager.blocks_for(seq.num_tokens) > self.block_manager.num_free_blocks:
            raise RuntimeError("not enough free KV blocks for prompt_logits")
        self.block_manager.grow(seq, seq.num_tokens)
        try:
            prepared = self.runner.prepare([ScheduledSequence(seq, seq.num_tokens)])
            return self.runner.run(prepared, all_logits=True)
        finally:
            self.block_manager.free(seq)

    def load(self) -> EngineLoad:
        waiting = self.scheduler.waiting
        running = self.scheduler.running
        return EngineLoad(
            num_waiting=len(waiting),
            num_running=len(running),
            waiting_prefill_tokens=sum(
                seq.num_tokens - max(seq.num_computed_tokens, seq.num_cached_on_arrival)
                for seq in waiting
            ),
            running_prefill_tokens=sum(
                seq.num_tokens - seq.num_computed_tokens - 1 for seq in running
            ),
            decode_blocks=sum(len(seq.block_table) for seq in running),
            free_blocks=self.block_manager.num_free_blocks,
            total_blocks=self.block_manager.num_blocks,
        )

    # Prefix cache and KV hand-off.

    def block_ids(self, token_ids: list[int]) -> list[int]:
        """The router block hashes (engine block ids) of the full blocks of `token_ids`."""
        return self.block_manager.hash_tokens(list(token_ids))

    def cached_block_ids(self, token_ids: list[int]) -> list[int]:
        """Block ids of the longest prefix of `token_ids` held in this cache."""
        ids = self.block_ids(token_ids)
        return ids[: len(self.block_manager.lookup(ids))]

    def pin_blocks(self, block_ids: list[int]) -> list[int]:
        """Keeps the cached prefix of `block_ids` from eviction (e.g. while a
        decode worker fetches it); returns the ids pinned. Release with `unpin_blocks`."""
        return self.block_manager.pin(block_ids)

    def unpin_blocks(self, block_ids: list[int]) -> None:
        self.block_manager.unpin(block_ids)

    @property
    def kv_layout(self) -> KvLayout:
        _, num_layers, block_size, heads, head_dim = self.runner.block_shape
        dtype = str(self.runner.dtype).removeprefix("torch.")
        return KvLayout(num_layers, block_size, heads, head_dim, dtype)

    def export_blocks(self, block_ids: list[int]) -> KvBlocks:
        """The KV of cached blocks, by block id, in one contiguous buffer."""
        physical = self.block_manager.lookup(block_ids)
        if len(physical) < len(block_ids):
            missing = block_ids[len(physical)]
            raise KeyError(f"block {missing} is not in the cache")
        return KvBlocks(list(block_ids), self.runner.read_blocks(physical))

    def import_blocks(self, token_ids: list[int], blocks: KvBlocks) -> int:
        """Caches received blocks of the sequence `token_ids`; they then serve
        prefix hits and are announced with stored events like computed blocks.
        Returns how many blocks were new here."""
        if blocks.layout != self.kv_layout:
            raise ValueError(
                f"KV layout {blocks.layout} does not match this engine's {self.kv_layout}"
            )
        own_ids = self.block_ids(token_ids)
        if not blocks.block_ids:
            return 0
        try:
            first = own_ids.index(blocks.block_ids[0])
        except ValueError:
            first = -1
        if first < 0 or own_ids[first : first + len(blocks.block_ids)] != blocks.block_ids:
            raise ValueError(
                "block ids do not match this engine's hashes of the tokens "
                "(another namespace or block size?)"
            )
        size = self.config.block_size
        tokens = [
            token_ids[(first + i) * size : (first + i + 1) * size]
            for i in range(len(blocks.block_ids))
        ]
        parent = own_ids[first - 1] if first > 0 else None
        reservation = self.block_manager.register_imported(blocks.block_ids, tokens, parent)
        try:
            if reservation.placed:
                indices = [index for index, _ in reservation.placed]
                self.runner.write_blocks(
                    [block_id for _, block_id in reservation.placed], blocks.data[:, :, indices]
                )
        finally:
            self.block_manager.release_import(reservation)
        return len(reservation.placed)

    def reset_prefix_cache(self) -> bool:
        return self.block_manager.reset_prefix_cache()

    def _agree(self, tokens: list[int]) -> list[int]:
        """Rank 0's tokens on every rank (sampling may differ across ranks)."""
        if self.tp.size == 1 or not tokens:
            return tokens
        shared = torch.tensor(tokens, dtype=torch.int64, device=self.runner.device)
        dist.broadcast(shared, src=0)
        return shared.tolist()
