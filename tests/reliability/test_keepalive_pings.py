"""The router accepts the keepalive pings of kvrouter's channels, even on a
connection with no calls: a server that allows fewer answers the third
early ping with GOAWAY (too_many_pings) and drops every idle client. The
client here pings a little more often than kvrouter's channels do, so that
three pings take seconds, not half a minute."""

from __future__ import annotations

import time

import grpc

from kvrouter.net.channels import CHANNEL_OPTIONS, KEEPALIVE_TIME_MS
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

# Above the router's floor (half of KEEPALIVE_TIME_MS), below kvrouter's own.
PING_EVERY_MS = KEEPALIVE_TIME_MS // 2 + 500
READY = grpc.ChannelConnectivity.READY


def test_an_idle_channel_keeps_its_connection(start_router):
    router = start_router()
    options = [o for o in CHANNEL_OPTIONS if o[0] != "grpc.keepalive_time_ms"]
    states: list[grpc.ChannelConnectivity] = []
    with grpc.insecure_channel(
        router.target, options=[*options, ("grpc.keepalive_time_ms", PING_EVERY_MS)]
    ) as channel:
        channel.subscribe(states.append)
        router_pb2_grpc.RegistryStub(channel).List(pb.ListWorkersRequest(), timeout=5)
        # Four pings' time with no call: the router's ping policy is what is
        # tested, so the wait is the point, not a timing assertion.
        time.sleep(4 * PING_EVERY_MS / 1000)
        assert states[-1] == READY
        assert states.count(READY) == 1  # never dropped and dialled again
