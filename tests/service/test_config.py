"""Configuration layers: defaults < file < environment < flags."""

from __future__ import annotations

import argparse

import pytest

from kvrouter.service import ServiceConfig
from kvrouter.service.config import add_arguments, load


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(flags)


def test_defaults_are_documented_values():
    config = load(parse(), env={})
    assert config == ServiceConfig()
    assert (config.block_size, config.heartbeat_ttl_s, config.listen) == (16, 5.0, "0.0.0.0:50051")


def test_file_then_env_then_flags(tmp_path):
    path = tmp_path / "router.toml"
    path.write_text(
        'block_size = 32\nheartbeat_ttl_s = 9\nlog_format = "text"\n[policy]\ntemperature = 0.25\n'
    )
    env = {
        "KVROUTER_HEARTBEAT_TTL_S": "8",
        "KVROUTER_POLICY_TIE_TOLERANCE": "0.1",
        "KVROUTER_UNRELATED": "ignored",
    }
    config = load(
        parse("--config", str(path), "--heartbeat-ttl-s", "7", "--policy", "temperature=0.5"),
        env=env,
    )
    assert config.block_size == 32
    assert config.log_format == "text"
    assert config.heartbeat_ttl_s == 7.0
    assert config.policy.temperature == 0.5
    assert config.policy.tie_tolerance == 0.1


@pytest.mark.parametrize(
    "flags, message",
    [
        (("--block-size", "0"), "block_size"),
        (("--heartbeat-interval-s", "10"), "heartbeat_interval_s"),
        (("--log-decisions", "maybe"), "log_decisions"),
        (("--policy", "no_such_knob=1"), "no_such_knob"),
        (("--policy", "temperature"), "FIELD=VALUE"),
    ],
)
def test_bad_settings_are_refused_by_name(flags, message):
    with pytest.raises(ValueError, match=message):
        load(parse(*flags), env={})
