"""Where replicas meet on NATS: the JetStream stream of KV event batches,
the subject of shared routing decisions and the bucket of worker ids."""

from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class NatsConfig:
    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    stream: str = "KVROUTER_EVENTS"
    # Batches go to `<prefix>.events.<worker id>`, decisions to `<prefix>.load`.
    subject_prefix: str = "kvrouter"
    # How long the stream keeps batches. A replica down for longer resumes
    # with gaps, which resync the workers concerned.
    max_age_s: float = 24 * 3600.0
    # Copies of the stream in a NATS cluster (3 survives a server loss).
    stream_replicas: int = 1

    def __post_init__(self) -> None:
        if not _TOKEN.match(self.stream):
            raise ValueError(f"stream name {self.stream!r}: use letters, digits, - and _")
        if not all(_TOKEN.match(part) for part in self.subject_prefix.split(".")):
            raise ValueError(f"subject prefix {self.subject_prefix!r} is not a NATS subject")

    def event_subject(self, worker_id: int) -> str:
        return f"{self.subject_prefix}.events.{worker_id}"

    @property
    def event_subjects(self) -> str:
        return f"{self.subject_prefix}.events.*"

    @property
    def load_subject(self) -> str:
        return f"{self.subject_prefix}.load"

    @property
    def id_bucket(self) -> str:
        """The key-value bucket of the worker ids the replicas have reserved."""
        return f"{self.stream}_WORKER_IDS"


def check_name(name: str) -> str:
    """A replica name doubles as its durable consumer's name."""
    if not _TOKEN.match(name):
        raise ValueError(f"replica name {name!r}: use letters, digits, - and _")
    return name
