"""The multi-agent GRPO objective: credit signals, group standardisation, the clipped loss.

Paper §8 ("Task and signal"). One routed rollout gives, for every prompt b and slate g
(the g-th completion of each of the K agents), the router's logged propensities ``p``,
the leave-one-out propensities ``P``, the outcome model's ``mu_hat``, the selected
candidate ``I`` and its reward ``G = R^(I)``. This module turns them into a loss:

1. :func:`credit` scores each agent on each slate with one *signal*:

   - ``"wta"``: winner-take-all, ``1{I = i} G`` (Theorem 1: ascends agent i's private
     utility, not the system objective);
   - ``"removal"``: the doubly robust removal contribution of Eq. (19), computed from
     the logged propensities and the outcome model, using only the selected reward G
     (Corollary 3: unbiased for the exact removal contribution);
   - ``"oracle"``: a diagnostic that is *not* available under filtered feedback: the exact
     removal contribution with ``g_j = R^(j)``, every candidate's own reward.

   Each signal is one function and one registration in :mod:`mcpg.grpo.credits`, with the flags
   the engine reads (every candidate's reward, an exact budget, fixed before the router's draw);
   :func:`credit` calls it by name.

   :func:`budgeted_removal` is removal with exact evaluations on a budget (paper §7 inside
   the loop; chapter 9): a share of the slates, drawn by Eq. (22)'s allocation, get every
   candidate's reward queried, and the credit is Eq. (21)'s corrected estimate. Budget 0 is
   ``"removal"``, budget 1 is ``"oracle"``, exactly.

2. :func:`group_advantages` turns each agent's scores into advantages within its group of
   m completions of the same prompt, in TRL's conventions (``scale_rewards="group"``:
   :func:`group_standardize`, GRPO's group-relative advantage; ``"batch"``: centred in the
   group, divided by the standard deviation over the whole batch; ``"none"``: centred only, as
   in Dr. GRPO), so the routed methods differ only in the signal.

   :func:`route_and_credit` chains the whole step "route, draw I, credit, advantages"; the
   LLM engine and the simulated pool of chapter 7 both call it, so the two cannot drift.

3. :func:`clipped_grpo_loss` is the token-level PPO-clip objective in TRL's conventions
   (``GRPOTrainer._compute_loss``), applied to each agent's adapter.

Shapes used throughout: ``(B, m, K)`` for per-agent quantities (prompts, slates, agents),
``(B, m)`` for ``selected`` and ``reward``, ``(B, m, K, K)`` for ``P``. Any leading batch
shape works for :func:`credit`; the K agents are always on the last axis.

This module depends on numpy, torch and :mod:`mcpg.routing` only (no transformers), so
the simulated pool of chapter 7 can use it without an LLM stack. What the signals' advantages
do in expectation over the router's draws (``advantage_moments``, ``expected_advantages``, the
alignment and by-outcome tables) is analysis, not training: :mod:`mcpg.grpo.slate_diagnostics`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .. import allocation, routing
from . import credits
from .credits import as_array as _np

__all__ = [
    "SIGNALS",
    "LOSS_TYPES",
    "SCALE_REWARDS",
    "ADVANTAGE_EPS",
    "credit",
    "ExactFeedback",
    "budgeted_removal",
    "credit_leverage",
    "group_standardize",
    "group_advantages",
    "zero_std_groups",
    "RoutedCredit",
    "route_and_credit",
    "LossStats",
    "clipped_grpo_loss",
]

SIGNALS: tuple[str, ...] = credits.SIGNALS
"""The paper's three credit signals, read from the registry (:data:`mcpg.grpo.credits.SIGNALS`);
:func:`mcpg.grpo.credits.names` lists every signal :func:`credit` knows."""

LOSS_TYPES: tuple[str, ...] = ("dapo", "bnpo", "grpo", "dr_grpo")
"""Token aggregations of :func:`clipped_grpo_loss`, named as TRL's ``GRPOConfig.loss_type``."""

