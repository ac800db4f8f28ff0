"""`kvrouter serve` and its index snapshot when the disk misbehaves: a
snapshot directory that is missing at start or vanishes before shutdown, and
a snapshot file damaged while the router was down."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from serve_process import ServeProcess, serve_command

from kvrouter.client import KvEventPublisher, RouterClient, WorkerRegistration

from .worker_process import prompt

TOKENS = prompt(seed=3, blocks=8)


def serve_until_refused(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        serve_command("--listen", "127.0.0.1:0", *flags), capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def snapshot(tmp_path):
    """A real snapshot: a router that held worker 9's 8 blocks, stopped."""
    path = tmp_path / "index.snap"
    router = ServeProcess("--snapshot-path", str(path), env={"KVROUTER_HEARTBEAT_TTL_S": "30"})
    try:
        worker = WorkerRegistration(router.target, role="both", capacity_blocks=100, worker_id=9)
        worker.start_background()
        publisher = KvEventPublisher(router.target, 9).start()
        publisher.stored(None, list(range(8)), TOKENS)
        assert publisher.flush(10)
        publisher.close(timeout=1)
        worker.stop_background(deregister=False)
        assert router.terminate() == 0
    finally:
        router.kill()
    return path


def test_a_missing_snapshot_directory_is_refused_at_start(tmp_path):
    missing = tmp_path / "no-such-dir" / "index.snap"
    refused = serve_until_refused("--snapshot-path", str(missing))
    assert refused.returncode == 1
    assert refused.stderr.strip().count("\n") == 0, refused.stderr
    assert f"directory {missing.parent} does not exist" in refused.stderr


def test_sigterm_exits_when_the_snapshot_cannot_be_written(tmp_path):
    folder = tmp_path / "snapshots"
    folder.mkdir()
    router = ServeProcess("--snapshot-path", str(folder / "index.snap"), "--drain-grace-s", "1")
    try:
        shutil.rmtree(folder)
        assert router.terminate() == 1  # it exits, and says the index was lost
        assert router.wait_for("index snapshot not written")["path"] == str(folder / "index.snap")
        router.wait_for("stopped")
    finally:
        router.kill()


def damage(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_corrupt_snapshot_stops_the_router_when_told_to_exit(snapshot):
    damage(snapshot)
    refused = serve_until_refused("--snapshot-path", str(snapshot), "--on-bad-snapshot", "exit")
    assert refused.returncode == 1
    assert refused.stderr.strip().count("\n") == 0, refused.stderr
    assert f"snapshot {snapshot} refused" in refused.stderr
    assert "checksum mismatch" in refused.stderr
    assert snapshot.exists()  # left as it was


@pytest.mark.parametrize("flags", [(), ("--on-bad-snapshot", "empty")])
def test_a_corrupt_snapshot_is_set_aside_and_the_router_starts_empty(snapshot, flags):
    damage(snapshot)
    corrupt = snapshot.read_bytes()
    router = ServeProcess("--snapshot-path", str(snapshot), *flags)
    try:
        refusal = router.wait_for("snapshot refused; starting with an empty index")
        assert "checksum mismatch" in refusal["error"]
        assert (snapshot.parent / "index.snap.corrupt").read_bytes() == corrupt
        worker = WorkerRegistration(router.target, role="both", capacity_blocks=100, worker_id=9)
        worker.start_background()
        with RouterClient(router.target) as client:
            routed = client.route(TOKENS, explain=True)
        assert routed.explanation.decode_candidates[0].overlap == 0  # nothing was restored
        worker.stop_background()
        assert router.terminate() == 0
    finally:
        router.kill()


def test_an_intact_snapshot_is_restored(snapshot):
    router = ServeProcess("--snapshot-path", str(snapshot), "--on-bad-snapshot", "exit")
    try:
        assert router.wait_for("index restored")["blocks"] == 8
        assert router.terminate() == 0
    finally:
        router.kill()
