import os

import pytest
import torch

from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint

# Triton kernels run under the interpreter where there is no GPU. The variable
# must be set before any kernel module is imported (they are imported lazily).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=1)


@pytest.fixture(scope="session")
def tiny_qwen2(tmp_path_factory):
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny-qwen2"), "qwen2", tie_word_embeddings=True, seed=2
    )
