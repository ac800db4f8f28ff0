"""A KV event sink that keeps the router's view of one worker's cache."""

from __future__ import annotations


class RecordingSink:
    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.events: list[tuple] = []
        # block id -> its token ids, as a router would hold it.
        self.view: dict[int, list[int]] = {}

    def stored(self, parent_block_id, block_ids, token_ids, tier) -> None:
        assert tier == "device"
        assert len(token_ids) == len(block_ids) * self.block_size
        self.events.append(("stored", parent_block_id, list(block_ids), list(token_ids)))
        for index, block_id in enumerate(block_ids):
            start = index * self.block_size
            self.view[block_id] = list(token_ids[start : start + self.block_size])

    def removed(self, block_ids, tier) -> None:
        assert tier == "device"
        self.events.append(("removed", list(block_ids)))
        for block_id in block_ids:
            del self.view[block_id]

    def cleared(self) -> None:
        self.events.append(("cleared",))
        self.view.clear()

    def stored_ids(self) -> list[int]:
        return [block_id for event in self.events if event[0] == "stored" for block_id in event[2]]
