"""Chapter 9: does a cheap proxy of the gradient leverage ‖Ψ_i‖ track it on the engine's own slates?

The allocation ``"leverage"`` (:func:`mcpg.allocation.predraw_allocation`) weighs a slate's
agents by a_i = ‖Ψ_i‖, the norm of the gradient, with respect to agent i's LoRA adapter, of
the log-probability of its completion (the paper's Eq. 22). The exact norm costs one backward
pass per completion; the engine uses a proxy read off the rollout. This script measures how
well each candidate proxy tracks the exact norm.

For two pools of SmolLM2-135M in the grid's configuration (``data/configs/ch08-grid-stop.json``
with ``mask_truncated_completions``): the untrained pool, and the adapters of a trained
winner-take-all run (read-only), it samples slates with the engine's own rollout
(:meth:`mcpg.grpo.agents.AgentPool.generate`, the agents' temperatures, ``keep_logprobs``),
and for every completion computes

- the exact ‖Ψ_i‖ = ‖∇ Σ_t log π_T(y_t)‖ over agent i's adapter parameters, the sum over the
  completion's tokens at the agent's sampling temperature (one backward per completion), and
  the same in the engine's loss scaling (``loss_type="dapo"``: divided by the agent's trained
  tokens in the rollout);
- the candidate proxies, from the rollout alone: the token count L, √L, Σ_t (1 − π_t),
  √Σ_t (1 − π_t), √Σ_t (1 − π_t)², −Σ_t log π_t and its square root (π_t the sampler's own
  probability of token t).

A completion cut at the token budget leaves the loss (``mask_truncated_completions``): its
leverage is 0 exactly, for the proxy as for the norm, so it is left out of the correlations
(and counted). Writes ``data/results/ch09/leverage.json``: Pearson and Spearman correlations
of each proxy with the exact norm (raw, and both in the engine's loss scaling), pooled and per
agent, with the command, commit, machine and date.

Run from the repository root (minutes on a free core)::

    OMP_NUM_THREADS=1 nice -n 5 python scripts/ch09_leverage.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from mcpg.grpo.configs import resolve_config
from mcpg.grpo.provenance import commit_state, machine_info
from mcpg.grpo.train import Engine

OUT = Path("data/results/ch09/leverage.json")
CONFIG = "data/configs/ch08-grid-stop.json"
TRAINED = Path("/work/runs/ch08/grid-mask/wta-group/seed3/adapters")


def proxies(logp: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
    """Candidate proxies of ‖Ψ‖ per completion from the sampler's token log-probabilities."""
    lp = np.where(mask > 0, logp, 0.0)
    q = np.where(mask > 0, 1.0 - np.exp(lp), 0.0)
    L = mask.sum(1)
    return {"tokens": L, "sqrt_tokens": np.sqrt(L), "sum_1mp": q.sum(1), "sqrt_sum_1mp": np.sqrt(q.sum(1)),
            "sqrt_sum_1mp2": np.sqrt((q**2).sum(1)), "surprisal": -lp.sum(1),
            "sqrt_surprisal": np.sqrt(-lp.sum(1))}


def sample(engine: Engine, questions: list[str], m: int) -> dict:
    """One rollout of the engine's pool and every completion's exact score norm and proxies."""
    cfg = engine.cfg
    prompts, adapters, temps, agent_ids = engine.prompt_rows(questions, m)
    roll = engine.pool.generate(prompts, adapters, temps, cfg.max_completion_length, keep_logprobs=True,
                                stop_at_answer=cfg["stop_at_answer"])
    mask = roll.completion_mask.double().numpy()
    norms = np.zeros(len(roll))
    for r in range(len(roll)):
        if roll.truncated[r]:
            continue  # masked out of the loss: no gradient
        params = engine.pool.adapter_params(roll.adapters[r])
        logp = engine.pool.token_logprobs(roll.rows([r]))
        total = (logp * roll.completion_mask[[r]].to(logp.dtype)).sum()
        grads = torch.autograd.grad(total, params)
        norms[r] = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
    return {"agent": np.array(agent_ids), "norm": norms, "truncated": roll.truncated.numpy().astype(bool),
            "logp": roll.sampler_logprobs.double().numpy(), "mask": mask}


