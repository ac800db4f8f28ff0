"""The JetStream stream that carries every worker's event batches."""

from __future__ import annotations

from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError

from kvrouter.adapters.nats.config import NatsConfig


async def ensure_stream(js: JetStreamContext, config: NatsConfig) -> None:
    """Creates the stream, or brings an existing one to this configuration.
    Limits retention: replicas read it independently, each at its own pace."""
    wanted = StreamConfig(
        name=config.stream,
        subjects=[config.event_subjects],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        max_age=config.max_age_s,
        num_replicas=config.stream_replicas,
    )
    try:
        await js.add_stream(wanted)
    except BadRequestError:
        await js.update_stream(wanted)


async def last_stream_seq(js: JetStreamContext, config: NatsConfig) -> int:
    return (await js.stream_info(config.stream)).state.last_seq
