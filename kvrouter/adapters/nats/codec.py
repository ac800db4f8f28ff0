"""Worker batches on the wire (msgpack):
`[worker_id, seq, resync, [event, ...]]` with events
`["stored", block_ids, token_ids, parent, tier, namespace]`,
`["removed", block_ids, tier]` and `["cleared"]`."""

from __future__ import annotations

import msgspec

from kvrouter.adapters.events import ClearedAll, Event, RemovedBlocks, StoredBlocks, WorkerBatch

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


def encode_batch(batch: WorkerBatch) -> bytes:
    return _encoder.encode([batch.worker_id, batch.seq, batch.resync,
                            [_encode_event(e) for e in batch.events]])


def _encode_event(event: Event) -> list:
    if isinstance(event, StoredBlocks):
        return ["stored", event.block_ids, event.token_ids, event.parent, event.tier,
                event.namespace]
    if isinstance(event, RemovedBlocks):
        return ["removed", event.block_ids, event.tier]
    return ["cleared"]


def decode_batch(data: bytes) -> WorkerBatch:
    """Raises ValueError for anything but a batch this module encoded."""
    try:
        worker, seq, resync, events = _decoder.decode(data)
        return WorkerBatch(int(worker), int(seq), [_decode_event(e) for e in events],
                           bool(resync))
    except (msgspec.DecodeError, TypeError, ValueError) as exc:
        raise ValueError(f"not a kvrouter event batch: {exc}") from exc


def _decode_event(raw: list) -> Event:
    kind, *fields = raw
    if kind == "stored":
        ids, tokens, parent, tier, namespace = fields
        return StoredBlocks(ids, tokens, parent, tier, namespace)
    if kind == "removed":
        ids, tier = fields
        return RemovedBlocks(ids, tier)
    if kind == "cleared":
        return ClearedAll()
    raise ValueError(f"unknown event kind {kind!r}")
