"""Monte Carlo probes: which way each credit signal pushes one agent, and what standardisation divides by.

Part of :mod:`mcpg.grpo.simulated` (chapter 7).
"""

from __future__ import annotations

import numpy as np
import torch

from ... import routing, stats
from ..objective import ADVANTAGE_EPS, SIGNALS, credit, group_advantages
from ..slate_diagnostics import advantage_moments, expected_advantages, group_alignment
from .pool import (
    SimConfig,
    _one_thread,
    _positive_int,
    calibrated_router,
    candidate_features,
    draw_questions,
)

__all__ = [
    "advantage_probe",
    "score_spread",
    "expected_advantages",
    "group_diagnostics",
    "rollout_diagnostics",
]


def _probe(cfg: SimConfig, type_index: int, others, n: int, rng: np.random.Generator, weights, agent: int):
    """One routed rollout of n groups: agent ``agent`` samples m answers uniformly, the
    others always give ``others``; returns (its answers (n, m), Z (n,), signal -> scores (n, m, K))."""
    _positive_int(n, "n")
    K, M, m = cfg.n_agents, cfg.n_answers, cfg.completions_per_agent
    others = np.asarray(others)
    if others.shape != (K,) or ((others < 0) | (others >= M)).any():
        raise ValueError(f"others must hold one answer in [0, {M}) per agent, shape ({K},)")
    if isinstance(agent, bool) or not isinstance(agent, (int, np.integer)) or not 0 <= agent < K:
        raise ValueError(f"agent must lie in [0, {K})")
    if (
        isinstance(type_index, bool)
        or not isinstance(type_index, (int, np.integer))
        or not 0 <= type_index < cfg.n_types
    ):
        raise ValueError(f"type_index must be an integer in [0, {cfg.n_types})")
    w = calibrated_router(cfg) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (cfg.n_features,) or np.isnan(w).any():
        raise ValueError(f"weights must be {cfg.n_features} numbers")
    q = np.asarray(cfg.answer_probs[type_index], dtype=float)
    if cfg.unsolvable > 0:  # Z = M: no candidate right
        z = rng.choice(M + 1, size=n, p=np.append(cfg.solvable_answer_probs()[type_index], cfg.unsolvable))
    else:
        z = rng.choice(M, size=n, p=q)
    checks = (np.arange(M)[None, :] == z[:, None]) ^ (rng.random((n, M)) < cfg.check_flip)
    actions = np.broadcast_to(others, (n, m, K)).copy()
    actions[..., agent] = rng.integers(0, M, size=(n, m))
    R = (actions == z[:, None, None]).astype(float)
    c = np.take_along_axis(np.broadcast_to(checks[:, None, :], (n, m, M)), actions, -1).astype(float)
    s = (candidate_features(cfg, np.full((n, m), type_index), actions, c) @ torch.as_tensor(w)).numpy()
    p = routing.router_propensities(s, tau=cfg.router_tau, eps=cfg.router_eps)
    P = routing.leave_one_out_propensities(s, tau=cfg.router_tau, eps=cfg.router_eps)
    mu = 1.0 / (1.0 + np.exp(-s))
    I = routing.sample_selection(p, rng)  # noqa: E741 (the paper's name)
    G = np.take_along_axis(R, I[..., None], -1)[..., 0]
    scores = {
        signal: credit(signal, I, G, p, P, mu, rewards_all=R) for signal in SIGNALS
    }
    return actions[..., agent], z, scores


def _mean_hw(x: np.ndarray) -> tuple[float, float]:
    x = np.asarray(x, dtype=float)
    if len(x) < 2:
        return (float(x.mean()) if len(x) else np.nan), np.nan
    m, hw = stats.mean_ci(x)
    return float(m), float(hw)