def correlations(x: np.ndarray, y: np.ndarray) -> dict:
    return {"pearson": float(stats.pearsonr(x, y)[0]), "spearman": float(stats.spearmanr(x, y)[0]),
            "n": int(x.size)}


def analyse(parts: list[dict]) -> dict:
    """Correlations of every proxy with the exact norm: raw and in the engine's loss scaling
    (both divided by the agent's trained tokens of its rollout), pooled and per agent."""
    rows = {"agent": [], "norm": [], "scaled_norm": [], "pool": []}
    props: dict[str, list] = {}
    scaled_props: dict[str, list] = {}
    for part in parts:
        keep = ~part["truncated"]
        trained_tokens = np.array([part["mask"][(part["agent"] == k) & keep].sum() for k in part["agent"]])
        pr = proxies(part["logp"], part["mask"])
        rows["agent"] += part["agent"][keep].tolist()
        rows["norm"] += part["norm"][keep].tolist()
        rows["scaled_norm"] += (part["norm"] / trained_tokens)[keep].tolist()
        rows["pool"] += [part["pool"]] * int(keep.sum())
        for k, v in pr.items():
            props.setdefault(k, []).extend(v[keep].tolist())
            scaled_props.setdefault(k, []).extend((v / trained_tokens)[keep].tolist())
    agent, norm, scaled = np.array(rows["agent"]), np.array(rows["norm"]), np.array(rows["scaled_norm"])
    pool = np.array(rows["pool"])
    out = {}
    for k in props:
        x, xs = np.array(props[k]), np.array(scaled_props[k])
        out[k] = {"raw": correlations(x, norm), "scaled": correlations(xs, scaled),
                  "per_agent": {int(a): correlations(x[agent == a], norm[agent == a])
                                for a in np.unique(agent)},
                  "per_pool": {p_: correlations(x[pool == p_], norm[pool == p_]) for p_ in np.unique(pool)}}
    return {"proxies": out, "norm_summary": {"mean": float(norm.mean()), "std": float(norm.std()),
                                             "min": float(norm.min()), "max": float(norm.max())},
            "rows": {"agent": agent.tolist(), "pool": pool.tolist(), "norm": norm.tolist(),
                     **{k: np.array(v).tolist() for k, v in props.items()}}}


FLAT_STD = 0.05
"""A group (one agent's m Eq. 19 scores of one prompt) is flat when their std is below this."""


