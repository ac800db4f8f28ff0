"""Build a model from an HF checkpoint directory (config.json + safetensors)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open

from kvrouter.engine.config import ModelConfig
from kvrouter.engine.kernels.backend import AttentionBackend
from kvrouter.engine.model.decoder import CausalLM
from kvrouter.engine.model.linear import ColumnParallelLinear, RowParallelLinear
from kvrouter.engine.parallel import TensorParallelGroup

# Checkpoint projection -> (fused module, output segment).
FUSED_PROJECTIONS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
# Precomputed tables some old checkpoints carry; the model computes its own.
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def load_model(
    checkpoint: str | Path,
    config: ModelConfig,
    backend: AttentionBackend,
    tp: TensorParallelGroup,
    device: torch.device,
    dtype: torch.dtype | None = None,
    max_positions: int | None = None,
) -> CausalLM:
    checkpoint = Path(checkpoint)
    with torch.device(device):
        model = CausalLM(config, backend, tp, max_positions or config.max_position_embeddings)
    load_weights(model, checkpoint)
    return model.to(dtype or config.dtype).eval()


def load_weights(model: CausalLM, checkpoint: Path) -> None:
    files = sorted(checkpoint.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {checkpoint}")
    modules = dict(model.named_modules())
    missing = _expected_targets(model)
    for file in files:
        with safe_open(file, framework="pt") as tensors:
            for name in tensors.keys():
                if name.endswith(IGNORED_SUFFIXES):
                    continue
                target = _load_one(model, modules, name, tensors.get_tensor(name))
                missing.discard(target)
    if missing:
        shown = ", ".join(sorted(str(target) for target in missing)[:5])
        raise ValueError(f"checkpoint {checkpoint} lacks {len(missing)} tensors, e.g. {shown}")


def _load_one(model: CausalLM, modules: dict, name: str, tensor: torch.Tensor) -> tuple:
    module_path, _, param_name = name.rpartition(".")
    parent_path, _, leaf = module_path.rpartition(".")
    if leaf in FUSED_PROJECTIONS:
        fused_name, segment = FUSED_PROJECTIONS[leaf]
        module_path = f"{parent_path}.{fused_name}"
        module = modules.get(module_path)
        if isinstance(module, ColumnParallelLinear):
            module.load(segment, param_name, tensor)
            return (module_path, param_name, segment)
    module = modules.get(module_path)
    if isinstance(module, RowParallelLinear):
        module.load(0, param_name, tensor)
        return (module_path, param_name, 0)
    param = getattr(module, param_name, None) if module is not None else None
    if not isinstance(param, torch.nn.Parameter):
        raise ValueError(f"unexpected tensor {name!r} in checkpoint")
    if param.shape != tensor.shape:
        raise ValueError(
            f"tensor {name!r} has shape {tuple(tensor.shape)}, expected {tuple(param.shape)}"
        )
    param.data.copy_(tensor)
    return (module_path, param_name, 0)


def _expected_targets(model: CausalLM) -> set[tuple]:
    targets = set()
    for path, module in model.named_modules():
        if isinstance(module, ColumnParallelLinear):
            segments = range(len(module.local_sizes))
            names = ["weight"] + (["bias"] if module.bias is not None else [])
            targets.update((path, name, segment) for name in names for segment in segments)
        elif isinstance(module, RowParallelLinear):
            names = ["weight"] + (["bias"] if module.bias is not None else [])
            targets.update((path, name, 0) for name in names)
        elif isinstance(module, (torch.nn.Embedding, torch.nn.Linear)) or hasattr(module, "eps"):
            targets.add((path, "weight", 0))
    if model.config.tie_word_embeddings:
        targets.discard(("lm_head", "weight", 0))
    return targets
