"""Probe candidate agent pools for chapter 8's grid before recording it: truncation and reward.

The grid's health precondition is that at most a quarter of the completions are cut at the
token budget (a cut answer earns 0 unless it wrote ``#### n``, so a comparison in which most
answers are cut compares formats, not credit signals). This script samples the *untrained*
pool of a candidate config (its roles, temperatures and instruction; LoRA adapters start as
the identity) on training problems of the arithmetic task, once at the largest budget, and
reads every smaller budget off the same samples: a sample of n tokens is the first n tokens
of a longer sample drawn with the same random stream, so cutting it is a draw at budget n.

For each budget and agent it reports the truncation rate, the committed reward (the engine's
:func:`mcpg.grpo.gsm8k.reward`), and strict and flexible accuracy; it writes every sample
(question, gold, agent, text at each budget, length) so the router's features can be
measured on them (``mcpg.grpo.router``).

    python scripts/ch08_grid_probe.py data/configs/ch08-compare.json --problems 48 --m 4 \\
        --budgets 32 48 64 --out data/results/ch08/grid/probe/compare
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))


def router_auc(rows: list[dict], budget: int, K: int, m: int, kinds=("basic", "calculation"),
               seed: int = 0, steps: int = 200) -> dict:
    """Held-out AUC of the engine's router/outcome model fitted on half the probed problems.

    The router is fitted as the engine fits it, from filtered feedback only: on every slate
    (one completion of each agent) one candidate is drawn uniformly, and only its reward is
    seen (IPW cross-entropy, :meth:`mcpg.grpo.router.Router.fit`). It is then scored on the
    other half of the problems, where every candidate's reward is known: the pooled AUC and the
    AUC within slates (:func:`mcpg.stats.within_slate_auc`), per feature set.
    """
    from mcpg.grpo.gsm8k import reward
    from mcpg.grpo.router import CandidateFeatures, Router
    from mcpg.stats import roc_auc, within_slate_auc

    per_problem = K * m
    n_prob = len(rows) // per_problem
    rng = np.random.default_rng([seed, 11])
    order = rng.permutation(n_prob)
    halves = {"fit": order[: n_prob // 2], "test": order[n_prob // 2:]}
    out = {}
    for kind in kinds:
        feats = CandidateFeatures(K, 128, 256, kind=kind)
        data = {}
        for name, probs in halves.items():
            F, R = [], []
            for b in probs:
                block = rows[b * per_problem:(b + 1) * per_problem]  # agent-major: K blocks of m
                for g in range(m):
                    slate = [block[k * m + g] for k in range(K)]
                    texts = [x["text"][str(budget)] if str(budget) in x["text"] else x["text"][budget]
                             for x in slate]
                    cut = [not (x["ended"] and x["tokens"] <= budget) for x in slate]
                    F.append(feats([x["question"] for x in slate], texts, list(range(K)), cut))
                    R.append([reward(t, x["gold"], truncated=c) for t, x, c in zip(texts, slate, cut)])
            data[name] = (torch.stack(F), np.array(R))
        torch.manual_seed(seed)
        router = Router(feats.dim, 64)
        F, R = data["fit"]
        p = np.full(R.shape, 1.0 / K)
        sel = rng.integers(0, K, size=len(R))
        router.fit(F, sel, R[np.arange(len(R)), sel], p, torch.optim.Adam(router.parameters(), lr=1e-2),
                   steps=steps)
        F, R = data["test"]
        with torch.no_grad():
            mu = torch.sigmoid(router(F)).numpy()
        out[kind] = {"auc": roc_auc(mu, R), "auc_within": within_slate_auc(mu, R),
                     "test_slates": len(R), "fit_slates": len(data["fit"][1])}
    return out


def main(argv: list[str] | None = None) -> int:
    from mcpg.grpo.configs import resolve_config
    from mcpg.grpo.gsm8k import extract_answer, reward
    from mcpg.grpo.provenance import commit_state, machine_info
    from mcpg.grpo.train import Engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config", help="a config name or JSON file (its agents and instruction are probed)")
    ap.add_argument("--problems", type=int, default=48, help="training problems sampled")
    ap.add_argument("--m", type=int, default=4, help="completions per agent and problem")
    ap.add_argument("--budgets", type=int, nargs="+", default=[32, 48, 64])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch", type=int, default=96, help="rows per generate call")
    ap.add_argument("--out", required=True, help="output folder (summary.json, samples.jsonl)")
    a = ap.parse_args(argv)
    if a.problems < 1 or a.m < 1 or min(a.budgets) < 1:
        ap.error("--problems, --m and --budgets must be positive")
    torch.set_num_threads(1)
    budgets = sorted(set(a.budgets))
    cfg = resolve_config(a.config, seed=a.seed, max_completion_length=budgets[-1], progress=False,
                         eval_initial=False)
    engine = Engine(cfg, "wta")
    rng = np.random.default_rng([a.seed, 7])
    idx = rng.choice(len(engine.train_set), size=min(a.problems, len(engine.train_set)), replace=False)
    problems = [engine.train_set[i] for i in idx]
    prompts, adapters, temps, agent_ids = engine.prompt_rows([p["question"] for p in problems], a.m)
    t0, c0 = time.time(), time.process_time()
    torch.manual_seed(a.seed)
    roll = engine.pool.generate(prompts, adapters, temps, budgets[-1], batch_size=a.batch)
    tok = engine.pool.tokenizer
    lengths = roll.completion_mask.sum(1).tolist()  # tokens up to and including EOS
    ended = (~roll.truncated).tolist()
    rows, per = [], {b: [] for b in budgets}
    for r in range(len(roll)):
        gold = problems[r // (len(engine.agents) * a.m)]["gold"]
        row = {"question": problems[r // (len(engine.agents) * a.m)]["question"], "gold": gold,
               "agent": agent_ids[r], "tokens": int(lengths[r]), "ended": bool(ended[r]), "text": {}}
        for b in budgets:
            cut = not (ended[r] and lengths[r] <= b)
            text = roll.texts[r]
            if cut:
                text = tok.decode(roll.completion_ids[r, :b], skip_special_tokens=True)
            row["text"][b] = text
            per[b].append({"agent": agent_ids[r], "truncated": cut,
                           "reward": reward(text, gold, truncated=cut),
                           "strict": float(extract_answer(text, "strict") == gold),
                           "flexible": float(extract_answer(text) == gold)})
        rows.append(row)
    K = len(engine.agents)
    summary = {}
    aucs = {str(b): router_auc(rows, b, K, a.m, seed=a.seed) for b in budgets}
    for b in budgets:
        d = per[b]
        by_agent = [[x for x in d if x["agent"] == k] for k in range(K)]
        summary[str(b)] = {
            key: float(np.mean([x[key] for x in d])) for key in ("truncated", "reward", "strict", "flexible")
        } | {
            f"agent_{key}": [float(np.mean([x[key] for x in g])) for g in by_agent]
            for key in ("truncated", "reward")
        }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "samples.jsonl", "w") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    result = {
        "what": "the untrained pool of a candidate config, sampled on arithmetic training problems",
        "config": a.config, "agents": cfg["agents"], "instruction": cfg["instruction"],
        "problems": len(problems), "m": a.m, "samples": len(rows), "budgets": summary,
        "router_auc": aucs,
        "command": "OMP_NUM_THREADS=1 python " + " ".join(["scripts/ch08_grid_probe.py", *sys.argv[1:]]),
        **commit_state(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seed": a.seed, "wall_s": round(time.time() - t0), "cpu_s": round(time.process_time() - c0),
        "machine": machine_info(),
    }
    (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    for b in budgets:
        s = summary[str(b)]
        print(f"{a.config} @ {b} tokens: truncated {s['truncated']:.2f} reward {s['reward']:.3f} "
              f"strict {s['strict']:.3f} flexible {s['flexible']:.3f} per agent trunc "
              f"{[round(x, 2) for x in s['agent_truncated']]} router AUC {aucs[str(b)]}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
