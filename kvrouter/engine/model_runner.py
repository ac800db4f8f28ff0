"""Runs the model on scheduled batches; owns the weights and the KV cache tensors."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvrouter.engine.config import EngineConfig, ModelConfig
from kvrouter.engine.kernels.backend import select_backend
from kvrouter.engine.kernels.metadata import AttentionMetadata
from kvrouter.engine.model.loader import load_model
from kvrouter.engine.parallel import TensorParallelGroup
from kvrouter.engine.scheduler import ScheduledSequence


@dataclass
class PreparedBatch:
    # The batch's entries in the order the tokens are laid out.
    ordered: list[ScheduledSequence]
    input_ids: torch.Tensor
    positions: torch.Tensor
    metadata: AttentionMetadata
    # Row of each sampling sequence's last token, in batch order.
    sample_rows: torch.Tensor
    sampling: list[ScheduledSequence]


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        tp: TensorParallelGroup,
        max_model_len: int,
    ) -> None:
        self.device = torch.device(config.device)
        self.block_size = config.block_size
        self.tp = tp
        self.backend = select_backend(config.attention_backend, self.device)
        self.model = load_model(
            config.model,
            model_config,
            self.backend,
            tp,
            self.device,
            config.dtype,
            max_positions=max_model_len,
        )
        self.model_config = model_config
        self.dtype = self.model.lm_head.weight.dtype
        attention = self.model.model.layers[0].self_attn
        # [num_layers, num_blocks, block_size, local kv heads, head_dim], one for K and one for V.
        cache_shape = (
            self.model_config.num_layers,
            config.num_kv_blocks,
            config.block_size,
            attention.num_kv_heads,
            attention.head_dim,
        )
        self.k_cache = torch.zeros(cache_shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(cache_shape, dtype=self.dtype, device=self.device)
        for index, layer in enumerate(self.model.model.layers):
            layer.self_attn.k_cache = self.k_cache[index]
            layer.self_attn.v_cache = self.v_cache[index]

    @property
    def block_shape(self) -> tuple[int, ...]:
        """One block's KV across layers: [2, num_layers, block_size, kv heads, head_dim]."""
        num_layers, _, block_size, heads, head_dim = self.k_cache.shape
        return (2, num_layers, block_size, heads, head_dim)

    def prepare(self, batch: list[ScheduledSequence]) -> PreparedBatch:
        # Decode-shaped entries (one new token) first: the decode kernel takes them.
        decodes = [item for item in batch if item.num_new_tokens == 1]
        prefills = [item for item in batch if item.num_new_tokens > 1]
        ordered = decodes + prefills
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        sampling: list[ScheduledSequence] = []
        for item in ordered:
            seq = item.seq
            start = seq.num_computed_tokens
            end = start + item.num_new_tokens
            input_ids.extend(seq.token_ids[start:end])
            positions.extend(range(start, end))
            slots.extend(
                seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size
                for pos in range(start, end)
            )
            if item.samples:
                sample_rows.append(len(input_ids) - 1)
                sampling.append(item)
        decode_lens = [item.seq.num_computed_tokens + 1 for item in decodes]
        prefill_lens = [item.seq.num_computed_tokens + item.num_new_tokens for item in prefills]
        query_offsets = [0]
        for item in prefills:
            query_offsets.append(query_offsets[-1] + item.num_new_tokens)
        metadata = AttentionMetadata(
            slot_mapping=self._tensor(slots, torch.int64),
            num_decode_tokens=len(decodes),
            decode_block_tables=self._block_tables(decodes),
            decode_context_lens=self._tensor(decode_lens, torch.int32),
            decode_max_context_len=max(decode_lens, default=0),
            prefill_block_tables=self._block_tables(prefills),
            prefill_context_lens=self._tensor(prefill_lens, torch.int32),
            prefill_cu_seqlens_q=self._tensor(query_offsets, torch.int32),
            prefill_max_query_len=max((item.num_new_tokens for item in prefills), default=0),
        )
        return PreparedBatch(
            ordered=ordered,
            input_ids=self._tensor(input_ids, torch.int64),
            positions=self._tensor(positions, torch.int64),
            metadata=metadata,
            sample_rows=self._tensor(sample_rows, torch.int64),
            sampling=sampling,
        )

    @torch.inference_mode()
    def run(self, prepared: PreparedBatch, all_logits: bool = False) -> torch.Tensor:
        """Logits [rows, vocab] in fp32: of the sampling rows, or of every token."""
        hidden = self.model(prepared.input_ids, prepared.positions, prepared.metadata)
        if not all_logits:
            hidden = hidden[prepared.sample_rows]
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def read_blocks(self, block_ids: list[int]) -> torch.Tensor:
        """KV of physical blocks, contiguous: [2, layers, n, block_size, heads, head_dim]."""
        index = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        return torch.stack(
            (self.k_cache.index_select(1, index), self.v_cache.index_select(1, index))
        )

    @torch.inference_mode()
    def write_blocks(self, block_ids: list[int], data: torch.Tensor) -> None:
        index = torch.tensor(block_ids, dtype=torch.int64, device=self.device)
        data = data.to(device=self.device, dtype=self.dtype)
        self.k_cache.index_copy_(1, index, data[0])
        self.v_cache.index_copy_(1, index, data[1])

    def _tensor(self, values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

    def _block_tables(self, items: list[ScheduledSequence]) -> torch.Tensor:
        width = max((len(item.seq.block_table) for item in items), default=0)
        rows = [item.seq.block_table + [0] * (width - len(item.seq.block_table)) for item in items]
        table = (
            torch.tensor(rows, dtype=torch.int32) if rows else torch.zeros(0, 0, dtype=torch.int32)
        )
        return table.to(self.device, non_blocking=True)
