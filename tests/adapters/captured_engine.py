"""Plays back KV event frames captured from a real vLLM
(scripts/capture_engine_events.py, tests/fixtures/vllm-<version>/): one PUB
and one ROUTER socket per captured DP rank, on consecutive free loopback
ports (global rank r on base + r, as vLLM offsets them). The ROUTER answers
replay requests with vLLM's own captured answer, limited to the batches
published so far, as the engine's buffer would be."""

from __future__ import annotations

import base64
import json
import threading
from pathlib import Path

import zmq

from kvrouter.adapters.vllm import EngineConfig

from .vllm_publisher import bind_consecutive

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def load_capture(version: str, scenario: str) -> dict:
    return json.loads((FIXTURES / f"vllm-{version}" / f"{scenario}.json").read_text())


def _frames(encoded: list[str]) -> list[bytes]:
    return [base64.b64decode(frame) for frame in encoded]


class CapturedRank:
    def __init__(self, pub: zmq.Socket, replay: zmq.Socket, captured: dict) -> None:
        self.pub, self.replay = pub, replay
        self.live = [_frames(message) for message in captured["pub"]]
        answer = [_frames(message) for message in captured["replay_from_0"]]
        self.replay_batches, self.replay_end = answer[:-1], answer[-1]
        self.published = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve_replay, daemon=True)
        self._thread.start()

    def publish_all(self) -> None:
        for frames in self.live:
            with self._lock:
                self.published += 1
            self.pub.send_multipart(frames)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.pub.close(linger=0)

    def _serve_replay(self) -> None:
        try:
            while not self._stop.is_set():
                if not self.replay.poll(20):
                    continue
                identity, _, start = self.replay.recv_multipart()
                start_seq = int.from_bytes(start, "big")
                with self._lock:
                    published = self.published
                for frames in self.replay_batches[start_seq:published]:
                    self.replay.send_multipart([identity, *frames])
                self.replay.send_multipart([identity, *self.replay_end])
        finally:
            self.replay.close(linger=0)


class CapturedEngine:
    """`engine.config` subscribes to it; `engine.publish_all()` sends every
    captured batch live."""

    def __init__(self, ctx: zmq.Context, capture: dict) -> None:
        ranks = [p["dp_rank"] for p in capture["publishers"]]
        count = max(ranks) + 1
        pubs, pub_base = bind_consecutive(ctx, zmq.PUB, count)
        replays, replay_base = bind_consecutive(ctx, zmq.ROUTER, count)
        for rank in range(count):
            if rank not in ranks:
                pubs[rank].close(linger=0)
                replays[rank].close(linger=0)
        self.ranks = {
            p["dp_rank"]: CapturedRank(pubs[p["dp_rank"]], replays[p["dp_rank"]], p)
            for p in capture["publishers"]
        }
        self.base, self.replay_base = pub_base, replay_base
        settings = {
            "name": capture["scenario"],
            "endpoint": f"tcp://127.0.0.1:{pub_base}",
            "replay_endpoint": f"tcp://127.0.0.1:{replay_base}",
            "topic": capture["topic"],
            **capture["engine"],
        }
        self.config = EngineConfig(**settings)

    def batches(self, rank: int) -> int:
        return len(self.ranks[rank].live)

    def publish_all(self) -> None:
        for rank in self.ranks.values():
            rank.publish_all()

    def close(self) -> None:
        for rank in self.ranks.values():
            rank.close()
