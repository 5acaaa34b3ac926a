"""Is a recorded run healthy enough to compare? Learning curves, the logged health metrics in long
form, the bars a run clears (:data:`HEALTH_BARS`), and what its signal paid for feedback.

- :func:`learning_curve`: the sampled deployed reward per update, with a trailing rolling mean;
- :func:`health`: every declared per-update metric (:data:`mcpg.grpo.rundir.PER_AGENT_METRICS`,
  :data:`mcpg.grpo.rundir.SCALAR_METRICS`) in long form (one row per update, agent and metric);
- :func:`health_table`: per finished run, the bars and the held-out measures read apart from the
  router; :func:`feedback_table`: reward queries beyond the deployed one (paper §7);
- :func:`recording_summary`: per run, the counts behind a diagnosis of a recording.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .heldout import _by_arm_and_seed, _held_out
from .rundir import PER_AGENT_METRICS, SCALAR_METRICS, Run

__all__ = ["learning_curve", "health", "HEALTH_BARS", "health_table", "feedback_table", "recording_summary"]


def learning_curve(runs: Run | list[Run], window: int = 5) -> pd.DataFrame:
    """Sampled deployed reward per update and its trailing rolling mean over ``window`` updates.

    Columns: ``run`` (the run's label), ``signal``, ``seed``, ``update``, ``reward`` (mean G of the
    rollout), ``rolling`` (mean of the last ``window`` updates' rewards, fewer at the start),
    ``oracle`` (share of slates with some correct candidate) and ``slates`` (slates per rollout).
    """
    if window < 1:
        raise ValueError(f"window must be a positive integer, got {window}")
    frames = []
    for run in [runs] if isinstance(runs, Run) else runs:
        m = run.metrics.sort_values("update")
        frames.append(pd.DataFrame({
            "run": run.label, "signal": run.signal, "seed": run.config.get("seed", 0),
            "update": m["update"].to_numpy(), "reward": m["reward"].to_numpy(dtype=float),
            "rolling": m["reward"].astype(float).rolling(window, min_periods=1).mean().to_numpy(),
            "oracle": m["oracle"].to_numpy(dtype=float), "slates": run.slates_per_update}))
    return pd.concat(frames, ignore_index=True)


def health(runs: Run | list[Run]) -> pd.DataFrame:
    """Health metrics in long form: one row per run, update, agent and metric.

    Per-agent metrics (:data:`~mcpg.grpo.rundir.PER_AGENT_METRICS`) get the agent's name; per-update metrics
    (:data:`~mcpg.grpo.rundir.SCALAR_METRICS`) get agent ``"all"``. Keys a run's rows do not hold (an older
    recording) are skipped. Columns: ``run``, ``signal``, ``update``, ``agent``, ``metric``, ``value``.
    """
    rows = []
    for run in [runs] if isinstance(runs, Run) else runs:
        for r in run.metrics.to_dict("records"):
            for key in PER_AGENT_METRICS:
                if isinstance(r.get(key), list):
                    rows += [(run.label, run.signal, r["update"], a, key, float(v))
                             for a, v in zip(run.agents, r[key])]
            for key in SCALAR_METRICS:
                v = r.get(key)
                if v is not None and not (isinstance(v, float) and np.isnan(v)):
                    rows.append((run.label, run.signal, r["update"], "all", key, float(v)))
    return pd.DataFrame(rows, columns=["run", "signal", "update", "agent", "metric", "value"])


HEALTH_BARS = {"truncated": 0.25, "router_auc": 0.70}
"""The bars a run clears before its credit signal is compared with another's.

``truncated`` is the largest share of completions cut at the token budget over a run's last five
updates (above it, a comparison compares answer formats); ``router_auc`` the smallest held-out
ROC AUC of the outcome model (below it, the router cannot route). :func:`health_table` adds a
third bar, deployed accuracy at least the agents' mean (a router no worse than a uniform draw)."""


