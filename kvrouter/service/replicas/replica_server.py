"""The router's gRPC service in front of a router replica
(`kvrouter serve --nats URL --replica-name NAME`).

The replica's index follows the JetStream stream and its policy shares the
load book with the other replicas (`RouterReplica`); the service on top is
the single router's (`RouterServer`): routing, registration, heartbeats and
proxied generation. Workers register with every replica, since each keeps
its own worker table; the ids replicas assign come from one counter they
share (shared_ids.py), so no two workers get the same id. KV events
published to the service over gRPC are refused with FAILED_PRECONDITION:
accepted, they would reach this replica's index alone, and the replicas'
indexes would drift apart. Publishers send them to the stream instead
(`kvrouter bridge`, `JetStreamWorkerPublisher`).
"""

from __future__ import annotations

import asyncio
import signal

import uvloop

from kvrouter.adapters.nats.config import NatsConfig, check_name
from kvrouter.net import logs
from kvrouter.service.config import ServiceConfig
from kvrouter.service.replicas.router_replica import RouterReplica
from kvrouter.service.routing import service_router
from kvrouter.service.server import RouterServer


def nats_config(config: ServiceConfig) -> NatsConfig:
    if not config.nats:
        raise ValueError("nats: give at least one server URL")
    return NatsConfig(
        servers=config.nats, stream=config.nats_stream, subject_prefix=config.nats_subject_prefix
    )


class ReplicaServer:
    """`await start()`, then `await stop()`; `server` is the RouterServer
    (its `port`, `index`, `policy`) once started."""

    def __init__(self, config: ServiceConfig) -> None:
        config.validate()
        self.config = config
        # The snapshot records the stream position with the index, so that a
        # restart resumes the stream right after it.
        self.replica = RouterReplica(
            nats_config(config),
            check_name(config.replica_name),
            policy=config.policy,
            block_size=config.block_size,
            max_blocks=config.max_index_blocks or None,
            snapshot_path=config.snapshot_path or None,
            on_bad_snapshot=config.on_bad_snapshot,
            make_router=lambda index: service_router(index, config, share_bookings=True),
        )
        self.server: RouterServer | None = None
        self._stopped = False

    async def start(self) -> None:
        try:
            await self.replica.start()
            self.server = RouterServer(
                self.config,
                index=self.replica.index,
                policy=self.replica.router,
                worker_ids=self.replica.worker_ids,
            )
            await self.server.start()
        except BaseException:
            await self.replica.stop(snapshot=False)
            raise

    async def stop(self, grace: float | None = None) -> None:
        """Drains the service, then stops the replica (writing its snapshot)."""
        if self._stopped:
            return
        self._stopped = True
        if self.server is not None:
            await self.server.stop(grace)
        await self.replica.stop()


async def serve(replica_server: ReplicaServer) -> None:
    """Runs until SIGTERM or SIGINT, then drains."""
    await replica_server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await replica_server.stop()


def run(replica_server: ReplicaServer) -> None:
    config = replica_server.config
    logs.configure(config.log_level, config.log_format)
    uvloop.run(serve(replica_server))
