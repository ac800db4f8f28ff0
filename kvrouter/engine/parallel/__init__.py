"""Tensor parallelism: the process group view and the all-reduce paths."""

from kvrouter.engine.parallel.group import TensorParallelGroup, init_tensor_parallel

__all__ = ["TensorParallelGroup", "init_tensor_parallel"]
