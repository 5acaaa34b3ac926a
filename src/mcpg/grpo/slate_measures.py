"""What could decide the sign of removal − winner-take-all, measured on routed slates.

Chapter 7's simulated pool puts removal credit ahead of winner-take-all's; chapter 8's LLM
agents put it behind. Whatever decides the sign must show in the slates each pool trains on,
so this module measures, on one update's slates (logged by the LLM engine or rolled out by the
simulator, as arrays), the quantities a candidate explanation names:

- how often the team succeeds (``team_success``: some candidate on the slate is right), and
  how often it succeeds twice over (``multi_right``: among those slates, the share with two or
  more right candidates, where the exact removal contribution of a right answer is about 0,
  Corollary 3's ``p_i (R_i − Σ_{j≠i} P^{-i}_j R_j)``, while winner-take-all pays it in full);
- each agent's accuracy (``accuracy_k``) and how correlated the agents' rightness is: on one
  slate (``rightness_corr``, the mean over agent pairs of the correlation of ``R_i`` and
  ``R_j`` over slates) and on one question (``question_corr``, the same for each agent's share
  of right answers among its m completions of a prompt, which is what a question's difficulty
  makes common to all agents);
- the share of GRPO groups with no right candidate on any slate (``no_right``);
- the router: the outcome model's ROC AUC for right against wrong candidates (``auc``) and
  how much it explores (``exploration``, the mean propensity off its favourite, ``1 − max_j p_j``);
- how far each signal's GRPO advantage follows the completion's own correctness
  (``align_<signal>_<scaling>``, :func:`~mcpg.grpo.slate_diagnostics.group_alignment`, exact
  over the router's draws; chapter 7 measures the same on simulated slates);
- the tail of Eq. (19)'s credits given the draw that was made (``credit_max``, the largest
  ``|Δ̂|`` of the update; ``credit_top_share``, the share of the credits' sum of squares
  that the largest one carries). The share of the update's gradient norm they carry is not
  in the grid's logs (its runs do not log a gradient norm), so it is not measured here.

:func:`slate_measures` reads arrays, :func:`run_measures` a recorded run update by update,
:func:`grid_measures` one row per run (its first rollout, before any update, and the mean over
its updates), and :func:`first_rollout` the untrained pool's rollouts of several seeds pooled
(what chapter 7's twin is matched to).
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from ..stats import roc_auc
from .objective import ADVANTAGE_EPS, SIGNALS, credit
from .rundir import Run
from .slate_diagnostics import advantage_moments, group_alignment

__all__ = ["MEASURES", "slate_measures", "run_measures", "grid_measures", "first_rollout"]

SCALINGS = ("group", "none")

MEASURES: dict[str, str] = {
    "team_success": "share of slates with a right candidate",
    "multi_right": "among slates with a right candidate, the share with two or more",
    "accuracy": "the agents' mean accuracy on their sampled completions",
    "rightness_corr": "correlation of two agents' rightness on one slate, mean over pairs",
    "question_corr": "correlation of two agents' share right on one prompt, mean over pairs",
    "no_right": "share of GRPO groups with no right candidate on any slate",
    "auc": "the outcome model's ROC AUC, right against wrong candidates",
    "exploration": "mean propensity off the router's favourite, 1 − max p",
    **{f"align_{s}_{sc}": f"correlation of {s}'s {'standardised' if sc == 'group' else 'centred'} "
                          "advantage with the completion's own reward" for s in SIGNALS for sc in SCALINGS},
    "credit_max": "largest |Eq. (19) credit| given the draw made",
    "credit_top_share": "share of the Eq. (19) credits' sum of squares carried by the largest",
}
"""Each measure :func:`slate_measures` returns (besides ``accuracy_k`` per agent), in words."""


def _mean_pair_corr(x: np.ndarray) -> float:
    """Mean over column pairs of the Pearson correlation of ``x[:, i]`` and ``x[:, j]``; pairs
    where a column does not vary are left out (NaN if every pair is)."""
    out = []
    for i, j in itertools.combinations(range(x.shape[1]), 2):
        a, b = x[:, i], x[:, j]
        if a.std() > 0 and b.std() > 0:
            out.append(float(np.corrcoef(a, b)[0, 1]))
    return float(np.mean(out)) if out else np.nan


def slate_measures(R, p, P, mu_hat, m: int, selected=None, eps: float = ADVANTAGE_EPS,
                   alignment: bool = True) -> dict:
    """The measures of :data:`MEASURES` on one update's slates.

    Args:
        R: every candidate's reward ``R^(j)``, ``(n, K)``, in {0, 1}; slates ``g*m`` to
            ``g*m + m − 1`` are one prompt's (one GRPO group per agent), as the engine logs them.
        p, P, mu_hat: the router's propensities (Eq. 3) ``(n, K)``, leave-one-out propensities
            ``(n, K, K)`` and outcome model ``(n, K)``.
        m: completions per agent and prompt.
        selected: the deployed candidate ``I`` of each slate ``(n,)``; without it the credit
            tail is NaN.
        eps: the advantage's ``advantage_eps``.
        alignment: compute ``align_*`` (an exact sum over the ``K^m`` draws per group).

    Returns a dict of floats, one per :data:`MEASURES` key, plus ``accuracy_k`` for each agent k.
    """
    R = np.asarray(R, dtype=float)
    p, P, mu = (np.asarray(x, dtype=float) for x in (p, P, mu_hat))
    if R.ndim != 2 or p.shape != R.shape or mu.shape != R.shape or P.shape != R.shape + R.shape[-1:]:
        raise ValueError(f"R, p and mu_hat must be (n, K) and P (n, K, K); got {R.shape}, {p.shape}, "
                         f"{mu.shape}, {P.shape}")
    n, K = R.shape
    if m < 1 or n % m:
        raise ValueError(f"{n} slates are not whole groups of m = {m}")
    right = R > 0
    count = right.sum(1)
    solved = count > 0
    groups = R.reshape(n // m, m, K)
    out = {
        "team_success": float(solved.mean()),
        "multi_right": float((count[solved] >= 2).mean()) if solved.any() else np.nan,
        "accuracy": float(R.mean()),
        **{f"accuracy_{k}": float(R[:, k].mean()) for k in range(K)},
        "rightness_corr": _mean_pair_corr(R),
        "question_corr": _mean_pair_corr(groups.mean(1)),
        "no_right": float((groups.max(axis=(1, 2)) == 0).mean()),
        "auc": np.nan if (a := roc_auc(mu, R)) is None else float(a),
        "exploration": float((1 - p.max(1)).mean()),
    }
    if alignment:
        shaped = [x.reshape((n // m, m) + x.shape[1:]) for x in (p, P, mu, R)]
        for s in SIGNALS:
            for sc in SCALINGS:
                mo = advantage_moments(s, *shaped, scale_rewards=sc, eps=eps)
                out[f"align_{s}_{sc}"] = group_alignment(s, *shaped, scale_rewards=sc, eps=eps,
                                                         moments=mo)["corr"]
    if selected is None:
        out["credit_max"] = out["credit_top_share"] = np.nan
    else:
        sel = np.asarray(selected, dtype=int)
        c = credit("removal", sel, R[np.arange(n), sel], p, P, mu)
        sq = c**2
        out["credit_max"] = float(np.abs(c).max())
        out["credit_top_share"] = float(sq.max() / sq.sum()) if sq.sum() > 0 else np.nan
    return out


def run_measures(run: Run, alignment: bool = True) -> pd.DataFrame:
    """:func:`slate_measures` on each update of a recorded run's logged slates, one row per
    update (``update`` 1 is the untrained pool's rollout: it is sampled before any update),
    with the run's ``arm``, ``signal``, ``scaling`` and ``seed``, and the share of its
    completions cut at the token budget (``cut``, where the engine logged it; else NaN)."""
    if not run.slates:
        raise ValueError(f"{run.path} holds no slates.jsonl")
    m = int(run.config["completions_per_agent"])
    rows = []
    for row in run.slates:
        meas = slate_measures(row["R"], row["p"], row["P"], row["mu_hat"], m, selected=row["I"],
                              eps=run.advantage_eps, alignment=alignment)
        cut = float(np.mean(row["cut"])) if "cut" in row else np.nan
        rows.append({"arm": run.arm, "signal": run.signal, "scaling": run.scale_rewards,
                     "seed": int(run.config.get("seed", 0)), "update": int(row["update"]),
                     **meas, "cut": cut})
    return pd.DataFrame(rows)


def grid_measures(runs, alignment: bool = True) -> pd.DataFrame:
    """One row per run and ``when``: ``"first"``, its first logged rollout (the untrained pool),
    and ``"mean"``, the mean over all its updates. Index ``(arm, seed, when)``; columns the
    measures of :func:`run_measures`."""
    frames = []
    for run in runs:
        per = run_measures(run, alignment=alignment)
        keys = ["arm", "signal", "scaling", "seed"]
        first = per.sort_values("update").iloc[[0]].assign(when="first")
        mean = per.drop(columns=keys).mean().to_frame().T.assign(when="mean")
        mean[keys] = first[keys].to_numpy()
        frames += [first, mean]
    frame = pd.concat(frames, ignore_index=True).drop(columns="update")
    return frame.set_index(["arm", "seed", "when"]).sort_index()


def first_rollout(runs, update: int = 1, alignment: bool = True) -> dict:
    """:func:`slate_measures` on the slates of ``update`` (1: the untrained pool's rollout) of
    each seed's run, pooled: one run per seed is read (the first met), since every arm of a seed
    rolls out the same untrained pool. Adds ``cut`` (the share of completions cut at the token
    budget, where logged), ``seeds`` and ``slates`` (how many were pooled)."""
    by_seed: dict[int, dict] = {}
    m = None
    for run in runs:
        seed = int(run.config.get("seed", 0))
        row = next((r for r in run.slates if int(r["update"]) == update), None)
        if row is None or seed in by_seed:
            continue
        m_run = int(run.config["completions_per_agent"])
        if m is not None and m_run != m:
            raise ValueError(f"runs disagree on completions_per_agent: {m} and {m_run}")
        m = m_run
        by_seed[seed] = row
    if not by_seed:
        raise ValueError(f"no run has logged slates of update {update}")
    rows = [by_seed[k] for k in sorted(by_seed)]
    cat = {key: np.concatenate([np.asarray(r[key], float) for r in rows])
           for key in ("R", "p", "P", "mu_hat")}
    sel = np.concatenate([np.asarray(r["I"], int) for r in rows])
    out = slate_measures(cat["R"], cat["p"], cat["P"], cat["mu_hat"], m, selected=sel, alignment=alignment)
    cuts = [np.asarray(r["cut"], float).ravel() for r in rows if "cut" in r]
    out["cut"] = float(np.concatenate(cuts).mean()) if cuts else np.nan
    out["seeds"] = len(rows)
    out["slates"] = int(cat["R"].shape[0])
    return out
