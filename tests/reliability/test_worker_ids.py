"""Worker ids on a real `kvrouter serve`: an id the router assigned is never
assigned again (not even after a restart from its snapshot), a worker that
lapsed and returns cannot act for a newer registration of its id, and ids
out of range are refused without harm to later registrations; an event
stream's hello proves its registration the same way."""

from __future__ import annotations

import grpc
import pytest
from serve_process import ServeProcess
from waiting import wait_until

from kvrouter.client import WorkerRegistration
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

from .publish_stream import Stream

SHORT_TTL = ("--heartbeat-interval-s", "0.1", "--heartbeat-ttl-s", "0.6")


@pytest.fixture
def router():
    process = ServeProcess(*SHORT_TTL)
    yield process
    process.kill()


@pytest.fixture
def registry(router):
    with grpc.insecure_channel(router.target) as channel:
        yield router_pb2_grpc.RegistryStub(channel)


def register(registry, address: str, **fields) -> pb.RegisterResponse:
    request = pb.RegisterRequest(
        role=pb.ROLE_BOTH, address=address, block_size=16, capacity_blocks=100, **fields
    )
    return registry.Register(request, timeout=5)


def listed(registry) -> dict[int, str]:
    return {w.worker_id: w.address for w in registry.List(pb.ListWorkersRequest()).workers}


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as refused:
        call()
    return refused.value.code()


def keep_alive(router, address: str, worker_id: int | None = None) -> WorkerRegistration:
    worker = WorkerRegistration(
        router.target, role="both", capacity_blocks=100, address=address, worker_id=worker_id
    )
    worker.start_background()
    return worker


def test_a_lapsed_worker_returning_does_not_take_over_a_newer_workers_id(router, registry):
    lapsed = register(registry, "a:1")
    wait_until(lambda: not listed(registry), what="the silent worker to lapse")
    newer = keep_alive(router, "b:1")
    try:
        assert newer.worker_id != lapsed.worker_id  # its id is not handed out again

        # It comes back: its heartbeat is not found, so it registers again.
        beat = pb.HeartbeatRequest(
            worker_id=lapsed.worker_id, registration_token=lapsed.registration_token
        )
        assert code_of(lambda: registry.Heartbeat(beat, timeout=5)) == grpc.StatusCode.NOT_FOUND
        back = register(
            registry,
            "a:1",
            worker_id=lapsed.worker_id,
            registration_token=lapsed.registration_token,
        )
        assert listed(registry) == {lapsed.worker_id: "a:1", newer.worker_id: "b:1"}

        # A replacement takes its id over; the old process can no longer act for it.
        replacement = keep_alive(router, "c:1", worker_id=lapsed.worker_id)
        try:
            stale = back.registration_token
            beat = pb.HeartbeatRequest(worker_id=back.worker_id, registration_token=stale)
            leave = pb.DeregisterRequest(worker_id=back.worker_id, registration_token=stale)
            precondition = grpc.StatusCode.FAILED_PRECONDITION
            assert code_of(lambda: registry.Heartbeat(beat, timeout=5)) == precondition
            assert code_of(lambda: registry.Deregister(leave, timeout=5)) == precondition

            def register_again():
                return register(registry, "a:1", worker_id=back.worker_id, registration_token=stale)

            assert code_of(register_again) == grpc.StatusCode.ALREADY_EXISTS
            assert listed(registry) == {lapsed.worker_id: "c:1", newer.worker_id: "b:1"}
            # Heartbeats without the token are refused too.
            bare = pb.HeartbeatRequest(worker_id=back.worker_id)
            assert code_of(lambda: registry.Heartbeat(bare, timeout=5)) == precondition
        finally:
            replacement.stop_background()
        assert listed(registry) == {newer.worker_id: "b:1"}
    finally:
        newer.stop_background()


def test_assigned_ids_are_not_reused_after_a_restart_from_the_snapshot(tmp_path):
    flags = ("--snapshot-path", str(tmp_path / "index.snap"))
    first = ServeProcess(*flags)
    try:
        with grpc.insecure_channel(first.target) as channel:
            registry = router_pb2_grpc.RegistryStub(channel)
            workers = [register(registry, f"w{n}:1") for n in range(3)]
            for worker in workers:
                leave = pb.DeregisterRequest(
                    worker_id=worker.worker_id, registration_token=worker.registration_token
                )
                registry.Deregister(leave, timeout=5)
        assert first.terminate() == 0
    finally:
        first.kill()
    second = ServeProcess(*flags)
    try:
        with grpc.insecure_channel(second.target) as channel:
            newcomer = register(router_pb2_grpc.RegistryStub(channel), "new:1")
        assert newcomer.worker_id > max(w.worker_id for w in workers)
        assert second.terminate() == 0
    finally:
        second.kill()


def test_out_of_range_ids_are_refused_and_later_registrations_work(registry):
    invalid = grpc.StatusCode.INVALID_ARGUMENT
    for worker_id in (2**64 - 1, 2**63):
        with pytest.raises(grpc.RpcError) as refused:
            register(registry, "huge:1", worker_id=worker_id)
        assert refused.value.code() == invalid
        assert "worker_id must be between 0 and 9223372036854775807" in refused.value.details()
    assert register(registry, "top:1", worker_id=2**63 - 1).worker_id == 2**63 - 1
    assigned = [register(registry, f"w{n}:1").worker_id for n in range(2)]
    assert assigned == [1, 2]


def test_a_stale_process_cannot_take_over_a_workers_event_stream(router):
    current = keep_alive(router, "a:1", worker_id=7)
    token = current.registration_token
    assert token  # registered before start_background returned

    def hello(registration_token: int) -> pb.PublishHello:
        return pb.PublishHello(
            worker_id=7, next_seq=0, block_size=16, registration_token=registration_token
        )

    streams = []
    try:
        live = Stream(router.target, hello(token))
        streams.append(live)
        assert live.replies.get(timeout=10).ack.next_seq == 0
        stale = Stream(router.target, hello(token ^ 1))
        streams.append(stale)
        assert stale.ended.wait(10)
        assert stale.error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "registration token" in stale.error.details()
        assert not live.ended.is_set()  # it was not replaced by the stale one
    finally:
        for stream in streams:
            stream.close()
        current.stop_background()
