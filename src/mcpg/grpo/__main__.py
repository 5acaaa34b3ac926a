"""Command line of the GRPO engine.

    python -m mcpg.grpo train --config NAME_OR_PATH --signal wta|removal|oracle --output DIR [--updates N] [--resume]
    python -m mcpg.grpo evaluate --run DIR

Named configs: tiny-random, cpu-smoke, colab, paper (see ``mcpg.grpo.configs``). Several
GPUs: ``accelerate launch --num_processes N -m mcpg.grpo train ...``; two CPU processes:
``accelerate launch --multi_gpu --num_processes 2 -m mcpg.grpo train --config tiny-random ...``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    from .configs import CONFIGS
    from .objective import SIGNALS

    parser = argparse.ArgumentParser(prog="python -m mcpg.grpo", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train K routed LoRA agents with one credit signal")
    t.add_argument("--config", required=True, help=f"a named config {sorted(CONFIGS)} or a JSON file")
    t.add_argument("--signal", required=True, help=f"credit signal: one of {list(SIGNALS)}")
    t.add_argument("--output", required=True, help="run directory")
    t.add_argument("--updates", type=int, default=None, help="total updates (overrides the config)")
    t.add_argument("--resume", action="store_true", help="continue the run in --output from its checkpoint")
    t.add_argument("--no-progress", action="store_true", help="no progress bars")
    e = sub.add_parser("evaluate", help="evaluate a run directory's weights; rewrites eval.json")
    e.add_argument("--run", required=True, help="run directory")
    e.add_argument("--no-progress", action="store_true", help="no progress bars")
    args = parser.parse_args(argv)

    from .train import evaluate_run, train

    try:
        if args.command == "train":
            result = train(args.config, args.signal, args.output, updates=args.updates, resume=args.resume,
                           progress=False if args.no_progress else None)
        else:
            result = evaluate_run(args.run, progress=False if args.no_progress else None)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if int(os.environ.get("RANK", "0")) == 0:  # under accelerate launch / torchrun: the main process reports
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
