"""The demo's tables: one per turn, and a summary of kv-aware routing
against round robin on the same workload."""

from __future__ import annotations

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


def summary(kv: WorkloadRun, baseline: WorkloadRun) -> str:
    rows = []
    for label, run in (("kv-aware", kv), ("round robin", baseline)):
        stats = [t.result.stats for t in run.turns]
        ttfts = [t.client_ttft_ms for t in run.turns]
        prompt = sum(s.prompt_tokens for s in stats)
        rows.append(
            [
                label,
                f"{_percentile(ttfts, 0.5):.1f}",
                f"{_percentile(ttfts, 0.9):.1f}",
                f"{sum(ttfts) / len(ttfts):.1f}",
                f"{100 * sum(s.cached_tokens for s in stats) / max(prompt, 1):.0f}%",
                str(sum(s.disaggregated for s in stats)),
                str(sum(s.blocks_transferred for s in stats)),
                f"{sum(s.bytes_transferred for s in stats) / 1024:.0f}",
                f"{run.wall_s:.1f}",
            ]
        )
    headers = [
        "policy",
        "TTFT p50",
        "p90",
        "mean",
        "prefix reuse",
        "split",
        "moved",
        "KiB",
        "wall s",
    ]
    same = sum(
        a.result.token_ids == b.result.token_ids
        for a, b in zip(kv.turns, baseline.turns, strict=True)
    )
    return (
        f"{_table(headers, rows)}\n"
        f"requests: {len(kv.turns)} per policy; same tokens under both policies: "
        f"{same}/{len(kv.turns)} (greedy decoding)"
    )