@_one_thread
def advantage_probe(
    cfg: SimConfig, type_index: int, others, n: int, rng: np.random.Generator, weights=None, agent: int = 0
):
    """Monte Carlo: the mean GRPO advantage of each answer of one agent, the others fixed.

    Agent ``agent`` samples its m answers uniformly; every other agent k always answers
    ``others[k]`` (the entry for ``agent`` is ignored). n questions of type ``type_index``
    are drawn, routed with ``weights`` (default :func:`calibrated_router`) by Eq. (3), and
    scored by each signal of :func:`~mcpg.grpo.objective.credit`; advantages are formed
    both as the engine does (:func:`~mcpg.grpo.objective.group_standardize`) and centred
    only (group mean subtracted). A positive mean advantage for answer a means the update
    moves the agent toward a.

    Returns a DataFrame with columns ``signal``, ``advantages`` ("standardised" or
    "centred"), ``answer``, ``mean``, ``±`` (95% t-interval half-width over the groups in which the
    agent gave that answer; one value per group) and ``n`` (those groups).
    """
    import pandas as pd

    mine, _, scores = _probe(cfg, type_index, others, n, rng, weights, agent)
    rows = []
    for signal, sc in scores.items():
        forms = {
            "standardised": group_advantages(sc, "group", eps=cfg.advantage_eps, axis=-2)[..., agent],
            "centred": group_advantages(sc, "none", axis=-2)[..., agent],
        }
        for form, adv in forms.items():
            for a in range(cfg.n_answers):
                hit = mine == a
                per_group = np.where(hit, adv, 0.0).sum(1) / np.maximum(hit.sum(1), 1)
                x = per_group[hit.any(1)]
                mean, hw = _mean_hw(x)
                rows.append(
                    {"signal": signal, "advantages": form, "answer": a, "mean": mean, "±": hw, "n": len(x)}
                )
    return pd.DataFrame(rows)


@_one_thread
def score_spread(
    cfg: SimConfig, type_index: int, others, n: int, rng: np.random.Generator, weights=None, agent: int = 0
):
    """Monte Carlo: how spread out one agent's m scores are within a group, by case.

    Same rollout as :func:`advantage_probe`. For each signal, the mean over groups of the
    standard deviation of the agent's m raw scores (what
    :func:`~mcpg.grpo.objective.group_standardize` divides by), separately for questions
    where some other agent's fixed answer is right ("others right") and where none is
    ("others wrong"). Returns a DataFrame: ``signal``, ``case``, ``mean``, ``±``, ``n``.
    """
    import pandas as pd

    _, z, scores = _probe(cfg, type_index, others, n, rng, weights, agent)
    others = np.asarray(others)
    right = np.isin(z, np.delete(others, agent))
    rows = []
    for signal, sc in scores.items():
        sd = sc[..., agent].std(axis=1, ddof=1)
        for case, sel in (("others right", right), ("others wrong", ~right)):
            mean, hw = _mean_hw(sd[sel])
            rows.append({"signal": signal, "case": case, "mean": mean, "±": hw, "n": int(sel.sum())})
    return pd.DataFrame(rows)


