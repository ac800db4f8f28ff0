"""`kvrouter demo`: the README's first command."""

from __future__ import annotations

import argparse
import sys

HELP = (
    "start a router with 2 prefill and 2 decode CPU workers on 127.0.0.1, run a multi-turn "
    "chat and agent workload through it, and compare kv-aware routing with round robin"
)
EXTRA = "engine"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chats", type=int, default=6, help="multi-turn chat sessions")
    parser.add_argument("--agents", type=int, default=3, help="agent sessions")
    parser.add_argument("--chat-turns", type=int, default=4, help="turns per chat")
    parser.add_argument("--agent-steps", type=int, default=5, help="steps per agent")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens generated per turn")
    parser.add_argument(
        "--local-prefill-max-tokens",
        type=int,
        default=128,
        help="prefill on the decode worker when at most this many prompt tokens are uncached",
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="workloads run under both policies (medians)"
    )
    parser.add_argument(
        "--no-burst",
        dest="burst",
        action="store_false",
        help="skip the burst of long prompts under running streams (and its third deployment)",
    )
    parser.add_argument("--json", default="", help="write the figures to this file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="", help="keep the processes' logs here")


def run(args: argparse.Namespace) -> int:
    from kvrouter.demo.main import DemoOptions, run_demo

    if args.rounds < 1:
        print("kvrouter demo: --rounds must be at least 1", file=sys.stderr)
        return 2

    return run_demo(
        DemoOptions(
            chats=args.chats,
            agents=args.agents,
            chat_turns=args.chat_turns,
            agent_steps=args.agent_steps,
            max_tokens=args.max_tokens,
            local_prefill_max_tokens=args.local_prefill_max_tokens,
            rounds=args.rounds,
            burst=args.burst,
            seed=args.seed,
            log_dir=args.log_dir,
            json_path=args.json,
        )
    )
