"""Chapter 7's twin of chapter 8: the simulated pool set from chapter 8's measured slates.

Chapter 7's default pool puts centred removal ahead of winner-take-all; chapter 8's LLM agents
put it behind. The twin is this simulator with everything it shares with chapter 8 set as
chapter 8 has it (K, m, prompts per update, updates, the router's ε and τ, gradient clipping),
and the rest fitted so that its untrained pool matches chapter 8's first rollout on the
measures of :mod:`mcpg.grpo.slate_measures`:

- agents right by competence on questions of shared difficulty (:class:`~mcpg.grpo.simulated.Competence`),
  with each agent's skill fitted to its first-rollout accuracy, the spread of difficulty and
  the share of unsolvable questions to the agents' rightness correlation and the share of
  groups with no right candidate, and a cut outcome to the share of cut answers
  (:func:`fit_competence`);
- the router's check (``check_flip``) to the outcome model's AUC over training, and the
  agents' learning rate to winner-take-all's training accuracy (:func:`fit_scalar`);

then ``ABLATIONS`` moves one variable at a time back to chapter 7's default
(:func:`ablation`).
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
from scipy import optimize

from ..slate_measures import slate_measures
from .loop import train_pool
from .pool import Competence, SimConfig

__all__ = ["MATCHED", "untrained_measures", "training_measures", "competence_expectations",
           "fit_competence", "fit_scalar",
           "ABLATIONS", "ablation"]

MATCHED: tuple[str, ...] = ("accuracy_0", "accuracy_1", "accuracy_2", "rightness_corr", "question_corr",
                            "no_right", "cut")
"""The first-rollout measures :func:`fit_competence` matches (each agent's accuracy, the two
correlations of rightness, the share of groups with no right candidate, the share cut)."""


def _pooled(run, update_index: int, alignment: bool = True) -> dict:
    """:func:`~mcpg.grpo.slate_measures.slate_measures` on one kept update's slates, every seed
    pooled, plus the share cut."""
    row = run.slates[update_index]
    cat = {k: np.concatenate(list(row[k])) for k in ("R", "p", "P", "mu_hat", "I")}
    m = run.cfg.completions_per_agent
    out = slate_measures(cat["R"], cat["p"], cat["P"], cat["mu_hat"], m, selected=cat["I"],
                         alignment=alignment)
    out["cut"] = float(np.mean(row["cut"])) if row["cut"] is not None else 0.0
    return out


def untrained_measures(cfg: SimConfig, seeds=range(4), prompts: int | None = None,
                       alignment: bool = True) -> dict:
    """The measures of the untrained pool's first rollout (before any update), every seed's
    slates pooled; ``prompts`` overrides the rollout's size (a larger one measures the pool,
    not one small rollout); ``alignment=False`` skips the ``align_*`` measures (their exact
    sum over the router's draws is most of the cost)."""
    cfg1 = dataclasses.replace(cfg, updates=1, eval_questions=10, eval_every=1,
                               prompts_per_update=prompts or cfg.prompts_per_update)
    return _pooled(train_pool(cfg1, "frozen", seeds, keep_slates=1), 0, alignment)


def training_measures(cfg: SimConfig, method: str, seeds=range(8), alignment: bool = True) -> dict:
    """The measures over training: each update's slates pooled over seeds, averaged over updates
    (as :func:`~mcpg.grpo.slate_measures.grid_measures`' ``"mean"`` row for a recorded run)."""
    run = train_pool(cfg, method, seeds, keep_slates=cfg.updates)
    rows = [_pooled(run, u, alignment) for u in range(cfg.updates)]
    return {k: float(np.nanmean([r[k] for r in rows])) for k in rows[0]}


def competence_expectations(cfg: SimConfig, nodes: int = 40) -> dict:
    """The untrained competence pool's ``MATCHED`` measures (and ``accuracy``,
    ``team_success``, ``multi_right``), exactly: expectations over the question's difficulty and
    each agent's own by Gauss-Hermite quadrature, at the initial logits without their
    ``init_noise`` and specialty bonus.

    Given a solvable question's difficulty d and agent k's own e_k, agent k's m completions are
    each right with ``π_k(d + e_k)`` (the softmax of :class:`~mcpg.grpo.simulated.Competence`'s logits),
    independently; ``q_k(d) = E_e π_k`` is its chance on one slate, and the agents are
    independent given d. An unsolvable question (share u) has no right answer. So with
    ``a_k = (1 − u) E[π_k]``, two agents' rightness on one slate has covariance
    ``(1 − u) E_d[q_i q_j] − a_i a_j`` and variance ``a_k (1 − a_k)``; on one prompt (each
    agent's share right among its m completions) the same covariance, with variance
    ``Var((1 − u_q) π_k) + (1 − u) E[π_k (1 − π_k)] / m``.
    """
    comp = cfg.competence
    if comp is None:
        raise ValueError("competence_expectations needs a Competence")
    x, w = np.polynomial.hermite_e.hermegauss(nodes)
    w = w / w.sum()
    skill = np.asarray(comp.skill, dtype=float)
    K, u, m = len(skill), cfg.unsolvable, cfg.completions_per_agent
    hard = (comp.difficulty_sd * x)[:, None] + (comp.idiosyncratic_sd * x)[None, :]  # (Qd, Qe)
    right_logit = skill[:, None, None] - hard[None]  # (K, Qd, Qe)
    others = [np.zeros_like(right_logit)] * comp.wrong_answers
    if comp.cut_action is not None:
        others.append(np.full_like(right_logit, comp.cut_logit))
    logits = np.stack([right_logit, *others])  # (M, K, Qd, Qe)
    pi = np.exp(logits - logits.max(0))
    pi = pi / pi.sum(0)
    right = pi[0]  # (K, Qd, Qe)

    def over_e(f):  # E over each agent's own difficulty, (K, Qd)
        return (f * w).sum(-1)

    def over_d(f):  # E over the shared difficulty
        return (f * w).sum(-1)

    q = over_e(right)  # (K, Qd)
    acc = (1 - u) * over_d(q)  # (K,)
    pairs = list(itertools.combinations(range(K), 2))
    cov = [(1 - u) * over_d(q[i] * q[j]) - acc[i] * acc[j] for i, j in pairs]
    var_slate = acc * (1 - acc)
    var_q = ((1 - u) * over_d(over_e(right**2)) - acc**2) + (1 - u) * over_d(over_e(right * (1 - right))) / m
    none_slate = np.prod(1 - q, 0)  # (Qd,)
    one = sum(q[k] * np.prod(np.delete(1 - q, k, 0), 0) for k in range(K))
    team = (1 - u) * over_d(1 - none_slate)
    no_right_group = np.prod(over_e((1 - right) ** m), 0)  # (Qd,)

    def corr(v):
        return float(np.mean([c / np.sqrt(v[i] * v[j]) for c, (i, j) in zip(cov, pairs)]))

    out = {f"accuracy_{k}": float(acc[k]) for k in range(K)}
    out.update({
        "accuracy": float(acc.mean()),
        "rightness_corr": corr(var_slate),
        "question_corr": corr(var_q),
        "no_right": float(u + (1 - u) * over_d(no_right_group)),
        "team_success": float(team),
        "multi_right": float((1 - u) * over_d(1 - none_slate - one) / team) if team > 0 else np.nan,
        "cut": float(over_d(over_e(pi[-1])).mean()) if comp.cut_action is not None else 0.0,
    })
    return out


def fit_competence(targets: dict, cfg: SimConfig) -> SimConfig:
    """``cfg`` with a :class:`~mcpg.grpo.simulated.Competence` (each agent's skill, the spreads of the shared
    and the agent's own difficulty, the cut logit) and an ``unsolvable`` share fitted so that
    its untrained pool's
    ``MATCHED`` measures (:func:`competence_expectations`, exact) come as close as they can
    to ``targets``: least squares, each measure's error divided by its target (so that an
    accuracy of 0.04 counts as much as a correlation of 0.26)."""
    K = cfg.n_agents
    keys = [k for k in MATCHED if k in targets and np.isfinite(targets[k])]

    def config(x):
        skill = tuple(float(v) for v in x[:K])
        sd, own, cut = abs(float(x[K])), abs(float(x[K + 1])), float(x[K + 2])
        uns = float(1 / (1 + np.exp(-x[K + 3])))
        comp = Competence(skill=skill, difficulty_sd=sd, idiosyncratic_sd=own,
                          cut_logit=cut if "cut" in keys else None)
        return dataclasses.replace(cfg, competence=comp, unsolvable=min(uns, 0.95))

    def residuals(x):
        got = competence_expectations(config(x))
        return [(got[k] - targets[k]) / max(abs(targets[k]), 0.02) for k in keys]

    x0 = np.r_[np.full(K, -1.5), 1.5, 0.5, -0.5, -2.0]
    return config(optimize.least_squares(residuals, x0).x)


def fit_scalar(cfg: SimConfig, field: str, target: float, measure: str, method: str, bounds,
               seeds=range(8), tol: float = 0.01) -> SimConfig:
    """``cfg`` with one scalar ``field`` set, by bisection within ``bounds``, so that the mean
    over training of ``measure`` (:func:`training_measures` under ``method``) meets ``target``
    within ``tol``. The measure must move one way from ``bounds[0]`` to ``bounds[1]``: pass them
    so that it grows (``(0.45, 0.0)`` for ``check_flip`` against the AUC)."""
    lo, hi = bounds
    for _ in range(12):
        mid = (lo + hi) / 2
        trial = dataclasses.replace(cfg, **{field: mid})
        got = training_measures(trial, method, seeds, alignment=False)[measure]
        if abs(got - target) < tol:
            break
        lo, hi = (mid, hi) if got < target else (lo, mid)
    return dataclasses.replace(cfg, **{field: mid})


ABLATIONS: dict[str, str] = {
    "rightness": "agents right by picking one of M equally likely answers, M the nearest to the "
                 "twin's untrained accuracy's inverse (chapter 7's world; it has no cut outcome "
                 "and no difficulty)",
    "difficulty": "no difficulty at all, shared or the agent's own: the agents' rightness "
                  "independent given their skill",
    "updates": "chapter 7's 150 updates instead of 32",
    "prompts": "chapter 7's 32 prompts per update instead of 8",
    "cut": "no cut outcome",
    "clipping": "no gradient clipping",
    "router": "chapter 7's router: its τ and its check",
}
"""One variable each, moved from the twin's value to chapter 7's default (:func:`ablation`)."""


def ablation(twin: SimConfig, name: str, default: SimConfig | None = None) -> SimConfig:
    """The twin with one variable (``ABLATIONS``) moved to chapter 7's default pool's value."""
    default = default or SimConfig()
    comp = twin.competence
    if comp is None:
        raise ValueError("the twin must have a Competence")
    if name == "rightness":
        acc = untrained_measures(twin, prompts=2000, alignment=False)["accuracy"]
        M = int(np.clip(round(1 / max(acc, 1e-3)), 2, 50))
        probs = tuple(tuple([1 / M] * M) for _ in range(twin.n_types))
        return dataclasses.replace(twin, competence=None, answer_probs=probs, unsolvable=0.0)
    if name == "difficulty":
        return dataclasses.replace(twin, competence=dataclasses.replace(comp, difficulty_sd=0.0,
                                                                        idiosyncratic_sd=0.0))
    if name == "updates":
        return dataclasses.replace(twin, updates=default.updates)
    if name == "prompts":
        return dataclasses.replace(twin, prompts_per_update=default.prompts_per_update)
    if name == "cut":
        return dataclasses.replace(twin, competence=dataclasses.replace(comp, cut_logit=None))
    if name == "clipping":
        return dataclasses.replace(twin, max_grad_norm=default.max_grad_norm)
    if name == "router":
        return dataclasses.replace(twin, router_tau=default.router_tau, check_flip=default.check_flip)
    raise ValueError(f"ablation must be one of {sorted(ABLATIONS)}, got {name!r}")