def group_diagnostics(p, P, mu_hat, rewards_all, eps: float = ADVANTAGE_EPS) -> dict:
    """The removal signal's GRPO groups, summarised: what chapter 8 measured on its LLM slates.

    Args: routed slates grouped as ``(..., m, K)`` (one prompt's m slates on axis -2):
    propensities ``p``, leave-one-out ``P`` ``(..., m, K, K)``, outcome model ``mu_hat``
    and every candidate's reward ``rewards_all``.

    Returns a dict:

    - ``no_right``: the share of groups with no right candidate on any slate;
    - ``auc``: the ROC AUC of ``mu_hat`` for right against wrong candidates;
    - ``abs_ea_group``, ``abs_ea_none``: the mean over completions of ``|E[A | completions]|``
      (:func:`expected_advantages`) for the removal signal of Eq. (19), standardised and centred;
    - ``abs_ea_group_no_right``, ``abs_ea_none_no_right``: the same over the groups with no
      right candidate (centred it is 0 there: Corollary 3);
    - ``corr_p``, ``corr_mu``: over those groups' completions, the correlation of the
      standardised ``E[A | completions]`` with the completion's propensity and with ``mu_hat``;
    - ``align_<signal>_<scaling>``, for ``wta``, ``removal`` and ``oracle`` under ``group`` and
      ``none``: the correlation of that signal's advantage with the completion's own reward,
      over completions and the router's draws
      (:func:`~mcpg.grpo.slate_diagnostics.group_alignment`).
    """
    p = np.asarray(p, dtype=float)
    mu = np.asarray(mu_hat, dtype=float)
    R = np.asarray(rewards_all, dtype=float)
    # each signal and scaling's draws are enumerated once, for E[A] and the alignment both
    moments = {(s, sc): advantage_moments(s, p, P, mu, R, sc, eps)
               for s in SIGNALS for sc in ("group", "none")}
    ea = {sc: moments["removal", sc][0] for sc in ("group", "none")}
    none_right = R.max(axis=(-2, -1)) == 0
    sel = np.broadcast_to(none_right[..., None, None], R.shape)
    x = ea["group"][sel]

    def corr(y):
        return float(np.corrcoef(x, y[sel])[0, 1]) if x.size > 2 and x.std() > 0 else np.nan

    return {
        "no_right": float(none_right.mean()), "auc": np.nan if (a := stats.roc_auc(mu, R)) is None else a,
        "abs_ea_group": float(np.abs(ea["group"]).mean()),
        "abs_ea_none": float(np.abs(ea["none"]).mean()),
        "abs_ea_group_no_right": float(np.abs(x).mean()) if x.size else np.nan,
        "abs_ea_none_no_right": float(np.abs(ea["none"][sel]).mean()) if x.size else np.nan,
        "corr_p": corr(p), "corr_mu": corr(mu),
        **{f"align_{s}_{sc}": group_alignment(s, p, P, mu, R, sc, eps=eps, moments=mo)["corr"]
           for (s, sc), mo in moments.items()},
    }


@_one_thread
def rollout_diagnostics(run, checkpoint: int = -1, prompts: int = 64, stream: int = 4):
    """What the LLM slates of chapter 8 were measured on, for a trained simulated pool.

    For each seed of ``run`` (a :class:`~mcpg.grpo.simulated.SimRun`), the pool at
    ``checkpoint`` (its policies and router) rolls out ``prompts`` fresh questions as in
    training (m sampled answers per agent; generator ``[seed, stream, checkpoint index]``),
    and one row per seed reports :func:`group_diagnostics` of the removal signal on it.
    """
    import pandas as pd

    cfg = run.cfg
    _positive_int(prompts, "prompts")
    K, M, m = cfg.n_agents, cfg.n_answers, cfg.completions_per_agent
    ci = range(len(run.updates))[checkpoint]
    rows = []
    for si, seed in enumerate(run.seeds):
        rng = np.random.default_rng([seed, stream, ci])
        types, z, checks = draw_questions(cfg, prompts, rng)
        pi = torch.softmax(torch.as_tensor(run.logits[si, ci]), -1).numpy()  # (K, T, M)
        cdf = np.cumsum(pi[:, types].transpose(1, 0, 2), -1)  # (B, K, M)
        u = rng.random((prompts, m, K))
        actions = np.minimum((u[..., None] > cdf[:, None]).sum(-1), M - 1)  # (B, m, K)
        R = (actions == z[:, None, None]).astype(float)
        c = np.take_along_axis(np.broadcast_to(checks[:, None, :], (prompts, m, M)), actions, -1)
        feats = candidate_features(cfg, np.broadcast_to(types[:, None], (prompts, m)), actions, c)
        s = (feats @ torch.as_tensor(run.router[si, ci])).numpy()
        p = routing.router_propensities(s, tau=cfg.router_tau, eps=cfg.router_eps)
        P = routing.leave_one_out_propensities(s, tau=cfg.router_tau, eps=cfg.router_eps)
        mu = 1.0 / (1.0 + np.exp(-s))
        rows.append({"seed": seed, "update": int(run.updates[ci]),
                     **group_diagnostics(p, P, mu, R, eps=cfg.advantage_eps)})
    return pd.DataFrame(rows)