SCALE_REWARDS: tuple[str, ...] = ("group", "batch", "none")
"""Advantage scalings of :func:`group_advantages`, named as TRL's ``GRPOConfig.scale_rewards``."""

ADVANTAGE_EPS: float = 1e-4
"""Added to the group standard deviation before dividing (TRL's ``GRPOTrainer`` constant)."""


def credit(
    signal: str,
    selected,
    reward,
    p,
    P,
    mu_hat,
    rewards_all=None,
) -> np.ndarray:
    """Per-agent credit scores of one routed rollout (paper §8, "Task and signal").

    Args:
        signal: a registered credit signal (:mod:`mcpg.grpo.credits`): the paper's ``"wta"``
            (``1{I=i} G``, Theorem 1), ``"removal"`` (Eq. 19: doubly robust removal
            contribution from selected feedback, Corollary 3), ``"oracle"`` (exact removal
            contribution ``sum_j p_j R^(j) - sum_{j != i} p^{-i}_j R^(j)`` using every
            candidate's reward; a full-feedback diagnostic), or another registered one.
        selected: index I of the deployed candidate, ints of shape ``(...)``.
        reward: the deployed reward ``G = R^(I)``, shape ``(...)``.
        p: logged router propensities (Eq. 3), shape ``(..., K)``.
        P: leave-one-out propensities, shape ``(..., K, K)``.
        mu_hat: outcome model ``sigmoid(s_j)``, shape ``(..., K)``; used by ``"removal"``.
        rewards_all: every candidate's reward ``R^(j)``, shape ``(..., K)``; read only by the
            signals registered with ``all_rewards`` (``"oracle"``), and checked against
            ``reward`` there.

    Returns:
        float array of shape ``(..., K)``: agent i's score on each slate.

    Numpy or torch inputs are accepted; the result is numpy. The signal's function receives
    only what its registration declares: ``rewards_all`` with ``all_rewards``, neither I nor G
    with ``before_draw``.
    """
    spec = credits.get(signal)
    selected = _np(selected, "selected")
    reward = _np(reward, "reward").astype(float)
    p = _np(p, "p").astype(float)
    if p.ndim == 0:
        raise ValueError("p must have the K candidates on its last axis")
    R = None
    if spec.all_rewards:
        if rewards_all is None:
            raise ValueError(f"rewards_all is required by signal {signal!r} (every candidate's reward R^(j))")
        R = _np(rewards_all, "rewards_all").astype(float)
        if R.shape != p.shape:
            raise ValueError(f"rewards_all must have shape {p.shape}, got {R.shape}")
        sel = np.asarray(selected).astype(int)
        if not np.allclose(np.take_along_axis(R, sel[..., None], axis=-1)[..., 0], reward):
            raise ValueError("reward must equal rewards_all at the selected candidate (G = R^(I))")
    if spec.before_draw:
        selected = reward = None
    return spec.fn(selected, reward, p, P, mu_hat, R)


def _groups(scores, axis: int) -> tuple[torch.Tensor, bool]:
    """``scores`` as a tensor (float64 from numpy) with at least 2 completions on ``axis``, checked."""
    is_torch = isinstance(scores, torch.Tensor)
    x = scores if is_torch else torch.as_tensor(_np(scores, "scores"), dtype=torch.float64)
    if torch.isnan(x).any():
        raise ValueError("scores contains NaN")
    if x.ndim == 0:
        raise ValueError("scores must have a group axis")
    if x.shape[axis] < 2:
        raise ValueError(f"scores needs at least 2 completions per group on axis {axis}, got {x.shape[axis]}")
    return x, is_torch


def group_standardize(scores, eps: float = ADVANTAGE_EPS, axis: int = -2):
    """GRPO's group-relative advantage, per agent: ``(x - mean) / (std + eps)`` over the group.

    Each agent's group is its m completions of one prompt, which sit on ``axis``
    (default ``-2`` for scores of shape ``(..., m, K)``: the agents on the last axis are
    standardised separately). As in TRL's ``GRPOTrainer`` (``scale_rewards="group"``) the
    standard deviation is the unbiased one and ``eps`` is added to it, so a group whose
    scores are all equal gets advantages 0. The result has the type of the input
    (numpy in, numpy out; torch in, torch out).
    """
    if not eps >= 0:
        raise ValueError(f"eps must be non-negative, got {eps}")
    x, is_torch = _groups(scores, axis)
    mean = x.mean(dim=axis, keepdim=True)
    std = x.std(dim=axis, keepdim=True, unbiased=True)
    out = (x - mean) / (std + eps)
    return out if is_torch else out.numpy()


