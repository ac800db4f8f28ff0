"""`kvrouter serve` as a process: it starts from flags, logs JSON with request
ids, drains on SIGTERM, and keeps its index across restarts via a snapshot."""

from __future__ import annotations

import queue
import subprocess
import sys

import grpc
import pytest
from serve_process import ServeProcess

from kvrouter.client import KvEventPublisher, RouterClient, WorkerRegistration
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

from .helpers import prompt


def test_sigterm_drains_and_the_snapshot_survives_a_restart(tmp_path):
    snapshot = tmp_path / "index.snap"
    flags = ("--snapshot-path", str(snapshot), "--drain-grace-s", "2")
    tokens = prompt(seed=21, blocks=8)
    first = ServeProcess(*flags, env={"KVROUTER_HEARTBEAT_TTL_S": "30"})
    try:
        worker = WorkerRegistration(first.target, role="both", capacity_blocks=1000, worker_id=9)
        worker.start_background()
        publisher = KvEventPublisher(first.target, 9).start()
        publisher.stored(None, list(range(8)), tokens)
        assert publisher.flush(10)
        with RouterClient(first.target) as client:
            routed = client.route(tokens, request_id="trace-me")
        assert routed.decode_worker == 9
        assert first.wait_for("routed")["request_id"] == "trace-me"
        publisher.close(timeout=1)
        worker.stop_background(deregister=False)

        assert first.terminate() == 0
        assert first.wait_for("index snapshot written")["blocks"] == 8
        assert snapshot.exists()
    finally:
        first.kill()

    second = ServeProcess(*flags)
    try:
        assert second.wait_for("index restored")["blocks"] == 8
        worker = WorkerRegistration(second.target, role="both", capacity_blocks=1000, worker_id=9)
        worker.start_background()
        with RouterClient(second.target) as client:
            result = client.route(tokens, explain=True)
        assert result.explanation.decode_candidates[0].overlap == 8
        worker.stop_background()
        assert second.terminate() == 0
    finally:
        second.kill()


def test_sigterm_ends_an_open_route_stream_with_unavailable():
    """A gateway holds its RouteStream open between requests: the drain ends
    it with UNAVAILABLE, so the gateway reconnects, rather than leave it open
    for the whole grace (here longer than `terminate` waits)."""
    router = ServeProcess("--drain-grace-s", "300")
    try:
        with grpc.insecure_channel(router.target) as channel:
            requests: queue.Queue = queue.Queue()
            stream = router_pb2_grpc.RouterStub(channel).RouteStream(iter(requests.get, None))
            requests.put(pb.RouteRequest(tokens=prompt(seed=3, blocks=2)))
            assert next(stream).error.code == grpc.StatusCode.UNAVAILABLE.value[0]  # no worker
            assert router.terminate() == 0
            with pytest.raises(grpc.RpcError) as ended:
                next(stream)
            assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "shutting down" in ended.value.details()
    finally:
        router.kill()


def test_bad_configuration_exits_with_a_message():
    proc = subprocess.run(
        [sys.executable, "-m", "kvrouter.cli", "serve", "--heartbeat-ttl-s", "soon"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "heartbeat_ttl_s" in proc.stderr and "soon" in proc.stderr
