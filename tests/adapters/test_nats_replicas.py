"""Router replicas on a real nats-server: converging indexes, a replica
killed mid-stream, and load shared between replicas."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from kvrouter.adapters.nats import JetStreamSink, NatsConfig, ensure_stream
from kvrouter.adapters.nats.codec import decode_batch, encode_batch
from kvrouter.adapters.nats.stream import last_stream_seq
from kvrouter.events import EndsReusable, WorkerBatch
from kvrouter.service import snapshot_file
from kvrouter.service.replicas import IndexReplica

from .conftest import until
from .replica_workload import reference_index, view, workload

nats = pytest.importorskip("nats", reason="the adapters extra (nats-py) is not installed")

WORKERS = [11, 12, 13, 14]
REPO = Path(__file__).resolve().parents[2]


def stream_position(snapshot: Path) -> int:
    restored = snapshot_file.load(snapshot, "exit")
    return restored[1]["stream_position"] if restored else 0


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


async def publish(url: str, batches) -> None:
    nc = await nats.connect(servers=[url])
    js = nc.jetstream()
    config = NatsConfig(servers=(url,))
    await ensure_stream(js, config)
    sink = JetStreamSink(js, config)
    for batch in batches:
        assert await sink.next_seq(batch.worker_id) == batch.seq
        await sink.deliver(batch)
    await nc.drain()


async def caught_up(replica: IndexReplica) -> None:
    last = await last_stream_seq(replica.js, replica.config)
    await until(lambda: replica.position >= last, f"replica {replica.name} at {last}")


def test_codec_round_trips_every_event_kind():
    batches, _ = workload(WORKERS, 40)
    ends = WorkerBatch(5, 10, [EndsReusable([1, 2], reusable=False), EndsReusable([3], True)])
    for batch in batches + [WorkerBatch(5, 9, [], resync=True), ends]:
        assert decode_batch(encode_batch(batch)) == batch
    with pytest.raises(ValueError, match="not a kvrouter event batch"):
        decode_batch(b"\x93\x01\x02")


def test_two_replicas_converge_to_the_same_index(nats_url):
    batches, prompts = workload(WORKERS, 300)
    expected = view(reference_index(batches), prompts)

    async def scenario():
        config = NatsConfig(servers=(nats_url,))
        nc = await nats.connect(servers=[nats_url])
        a, b = IndexReplica(nc, config, "a"), IndexReplica(nc, config, "b")
        await a.start()
        await publish(nats_url, batches[:150])
        await b.start()  # joins late: reads the stream from the start
        await publish(nats_url, batches[150:])
        for replica in (a, b):
            await caught_up(replica)
            assert view(replica.index, prompts) == expected
            assert replica.stats["resyncs"] == 0
        await a.stop()
        await b.stop()
        await nc.close()

    run(scenario())


def test_a_killed_replica_resumes_from_its_snapshot_without_losing_events(nats_url, tmp_path):
    batches, prompts = workload(WORKERS, 400, seed=1)
    snapshot = tmp_path / "a.snapshot"

    async def scenario():
        config = NatsConfig(servers=(nats_url,))
        await publish(nats_url, batches[:200])
        proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("replica_process.py")),
                nats_url,
                "a",
                str(snapshot),
            ],
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            await until(lambda: stream_position(snapshot) >= 50, "the replica's first snapshots")
            await publish(nats_url, batches[200:300])
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        await publish(nats_url, batches[300:])
        resumed_at = stream_position(snapshot)
        assert 50 <= resumed_at < len(batches)

        nc = await nats.connect(servers=[nats_url])
        a = IndexReplica(nc, config, "a", snapshot_path=snapshot)
        await a.start()
        assert a.position == resumed_at
        await caught_up(a)
        assert view(a.index, prompts) == view(reference_index(batches), prompts)
        # It read on from its snapshot, not the whole stream again.
        assert a.stats["batches"] == len(batches) - resumed_at
        await a.stop()
        assert stream_position(snapshot) == len(batches)
        await nc.close()

    run(scenario())


def test_the_replica_names_still_import_from_adapters_nats():
    from kvrouter.adapters import nats as old_home
    from kvrouter.service import replicas

    for name in ("IndexReplica", "RouterReplica"):
        assert getattr(old_home, name) is getattr(replicas, name)
    with pytest.raises(AttributeError):
        old_home.NoSuchName  # noqa: B018
