"""A tiny model behind the front door: what scripts/serve.sh runs."""

from __future__ import annotations

import argparse
import signal
import tempfile
from pathlib import Path

from kvrouter.demo.cluster import LocalCluster
from kvrouter.engine.tiny_checkpoint import write_tiny_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--http-listen", default="127.0.0.1:8000")
    parser.add_argument("--model-name", default="tiny")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvrouter-serve-"))
    model = write_tiny_checkpoint(work / "model", "llama", seed=11)
    router_args = [
        "--http-listen",
        args.http_listen,
        "--served-models",
        f"{args.model_name}={model}",
    ]
    cluster = LocalCluster(
        model,
        ["prefill", "decode"],
        router_args=router_args,
        served_models=[args.model_name] * 2,
    )
    with cluster:
        print(
            f"serving {args.model_name!r} at http://{args.http_listen}/v1 (logs: {cluster.log_dir})"
        )
        print("Ctrl-C stops it.", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})


if __name__ == "__main__":
    main()
