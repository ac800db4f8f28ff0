"""Attention and KV-cache kernels: torch references and Triton versions."""
