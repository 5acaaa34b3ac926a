"""Chapter 7's reversal grid: can the simulated pool reproduce chapter 8's ranking?

Under standardised advantages chapter 7's simulated pool ranks removal > winner-take-all >
oracle, while chapter 8's LLM pool ranks oracle > winner-take-all > removal. Its logged
slates show two things the default simulation lacks: many GRPO groups with no right
candidate on any slate, and an outcome model that barely separates right from wrong
candidates. This grid trains the simulated pool with each, and both:

- ``unsolvable``: the share of questions whose right answer is none of the candidates
  (0, 0.2, 0.4, 0.6);
- ``check_flip``: how often the router's check of a candidate is wrong (0.2, the default;
  0.45, where the outcome model's AUC falls to the LLM's);
- and a pool of weaker agents: six candidate answers per type, none right more than 35% of
  the time (``answer_probs`` = ``WEAK``), with and without unsolvable questions.

Every cell is trained with winner-take-all, removal and the oracle under both scalings
(``scale_rewards`` "group" and "none") on 30 fresh seeds (300-329, never used before).
The final value of each metric is stored per seed, and for every run the diagnostics of
:func:`mcpg.grpo.simulated.rollout_diagnostics` (share of groups with no right candidate,
the outcome model's AUC, the removal signal's mean ``|E[A | completions]|``, and how far each
signal's advantage follows the completion's own reward) at the middle and the last
checkpoint, per seed.

Writes ``data/results/ch07/reversal.json`` after every run (an interrupted run keeps what
it has, and a rerun resumes), with the command, the commit, the date, the machine and the
seeds. Run from the repository root (about six CPU-minutes; longer on a shared core)::

    OMP_NUM_THREADS=1 nice -n 10 python scripts/ch07_reversal.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from mcpg.grpo import simulated as sim
from mcpg.grpo.provenance import commit_state, machine_info

OUT = Path("data/results/ch07/reversal.json")
SEEDS = list(range(300, 330))
WEAK = (
    (0.25, 0.20, 0.15, 0.15, 0.15, 0.10),
    (0.30, 0.20, 0.15, 0.15, 0.10, 0.10),
    (0.35, 0.15, 0.15, 0.15, 0.10, 0.10),
)
CELLS = [
    {"agents": "default", "unsolvable": u, "check_flip": f}
    for f in (0.2, 0.45)
    for u in (0.0, 0.2, 0.4, 0.6)
] + [{"agents": "weak", "unsolvable": u, "check_flip": 0.2} for u in (0.0, 0.4)]
SCALINGS = ("group", "none")
SIGNALS = ("wta", "removal", "oracle")
KEYS = sim.EVAL_KEYS + sim.DIAGNOSTIC_KEYS
DIAG = ("no_right", "auc", "abs_ea_group", "abs_ea_none", "abs_ea_group_no_right",
        "abs_ea_none_no_right", "corr_p", "corr_mu",
        *(f"align_{s}_{sc}" for s in SIGNALS for sc in SCALINGS))


def config(cell: dict, scale: str) -> sim.SimConfig:
    """The :class:`~mcpg.grpo.simulated.SimConfig` of a cell of the grid."""
    base = sim.SimConfig()
    extra = {"answer_probs": WEAK} if cell["agents"] == "weak" else {}
    return replace(base, unsolvable=cell["unsolvable"], check_flip=cell["check_flip"],
                   scale_rewards=scale, **extra)


def _record(run: sim.SimRun) -> dict:
    final = {k: [float(v) for v in run.metrics[k][:, -1]] for k in KEYS}
    diag = {}
    for name, ckpt in (("middle", len(run.updates) // 2), ("last", -1)):
        d = sim.rollout_diagnostics(run, checkpoint=ckpt, prompts=64)
        diag[name] = {"update": int(d["update"].iloc[0]),
                      **{k: [float(v) for v in d[k]] for k in DIAG}}
    return {"seeds": run.seeds, "final": final, "diagnostics": diag,
            "seconds": round(run.seconds, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--limit", type=int, default=None, help="only the first LIMIT cells")
    args = ap.parse_args()
    data = {"results": []}
    if args.out.exists():
        old = json.loads(args.out.read_text())
        if old.get("seeds") == SEEDS:  # resume: keep the runs of cells still in the grid
            old["results"] = [r for r in old["results"] if r["cell"] in CELLS]
            data = old
    done = {(json.dumps(r["cell"], sort_keys=True), r["scale_rewards"], r["method"])
            for r in data["results"]}
    data.update({
        "command": f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '')} python " + " ".join(sys.argv),
        **commit_state(),  # commit, dirty (mcpg.grpo.provenance)
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": machine_info(),
        "seeds": SEEDS,
        "cells": CELLS,
        "weak_answer_probs": [list(r) for r in WEAK],
        "base_config": asdict(sim.SimConfig()),
        "scalings": list(SCALINGS),
        "signals": list(SIGNALS),
    })
    args.out.parent.mkdir(parents=True, exist_ok=True)
    todo = CELLS[: args.limit]
    t0 = time.perf_counter()
    for n, cell in enumerate(todo):
        for scale in SCALINGS:
            for method in SIGNALS:
                key = (json.dumps(cell, sort_keys=True), scale, method)
                if key in done:
                    continue
                run = sim.train_pool(config(cell, scale), method, SEEDS)
                data["results"].append(
                    {"cell": cell, "scale_rewards": scale, "method": method, **_record(run)})
                done.add(key)
                tmp = args.out.with_suffix(".tmp")
                tmp.write_text(json.dumps(data, indent=1))
                tmp.replace(args.out)
        print(f"cell {n + 1}/{len(todo)} {cell} done at {time.perf_counter() - t0:.0f} s",
              flush=True)
    data["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