def _batch_std(x: torch.Tensor, axis: int, batch_axis: int | None) -> torch.Tensor:
    """Each agent's unbiased standard deviation over the batch: the group axis and the prompts'."""
    if batch_axis is None:
        raise ValueError("scale_rewards 'batch' divides by the standard deviation over the batch: "
                         "give batch_axis, the prompts' axis")
    if not -x.ndim <= batch_axis < x.ndim:
        raise ValueError(f"batch_axis {batch_axis} does not exist in scores of shape {tuple(x.shape)}")
    dims = sorted({axis % x.ndim, batch_axis % x.ndim})
    if (x.ndim - 1) in dims:
        raise ValueError("the agents' axis (the last) cannot be part of the batch")
    return x.std(dim=dims, keepdim=True, unbiased=True)


def group_advantages(scores, scale_rewards: str = "group", eps: float = ADVANTAGE_EPS, axis: int = -2,
                     batch_axis: int | None = None):
    """Per-agent group advantages in TRL's conventions (``GRPOConfig.scale_rewards``).

    - ``"group"``: ``(x - mean) / (std + eps)`` within each group (:func:`group_standardize`;
      unbiased std, TRL's ``eps = 1e-4``);
    - ``"batch"``: ``(x - mean) / (std_batch + eps)``: centred within each group, divided by the
      unbiased standard deviation of the agent's scores over the whole batch (every prompt's
      group: the axes ``axis`` and ``batch_axis``), as TRL's ``GRPOTrainer`` does with
      ``scale_rewards="batch"`` (``nanstd(rewards)`` over the batch);
    - ``"none"``: ``x - mean``, centred only (Dr. GRPO), which keeps the signal's scale, so an
      unbiased credit signal (Corollary 3) stays an unbiased direction after the baseline.

    The group (one prompt's m completions) sits on ``axis``, the prompts on ``batch_axis``
    (read by ``"batch"`` only, which needs it); agents on the last axis are treated
    separately: each agent is its own GRPO problem, so its batch is its own scores.
    numpy in, numpy out; torch in, torch out.
    """
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    if scale_rewards == "group":
        return group_standardize(scores, eps=eps, axis=axis)
    x, is_torch = _groups(scores, axis)
    out = x - x.mean(dim=axis, keepdim=True)
    if scale_rewards == "batch":
        out = out / (_batch_std(x, axis, batch_axis) + eps)
    return out if is_torch else out.numpy()


def zero_std_groups(scores, axis: int = -2) -> np.ndarray:
    """Which groups have scores with zero spread (no learning signal after the baseline).

    Returns a boolean array: ``scores`` with ``axis`` removed, True where the group's
    unbiased standard deviation is zero by TRL's test (``isclose(std, 0)``, its
    ``frac_reward_zero_std`` metric). The mean over everything but the last (agent) axis
    is each agent's zero-std fraction.
    """
    x = _np(scores, "scores").astype(float)
    if x.ndim == 0 or x.shape[axis] < 2:
        raise ValueError("scores needs a group axis with at least 2 completions")
    std = x.std(axis=axis, ddof=1)
    return np.isclose(std, 0.0, rtol=1e-5, atol=1e-8)


