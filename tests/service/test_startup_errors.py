"""`kvrouter serve` refuses a setting it cannot run with by exiting non-zero
with one line that names the problem and the flag: no traceback, no process
left behind, no port silently changed."""

from __future__ import annotations

import subprocess

import pytest
from cli_errors import assert_one_line_naming, kvrouter
from cli_errors import taken_port as held_port

from kvrouter import PrefixIndex


def serve(*flags: str) -> subprocess.CompletedProcess:
    return kvrouter("serve", *flags)


@pytest.fixture
def taken_port():
    with held_port() as port:
        yield port


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--listen", "127.0.0.1:99999"), ("--listen", "65535")),
        (("--listen", "localhost"), ("--listen", "HOST:PORT")),
        (("--metrics-listen", "127.0.0.1:70000"), ("--metrics-listen",)),
        (("--log-level", "loud"), ("--log-level", "loud")),
        (
            ("--tls-cert-file", "/nonexistent.pem", "--tls-key-file", "/nonexistent.key"),
            ("--tls-cert-file", "/nonexistent.pem"),
        ),  # fmt: skip
        (("--auth-tokens-file", "/nonexistent-tokens"), ("--auth-tokens-file",)),
    ],
    ids=["port-out-of-range", "no-port", "metrics-port", "log-level", "tls-file", "tokens-file"],
)
def test_bad_settings_exit_with_one_line(flags, words):
    base = ("--listen", "127.0.0.1:0", "--metrics-listen", "")
    assert_one_line_naming(serve(*base, *flags), *words)


def test_a_bad_token_file_is_one_line(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("router-only-one-field\n")
    result = serve("--listen", "127.0.0.1:0", "--metrics-listen", "", "--auth-tokens-file",
                   str(tokens))  # fmt: skip
    assert_one_line_naming(result, str(tokens), "ROLE TOKEN")


def test_the_port_in_use_is_one_line(taken_port):
    result = serve("--listen", f"127.0.0.1:{taken_port}", "--metrics-listen", "")
    assert_one_line_naming(result, "--listen", str(taken_port))


def test_the_metrics_port_in_use_is_one_line(taken_port):
    result = serve("--listen", "127.0.0.1:0", "--metrics-listen", f"127.0.0.1:{taken_port}")
    assert_one_line_naming(result, "--metrics-listen", str(taken_port))


def test_a_snapshot_of_another_block_size_is_one_line(tmp_path):
    path = tmp_path / "index.snap"
    path.write_bytes(PrefixIndex(32).snapshot())
    result = serve("--listen", "127.0.0.1:0", "--metrics-listen", "", "--snapshot-path",
                   str(path))  # fmt: skip
    assert_one_line_naming(result, "block size")


def test_version():
    result = kvrouter("--version")
    assert result.returncode == 0 and result.stdout.startswith("kvrouter ")


def test_commands_run_from_a_checkout_that_is_not_installed(monkeypatch, capsys):
    """A checkout on PYTHONPATH has no package metadata; the CLI still starts."""
    import importlib.metadata

    from kvrouter.cli import main

    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("kvrouter (a source checkout")
