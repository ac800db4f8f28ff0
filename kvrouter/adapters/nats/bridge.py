"""Publishes vLLM/SGLang engines' KV events to the JetStream stream, for
router replicas to consume:

    kvrouter bridge --nats nats://10.0.0.1:4222 engines.toml

Run one bridge per engine (next to it, or one for a group of engines): the
stream carries each worker's batches in the order one bridge published them.
A restarted bridge continues each worker's numbering from the stream.
"""

from __future__ import annotations

import nats

from kvrouter.adapters.nats.config import NatsConfig
from kvrouter.adapters.nats.publisher import JetStreamSink
from kvrouter.adapters.nats.stream import ensure_stream
from kvrouter.adapters.vllm.config import EngineConfig
from kvrouter.adapters.vllm.subscriber import EngineSubscriber


class EngineBridge:
    """`async with EngineBridge(config, engines) as bridge:`"""

    def __init__(
        self, config: NatsConfig, engines: list[EngineConfig], *, block_size: int = 16
    ) -> None:
        self.config = config
        self.engines = engines
        self.block_size = block_size
        self.nc = None
        self.subscriber: EngineSubscriber | None = None

    async def start(self) -> None:
        self.nc = await nats.connect(servers=list(self.config.servers), name="kvrouter-bridge")
        js = self.nc.jetstream()
        await ensure_stream(js, self.config)
        self.subscriber = EngineSubscriber(
            self.engines, JetStreamSink(js, self.config), block_size=self.block_size
        )
        await self.subscriber.start()

    async def stop(self) -> None:
        if self.subscriber is not None:
            await self.subscriber.stop()
        if self.nc is not None:
            await self.nc.flush()
            await self.nc.close()

    async def __aenter__(self) -> EngineBridge:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()