def credit_leverage(
    scores, scale_rewards: str = "group", eps: float = ADVANTAGE_EPS, axis: int = -2,
    batch_axis: int | None = None,
) -> np.ndarray:
    """The gradient leverage a of each credit score: how much an error in it moves its advantage.

    With ``scale_rewards="none"`` the advantage is the centred score, so a = 1. With
    ``"group"`` it is divided by the group's standard deviation, so to first order an error
    in one score moves its advantage by 1/(std + eps): a = 1/(std + eps) of the agent's
    group (the m scores on ``axis``); with ``"batch"``, 1/(std + eps) of the agent's scores
    over the batch (``axis`` and ``batch_axis``, as :func:`group_advantages`). Returns an array
    of the shape of ``scores``.
    """
    x = _np(scores, "scores").astype(float)
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    if scale_rewards == "none":
        return np.ones_like(x)
    if scale_rewards == "batch":
        std = _batch_std(torch.as_tensor(x), axis, batch_axis).numpy()
    else:
        std = x.std(axis=axis, ddof=1, keepdims=True)
    return np.broadcast_to(1.0 / (std + eps), x.shape).copy()


@dataclass(frozen=True)
class ExactFeedback:
    """The exact evaluations of one rollout (:func:`budgeted_removal`), per slate ``(..., m)``.

    Attributes:
        p: the probability each slate was evaluated with (Eq. 22; floored for the rules
            other than ``"leverage"``, which allows 0).
        z: 1 where it was evaluated (every candidate's reward queried).
        cost: reward queries beyond the deployed one: K − 1 where z = 1, else 0.
        delta_hat: Eq. (19)'s estimate, ``(..., m, K)``.
        proxy: the predicted squared error v: :func:`mcpg.allocation.predraw_error_proxy`
            under rule ``"leverage"``, else :func:`mcpg.allocation.removal_error_proxy`.
        leverage: a, ``(..., m, K)``: the gradient leverage passed in under rule
            ``"leverage"`` (‖Ψ_i‖ or its proxy), else :func:`credit_leverage`.
    """

    p: np.ndarray
    z: np.ndarray
    cost: np.ndarray
    delta_hat: np.ndarray
    proxy: np.ndarray
    leverage: np.ndarray


