import pytest
from transformers import AutoTokenizer

from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint
from kvrouter.frontend import ModelTokenizer

# 256: the default checkpoint, few merges (nearly a byte per token); 1024: a
# BPE whose tokens hold whole words and multi-byte characters.
VOCAB_SIZES = (256, 1024)


@pytest.fixture(scope="session", params=VOCAB_SIZES, ids=lambda v: f"vocab{v}")
def model_dir(request, tmp_path_factory):
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp(f"tiny-{request.param}"), vocab_size=request.param
    )


@pytest.fixture(scope="session")
def tokenizer(model_dir):
    return ModelTokenizer.from_dir(model_dir)


@pytest.fixture(scope="session")
def hf_tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)
