"""Workers started for real on 127.0.0.1 (free ports), each on an event loop
of its own thread, with no router; and a plain engine as the reference."""

from __future__ import annotations

import pytest
from greedy_reference import greedy_reference
from threaded_worker import started_workers

from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama", seed=3)


@pytest.fixture
def start_worker(tiny_model):
    yield from started_workers(str(tiny_model), num_kv_blocks=128, torch_threads=0)


@pytest.fixture(scope="session")
def reference(tiny_model):
    return greedy_reference(tiny_model)
