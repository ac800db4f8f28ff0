"""Configuration layers: defaults < file < environment < flags."""

from __future__ import annotations

import argparse

import pytest

from kvrouter.cli import bridge
from kvrouter.service import RouterServer, ServiceConfig
from kvrouter.service.config import add_arguments, load
from kvrouter.service.proxy_config import ProxyConfig


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
        (("--proxy", "policy=random"), "proxy policy"),
        (("--proxy", "no_such_knob=1"), "no_such_knob"),
        (("--proxy", "prefill_timeout_s"), "FIELD=VALUE"),
    ],
)
def test_bad_settings_are_refused_by_name(flags, message):
    with pytest.raises(ValueError, match=message):
        load(parse(*flags), env={})


def test_proxy_settings_come_from_the_file_env_and_flags(tmp_path):
    path = tmp_path / "router.toml"
    path.write_text('[proxy]\npolicy = "round_robin"\nprefill_timeout_s = 9\ntoken_timeout_s = 9\n')
    env = {"KVROUTER_PROXY_TOKEN_TIMEOUT_S": "4", "KVROUTER_PROXY_RELEASE_TIMEOUT_S": "1"}
    config = load(parse("--config", str(path), "--proxy", "prefill_timeout_s=2.5"), env=env)
    assert config.proxy == ProxyConfig(
        policy="round_robin", prefill_timeout_s=2.5, token_timeout_s=4.0, release_timeout_s=1.0
    )


def test_the_router_follows_its_configured_proxy_settings():
    config = load(parse("--proxy", "handoff_timeout_s=7", "--metrics-listen", ""), env={})
    assert RouterServer(config).generation.ctx.config.handoff_timeout_s == 7.0


def test_nats_servers_are_a_tuple_from_a_toml_array_or_comma_separated_text(tmp_path):
    servers = ("nats://a:4222", "nats://b:4222")
    path = tmp_path / "router.toml"
    path.write_text('nats = ["nats://a:4222", "nats://b:4222"]\nreplica_name = "r1"\n')
    assert load(parse("--config", str(path)), env={}).nats == servers
    flags = parse("--nats", "nats://a:4222, nats://b:4222", "--replica-name", "r1")
    assert load(flags, env={}).nats == servers
    env = {"KVROUTER_NATS": "nats://a:4222,nats://b:4222", "KVROUTER_REPLICA_NAME": "r1"}
    assert load(parse(), env=env).nats == servers
    assert load(parse(), env={}).nats == ()


def test_publishers_take_nats_servers_in_the_same_forms():
    parser = argparse.ArgumentParser()
    bridge.add_stream_arguments(parser, required=True)
    args = parser.parse_args(["--nats", "nats://a:4222,nats://b:4222", "--nats", "nats://c:4222"])
    assert bridge.nats_config(args).servers == ("nats://a:4222", "nats://b:4222", "nats://c:4222")


def test_nats_as_one_string_is_refused():
    config = ServiceConfig(nats="nats://a:4222", replica_name="r1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tuple of server URLs"):
        config.validate()