def budgeted_removal(
    selected,
    reward,
    p,
    P,
    mu_hat,
    rewards_all,
    budget: allocation.ExactBudget,
    rng: np.random.Generator,
    scale_rewards: str = "group",
    advantage_eps: float = ADVANTAGE_EPS,
    leverage=None,
) -> tuple[np.ndarray, ExactFeedback]:
    """Removal credit with exact evaluations on a budget: Eq. (19), Eq. (22), Eq. (21).

    Shapes ``(..., m, K)`` with the GRPO group (m slates of one prompt) on axis -2 (and, for
    ``scale_rewards="batch"``, the prompts on axis -3).

    1. Δ̂ = Eq. (19) from the selected feedback (:func:`credit` ``"removal"``);
    2. per slate, p from ``budget`` (:meth:`mcpg.allocation.ExactBudget.probabilities`): a
       leverage a, the predicted η² from the outcome model and the calibration learned from
       earlier evaluations, cost K − 1. Rules ``"sqrt"``, ``"uniform"``, ``"proportional"``:
       a of :func:`credit_leverage` and η² of :func:`mcpg.allocation.removal_error_proxy`
       (both read the draw), p floored above 0. Rule ``"leverage"``: ``leverage`` (the
       gradient leverage ‖Ψ_i‖ of each completion, or a proxy; required) and η² of
       :func:`mcpg.allocation.predraw_error_proxy`, nothing from the draw, p = 0 allowed;
    3. Z ~ Bernoulli(p) per slate, from ``rng`` (its own generator, so that budget 0 draws
       nothing and leaves every other draw as in ``"removal"``);
    4. where Z = 1, every candidate's reward is read and Y = the exact removal contribution
       (the ``"oracle"`` credit of that slate); the credit is Eq. (21)'s
       Δ̃ = Δ̂ + Z/p (Y − Δ̂). With every p > 0 it is unbiased for Y on every slate, given the
       draw; under ``"leverage"`` a slate with p = 0 keeps Δ̂, unbiased over the router's draw
       only (Corollary 3), which is why its p may not depend on the draw;
    5. ``budget`` learns from this rollout's evaluations (used from the next rollout on).

    Returns ``(credit, ExactFeedback)``. With ``budget.share == 0`` the credit is Δ̂ itself
    (no evaluation); with ``share == 1`` every p = 1 and the credit is Y itself.
    """
    delta_hat = credit("removal", selected, reward, p, P, mu_hat)
    p_arr = _np(p, "p").astype(float)
    slate_shape, K = p_arr.shape[:-1], p_arr.shape[-1]
    zeros = np.zeros(slate_shape)
    if budget.share == 0.0:
        none = np.zeros_like(delta_hat)
        return delta_hat, ExactFeedback(p=zeros, z=zeros.astype(int), cost=zeros, delta_hat=delta_hat,
                                        proxy=none, leverage=none + 1.0)
    if budget.rule == "leverage":  # before the draw: the gradient's leverage, Eq. (19)'s expected error
        if leverage is None:
            raise ValueError("rule 'leverage' needs the gradient leverage of each completion (leverage=)")
        lev = _np(leverage, "leverage").astype(float)
        if lev.shape != p_arr.shape:
            raise ValueError(f"leverage must have shape {p_arr.shape}, got {lev.shape}")
        proxy = allocation.predraw_error_proxy(p_arr, _np(P, "P"), _np(mu_hat, "mu_hat"))
    else:  # the advantage's leverage and the error given the draw
        proxy = allocation.removal_error_proxy(selected, reward, p_arr, _np(P, "P"), _np(mu_hat, "mu_hat"))
        lev = credit_leverage(delta_hat, scale_rewards, advantage_eps, axis=-2,
                              batch_axis=-3 if scale_rewards == "batch" else None)
    cost = np.full(slate_shape, float(K - 1))
    prob = budget.probabilities(lev.reshape(-1, K), proxy.reshape(-1, K), cost.reshape(-1))
    prob = prob.reshape(slate_shape)
    z = (rng.random(slate_shape) < prob).astype(int)
    R = _np(rewards_all, "rewards_all").astype(float)
    if R.shape != p_arr.shape:
        raise ValueError(f"rewards_all must have shape {p_arr.shape}, got {R.shape}")
    # read the rewards of evaluated slates only (the others stay unqueried: zeros)
    R_read = np.where(z[..., None] == 1, R, 0.0)
    y = routing.removal_contributions(R_read, p_arr, _np(P, "P"))
    scores = allocation.corrected_contribution(delta_hat, y, z[..., None], prob[..., None])  # Eq. (21)
    budget.observe(z.reshape(-1), prob.reshape(-1), delta_hat.reshape(-1, K), y.reshape(-1, K),
                   proxy.reshape(-1, K))
    return scores, ExactFeedback(p=prob, z=z, cost=z * float(K - 1), delta_hat=delta_hat, proxy=proxy,
                                 leverage=lev)


@dataclass(frozen=True)
class RoutedCredit:
    """What :func:`route_and_credit` returns for one routed rollout of shape ``(..., m, K)``.

    Attributes:
        I: the deployed candidate of each slate, ints ``(..., m)``.
        G: its reward ``R^(I)``, the only reward fed back, ``(..., m)``.
        scores: the signal's per-agent credit (:func:`credit`), ``(..., m, K)``.
        advantages: the per-agent group advantages (:func:`group_advantages`), ``(..., m, K)``.
        zero_std_fraction: per agent, the share of groups whose scores have zero spread, ``(K,)``.
        exact: with an exact budget, the rollout's :class:`ExactFeedback` (else None).
    """

    I: np.ndarray  # noqa: E741 (the paper's name)
    G: np.ndarray
    scores: np.ndarray
    advantages: np.ndarray
    zero_std_fraction: np.ndarray
    exact: ExactFeedback | None = None


