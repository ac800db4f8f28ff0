"""What a worker that never reads the router's replies costs the router: a
real `kvrouter serve` and one Publish stream over raw HTTP/2 that grants it
no window to reply in (tests/reliability/unread_publish.py), sending empty
batches as fast as the router takes them. The router's RSS is sampled as
the batches go in; bounded replies keep it flat, one queued reply per batch
grows it by every batch.

    .venv/bin/python bench/unread_replies_memory.py [--batches 100000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS))

from reliability.unread_publish import UnreadPublish  # noqa: E402
from route_stream_memory import rss_mb  # noqa: E402
from serve_process import ServeProcess  # noqa: E402

from kvrouter.client import WorkerRegistration  # noqa: E402
from kvrouter.proto_gen import router_pb2 as pb  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "unread_replies_memory.json"


def measure(batches: int, samples: int) -> list[dict]:
    # Long enough that the router keeps the stream open for the whole run.
    router = ServeProcess(env={"KVROUTER_EVENT_ACK_TIMEOUT_S": "3600"})
    registration = WorkerRegistration(router.target, role="both", capacity_blocks=100, worker_id=1)
    registration.start_background()
    stream = UnreadPublish(router.port, pb.PublishHello(worker_id=1, next_seq=0, block_size=16))
    rows = []
    started = time.monotonic()
    try:
        for seq in range(batches):
            if seq % (batches // samples) == 0:
                rows.append(
                    {
                        "batches": seq,
                        "t_s": round(time.monotonic() - started, 1),
                        "rss_mb": round(rss_mb(router.proc.pid), 1),
                    }
                )
            stream.send(pb.PublishRequest(batch=pb.EventBatch(seq=seq)))
        time.sleep(1)
        rows.append({"batches": batches, "t_s": round(time.monotonic() - started, 1),
                     "rss_mb": round(rss_mb(router.proc.pid), 1)})  # fmt: skip
    finally:
        stream.close()
        registration.stop_background(deregister=False)
        router.kill()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    rows = measure(args.batches, args.samples)
    print(f"{'batches':>9} {'t_s':>7} {'rss_mb':>8}")
    for row in rows:
        print(f"{row['batches']:>9} {row['t_s']:>7} {row['rss_mb']:>8}")
    growth = rows[-1]["rss_mb"] - rows[1]["rss_mb"]
    print(f"RSS growth after the first sample: {growth:.1f} MB over {args.batches} unread batches")
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps({"batches": args.batches, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
