"""Router overhead: what a router adds per request, in front of a backend that
costs nothing (bench/openai_stub_backend.py: N tokens at once, no model).

Legs, one after another in one run, all in front of the same backend:

- direct: the load generator talks to the backend itself (its ceiling);
- kvrouter: `kvrouter serve --http-listen ... --served-models NAME=DIR`, the
  backend registered over the router's gRPC Register as an OpenAI-protocol
  worker (`WORKER_PROTOCOL_OPENAI`, kept alive by heartbeats from this
  process); the front door tokenizes the prompt, routes, POSTs the token ids
  to the backend with `return_token_ids` and re-encodes its stream;
- kvrouter-token-ids: the same, sent the prompt as token ids, so that the
  difference is the tokenizer's;
- kvrouter-before (with `--before PATH`): the kvrouter leg run from another
  checkout (a `git worktree` of an earlier commit, its extension built), so
  that a change to the front door is measured against what it replaces in
  the same run;
- asyncio-ceiling: a proxy on one asyncio event loop that only moves bytes
  (bench/asyncio_proxy_ceiling.py): the most any front door built as
  kvrouter's is (one Python loop) can reach on this machine;
- sglang-router and vllm-router (PyPI, from their own venv: `--router-venv`),
  each with its `cache_aware` policy.

The load generator is oha (a compiled, multi-threaded HTTP load generator;
`cargo install oha`): Python clients top out below the routers measured here.
Every request is a streaming `/v1/completions` with the same ~4k-token prompt
and `max_tokens` N; its latency is until the last byte (`data: [DONE]`).

First each leg's maximum requests/s (closed loop, `--max-concurrency`
connections), in `--rounds` rounds of every leg in turn: the maximum is the
best of all rounds, and the ratio to the faster Rust router is also given as
the median of the rounds' ratios, each of legs run minutes apart (this
shared machine's speed drifts by a fifth over a run). Then each leg's
latency (p50, p99) at one fixed rate: half of kvrouter's own maximum, the
median of its rounds' maxima (or `--rate`), so "added latency" compares
legs at the same load and is kvrouter's at half its maximum, as issue 15
asks. Every run also records the router's CPU time, in ms a request and
in cores busy. With `--profile`, py-spy records each kvrouter leg's
process under closed-loop load and the share of samples in each part of
the front door is reported.

Prints one table and writes bench/results/router_overhead.json.

    PYTHONPATH=$PWD .venv/bin/python bench/router_overhead.py --router-venv ~/router-venv --profile
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import psutil
from openai_stub_backend import TOKEN_TEXT
from router_overhead_profile import summarize

from kvrouter.demo.cluster import free_port
from kvrouter.engine.tiny_tokenizer import write_tiny_tokenizer
from kvrouter.frontend import ModelTokenizer
from kvrouter.proto_gen import router_pb2 as pb
from kvrouter.proto_gen import router_pb2_grpc

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "router_overhead.json"
MODEL = "stub"
# kvrouter again, sent the prompt as token ids: the front door without its tokenizer.
TOKEN_IDS_LEG = "kvrouter-token-ids"
# kvrouter again, from the checkout `--before` names.
BEFORE_LEG = "kvrouter-before"
KVROUTER_LEGS = ("kvrouter", TOKEN_IDS_LEG, BEFORE_LEG)
# A byte-moving asyncio proxy (bench/asyncio_proxy_ceiling.py): what any front
# door on one Python event loop can reach here.
CEILING_LEG = "asyncio-ceiling"
LEGS = (
    "direct",
    "kvrouter",
    BEFORE_LEG,
    TOKEN_IDS_LEG,
    CEILING_LEG,
    "sglang-router",
    "vllm-router",
)
RUST_ROUTERS = ("sglang-router", "vllm-router")
WORDS = ("alpha", "beta", "gamma", "delta", "omega", "router", "cache", "prefix", "block")


class LegUnavailable(Exception):
    """A leg that cannot run in this checkout or on this machine."""


def prompt_of(tokenizer: ModelTokenizer, tokens: int) -> str:
    """Text that encodes to exactly `tokens` tokens (with the bos)."""
    words = [WORDS[(i * 7 + i // 9) % len(WORDS)] + str(i % 97) for i in range(tokens)]
    text = " ".join(words)
    while len(tokenizer.encode(text)) > tokens:
        text = text[: len(text) - max(1, (len(tokenizer.encode(text)) - tokens) // 2)]
    return text


def tokenize_ms(tokenizer: ModelTokenizer, prompt: str, times: int = 50) -> float:
    """The median time the front door's tokenizer takes to encode `prompt`
    here, in this process: its share of kvrouter's added latency."""
    took = []
    for _ in range(times):
        start = time.perf_counter()
        tokenizer.encode(prompt)
        took.append(time.perf_counter() - start)
    return 1000 * statistics.median(took)