def health_table(runs: Run | list[Run], last: int = 5) -> pd.DataFrame:
    """One row per finished run, indexed by ``(arm, seed)``: is it healthy enough to compare?

    Columns: ``cut`` (share of completions cut, mean over the last ``last`` updates), ``cut,
    held-out`` (the share of the held-out greedy answers cut at the evaluation's budget, eval.json's
    ``truncated``; not a bar: a run can pass ``cut`` in training and still cut many answers where it
    is measured), ``zero-spread`` (share of GRPO groups whose rewards are all equal, over the same
    updates and the agents), ``router_auc`` and ``router_auc_within`` (eval.json), ``deployed``
    (held-out accuracy), ``agents' mean`` (``uniform_accuracy``: a uniform router), ``best_of_k``,
    ``largest share`` (the largest share of held-out problems one agent was sent: routing collapse
    when near 1), and ``healthy``: ``cut`` <= ``HEALTH_BARS["truncated"]``, ``router_auc`` >=
    ``HEALTH_BARS["router_auc"]`` and ``deployed`` >= ``agents' mean``.
    """
    if last < 1:
        raise ValueError(f"last must be a positive integer, got {last}")

    def row(r: Run) -> dict:
        tail = r.metrics.sort_values("update").tail(last)
        zero = (np.array(tail["zero_std_reward_fraction"].tolist(), dtype=float).mean()
                if "zero_std_reward_fraction" in tail else float("nan"))
        e = r.eval
        auc = e.get("router_auc")
        out = {"cut": float(tail["truncated"].mean()),
               "cut, held-out": float(e.get("truncated", np.nan)), "zero-spread": float(zero),
               "router_auc": np.nan if auc is None else float(auc),
               "router_auc_within": (np.nan if e.get("router_auc_within") is None
                                     else float(e["router_auc_within"])),
               **_held_out(e), "largest share": float(max(e["deployed_fraction"]))}
        out["healthy"] = bool(out["cut"] <= HEALTH_BARS["truncated"]
                              and out["router_auc"] >= HEALTH_BARS["router_auc"]
                              and out["deployed"] >= out["agents' mean"] - 1e-12)
        return out

    return _by_arm_and_seed(runs, row)


def feedback_table(runs: Run | list[Run]) -> pd.DataFrame:
    """What each finished run paid for feedback, indexed by ``(arm, seed)`` (paper §7).

    A reward query beyond the deployed one is the unit of cost: an exact evaluation of a slate
    queries its K - 1 undeployed candidates. ``removal`` with ``exact_budget`` b evaluates a
    share of about b of its slates (Eq. 21's Z = 1, logged per update as ``exact_evaluations``);
    the ``oracle`` evaluates every slate; ``wta`` and ``removal`` without a budget none.

    Columns: ``budget`` (the config's ``exact_budget``; 1 for the oracle), ``exact share``
    (slates evaluated exactly / slates, over the run), ``feedback cost`` (reward queries beyond
    the deployed ones, over the run), ``cost per update``, and the held-out ``deployed``,
    ``agents' mean`` and ``best_of_k`` (as in :func:`health_table`).
    """
    def row(r: Run) -> dict:
        m = r.metrics
        slates = len(m) * r.slates_per_update
        if r.signal == "oracle":
            exact, budget = slates, 1.0
        else:
            exact = int(m["exact_evaluations"].sum()) if "exact_evaluations" in m else 0
            budget = float(r.config.get("exact_budget", 0.0)) if r.signal == "removal" else 0.0
        cost = exact * (len(r.agents) - 1)
        return {"budget": budget, "exact share": exact / slates, "feedback cost": cost,
                "cost per update": cost / len(m), **_held_out(r.eval)}

    return _by_arm_and_seed(runs, row)


def recording_summary(run: Run) -> dict:
    """Counts behind a diagnosis of one recording, from its metrics rows and eval.json.

    ``truncated_mean``/``_min``/``_max``: share of completions cut at ``max_completion_length``;
    ``agent_updates``: updates x agents; ``no_correct``: agent-updates none of whose sampled
    completions is right (every group of that agent has zero reward spread);
    ``no_credit``: agent-updates whose credit scores are all 0 (for ``wta``, whose scores are
    >= 0, ``credit_mean == 0`` means exactly that: every group standardises to advantage 0);
    ``groups``/``groups_without_signal_min``: the agent's groups in total and a lower bound on
    those without signal (all groups of credit-free agent-updates; ``wta`` only, else None);
    ``rollouts_no_correct``: updates with no correct candidate in the whole rollout (``oracle == 0``);
    ``max_deployed_fraction``: at evaluation, the largest share of problems one agent got.
    """
    m = run.metrics
    acc = np.array(m["agent_accuracy"].tolist(), dtype=float)
    cm = np.array(m["credit_mean"].tolist(), dtype=float)
    groups_per = int(run.config["prompts_per_update"])
    no_credit = int((cm == 0).sum()) if run.signal == "wta" else None
    return {
        "updates": len(m), "truncated_mean": float(m["truncated"].mean()),
        "truncated_min": float(m["truncated"].min()), "truncated_max": float(m["truncated"].max()),
        "agent_updates": int(acc.size), "no_correct": int((acc == 0).sum()),
        "no_credit": no_credit, "groups": int(acc.size * groups_per),
        "groups_without_signal_min": None if no_credit is None else no_credit * groups_per,
        "rollouts_no_correct": int((m["oracle"] == 0).sum()),
        "max_deployed_fraction": None if run.eval is None else float(max(run.eval["deployed_fraction"])),
    }
