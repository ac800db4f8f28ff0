"""kvrouter's replay from this checkout, scored against the Dynamo figures
of an earlier compare_dynamo.py or compare_generated.py result.

Dynamo's mocker in kv_router mode does not repeat itself from run to run
(on `tenants` its reuse moved by up to 0.6 points between two runs); our
replay does. Two builds of the policy therefore compare exactly when each
is scored against the same Dynamo run: replay kvrouter with one build,
keep every other figure of the result (Dynamo's, the baselines', the
floor), recompute the targets and print the verdicts with how many rows
meet each target.

    PYTHONPATH=$PWD .venv/bin/python bench/rescore_kvrouter.py \\
        --results bench/results/compare_generated_tenants.json --workload tenants \\
        --output bench/results/tenants_rescored.json [--policy congestion_weight=0.25]

`--policy` replays kvrouter with a setting changed, as the service takes it;
`--seed` must be the one the results' workload was generated with.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare_dynamo  # noqa: E402
import compare_generated  # noqa: E402

from kvrouter.policy import PolicyConfig  # noqa: E402
from kvrouter.replay import load_mooncake  # noqa: E402
from kvrouter.replay.synthetic import generate  # noqa: E402
from kvrouter.replay.trace import write_mooncake  # noqa: E402
from kvrouter.service import config as service_config  # noqa: E402

MOONCAKE = "mooncake"


def rescore(report: dict, trace: Path, settings: PolicyConfig | None = None) -> dict:
    rows = []
    for row in report["rows"]:
        requests = load_mooncake(trace, row["speed"])
        mine = compare_dynamo.ours(requests, "kvrouter", row["workers"], settings)
        rows.append({**row, "ours_kvrouter": mine})
    return {**report, "rows": rows, "targets": compare_dynamo.targets(rows)}


def counts(report: dict) -> dict:
    verdicts = [t["verdict"] for t in report["targets"].values()]
    out = {name: sum(v[name] for v in verdicts) for name in verdicts[0]}
    out["all"] = sum(all(v.values()) for v in verdicts)
    out["rows"] = len(verdicts)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, required=True)
    parser.add_argument(
        "--workload", required=True, choices=[*compare_generated.WORKLOADS, MOONCAKE]
    )
    parser.add_argument("--seed", type=int, default=1, help="the generated workload's seed")
    parser.add_argument(
        "--policy",
        metavar="FIELD=VALUE",
        action="append",
        default=[],
        help="a policy setting, as `kvrouter serve --policy` takes it (repeatable)",
    )
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    settings = service_config.load(
        argparse.Namespace(config=None, policy=args.policy, proxy=[]), env={}
    ).policy
    report = json.loads(args.results.read_text())
    if args.workload == MOONCAKE:
        report = rescore(report, compare_dynamo.TRACE, settings)
    else:
        # Written and read back as compare_generated.py replays it.
        with tempfile.TemporaryDirectory() as tmp:
            trace = Path(tmp) / f"{args.workload}.jsonl"
            shape = compare_generated.WORKLOADS[args.workload]
            write_mooncake(trace, generate(shape, seed=args.seed))
            report = rescore(report, trace, settings)
    args.output.write_text(json.dumps(report, indent=2))
    print(f"{'workload':<10} {'row':<9} {compare_dynamo.VERDICT_HEADER}")
    compare_dynamo.print_verdicts(report, f"{args.workload:<10} ")
    print(f"rows meeting each target: {counts(report)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
