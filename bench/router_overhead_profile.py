"""Where a front door's time goes, from py-spy's raw (collapsed) stacks: each
sample is charged to the part that owns the frame nearest its leaf, skipping
the standard library's frames (asyncio, json, ...) when an owner is further
up, so a socket read under an HTTP client counts as the HTTP client."""

from __future__ import annotations

import re
from collections import Counter

# Checked in order; the first whose marker is in a frame ("function (file:line)") owns it.
PARTS = (
    ("tokenize", ("kvrouter/frontend/tokenizer.py", "tokenizers/")),
    (
        "detokenize",
        (
            "kvrouter/frontend/detokenizer.py",
            "kvrouter/frontend/text_stream.py",
            "kvrouter/frontend/stop.py",
        ),
    ),
    ("SSE encode (completion chunks)", ("kvrouter/service/openai/completion.py",)),
    (
        "HTTP server (the front door's, or uvicorn)",
        ("net/http1_server.py", "openai/routes.py", "uvicorn/", "httptools/"),
    ),
    ("request parse and checks (front door)", ("kvrouter/service/openai/",)),
    (
        "HTTP client (to the engine, and its SSE parse)",
        ("kvrouter/service/openai_worker.py", "kvrouter/net/http_client.py"),
    ),
    (
        "routing",
        (
            "kvrouter/service/routing.py",
            "kvrouter/service/generate.py",
            "kvrouter/service/workers.py",
            "kvrouter/policy/",
        ),
    ),
    ("gRPC", ("grpc/",)),
    # The router's own frame under uvloop's run: the loop's native work
    # (polling, socket reads and writes) shows as time in it.
    ("event loop (uvloop, socket I/O)", ("run (kvrouter/service/server.py",)),
    ("kvrouter, other", ("kvrouter/",)),
    # Pool threads between jobs: the front door's executor runs the tokenizer.
    ("thread pool hand-off", ("concurrent/futures/thread.py",)),
)
STDLIB = "event loop and standard library"
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _owner(frame: str) -> str | None:
    for part, markers in PARTS:
        if any(marker in frame for marker in markers):
            return part
    return None


def _short(file: str) -> str:
    for marker in ("kvrouter/", "site-packages/"):
        if marker in file:
            return file[file.index(marker) + (0 if marker == "kvrouter/" else len(marker)) :]
    return file.rsplit("/", 2)[-1]


def summarize(raw: str, top: int = 15) -> dict:
    """{"samples", "parts": {part: share}, "top_frames": [[frame, share]]}."""
    parts: Counter[str] = Counter()
    frames: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        samples = int(count)
        total += samples
        owner, owned_by = STDLIB, None
        for frame in reversed(stack.split(";")):
            match = FRAME.match(frame)
            if match is None:
                continue
            part = _owner(frame)
            if part is not None:
                owner, owned_by = part, f"{match['function']} ({_short(match['file'])})"
                break
        parts[owner] += samples
        leaf = FRAME.match(stack.rsplit(";", 1)[-1])
        frames[owned_by or (f"{leaf['function']} ({_short(leaf['file'])})" if leaf else stack)] += (
            samples
        )
    share = (lambda n: round(n / total, 4)) if total else (lambda n: 0.0)
    return {
        "samples": total,
        "parts": {part: share(n) for part, n in parts.most_common()},
        "top_frames": [[frame, share(n)] for frame, n in frames.most_common(top)],
    }
