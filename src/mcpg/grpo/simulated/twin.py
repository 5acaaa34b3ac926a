"""Chapter 7's twin of chapter 8: the simulated pool set from chapter 8's measured slates.

Chapter 7's default pool puts centred removal ahead of winner-take-all; chapter 8's LLM agents
put it behind. The twin is this simulator with everything it shares with chapter 8 set as
chapter 8 has it (K, m, prompts per update, updates, the router's ε and τ, gradient clipping),
and the rest fitted so that its untrained pool matches chapter 8's first rollout on the
measures of :mod:`mcpg.grpo.slate_measures`:

- agents right by competence on questions of shared difficulty (:class:`~.pool.Competence`),
  with each agent's skill fitted to its first-rollout accuracy, the spread of difficulty and
  the share of unsolvable questions to the agents' rightness correlation and the share of
  groups with no right candidate, and a cut outcome to the share of cut answers
  (:func:`fit_competence`);
- the router's check (``check_flip``) to the outcome model's AUC over training, and the
  agents' learning rate to winner-take-all's training accuracy (:func:`fit_scalar`);

then :data:`ABLATIONS` moves one variable at a time back to chapter 7's default
(:func:`ablation`).
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import optimize

from ..slate_measures import slate_measures
from .loop import train_pool
from .pool import Competence, SimConfig

__all__ = ["MATCHED", "untrained_measures", "training_measures", "fit_competence", "fit_scalar",
           "ABLATIONS", "ablation"]

MATCHED: tuple[str, ...] = ("accuracy_0", "accuracy_1", "accuracy_2", "rightness_corr", "question_corr",
                            "no_right", "cut")
"""The first-rollout measures :func:`fit_competence` matches (each agent's accuracy, the two
correlations of rightness, the share of groups with no right candidate, the share cut)."""


def _pooled(run, update_index: int) -> dict:
    """:func:`~mcpg.grpo.slate_measures.slate_measures` on one kept update's slates, every seed
    pooled, plus the share cut."""
    row = run.slates[update_index]
    cat = {k: np.concatenate(list(row[k])) for k in ("R", "p", "P", "mu_hat", "I")}
    m = run.cfg.completions_per_agent
    out = slate_measures(cat["R"], cat["p"], cat["P"], cat["mu_hat"], m, selected=cat["I"])
    out["cut"] = float(np.mean(row["cut"])) if row["cut"] is not None else 0.0
    return out


def untrained_measures(cfg: SimConfig, seeds=range(4), prompts: int | None = None) -> dict:
    """The measures of the untrained pool's first rollout (before any update), every seed's
    slates pooled; ``prompts`` overrides the rollout's size (a larger one measures the pool,
    not one small rollout)."""
    cfg1 = dataclasses.replace(cfg, updates=1, eval_questions=10, eval_every=1,
                               prompts_per_update=prompts or cfg.prompts_per_update)
    return _pooled(train_pool(cfg1, "frozen", seeds, keep_slates=1), 0)


def training_measures(cfg: SimConfig, method: str, seeds=range(8)) -> dict:
    """The measures over training: each update's slates pooled over seeds, averaged over updates
    (as :func:`~mcpg.grpo.slate_measures.grid_measures`' ``"mean"`` row for a recorded run)."""
    run = train_pool(cfg, method, seeds, keep_slates=cfg.updates)
    rows = [_pooled(run, u) for u in range(cfg.updates)]
    return {k: float(np.nanmean([r[k] for r in rows])) for k in rows[0]}


def fit_competence(targets: dict, cfg: SimConfig, prompts: int = 2000, seeds=(0, 1)) -> SimConfig:
    """``cfg`` with a :class:`~.pool.Competence` (skills, difficulty spread, cut logit) and an
    ``unsolvable`` share fitted so that its untrained pool's :data:`MATCHED` measures come as
    close as they can to ``targets`` (least squares, each measure in its own units; Nelder-Mead
    on a large first rollout with fixed seeds, so the objective is deterministic)."""
    K = cfg.n_agents
    keys = [k for k in MATCHED if k in targets and np.isfinite(targets[k])]

    def config(x):
        skill = tuple(float(v) for v in x[:K])
        sd, cut, uns = abs(float(x[K])), float(x[K + 1]), float(1 / (1 + np.exp(-x[K + 2])))
        comp = Competence(skill=skill, difficulty_sd=sd, cut_logit=cut if "cut" in keys else None)
        return dataclasses.replace(cfg, competence=comp, unsolvable=min(uns, 0.95))

    def loss(x):
        got = untrained_measures(config(x), seeds, prompts)
        return sum((got[k] - targets[k]) ** 2 for k in keys)

    x0 = np.r_[np.full(K, -1.5), 1.5, 0.0, -2.0]
    res = optimize.minimize(loss, x0, method="Nelder-Mead",
                            options={"xatol": 1e-2, "fatol": 1e-6, "maxfev": 600})
    return config(res.x)


def fit_scalar(cfg: SimConfig, field: str, target: float, measure: str, method: str, bounds,
               seeds=range(8), tol: float = 0.01) -> SimConfig:
    """``cfg`` with one scalar ``field`` set, by bisection within ``bounds``, so that the mean
    over training of ``measure`` (:func:`training_measures` under ``method``) meets ``target``;
    the measure must grow with the field (for one that falls, pass bounds high to low)."""
    lo, hi = bounds
    for _ in range(12):
        mid = (lo + hi) / 2
        got = training_measures(dataclasses.replace(cfg, **{field: mid}), method, seeds)[measure]
        if abs(got - target) < tol:
            break
        lo, hi = (mid, hi) if got < target else (lo, mid)
    return dataclasses.replace(cfg, **{field: mid})


ABLATIONS: dict[str, str] = {
    "rightness": "agents right by picking among a type's answers (chapter 7's default), at the "
                 "twin's accuracies",
    "difficulty": "no shared difficulty: each question alike (difficulty_sd = 0), the agents' "
                  "rightness independent given their skill",
    "horizon": "chapter 7's 150 updates of 32 prompts instead of 32 of 8",
    "cut": "no cut answers",
    "clipping": "no gradient clipping",
    "router": "chapter 7's router: τ = 0.5 and its check",
    "unsolvable": "no unsolvable questions",
}
"""One variable each, moved from the twin's value to chapter 7's default (:func:`ablation`)."""


def ablation(twin: SimConfig, name: str, default: SimConfig | None = None) -> SimConfig:
    """The twin with one variable (:data:`ABLATIONS`) moved to chapter 7's default pool's value.

    ``rightness`` keeps the twin's types, router and horizon and gives each agent chapter 7's
    picking policy over three answers, with the answer distribution set so that the untrained
    pool's mean accuracy is the twin's (answer 0 right with the twin's mean accuracy, the other
    two sharing the rest)."""
    default = default or SimConfig()
    comp = twin.competence
    if comp is None:
        raise ValueError("the twin must have a Competence")
    if name == "rightness":
        acc = float(np.clip(untrained_measures(twin, prompts=2000)["accuracy"], 0.05, 0.9))
        rest = (1 - acc) / 2
        probs = tuple((acc, rest, rest) for _ in range(twin.n_types))
        return dataclasses.replace(twin, competence=None, answer_probs=probs, unsolvable=0.0)
    if name == "difficulty":
        return dataclasses.replace(twin, competence=dataclasses.replace(comp, difficulty_sd=0.0))
    if name == "horizon":
        return dataclasses.replace(twin, updates=default.updates, prompts_per_update=default.prompts_per_update)
    if name == "cut":
        return dataclasses.replace(twin, competence=dataclasses.replace(comp, cut_logit=None))
    if name == "clipping":
        return dataclasses.replace(twin, max_grad_norm=default.max_grad_norm)
    if name == "router":
        return dataclasses.replace(twin, router_tau=default.router_tau, check_flip=default.check_flip)
    if name == "unsolvable":
        return dataclasses.replace(twin, unsolvable=default.unsolvable)
    raise ValueError(f"ablation must be one of {sorted(ABLATIONS)}, got {name!r}")
