"""`kvrouter worker` refuses a setting it cannot start with as `kvrouter
serve` does: it exits non-zero with one line that names the problem and the
flag, no traceback, nothing left running, no port silently changed. A router
that is not up yet is no such setting: the worker waits for it
(tests/reliability/test_start_order.py)."""

from __future__ import annotations

import pytest
from cli_errors import assert_one_line_naming, kvrouter, taken_port
from serve_process import ServeProcess

# The engine-compatible mode's two addresses, on free ports.
HTTP = ("--vllm-http-listen", "127.0.0.1:0")
ZMQ = ("--vllm-kv-events-endpoint", "tcp://127.0.0.1:*")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A bad token file, an empty one, a directory with no checkpoint and a
    plain file where a checkpoint directory would go."""
    root = tmp_path_factory.mktemp("files")
    (root / "tokens").write_text("router-only-one-field\n")
    (root / "empty-token").write_text("")
    (root / "no-checkpoint").mkdir()
    (root / "a-file").write_text("")
    return root


def worker(tiny_model, *flags: str):
    return kvrouter("worker", "--model", str(tiny_model), *flags)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--listen", "127.0.0.1:99999"), ("--listen", "65535")),
        (("--listen", "localhost"), ("--listen", "HOST:PORT")),
        (("--vllm-http-listen", "127.0.0.1:70000", *ZMQ), ("--vllm-http-listen", "65535")),
        ((*HTTP, "--vllm-kv-events-endpoint", "nonsense"), ("--vllm-kv-events-endpoint",)),
        (("--router", "localhost"), ("--router", "HOST:PORT")),
        (("--router", "127.0.0.1:0"), ("--router", "port 0")),
        (("--advertise", "localhost"), ("--advertise", "HOST:PORT")),
        (("--tls-cert-file", "/nonexistent.pem", "--tls-key-file", "/nonexistent.key"),
         ("--tls-cert-file", "/nonexistent.pem")),
        (("--auth-tokens-file", "/nonexistent-tokens"), ("--auth-tokens-file",)),
        (("--token-file", "/nonexistent-token"), ("--token-file",)),
        (("--ca-file", "/nonexistent-ca.pem"), ("--ca-file",)),
        (("--log-level", "loud"), ("--log-level", "loud")),
        (("--block-size", "0"), ("--block-size", "positive")),
        (("--num-kv-blocks", "-1"), ("--num-kv-blocks", "positive")),
        (("--max-num-seqs", "0"), ("--max-num-seqs", "positive")),
        (("--lease-ms", "0"), ("--lease-ms", "positive")),
        (("--device", "toaster"), ("--device", "toaster")),
    ],
    ids=[
        "port-out-of-range", "no-port", "http-port-out-of-range", "zmq-endpoint",
        "router-no-port", "router-port-0", "advertise-no-port", "tls-file", "tokens-file",
        "token-file", "ca-file", "log-level", "block-size", "num-kv-blocks", "max-num-seqs",
        "lease-ms", "device",
    ],
)  # fmt: skip
def test_bad_settings_exit_with_one_line(tiny_model, flags, words):
    assert_one_line_naming(worker(tiny_model, *flags), *words)


@pytest.mark.parametrize(
    ("flag", "address", "others"),
    [
        ("--listen", "127.0.0.1:{}", ()),
        ("--vllm-http-listen", "127.0.0.1:{}", ZMQ),
        ("--vllm-kv-events-endpoint", "tcp://127.0.0.1:{}", HTTP),
        ("--vllm-kv-events-replay-endpoint", "tcp://127.0.0.1:{}", (*HTTP, *ZMQ)),
    ],
)
def test_a_port_in_use_is_one_line(tiny_model, flag, address, others):
    with taken_port() as port:
        result = worker(tiny_model, *others, flag, address.format(port))
    assert_one_line_naming(result, flag, str(port))


def test_a_bad_token_file_is_one_line(tiny_model, files):
    result = worker(tiny_model, "--auth-tokens-file", str(files / "tokens"))
    assert_one_line_naming(result, str(files / "tokens"), "ROLE TOKEN")


def test_an_empty_token_file_is_one_line(tiny_model, files):
    result = worker(tiny_model, "--token-file", str(files / "empty-token"))
    assert_one_line_naming(result, str(files / "empty-token"), "empty")


@pytest.mark.parametrize("model", ["/nonexistent-model", "no-checkpoint"])
def test_a_model_without_a_checkpoint_is_one_line(files, model):
    path = str(files / model)
    assert_one_line_naming(kvrouter("worker", "--model", path), "--model", path, "config.json")


def test_a_tiny_model_that_cannot_be_written_is_one_line(files):
    path = str(files / "a-file")
    assert_one_line_naming(kvrouter("worker", "--tiny-model", path), "--tiny-model", path)


def test_a_router_that_refuses_the_worker_is_one_line(tiny_model):
    router = ServeProcess("--block-size", "16")
    try:
        result = worker(tiny_model, "--router", router.target, "--block-size", "32")
    finally:
        router.kill()
    assert_one_line_naming(result, "--router", router.target, "block size")