def flat_group_weights(paths: list[Path], budgets=(0.1, 0.3), m: int = 4) -> dict:
    """The allocation's weight on flat groups, before (rule ``sqrt`` on :func:`credit_leverage`,
    Eq. 19's error given the draw, floor 0.1) and after (rule ``leverage``, the error before the
    draw), on logged slates of standardised removal. κ = 1 (the outcome model's own belief).
    The logs hold no ‖Ψ‖, so "after" takes a = 1: it shows what dropping 1/std does.

    ``weight``: Σ over flat (slate, agent) of a²η² / Σ over all; ``evaluations`` at each budget:
    Σ_s p_s f_s / Σ_s p_s, f_s the share of slate s's weight a²η² from its flat groups."""
    from mcpg import allocation
    from mcpg.grpo.objective import credit_leverage

    acc = {"before": {"flat": 0.0, "all": 0.0}, "after": {"flat": 0.0, "all": 0.0}}
    ev = {rule: {b: [0.0, 0.0] for b in budgets} for rule in acc}
    groups = flat_groups = 0
    for path in paths:
        for line in path.read_text().splitlines():
            r = {k: np.array(v, dtype=float) for k, v in json.loads(line).items() if k != "update"}
            N, K = r["score"].shape
            g = r["score"].reshape(-1, m, K)
            flat = np.broadcast_to(g.std(1, ddof=1, keepdims=True) < FLAT_STD, g.shape).reshape(N, K)
            groups += g.shape[0] * K
            flat_groups += int((g.std(1, ddof=1) < FLAT_STD).sum())
            cost = np.full(N, K - 1.0)
            sel = r["I"].astype(int)
            v_post = allocation.removal_error_proxy(sel, r["G"], r["p"], r["P"], r["mu_hat"])
            v_pre = allocation.predraw_error_proxy(r["p"], r["P"], r["mu_hat"])
            a_before = credit_leverage(g, "group").reshape(N, K)
            terms = {"before": a_before**2 * v_post, "after": v_pre}
            for rule, t in terms.items():
                acc[rule]["flat"] += float(t[flat].sum())
                acc[rule]["all"] += float(t.sum())
                f_s = np.divide((t * flat).sum(1), t.sum(1), out=np.zeros(N), where=t.sum(1) > 0)
                for b in budgets:
                    if rule == "before":
                        p = allocation.slate_allocation(a_before, np.zeros_like(v_post), v_post, cost,
                                                        b * cost.sum(), rule="sqrt", floor=0.1)
                    else:
                        p = allocation.predraw_allocation(t.sum(1), cost, b * cost.sum())
                    ev[rule][b][0] += float(p @ f_s)
                    ev[rule][b][1] += float(p.sum())
    return {
        "definition": f"flat group: std of its {m} Eq. (19) scores < {FLAT_STD}; before: rule sqrt, "
                      "a = 1/(std + 1e-4) of the group, eta2 = removal_error_proxy (given the draw), "
                      "floor 0.1; after: rule leverage, a = 1 (no norm logged), "
                      "eta2 = predraw_error_proxy; kappa = 1",
        "slates": [str(p) for p in paths],
        "flat_group_share": flat_groups / groups,
        **{rule: {"weight_on_flat": acc[rule]["flat"] / acc[rule]["all"],
                  "evaluations_on_flat": {str(b): ev[rule][b][0] / ev[rule][b][1] for b in budgets}}
           for rule in acc},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--prompts", type=int, default=4,
                    help="problems per pool (each K agents x m completions)")
    ap.add_argument("--trained", type=Path, default=TRAINED)
    ap.add_argument("--flat", action="store_true",
                    help="only add the allocation's weight on flat groups (logged slates) to --out")
    args = ap.parse_args()
    if args.flat:
        paths = sorted(Path("data/results/ch08/grid-mask/removal-group").glob("seed*/slates.jsonl"))
        data = json.loads(args.out.read_text()) if args.out.exists() else {}
        data["flat_groups"] = {**flat_group_weights(paths), **commit_state(),
                               "command": "python " + " ".join(sys.argv),
                               "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
        args.out.write_text(json.dumps(data, indent=1))
        print(json.dumps(data["flat_groups"], indent=1))
        return
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    cfg = resolve_config(CONFIG, mask_truncated_completions=True, device="cpu", threads=1)
    engine = Engine(cfg, "removal")
    rng = np.random.default_rng(909)
    idx = rng.choice(len(engine.train_set), size=args.prompts, replace=False)
    questions = [engine.train_set[i]["question"] for i in idx]
    m = engine.cfg["completions_per_agent"]
    parts = []
    for pool in ("untrained", "trained"):
        if pool == "trained":
            engine.pool.load_adapters(args.trained)
        torch.manual_seed(909)
        part = sample(engine, questions, m)
        part["pool"] = pool
        parts.append(part)
        print(f"{pool}: {len(part['norm'])} completions, {int(part['truncated'].sum())} cut "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)
    result = analyse(parts)
    result.update({
        "command": "OMP_NUM_THREADS=1 nice -n 5 python " + " ".join(sys.argv),
        **commit_state(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": machine_info(),
        "config": CONFIG, "mask_truncated_completions": True, "trained_adapters": str(args.trained),
        "prompts_per_pool": args.prompts, "completions_per_agent": m,
        "completions": int(sum(len(p["norm"]) for p in parts)),
        "cut": int(sum(p["truncated"].sum() for p in parts)),
        "seconds": round(time.perf_counter() - t0, 1),
    })
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    for k, v in result["proxies"].items():
        print(f"{k:>15}: raw pearson {v['raw']['pearson']:.3f} spearman {v['raw']['spearman']:.3f}; "
              f"scaled pearson {v['scaled']['pearson']:.3f} spearman {v['scaled']['spearman']:.3f}")


if __name__ == "__main__":
    main()