def route_and_credit(
    signal: str,
    p,
    P,
    mu_hat,
    rewards_all,
    rng: np.random.Generator | Sequence[np.random.Generator],
    scale_rewards: str = "group",
    advantage_eps: float = ADVANTAGE_EPS,
    budget: allocation.ExactBudget | Sequence[allocation.ExactBudget] | None = None,
    budget_rng: np.random.Generator | Sequence[np.random.Generator] | None = None,
    leverage=None,
) -> RoutedCredit:
    """Route, draw I, credit, advantages: one step of the multi-agent GRPO update (paper §8).

    1. draw the deployed candidate ``I ~ p`` on every slate (Eq. 3's propensities, logged);
    2. feed back only ``G = R^(I)`` (filtered feedback);
    3. score each agent with ``signal`` (:func:`credit`; only a signal registered with
       ``all_rewards``, the oracle, reads all of R);
    4. form per-agent group advantages over the m slates of a prompt (:func:`group_advantages`).

    Args:
        signal: a registered signal (:func:`mcpg.grpo.credits.names`).
        p: propensities ``(..., m, K)``; P: leave-one-out propensities ``(..., m, K, K)``;
            mu_hat: the outcome model ``(..., m, K)``.
        rewards_all: every candidate's reward ``R^(j)``, ``(..., m, K)``. The loop needs it to
            look up ``G = R^(I)``; only the signals registered with ``all_rewards`` see the rest.
        rng: a generator, or a sequence of generators, one per index of the first axis (the
            simulated pool runs independent seeds side by side).
        scale_rewards, advantage_eps: TRL's advantage scaling (:data:`SCALE_REWARDS`, ``1e-4``);
            ``"batch"`` reads the prompts on axis -3 (``(..., B, m, K)``: the batch of one seed).
        budget, budget_rng: for a signal registered with ``exact_budget`` only (``"removal"``),
            exact evaluations on a budget (:func:`budgeted_removal`;
            :func:`mcpg.grpo.credits.exact_budget` says when a run has one): an
            :class:`mcpg.allocation.ExactBudget` and its own generator, or one of each per index of
            the first axis, like ``rng``. None: Eq. (19) alone.
        leverage: the gradient leverage ‖Ψ_i‖ of each completion, ``(..., m, K)``; needed by
            a budget of rule ``"leverage"`` only.

    K = 1 works: removal's leave-one-out slate is empty (deploys nothing, value 0), so
    removal, winner-take-all and the oracle all credit the single agent with G.
    """
    p = _np(p, "p").astype(float)
    R = _np(rewards_all, "rewards_all").astype(float)
    if p.ndim < 2 or R.shape != p.shape:
        raise ValueError(f"p and rewards_all must share a shape (..., m, K); got {p.shape} and {R.shape}")
    if isinstance(rng, np.random.Generator):
        I = routing.sample_selection(p, rng)  # noqa: E741 (the paper's name)
    else:
        rngs = list(rng)
        if p.ndim < 3 or len(rngs) != p.shape[0]:
            raise ValueError(f"one generator per index of the first axis is needed "
                             f"({p.shape[0]}), got {len(rngs)}")
        I = np.stack([routing.sample_selection(p[s], r) for s, r in enumerate(rngs)])  # noqa: E741
    G = np.take_along_axis(R, I[..., None], axis=-1)[..., 0]
    exact = None
    if budget is None:
        scores = credit(signal, I, G, p, P, mu_hat, rewards_all=R)  # read only where registered so
    elif not credits.get(signal).exact_budget:  # a budget given at all, even of share 0
        credits.check_exact_budget(signal, 1.0, what="an exact budget")
    elif isinstance(budget, allocation.ExactBudget):
        if not isinstance(budget_rng, np.random.Generator):
            raise ValueError("budget_rng must be a numpy Generator when budget is one ExactBudget")
        scores, exact = budgeted_removal(I, G, p, P, mu_hat, R, budget, budget_rng,
                                         scale_rewards, advantage_eps, leverage)
    else:  # one budget and one generator per index of the first axis (independent seeds)
        budgets, brngs = list(budget), list(budget_rng or [])
        if len(budgets) != p.shape[0] or len(brngs) != p.shape[0]:
            raise ValueError(f"one budget and one budget_rng per index of the first axis ({p.shape[0]}) "
                             f"are needed, got {len(budgets)} and {len(brngs)}")
        P_arr, mu_arr = _np(P, "P"), _np(mu_hat, "mu_hat")
        lev = [None] * len(budgets) if leverage is None else _np(leverage, "leverage")
        parts = [budgeted_removal(I[s], G[s], p[s], P_arr[s], mu_arr[s], R[s], b, r, scale_rewards,
                                  advantage_eps, lev[s]) for s, (b, r) in enumerate(zip(budgets, brngs))]
        scores = np.stack([c for c, _ in parts])
        exact = ExactFeedback(**{f: np.stack([getattr(e, f) for _, e in parts])
                                 for f in ("p", "z", "cost", "delta_hat", "proxy", "leverage")})
    adv = group_advantages(scores, scale_rewards=scale_rewards, eps=advantage_eps, axis=-2,
                           batch_axis=-3 if scale_rewards == "batch" else None)
    zs = zero_std_groups(scores, axis=-2)
    return RoutedCredit(I=I, G=G, scores=scores, advantages=adv,
                        zero_std_fraction=zs.reshape(-1, zs.shape[-1]).mean(axis=0), exact=exact)