def wait_http(url: str, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        if process is not None and process.poll() is not None:
            raise LegUnavailable(f"exited with {process.returncode} before {url} answered")
        if time.monotonic() > deadline:
            raise LegUnavailable(f"{url} did not answer 200 in {timeout_s} s")
        time.sleep(0.2)


def start(
    command: list[str], log: Path, env: dict | None = None, cwd: Path | None = None
) -> subprocess.Popen:
    sink = log.open("w")
    return subprocess.Popen(
        command,
        stdout=sink,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


class OpenAiWorker:
    """The backend as a kvrouter worker of the OpenAI protocol: registered,
    and kept alive with heartbeats from a thread of this process."""

    def __init__(self, router: str, backend_url: str) -> None:
        if not hasattr(pb, "WORKER_PROTOCOL_OPENAI"):
            raise LegUnavailable(
                "this checkout's router has no HTTP dispatch (RegisterRequest.protocol)"
            )
        self.channel = grpc.insecure_channel(router)
        self.stub = router_pb2_grpc.RegistryStub(self.channel)
        request = pb.RegisterRequest(
            role=pb.ROLE_BOTH,
            address=backend_url,
            block_size=16,
            capacity_blocks=1 << 20,
            model=MODEL,
            protocol=pb.WORKER_PROTOCOL_OPENAI,
        )
        reply = self.stub.Register(request, timeout=10, wait_for_ready=True)
        self.worker_id = reply.worker_id
        self.token = reply.registration_token
        self.interval_s = reply.heartbeat_interval_s
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        beat = pb.HeartbeatRequest(worker_id=self.worker_id, registration_token=self.token)
        while not self.stopped.wait(self.interval_s):
            try:
                self.stub.Heartbeat(beat, timeout=5)
            except grpc.RpcError as e:
                print(f"heartbeat failed: {e.code().name}", file=sys.stderr)

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.channel.close()


class Leg:
    """One router (or none) in front of the backend, started and stopped."""

    def __init__(self, name: str, args, backend_url: str, tokenizer_dir: Path, logs: Path):
        self.name = name
        self.args = args
        self.backend_url = backend_url
        self.tokenizer_dir = tokenizer_dir
        self.logs = logs
        self.process: subprocess.Popen | None = None
        self.worker: OpenAiWorker | None = None
        self.url = backend_url

    def __enter__(self) -> Leg:
        if self.name == "direct":
            return self
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        log = self.logs / f"{self.name}.log"
        try:
            if self.name in KVROUTER_LEGS:
                self._start_kvrouter(port, log)
            elif self.name == CEILING_LEG:
                script = HERE / "asyncio_proxy_ceiling.py"
                command = [sys.executable, str(script), "--port", str(port)]
                command += ["--backend", self.backend_url]
                self.process = start(self._niced(command), log)
                wait_http(self.url + "/health", 60, self.process)
            else:
                self.process = start(self._niced(self._rust_router(port)), log)
                wait_http(self.url + "/health", 60, self.process)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _niced(self, command: list[str]) -> list[str]:
        """The router's command at `--router-nice`, the same for every leg."""
        if self.args.router_nice == 0:
            return command
        return ["nice", "-n", str(self.args.router_nice), *command]

    def _rust_router(self, port: int) -> list[str]:
        venv = self.args.router_venv
        common = [
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--worker-urls",
            self.backend_url,
            "--policy",
            "cache_aware",
            "--prometheus-port",
            str(free_port()),
            "--max-concurrent-requests",
            str(4 * max(self.args.max_concurrency)),
        ]
        if self.name == "sglang-router":
            if not (venv / "bin" / "sglang-router").exists():
                raise LegUnavailable(f"no sglang-router in {venv}")
            launcher = [str(venv / "bin" / "python"), "-m", "sglang_router.launch_router"]
            return launcher + common + ["--log-level", "warn"]
        if not (venv / "bin" / "vllm-router").exists():
            raise LegUnavailable(f"no vllm-router in {venv}")
        return [str(venv / "bin" / "vllm-router"), *common, "--log-level", "warning"]

    def _start_kvrouter(self, port: int, log: Path) -> None:
        grpc_port = free_port()
        command = [
            sys.executable,
            "-m",
            "kvrouter.cli",
            "serve",
            "--listen",
            f"127.0.0.1:{grpc_port}",
            "--metrics-listen",
            "",
            "--http-listen",
            f"127.0.0.1:{port}",
            "--served-models",
            f"{MODEL}={self.tokenizer_dir}",
            "--http-max-requests",
            str(4 * max(self.args.max_concurrency)),
            # The stub prefills nothing, so the router's predicted prefill
            # backlog is no reason for admission to hold requests back.
            "--http-max-backlog-ms",
            "1e9",
            "--log-level",
            "warning",
        ]
        env = cwd = None
        if self.name == BEFORE_LEG:
            if self.args.before is None:
                raise LegUnavailable("no --before checkout")
            # Run from the checkout: `python -m` puts the working directory
            # ahead of PYTHONPATH, so from this one it would import this code.
            env = os.environ | {"PYTHONPATH": str(self.args.before)}
            cwd = self.args.before
            check_imports_from(self.args.before, env)
        self.process = start(self._niced(command), log, env, cwd)
        wait_http(self.url + "/health", 60, self.process)
        self.worker = OpenAiWorker(f"127.0.0.1:{grpc_port}", self.backend_url)
        wait_http(self.url + "/ready", 30, self.process)

    def cpu_s(self) -> float:
        """CPU seconds the router's processes have used (0 for direct)."""
        if self.process is None:
            return 0.0
        root = psutil.Process(self.process.pid)
        processes = [root, *root.children(recursive=True)]
        return sum(t.user + t.system for t in (p.cpu_times() for p in processes))

    def __exit__(self, *_) -> None:
        if self.worker is not None:
            self.worker.close()
            self.worker = None
        if self.process is not None:
            stop(self.process)
            self.process = None


# oha's word for the requests still open when a timed run ends: not failures.
CUT_AT_END = "aborted due to deadline"


def oha(
    args,
    url: str,
    body: Path,
    *,
    seconds: float,
    concurrency: int,
    rate: float | None = None,
    keepalive: bool = True,
) -> dict:
    """One oha run against `url`; its JSON summary."""
    command = [
        args.oha,
        "--no-tui",
        "--output-format",
        "json",
        "-z",
        f"{seconds}s",
        "-c",
        str(concurrency),
        "-m",
        "POST",
        "-T",
        "application/json",
        "-D",
        str(body),
    ]
    if rate is not None:
        # Requests due at a fixed rate; a late one's latency counts from when
        # it was due, so a stall is not hidden (coordinated omission).
        command += ["-q", f"{rate:.1f}", "--latency-correction"]
    if not keepalive:
        command.append("--disable-keepalive")
    reply = subprocess.run(
        [*command, url + "/v1/completions"],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 60,
    )
    report = json.loads(reply.stdout)
    summary = report["summary"]
    statuses = report.get("statusCodeDistribution", {})
    ok = int(statuses.get("200", 0))
    failed = sum(int(n) for code, n in statuses.items() if code != "200")
    errors = report.get("errorDistribution", {})
    failed += sum(int(n) for error, n in errors.items() if error != CUT_AT_END)
    percentiles = report["latencyPercentiles"]
    return {
        "requests_per_s": ok / summary["total"],
        "ok": ok,
        "failed": failed,
        "p50_ms": 1000 * (percentiles.get("p50") or 0),
        "p99_ms": 1000 * (percentiles.get("p99") or 0),
        "mean_ms": 1000 * (summary.get("average") or 0),
        "errors": {error: n for error, n in errors.items() if error != CUT_AT_END},
    }


def check_imports_from(checkout: Path, env: dict) -> None:
    """LegUnavailable unless a router started from `checkout` imports its code."""
    found = subprocess.run(
        [sys.executable, "-c", "import kvrouter; print(kvrouter.__file__)"],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    if not Path(found).resolve().is_relative_to(checkout.resolve()):
        raise LegUnavailable(f"a router started from {checkout} imports {found}")


def check_stream(url: str, body: bytes, tokens: int) -> None:
    """One request by hand: a 200 SSE stream of `tokens` tokens ending in [DONE]."""
    request = urllib.request.Request(
        url + "/v1/completions", body, {"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        text = reply.read().decode()
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    if events[-1:] != ["[DONE]"]:
        raise LegUnavailable(f"the stream does not end in [DONE]: {text[-200:]!r}")
    chunks = [json.loads(e) for e in events[:-1]]
    got = sum(len(c.get("text") or "") for chunk in chunks for c in chunk.get("choices", []))
    if got != tokens:
        raise LegUnavailable(f"the stream had {got} tokens' text, not {tokens}: {text[-300:]!r}")


def profile(args, leg: Leg, body: Path, out: Path) -> dict:
    """py-spy on the router's process under closed-loop load: the share of
    samples in each part of the front door, and the top frames by self time."""
    py_spy = args.py_spy or shutil.which("py-spy")
    if py_spy is None:
        raise LegUnavailable("no py-spy (pip install py-spy; --py-spy PATH)")
    log = (leg.logs / "py-spy.log").open("w")
    record = subprocess.Popen(
        [
            py_spy,
            "record",
            "--pid",
            str(leg.process.pid),
            "--duration",
            str(round(args.seconds)),
            "--rate",
            "250",
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    time.sleep(1)
    oha(args, leg.url, body, seconds=args.seconds, concurrency=max(args.max_concurrency))
    if record.wait(timeout=60) != 0:
        raise LegUnavailable(f"py-spy failed: see {leg.logs / 'py-spy.log'}")
    return summarize(out.read_text())


# A timed run ends with requests still open; a slow router keeps working on
# them for a while, and the next run should not start behind them.
SETTLE_S = 3


def warm_up(args, leg: Leg, body: Path, rate: float | None) -> None:
    """2 s of load: closed loop before the maxima, at `rate` before the
    latency runs (a closed loop would leave a slow router a backlog)."""
    concurrency = min(args.max_concurrency) if rate is None else args.latency_concurrency
    oha(args, leg.url, body, seconds=2, concurrency=concurrency, rate=rate)
    time.sleep(SETTLE_S)


def timed_oha(leg: Leg, *args, **kwargs) -> dict:
    """`oha`, with the router's CPU time over the run: in ms a request, and in
    cores busy. A router that costs more a request at a fixed rate than at its
    closed-loop maximum runs busier than half at half that maximum."""
    cpu_before, wall_before = leg.cpu_s(), time.monotonic()
    run = oha(*args, **kwargs)
    cpu_s, wall_s = leg.cpu_s() - cpu_before, time.monotonic() - wall_before
    run["router_cpu_ms_per_request"] = 1000 * cpu_s / max(run["ok"], 1)
    run["router_cores_busy"] = cpu_s / wall_s
    return run


def measure(args, phase: str, leg: Leg, body: Path, rate: float | None, work: Path) -> dict:
    """The phase's runs on one leg: its maximum (the best closed-loop run), or its
    latency at `rate` over kept-alive connections and over a new connection
    a request, and, with --profile, a kvrouter leg's profile."""
    if phase == "max":
        runs = []
        for concurrency in args.max_concurrency:
            run = timed_oha(leg, args, leg.url, body, seconds=args.seconds, concurrency=concurrency)
            runs.append(run | {"concurrency": concurrency})
            time.sleep(SETTLE_S)
        return {"max_runs": runs}
    found = {}
    for key, keepalive in (("latency", True), ("latency_new_connections", False)):
        found[key] = timed_oha(
            leg,
            args,
            leg.url,
            body,
            seconds=args.latency_seconds,
            concurrency=args.latency_concurrency,
            rate=rate,
            keepalive=keepalive,
        )
        time.sleep(SETTLE_S)
    if args.profile and leg.name in KVROUTER_LEGS:
        found["profile"] = profile(args, leg, body, work / f"{leg.name}.pyspy.txt")
    return found


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="router-overhead-"))
    logs = work / "logs"
    logs.mkdir()
    tokenizer_dir = work / "tokenizer"
    tokenizer_dir.mkdir()
    write_tiny_tokenizer(tokenizer_dir, vocab_size=256, model_max_length=1 << 20)
    tokenizer = ModelTokenizer.from_dir(tokenizer_dir)
    prompt = prompt_of(tokenizer, args.prompt_tokens)
    (token_id,) = tokenizer.encode(TOKEN_TEXT, add_special_tokens=False)
    bodies = {}
    for kind, value in (("text", prompt), ("ids", tokenizer.encode(prompt))):
        request = {"model": MODEL, "prompt": value, "max_tokens": args.output_tokens}
        bodies[kind] = work / f"{kind}.json"
        bodies[kind].write_text(json.dumps(request | {"stream": True}))
    backend_port = free_port()
    backend_url = f"http://127.0.0.1:{backend_port}"
    backend = start(
        [
            sys.executable,
            str(HERE / "openai_stub_backend.py"),
            "--port",
            str(backend_port),
            "--processes",
            str(args.backend_processes),
            "--token-id",
            str(token_id),
        ],
        logs / "backend.log",
    )
    results = {name: {} for name in args.legs}
    try:
        wait_http(backend_url + "/health", 30, backend)
        rate = None
        # The maxima are taken in rounds, each leg in turn, so that the legs
        # of one round ran within minutes of each other and a drift of the
        # machine's speed over the run does not favour the legs run first.
        steps = [("max", r) for r in range(args.rounds)] + [("latency", 0)]
        for phase, round_ in steps:
            if phase == "latency":
                rate = args.rate or _latency_rate(results)
            for name in args.legs:
                if "error" in results[name]:
                    continue
                body = bodies["ids" if name == TOKEN_IDS_LEG else "text"]
                try:
                    with Leg(name, args, backend_url, tokenizer_dir, logs) as leg:
                        check_stream(leg.url, body.read_bytes(), args.output_tokens)
                        warm_up(args, leg, body, rate)
                        found = measure(args, phase, leg, body, rate, work)
                except (LegUnavailable, subprocess.CalledProcessError) as e:
                    results[name] = {"error": str(e)}
                    print(f"{phase} {name}: {results[name]}", flush=True)
                    continue
                if phase == "max":
                    _add_round(results[name], round_, found["max_runs"])
                    done = results[name]["round_max"][-1]
                    print(f"max {name}, round {round_ + 1}: {done:.0f} requests/s", flush=True)
                else:
                    results[name].update(found)
                    print(f"{phase} {name}: {found}", flush=True)
    finally:
        stop(backend)
    return {
        "prompt_tokens": args.prompt_tokens,
        "prompt_chars": len(prompt),
        "tokenize_prompt_ms": tokenize_ms(tokenizer, prompt),
        "output_tokens": args.output_tokens,
        "latency_rate_per_s": rate,
        "max_concurrency": args.max_concurrency,
        "latency_concurrency": args.latency_concurrency,
        "seconds_per_run": args.seconds,
        "rounds": args.rounds,
        "seconds_per_latency_run": args.latency_seconds,
        "backend_processes": args.backend_processes,
        "router_nice": args.router_nice,
        "cpus": os.cpu_count(),
        "load_before": args.load_before,
        "load_after": os.getloadavg(),
        "python": platform.python_version(),
        "logs": str(logs),
        "legs": _with_ratios(results),
    }


def _add_round(result: dict, round_: int, runs: list[dict]) -> None:
    """One round's closed-loop runs of a leg: its maximum for the round,
    and the best of every round so far as the leg's `max`."""
    runs = [run | {"round": round_} for run in runs]
    result.setdefault("max_runs", []).extend(runs)
    result.setdefault("round_max", []).append(max(r["requests_per_s"] for r in runs))
    result["max"] = max(result["max_runs"], key=lambda r: r["requests_per_s"])


def _latency_rate(results: dict) -> float:
    """Half of kvrouter's maximum, or of the slowest leg's when it has none.
    A leg's maximum here is the median of its rounds' maxima, not the best
    round: on this shared machine one round can run a quarter faster than
    the others (kvrouter 6,166 requests/s against 4,634 and 4,828 in one
    run), and at half of such a round every leg's tail broke."""
    kvrouter = results.get("kvrouter", {})
    if "round_max" in kvrouter:
        return statistics.median(kvrouter["round_max"]) / 2
    maxima = [statistics.median(r["round_max"]) for r in results.values() if "round_max" in r]
    if not maxima:
        raise SystemExit("no leg ran")
    return min(maxima) / 2


def _with_ratios(results: dict) -> dict:
    """Added latency against the direct leg's; each maximum against the
    faster Rust router's, overall and as the median of the rounds' ratios
    (a round's ratio compares legs run minutes apart, not the whole run)."""
    rust = [
        results[n]["max"]["requests_per_s"] for n in RUST_ROUTERS if "max" in results.get(n, {})
    ]
    rust_rounds = [results[n]["round_max"] for n in RUST_ROUTERS if "max" in results.get(n, {})]
    for result in results.values():
        if rust_rounds and "round_max" in result:
            faster = [max(maxima) for maxima in zip(*rust_rounds, strict=True)]
            ratios = [m / f for m, f in zip(result["round_max"], faster, strict=True)]
            result["round_vs_faster_rust_router"] = ratios
            result["median_round_vs_faster_rust_router"] = statistics.median(ratios)
        for key in ("latency", "latency_new_connections"):
            base = results.get("direct", {}).get(key)
            if base and key in result:
                result[key]["added_p50_ms"] = result[key]["p50_ms"] - base["p50_ms"]
                result[key]["added_p99_ms"] = result[key]["p99_ms"] - base["p99_ms"]
        if rust and "max" in result:
            result["max_vs_faster_rust_router"] = result["max"]["requests_per_s"] / max(rust)
    return results


def table(report: dict) -> str:
    """Latency (p50, p99 and added to direct's, in ms) over kept-alive
    connections and over a new connection a request, then the maximum."""
    nan = float("nan")
    rows = [
        f"{'':18} {'kept-alive connections':^35} {'a new connection a request':^35}",
        f"{'leg':18}"
        + " {:>8} {:>8} {:>8} {:>8}".format("p50", "p99", "+p50", "+p99") * 2
        + f" {'max req/s':>10} {'vs faster Rust':>14} {'median of rounds':>16}",
    ]
    for name, result in report["legs"].items():
        if "error" in result:
            rows.append(f"{name:<18} ({result['error']})")
            continue
        cells = []
        for key in ("latency", "latency_new_connections"):
            latency = result.get(key, {})
            cells += [
                latency.get(f, nan) for f in ("p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms")
            ]
        maximum = result.get("max", {}).get("requests_per_s", nan)
        ratio = result.get("max_vs_faster_rust_router", nan)
        median = result.get("median_round_vs_faster_rust_router", nan)
        rows.append(
            f"{name:<18}"
            + "".join(f" {c:>8.2f}" for c in cells)
            + f" {maximum:>10.0f} {ratio:>14.2f} {median:>16.2f}"
        )
    rows += [
        "",
        f"{'router CPU':18} {'ms a request at max':>20} {'at the rate':>12} {'cores busy':>11}",
    ]
    for name, result in report["legs"].items():
        if name == "direct" or "error" in result:
            continue
        at_max = result.get("max", {}).get("router_cpu_ms_per_request", nan)
        at_rate = result.get("latency", {}).get("router_cpu_ms_per_request", nan)
        busy = result.get("latency", {}).get("router_cores_busy", nan)
        rows.append(f"{name:<18} {at_max:>20.3f} {at_rate:>12.3f} {busy:>11.2f}")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--legs", nargs="+", choices=LEGS, default=[n for n in LEGS if n != BEFORE_LEG]
    )
    parser.add_argument("--router-venv", type=Path, default=Path.home() / "router-venv")
    parser.add_argument(
        "--before", type=Path, help=f"a kvrouter checkout to run as the {BEFORE_LEG} leg"
    )
    parser.add_argument("--oha", default=shutil.which("oha") or "oha")
    parser.add_argument("--py-spy", help="py-spy binary (default: on PATH)")
    parser.add_argument("--profile", action="store_true", help="py-spy the kvrouter legs")
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--output-tokens", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=10, help="each closed-loop run's")
    # Longer: at half a slow router's maximum, 10 s holds too few requests for a p99.
    parser.add_argument("--latency-seconds", type=float, default=20)
    # The maximum is the best of closed-loop runs at each: a router that holds
    # each response ~40 ms needs many connections to reach its CPU's limit.
    parser.add_argument("--max-concurrency", type=int, nargs="+", default=[64, 128, 256])
    # Enough open connections that a router holding each response ~40 ms
    # (see docs/benchmarks.md) still keeps up with the rate.
    parser.add_argument("--latency-concurrency", type=int, default=128)
    parser.add_argument(
        "--rounds", type=int, default=1, help="rounds of every leg's closed-loop runs"
    )
    parser.add_argument(
        "--rate", type=float, help="latency runs' rate (default: half kvrouter's max)"
    )
    parser.add_argument("--backend-processes", type=int, default=2)
    # Below 0, every router outranks the load generator and the backend on
    # the shared cores, as a router on cores of its own would.
    parser.add_argument(
        "--router-nice", type=int, default=0, help="niceness of every router leg's process"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.load_before = os.getloadavg()
    report = run(args)
    print(table(report))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
