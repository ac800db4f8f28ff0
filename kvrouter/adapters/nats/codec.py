"""Worker batches on the wire (msgpack):
`[worker_id, seq, resync, [event, ...]]` with events
`["stored", block_ids, token_ids, parent, tier, namespace]` (and the local
hashes after them, when the event has some), `["removed", block_ids, tier]`,
`["ends_reusable", block_ids, reusable]` and `["cleared"]`. Tiers are their
names."""

from __future__ import annotations

import msgspec

from kvrouter.events import Cleared, EndsReusable, Event, Removed, Stored, WorkerBatch

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def encode_batch(batch: WorkerBatch) -> bytes:
    return _encoder.encode(
        [batch.worker_id, batch.seq, batch.resync, [_encode_event(e) for e in batch.events]]
    )


def _encode_event(event: Event) -> list:
    match event:
        case Stored():
            fields = [
                "stored",
                event.block_ids,
                event.token_ids,
                event.parent,
                event.tier,
                event.namespace,
            ]
            return fields + [event.local_hashes] if event.local_hashes else fields
        case Removed():
            return ["removed", event.block_ids, event.tier]
        case EndsReusable():
            return ["ends_reusable", event.block_ids, event.reusable]
        case Cleared():
            return ["cleared"]
    raise TypeError(f"{type(event).__name__} is not a KV event")


def decode_batch(data: bytes) -> WorkerBatch:
    """Raises ValueError for anything but a batch this module encoded."""
    try:
        worker, seq, resync, events = _decoder.decode(data)
        return WorkerBatch(int(worker), int(seq), [_decode_event(e) for e in events], bool(resync))
    except (msgspec.DecodeError, TypeError, ValueError) as exc:
        raise ValueError(f"not a kvrouter event batch: {exc}") from exc


def _decode_event(raw: list) -> Event:
    kind, *fields = raw
    if kind == "stored":
        ids, tokens, parent, tier, namespace, *rest = fields
        (local_hashes,) = rest or ((),)
        return Stored(
            ids, tokens, parent=parent, tier=tier, namespace=namespace, local_hashes=local_hashes
        )
    if kind == "removed":
        ids, tier = fields
        return Removed(ids, tier)
    if kind == "ends_reusable":
        ids, reusable = fields
        return EndsReusable(ids, bool(reusable))
    if kind == "cleared":
        return Cleared()
    raise ValueError(f"unknown event kind {kind!r}")
