"""One list of worker roles, checked the same way by every layer that
takes a role: the policy, the router's worker table and the worker."""

from __future__ import annotations

import pytest

from kvrouter._core import PrefixIndex
from kvrouter.policy import Router
from kvrouter.roles import ROLES
from kvrouter.service.errors import ServiceError
from kvrouter.service.workers import WorkerRecord, WorkerTable
from kvrouter.worker import WorkerConfig


def test_roles_are_prefill_decode_and_both():
    assert ROLES == ("prefill", "decode", "both")


@pytest.mark.parametrize("role", ROLES)
def test_every_layer_takes_each_role(role):
    index = PrefixIndex(16)
    Router(index).upsert_worker(1, role, 100)
    WorkerTable(Router(index), index, heartbeat_ttl_s=5.0).register(
        WorkerRecord(2, role, "w2:1", 16, 100)
    )
    WorkerConfig(model="m", role=role).validate()


def test_every_layer_refuses_another_role():
    index = PrefixIndex(16)
    with pytest.raises(ValueError, match="role"):
        Router(index).upsert_worker(1, "verify", 100)
    with pytest.raises(ServiceError, match="role"):
        WorkerTable(Router(index), index, heartbeat_ttl_s=5.0).register(
            WorkerRecord(2, "verify", "w2:1", 16, 100)
        )
    with pytest.raises(ValueError, match="role"):
        WorkerConfig(model="m", role="verify").validate()  # type: ignore[arg-type]