@dataclass(frozen=True)
class LossStats:
    """What :func:`clipped_grpo_loss` measures beside the loss (``return_stats=True``), as sums over
    the counted tokens (``mask``), so that micro-batches and processes add up exactly.

    Attributes:
        tokens: the counted tokens.
        low_clipped: tokens whose ratio lies below ``1 - eps_low`` with a negative advantage
            (TRL's ``is_low_clipped``; the clip removes their gradient).
        high_clipped: tokens whose ratio lies above ``1 + eps_high`` with a positive advantage
            (TRL's ``is_high_clipped``).
        approx_kl: the sum of ``(r_t - 1) - log r_t``, the k3 estimate of KL(old || new) that
            CleanRL logs as ``approx_kl`` (0 on-policy).
        kl: the sum of the KL term as it enters the loss (before ``beta``), TRL's ``kl`` metric;
            0 when ``beta`` is 0.

    :meth:`means` gives TRL's logged names (``clip_ratio/low_mean``, ...) as means over the tokens.
    """

    tokens: torch.Tensor
    low_clipped: torch.Tensor
    high_clipped: torch.Tensor
    approx_kl: torch.Tensor
    kl: torch.Tensor

    def means(self) -> dict[str, float]:
        """Means over the counted tokens, under TRL's metric names (and CleanRL's ``approx_kl``)."""
        n = float(self.tokens.clamp(min=1.0))
        low, high = float(self.low_clipped) / n, float(self.high_clipped) / n
        return {"clip_ratio/low_mean": low, "clip_ratio/high_mean": high,
                "clip_ratio/region_mean": low + high, "approx_kl": float(self.approx_kl) / n,
                "kl": float(self.kl) / n}


