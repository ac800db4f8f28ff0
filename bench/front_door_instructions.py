"""What a front-door request costs the router, in instructions: the count
does not move with the machine's load, where requests/s on this shared
2-core machine move by a quarter between runs minutes apart.

`kvrouter serve` runs under valgrind's callgrind (one file per thread), in
front of bench/openai_stub_backend.py registered as an OpenAI-protocol
worker, and oha sends the router-overhead bench's request (a streamed
`/v1/completions` of a 4,096-token prompt, 16 tokens back): a warm-up, then
N requests, then SIGTERM. It is run for two N; the main thread's (the event
loop's) instructions between them, over the requests between them, are one
request's, with start-up, warm-up and shut-down cancelled out. With
`--before PATH` the same is measured for another checkout (a `git worktree`
of an earlier commit, its extension built), started from that checkout so
that it imports its own code. `--token-ids` sends the prompt as its ids.

Prints a table and writes bench/results/front_door_instructions.json.
Needs valgrind (Debian's package) and oha (`cargo install oha`); about 5
minutes a checkout.

    PYTHONPATH=$PWD .venv/bin/python bench/front_door_instructions.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from openai_stub_backend import TOKEN_TEXT
from router_overhead import (
    MODEL,
    LegUnavailable,
    OpenAiWorker,
    check_imports_from,
    prompt_of,
    start,
    stop,
    wait_http,
)

from kvrouter.demo.cluster import free_port
from kvrouter.engine.tiny_tokenizer import write_tiny_tokenizer
from kvrouter.frontend import ModelTokenizer

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "front_door_instructions.json"
WARM_UP_REQUESTS = 50
# valgrind runs the router some 50 times slower: no worker may expire meanwhile.
HEARTBEAT_TTL_S = 600


def _oha(args, url: str, body: Path, requests: int) -> None:
    command = [args.oha, "-n", str(requests), "-c", "4", "--no-tui", "-m", "POST"]
    command += ["-H", "content-type: application/json", "-D", str(body)]
    done = subprocess.run(command + [url + "/v1/completions"], capture_output=True, text=True)
    if "Success rate:\t100.00%" not in done.stdout:
        raise SystemExit(f"requests failed:\n{done.stdout}{done.stderr}")


def main_thread_instructions(args, checkout: Path | None, requests: int, work: Path) -> int:
    """The router's main thread's instructions over a warm-up and `requests`."""
    grpc_port, http_port = free_port(), free_port()
    out = work / f"callgrind.{requests}.{'before' if checkout else 'this'}"
    command = ["valgrind", "--tool=callgrind", "--separate-threads=yes"]
    command += [f"--callgrind-out-file={out}", sys.executable, "-m", "kvrouter.cli", "serve"]
    command += ["--listen", f"127.0.0.1:{grpc_port}", "--http-listen", f"127.0.0.1:{http_port}"]
    command += ["--metrics-listen", "", "--served-models", f"{MODEL}={args.tokenizer_dir}"]
    command += ["--http-max-backlog-ms", "1e9", "--log-level", "warning"]
    command += ["--heartbeat-ttl-s", str(HEARTBEAT_TTL_S)]
    env = None
    if checkout is not None:
        env = os.environ | {"PYTHONPATH": str(checkout)}
        check_imports_from(checkout, env)
    router = start(command, work / "router.log", env, checkout)
    url = f"http://127.0.0.1:{http_port}"
    worker = None
    try:
        wait_http(url + "/health", 600, router)
        worker = OpenAiWorker(f"127.0.0.1:{grpc_port}", args.backend_url)
        wait_http(url + "/ready", 300, router)
        _oha(args, url, args.body, WARM_UP_REQUESTS)
        _oha(args, url, args.body, requests)
        router.send_signal(signal.SIGTERM)
        router.wait(600)
    finally:
        if worker is not None:
            worker.close()
        stop(router)
    # Thread 1 is the main thread: the event loop the front door runs on.
    for line in Path(f"{out}-01").read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no instruction count in {out}-01")


def per_request(args, checkout: Path | None, work: Path) -> float:
    few, many = args.requests
    counts = {n: main_thread_instructions(args, checkout, n, work) for n in (few, many)}
    return (counts[many] - counts[few]) / (many - few)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="another checkout to measure too")
    parser.add_argument("--requests", type=int, nargs=2, default=[100, 400])
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument(
        "--token-ids", action="store_true", help="send the prompt as its token ids, not text"
    )
    parser.add_argument("--oha", default=shutil.which("oha") or "oha")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind: apt-get install valgrind")
    work = Path(tempfile.mkdtemp(prefix="front-door-instructions-"))
    args.tokenizer_dir = work / "tokenizer"
    args.tokenizer_dir.mkdir()
    write_tiny_tokenizer(args.tokenizer_dir, vocab_size=256, model_max_length=1 << 20)
    tokenizer = ModelTokenizer.from_dir(args.tokenizer_dir)
    (token_id,) = tokenizer.encode(TOKEN_TEXT, add_special_tokens=False)
    args.body = work / "body.json"
    prompt = prompt_of(tokenizer, args.prompt_tokens)
    if args.token_ids:
        prompt = list(tokenizer.encode(prompt))
    request = {"model": MODEL, "prompt": prompt, "max_tokens": 16, "stream": True}
    args.body.write_text(json.dumps(request))
    backend_port = free_port()
    args.backend_url = f"http://127.0.0.1:{backend_port}"
    backend = start(
        [sys.executable, str(HERE / "openai_stub_backend.py"), "--port", str(backend_port)]
        + ["--processes", "1", "--token-id", str(token_id)],
        work / "backend.log",
    )
    results = {}
    try:
        wait_http(args.backend_url + "/health", 30, backend)
        for name, checkout in (("this checkout", None), ("before", args.before)):
            if name == "before" and checkout is None:
                continue
            try:
                results[name] = per_request(args, checkout, work)
            except LegUnavailable as e:
                results[name] = None
                print(f"{name}: {e}", file=sys.stderr)
    finally:
        stop(backend)
    rows = [f"{'router':<16} {'instructions a request':>24} {'÷ this checkout':>16}"]
    for name, count in results.items():
        ratio = count / results["this checkout"] if count else float("nan")
        rows.append(f"{name:<16} {count or float('nan'):>24,.0f} {ratio:>16.2f}")
    print("\n".join(rows))
    report = {
        "requests": args.requests,
        "prompt_tokens": args.prompt_tokens,
        "prompt_as": "token ids" if args.token_ids else "text",
        "before": str(args.before) if args.before else None,
        "main_thread_instructions_per_request": results,
    }
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
