"""The demo's tables: one per turn, and a summary of kv-aware routing
against round robin on the same workload."""

from __future__ import annotations

from kvrouter.demo.burst import BURST, BURST_PROMPT_TOKENS, STREAMS, BurstRun
from kvrouter.demo.runner import WorkloadRun


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def turn_tables(run: WorkloadRun, block_size: int) -> str:
    headers = ["session", "prompt", "TTFT ms", "P", "D", "mode", "cached", "reused", "moved", "KiB"]
    out = []
    for turn in sorted({t.turn for t in run.turns}):
        rows = []
        for t in (t for t in run.turns if t.turn == turn):
            s, r = t.result.stats, t.result
            rows.append(
                [
                    t.session,
                    str(t.prompt_tokens),
                    f"{t.client_ttft_ms:.1f}",
                    str(r.prefill_worker) if r.prefill_worker is not None else "-",
                    str(r.decode_worker),
                    "disagg" if s.disaggregated else "agg",
                    str(s.cached_tokens // block_size),
                    str(s.blocks_reused) if s.disaggregated else "-",
                    str(s.blocks_transferred) if s.disaggregated else "-",
                    f"{s.bytes_transferred / 1024:.0f}" if s.disaggregated else "-",
                ]
            )
        out.append(f"turn {turn}\n{_table(headers, rows)}")
    legend = (
        "cached: prompt blocks found in the prefilling worker's prefix cache; reused: blocks\n"
        "the decode worker already held; moved: blocks it fetched from the prefill worker"
    )
    return "\n\n".join(out) + "\n" + legend


def round_stats(run: WorkloadRun) -> dict[str, float]:
    """One policy's figures for one round."""
    stats = [t.result.stats for t in run.turns]
    ttfts = [t.client_ttft_ms for t in run.turns]
    prompt = sum(s.prompt_tokens for s in stats)
    return {
        "ttft_p50_ms": _percentile(ttfts, 0.5),
        "ttft_p90_ms": _percentile(ttfts, 0.9),
        "ttft_mean_ms": sum(ttfts) / len(ttfts),
        "prefix_reuse": sum(s.cached_tokens for s in stats) / max(prompt, 1),
        "split": sum(s.disaggregated for s in stats),
        "blocks_moved": sum(s.blocks_transferred for s in stats),
        "wall_s": run.wall_s,
    }


def summary(rounds: list[dict[str, WorkloadRun]]) -> str:
    """Each round's TTFT p50 under both policies, then each policy's median
    over the rounds, with their range."""
    per_round = [{policy: round_stats(run) for policy, run in runs.items()} for runs in rounds]
    rows = [
        [
            str(i + 1),
            f"{r['kv']['ttft_p50_ms']:.1f}",
            f"{r['round_robin']['ttft_p50_ms']:.1f}",
            f"{r['kv']['ttft_p50_ms'] / r['round_robin']['ttft_p50_ms']:.2f}",
            f"{100 * r['kv']['prefix_reuse']:.0f}% / {100 * r['round_robin']['prefix_reuse']:.0f}%",
        ]
        for i, r in enumerate(per_round)
    ]
    table = _table(["round", "kv TTFT p50", "round robin", "ratio", "prefix reuse"], rows)
    medians = []
    for label, policy in (("kv-aware", "kv"), ("round robin", "round_robin")):
        p50s = [r[policy]["ttft_p50_ms"] for r in per_round]
        means = [r[policy]["ttft_mean_ms"] for r in per_round]
        medians.append(
            [
                label,
                f"{_percentile(p50s, 0.5):.1f}",
                f"{min(p50s):.1f}-{max(p50s):.1f}",
                f"{_percentile(means, 0.5):.1f}",
                f"{100 * _percentile([r[policy]['prefix_reuse'] for r in per_round], 0.5):.0f}%",
                str(round(_percentile([r[policy]["split"] for r in per_round], 0.5))),
            ]
        )
    headers = ["policy", "TTFT p50, median", "range", "mean, median", "prefix reuse", "split"]
    same = sum(
        a.result.token_ids == b.result.token_ids
        for runs in rounds
        for a, b in zip(runs["kv"].turns, runs["round_robin"].turns, strict=True)
    )
    total = sum(len(runs["kv"].turns) for runs in rounds)
    return (
        f"{table}\n\n{_table(headers, medians)}\n"
        f"requests: {total} per policy; same tokens under both policies: "
        f"{same}/{total} (greedy decoding)"
    )


def burst_table(disaggregated: BurstRun, aggregated: BurstRun) -> str:
    rows = []
    for label, run in (
        ("disaggregated (2 prefill + 2 decode)", disaggregated),
        ("aggregated (4 workers doing both)", aggregated),
    ):
        rows.append(
            [
                label,
                f"{_percentile(run.gaps_ms, 0.5):.1f}",
                f"{_percentile(run.gaps_ms, 0.99):.1f}",
                f"{max(run.gaps_ms, default=0.0):.1f}",
                f"{_percentile(run.burst_ttft_ms, 0.5):.0f}",
            ]
        )
    headers = ["deployment", "TBT p50 ms", "p99", "max", "burst TTFT p50 ms"]
    return (
        f"{_table(headers, rows)}\n"
        f"{STREAMS} streams decoding while {BURST} prompts of {BURST_PROMPT_TOKENS} tokens "
        "arrive at once; TBT: their time between tokens until the burst's last first token"
    )
