"""`kvrouter sidecar` refuses an engine list or a setting it cannot start
with as `kvrouter serve` does: it exits non-zero with one line that names
the problem and the file or flag, and no traceback. A router that is not up
yet is no such setting: the sidecar waits for it."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from cli_errors import assert_one_line_naming, kvrouter, taken_port

ENGINE = 'name = "a"\nendpoint = "tcp://127.0.0.1:5557"\naddress = "http://127.0.0.1:8000"\n'


def sidecar(engines, *flags: str):
    return kvrouter("sidecar", "--router", "127.0.0.1:1", *flags, str(engines))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[[engines]\n", ("Expected",)),
        ("", ("list of engines",)),
        ('engines = "a"\n', ("list of engines",)),
        (f'[[engines]]\n{ENGINE}data_parallel_size = "two"\n', ("engine 'a'", "wrong type")),
        (f"[[engines]]\n{ENGINE}worker_ids = 3\n", ("engine 'a'", "wrong type")),
        (f"[[engines]]\n{ENGINE}probe_interval_s = -1\n", ("engine a", "probe_interval_s")),
        (f'[[engines]]\n{ENGINE}colour = "red"\n', ("engine 'a'", "colour")),
        (f'[[engines]]\n{ENGINE}role = "chef"\n', ("engine a", "role", "chef")),
        ('[[engines]]\nendpoint = "tcp://127.0.0.1:5557"\n', ("missing name",)),
        ('[[engines]]\nname = "a"\n', ("engine 'a'", "missing endpoint")),
        ('[[engines]]\nname = "a"\nendpoint = "nonsense"\n', ("engine a", "endpoint", "nonsense")),
        ('[[engines]]\nname = "a"\nendpoint = "tcp://h:x"\n', ("engine a", "tcp://h:x")),
        ('[[engines]]\nname = "a"\nendpoint = "tcp://h:1"\naddress = "h:8000"\n',
         ("engine a", "base URL")),
    ],
    ids=[
        "unparsable", "empty", "not-a-list", "bad-number", "bad-list", "bad-value",
        "unknown-key", "bad-role", "no-name", "no-endpoint", "bad-endpoint", "bad-port",
        "bad-address",
    ],
)  # fmt: skip
def test_a_bad_engine_list_is_one_line(tmp_path, text, words):
    path = tmp_path / "engines.toml"
    path.write_text(text)
    assert_one_line_naming(sidecar(path), *words)


def test_a_missing_engine_list_is_one_line(tmp_path):
    path = tmp_path / "engines.toml"
    assert_one_line_naming(sidecar(path), str(path), "no such file")


def test_unparsable_json_names_the_file(tmp_path):
    path = tmp_path / "engines.json"
    path.write_text('{"engines": [')
    assert_one_line_naming(sidecar(path), str(path))


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (("--router", "localhost"), ("--router", "HOST:PORT")),
        (("--router", "127.0.0.1:1", "--block-size", "0"), ("--block-size", "positive")),
    ],
)
def test_bad_flags_are_one_line(tmp_path, flags, words):
    path = tmp_path / "engines.toml"
    path.write_text(f"[[engines]]\n{ENGINE}")
    result = kvrouter("sidecar", *flags, str(path))
    assert_one_line_naming(result, *words)


def test_a_sidecar_waiting_for_its_router_stops_on_sigterm(tmp_path):
    """Not up yet is no error: the sidecar waits for its router, and a
    SIGTERM meanwhile stops it (it used to be ignored until the router came)."""
    path = tmp_path / "engines.toml"
    path.write_text(f"[[engines]]\n{ENGINE}")
    with taken_port() as port:
        pass  # free again, and no router there
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "kvrouter.cli", "sidecar", "--router", f"127.0.0.1:{port}",
         str(path)],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        for line in sidecar.stderr:
            if "waiting for the router" in line:
                break
        sidecar.send_signal(signal.SIGTERM)
        assert sidecar.wait(timeout=60) == 0
    finally:
        sidecar.kill()
        sidecar.wait()
