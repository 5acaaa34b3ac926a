"""Chapter 9's curves: removal with exact evaluations on a budget, on the simulated routed pool.

For both advantage scalings (``scale_rewards="group"``, the engine's default, and ``"none"``),
the pool of chapter 7 (its default configuration) is trained with

- removal at every budget of ``BUDGETS`` (the expected share of slates evaluated exactly)
  under each allocation of ``ALLOCATIONS`` (Eq. 22's square root, uniform, proportional, and
  ``leverage``: Eq. 22 before the draw on the exact score norms ‖Ψ‖, p = 0 allowed);
- budget 0, which is plain removal (Eq. 19 alone), and budget 1, which is the oracle (both
  exactly, bit for bit: tests/test_grpo_simulated.py), recorded once each;
- the frozen pool and winner-take-all, the references of chapter 7.

Seeds are fresh: 200-229, not used before this grid was fixed (chapter 7 used 0-9 and
100-129). Every method of a scaling runs on the same seeds, so differences are paired.

Writes ``data/results/ch09/budget.json`` after every cell (an interrupted run keeps what it
has; a rerun resumes, and a new allocation adds its cells to the recorded ones), with the
command, the commit, the date, the machine and the seeds of the recording that made the file;
each cell also records the commit, date, machine and command it was computed with (cells
recorded before those fields existed get the file's). A resumed recording (same seeds and
budgets) leaves the file's own provenance as it was and adds its cells with theirs.
Per cell and seed it stores the final value of every metric of chapter 7, the agents' own
accuracy (each agent's greedy answer and its sampled answer, exact expectations from its
policy), and for budgeted cells the run's exact evaluations, feedback cost and gradient
error (``SimRun.exact``).

Run from the repository root (about 45 minutes on one busy core)::

    OMP_NUM_THREADS=1 nice -n 10 python scripts/ch09_budget.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from mcpg.grpo import simulated as sim
from mcpg.grpo.provenance import commit_state, machine_info

OUT = Path("data/results/ch09/budget.json")
SEEDS = list(range(200, 230))
BUDGETS = [0.02, 0.05, 0.1, 0.25, 0.5]
ALLOCATIONS = ["sqrt", "uniform", "proportional", "leverage"]
SCALINGS = ["group", "none"]
KEYS = sim.EVAL_KEYS + sim.SAMPLED_KEYS + sim.DIAGNOSTIC_KEYS


def agent_accuracy(run: sim.SimRun) -> dict[str, list]:
    """Each agent's own accuracy at the end, exactly from its policy (no sampling).

    ``agent_accuracy``: mean over agents of Σ_t w_t q_t(greedy answer), the held-out accuracy
    of the agent answering alone (greedily); ``agent_sampled_accuracy``: the same for an
    answer sampled from its policy, Σ_t w_t Σ_a π(a|t) q_t(a). Per seed; and per agent.
    """
    cfg = run.cfg
    q, w = np.asarray(cfg.answer_probs), cfg.type_distribution()
    theta = run.logits[:, -1]  # (S, K, T, M)
    greedy = theta.argmax(-1)  # (S, K, T)
    acc = (np.take_along_axis(np.broadcast_to(q, theta.shape), greedy[..., None], -1)[..., 0] * w).sum(-1)
    pi = np.exp(theta - theta.max(-1, keepdims=True))
    pi /= pi.sum(-1, keepdims=True)
    sampled = ((pi * q).sum(-1) * w).sum(-1)  # (S, K)
    return {"agent_accuracy": acc.mean(1).tolist(), "agent_sampled_accuracy": sampled.mean(1).tolist(),
            "agent_accuracy_each": acc.tolist()}


def record(run: sim.SimRun) -> dict:
    final = {k: [float(v) for v in run.metrics[k][:, -1]] for k in KEYS}
    final.update(agent_accuracy(run))
    out = {"seeds": run.seeds, "final": final, "seconds": round(run.seconds, 2),
           "accuracy_curve": np.nanmean(run.metrics["accuracy"], 0).tolist(),
           "updates": run.updates.tolist()}
    if run.exact is not None:
        out["exact"] = {k: v.tolist() for k, v in run.exact.items()}
    return out


def jobs() -> list[tuple[str, str, float, str]]:
    """(scale_rewards, method, budget, allocation): references first, then budgets low to high."""
    out = []
    for scale in SCALINGS:
        out += [(scale, "frozen", 0.0, "n/a"), (scale, "wta", 0.0, "n/a"), (scale, "removal", 0.0, "n/a"),
                (scale, "oracle", 1.0, "n/a")]
    for b in BUDGETS:
        for scale in SCALINGS:
            out += [(scale, "removal", b, a) for a in ALLOCATIONS]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--limit", type=int, default=None, help="only the first LIMIT jobs (a smoke test)")
    ap.add_argument("--seeds", type=int, default=len(SEEDS), help="the first N seeds (a smoke test)")
    args = ap.parse_args()
    seeds = SEEDS[: args.seeds]
    base = sim.SimConfig()
    data = {"results": []}
    resumed = False
    if args.out.exists():
        old = json.loads(args.out.read_text())
        if old.get("seeds") == seeds and old.get("budgets") == BUDGETS:
            data, resumed = old, True
            for r in data["results"]:  # cells of an earlier recording keep its provenance
                r.setdefault("commit", old["commit"])
                r.setdefault("date", old["date"])
    done = {(r["scale_rewards"], r["method"], r["exact_budget"], r["allocation"]) for r in data["results"]}
    prov = {
        "command": "OMP_NUM_THREADS=1 python " + " ".join(sys.argv),
        **commit_state(),  # commit, dirty (mcpg.grpo.provenance)
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": machine_info(),
    }
    if not resumed:
        data.update(prov)
    data.update(
        {
            "seeds": seeds,
            "budgets": BUDGETS,
            "allocations": ALLOCATIONS,
            "scalings": SCALINGS,
            "base_config": asdict(base),
        }
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    todo = jobs()[: args.limit]
    t0 = time.perf_counter()
    for n, (scale, method, b, alloc) in enumerate(todo):
        if (scale, method, b, alloc) in done:
            continue
        cfg = replace(base, scale_rewards=scale)
        if method == "removal" and b > 0:
            cfg = replace(cfg, exact_budget=b, allocation=alloc)
        run = sim.train_pool(cfg, method, seeds)
        data["results"].append({"scale_rewards": scale, "method": method, "exact_budget": b,
                                "allocation": alloc, **record(run), **prov,
                                "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())})
        done.add((scale, method, b, alloc))
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(args.out)
        print(f"job {n + 1}/{len(todo)} {scale} {method} {b} {alloc}: {run.seconds:.0f} s "
              f"(total {time.perf_counter() - t0:.0f} s)", flush=True)
    if not resumed:
        data["seconds"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(data, indent=1))


if __name__ == "__main__":
    main()
