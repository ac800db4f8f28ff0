"""Runs one index replica until it is killed: `python replica_process.py URL
NAME SNAPSHOT_PATH`. It reads the stream in small steps and snapshots often,
so that a kill lands mid-stream with batches applied after the last
snapshot."""

import asyncio
import sys

import nats

from kvrouter.adapters.nats import NatsConfig
from kvrouter.service.replicas import IndexReplica


async def main(url: str, name: str, snapshot_path: str) -> None:
    nc = await nats.connect(servers=[url])
    replica = IndexReplica(
        nc,
        NatsConfig(servers=(url,)),
        name,
        snapshot_path=snapshot_path,
        snapshot_interval_s=0.05,
        fetch_batch=4,
    )
    await replica.start()
    while True:
        await asyncio.sleep(0.02)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
