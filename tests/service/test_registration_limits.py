"""A registration's address and metadata are capped: one worker with huge
fields is refused with a clear error instead of costing every other caller
(List failing for everyone, every Route reply megabytes long)."""

from __future__ import annotations

import grpc
import pytest

from kvrouter.client import RouterClient
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

from .helpers import BLOCK, prompt


def register(target: str, **fields) -> pb.RegisterResponse:
    request = pb.RegisterRequest(
        role=pb.ROLE_BOTH, block_size=BLOCK, capacity_blocks=1000, **fields
    )
    with grpc.insecure_channel(target) as channel:
        return router_pb2_grpc.RegistryStub(channel).Register(request, timeout=10)


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"address": "h" * (3 << 20)}, "address"),
        ({"metadata": {"blob": "x" * (3 << 20)}}, "metadata"),
        ({"metadata": {f"k{i}": "v" for i in range(1000)}}, "metadata"),
    ],
    ids=["3 MiB address", "3 MiB metadata", "1000 metadata entries"],
)
def test_oversized_fields_are_refused_and_the_router_serves_on(start_router, fields, named):
    router = start_router()
    with pytest.raises(grpc.RpcError) as refused:
        register(router.target, **fields)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in refused.value.details()
    registered = register(router.target, address="10.0.0.1:9000", metadata={"zone": "a"})
    with RouterClient(router.target) as client:
        assert [w.worker_id for w in client.list_workers()] == [registered.worker_id]
        routed = client.route(prompt(1, 64))
        assert routed.decode_address == "10.0.0.1:9000"