def clipped_grpo_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    loss_type: str = "dapo",
    max_completion_length: int | None = None,
    beta: float = 0.0,
    logp_ref: torch.Tensor | None = None,
    use_bias_correction_kl: bool = True,
    return_stats: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, LossStats]:
    """Token-level PPO-clip GRPO loss, as TRL's ``GRPOTrainer`` computes it.

    With ratio ``r_t = exp(logp_new_t - logp_old_t)`` and one advantage ``A`` per completion,
    the per-token loss is ``-min(r_t A, clip(r_t, 1 - eps_low, 1 + eps_high) A)``, plus
    ``beta * KL_t`` when ``beta != 0``: TRL's k3 estimator of the KL divergence to the
    reference policy, ``KL_t = exp(d_t) - d_t - 1`` with ``d_t = logp_ref_t - logp_new_t``,
    multiplied by ``r_t`` when ``use_bias_correction_kl`` (TRL's default: the unbiased
    reverse-KL gradient; ``r_t`` is 1 on-policy but its gradient is not 0). Tokens are
    aggregated as TRL's ``loss_type`` says:

    - ``"dapo"`` (TRL's default): sum over all active tokens of the batch / their number;
    - ``"bnpo"``: the same within one local batch (identical here: one batch, one process);
    - ``"grpo"``: per-sequence mean over its tokens, then mean over sequences;
    - ``"dr_grpo"``: sum / (number of sequences * ``max_completion_length``).

    Args:
        logp_new: log-probabilities of the sampled tokens under the current policy, (N, T).
        logp_old: the same under the policy that sampled them (no gradient), (N, T).
        advantages: one advantage per completion, (N,) (or per token, (N, T)).
        mask: 1 for completion tokens that count, 0 for padding, (N, T).
        clip_eps: lower clipping epsilon (TRL ``epsilon``).
        clip_eps_high: upper clipping epsilon (TRL ``epsilon_high``); defaults to ``clip_eps``.
        loss_type: one of :data:`LOSS_TYPES`.
        max_completion_length: the constant of ``"dr_grpo"``; defaults to T.
        beta: KL coefficient (TRL ``beta``, default 0: no reference model).
        logp_ref: reference-policy log-probabilities, (N, T), needed when ``beta != 0``.
        use_bias_correction_kl: TRL's key of that name (default True): weight the KL term by
            the probability ratio.
        return_stats: also return the :class:`LossStats` of the batch (clipped tokens low and
            high, approximate KL), computed from the same ratios as the loss.

    Returns:
        a scalar tensor; its gradient flows through ``logp_new`` only. With ``return_stats``,
        ``(loss, LossStats)``.
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if logp_new.shape != logp_old.shape or logp_new.shape != mask.shape or logp_new.ndim != 2:
        raise ValueError(
            "logp_new, logp_old and mask must share one shape (N, T); got "
            f"{tuple(logp_new.shape)}, {tuple(logp_old.shape)} and {tuple(mask.shape)}"
        )
    if not clip_eps >= 0:
        raise ValueError(f"clip_eps must be non-negative, got {clip_eps}")
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not eps_high >= 0:
        raise ValueError(f"clip_eps_high must be non-negative, got {clip_eps_high}")
    adv = torch.as_tensor(advantages, dtype=logp_new.dtype, device=logp_new.device)
    if adv.ndim == 1:
        if adv.shape[0] != logp_new.shape[0]:
            raise ValueError(f"advantages must have shape ({logp_new.shape[0]},), got {tuple(adv.shape)}")
        adv = adv.unsqueeze(1)
    elif adv.shape != logp_new.shape:
        raise ValueError(f"advantages must have shape (N,) or (N, T), got {tuple(adv.shape)}")
    if torch.isnan(adv).any():
        raise ValueError("advantages contains NaN")
    mask = mask.to(logp_new.dtype)

    coef_1 = torch.exp(logp_new - logp_old.detach())
    coef_2 = torch.clamp(coef_1, 1 - clip_eps, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * adv, coef_2 * adv)
    kl = None
    if beta != 0.0:
        if logp_ref is None:
            raise ValueError("logp_ref is required when beta != 0")
        if logp_ref.shape != logp_new.shape:
            raise ValueError(f"logp_ref must have shape {tuple(logp_new.shape)}, got {tuple(logp_ref.shape)}")
        d = logp_ref.detach() - logp_new
        kl = torch.exp(d) - d - 1
        if use_bias_correction_kl:
            kl = kl * coef_1
        per_token_loss = per_token_loss + beta * kl

    if loss_type in ("dapo", "bnpo"):
        loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    elif loss_type == "grpo":
        loss = ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    else:
        T = logp_new.shape[1] if max_completion_length is None else int(max_completion_length)
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * T)
    if not return_stats:
        return loss
    with torch.no_grad():
        ratio, m = coef_1.detach(), mask.double()
        low = (ratio < 1 - clip_eps) & (adv < 0)
        high = (ratio > 1 + eps_high) & (adv > 0)
        log_ratio = logp_new.detach() - logp_old.detach()
        stats = LossStats(tokens=m.sum(), low_clipped=(low * m).sum(), high_clipped=(high * m).sum(),
                          approx_kl=((torch.expm1(log_ratio) - log_ratio) * m).sum(),
                          kl=(kl.detach() * m).sum() if kl is not None else m.new_zeros(()))
    return loss, stats
