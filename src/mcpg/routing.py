"""Routed systems: router propensities and removal contributions under filtered feedback.

Paper §3.1 (the softmax router, Eq. 3; winner-take-all credit, Theorem 1) and §6.1
(removal contributions identified from selected feedback, Eq. 19 and Corollary 3).

Conventions: the K candidates of a slate sit on the last axis; any leading axes are
batch axes (prompts, slates, Monte Carlo draws). Everything is numpy, except
:func:`ipw_outcome_loss`, which is a torch loss for training an outcome model.
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array, check_positive, check_same_shape, leave_one_out

__all__ = [
    "router_propensities",
    "leave_one_out_propensities",
    "removal_contributions",
    "dr_removal_contributions",
    "winner_take_all_scores",
    "routing_entropy",
    "sample_selection",
    "rerun_slates",
    "ipw_outcome_loss",
]


def _check_tau_eps(tau: float, eps: float) -> None:
    if not np.isfinite(tau) or tau <= 0:
        raise ValueError(f"tau must be a positive finite temperature, got {tau}")
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"eps must lie in [0, 1], got {eps}")


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    z = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=axis, keepdims=True)


def router_propensities(scores, tau: float = 1.0, eps: float = 0.0) -> np.ndarray:
    """Selection probabilities of the softmax router with uniform exploration (Eq. 3).

    ``p_j = (1 - eps) * softmax_j(s_j / tau) + eps / K`` over the last axis.

    Args:
        scores: router scores s(H, A^(j)), shape (..., K). ``-inf`` marks a deleted
            candidate, which then receives probability 0 (exploration is spread over the
            candidates that remain).
        tau: softmax temperature, > 0. Small tau selects the best-scored candidate.
        eps: uniform exploration weight in [0, 1]. Any eps > 0 keeps every propensity
            at least eps / K, the overlap that Corollary 3 needs.
    """
    s = np.asarray(scores, dtype=float)
    if np.isnan(s).any():
        raise ValueError("scores contains NaN")
    if s.ndim == 0 or s.shape[-1] == 0:
        raise ValueError("scores must have the K candidates on a non-empty last axis")
    _check_tau_eps(tau, eps)
    if np.isposinf(s).any():
        raise ValueError("scores must be finite or -inf (a deleted candidate)")
    present = ~np.isneginf(s)
    k = present.sum(axis=-1, keepdims=True)
    if (k == 0).any():
        raise ValueError("scores has a slate with every candidate deleted")
    soft = _softmax(np.where(present, s / tau, -np.inf))
    return (1.0 - eps) * soft + eps * present / k


def leave_one_out_propensities(scores, tau: float = 1.0, eps: float = 0.0) -> np.ndarray:
    """Propensities p^{-i}_j of the same router on the slate with candidate i deleted.

    Returns shape (..., K, K): row i is Eq. (3) applied to the K - 1 candidates other
    than i (exploration eps / (K - 1)), and ``P[..., i, i] = 0``. With K = 1 the slate
    without the only candidate is empty: it deploys nothing, so its row is all zeros
    (and the removal contribution of the single candidate is its whole value).
    """
    s = as_float_array(scores, "scores")
    K = s.shape[-1] if s.ndim else 0
    if K < 1:
        raise ValueError("scores must hold at least one candidate")
    _check_tau_eps(tau, eps)
    if K == 1:
        return np.zeros(s.shape + (1,))
    rows = np.broadcast_to(s[..., None, :], s.shape[:-1] + (K, K)).copy()
    idx = np.arange(K)
    rows[..., idx, idx] = -np.inf
    return router_propensities(rows, tau=tau, eps=eps)


def removal_contributions(g, p, P) -> np.ndarray:
    """Exact removal contributions of every candidate (paper §6.1).

    ``Delta^rem_i = sum_j p_j g_j - sum_{j != i} p^{-i}_j g_j``: the drop in expected
    deployed reward when candidate i is deleted from the slate.

    Args:
        g: candidate values g_j(H, A^(j)) = E[R^(j) | H, A^(j)], shape (..., K).
        p: router propensities, shape (..., K).
        P: leave-one-out propensities, shape (..., K, K).
    """
    g = as_float_array(g, "g")
    p = as_float_array(p, "p")
    check_same_shape(g, p, "g", "p")
    P = leave_one_out(P, p)
    full = np.sum(p * g, axis=-1, keepdims=True)
    without = np.einsum("...ij,...j->...i", P, g)
    return full - without


def dr_removal_contributions(selected, reward, p, P, mu_hat) -> np.ndarray:
    """Doubly robust removal contributions from selected feedback (Eq. 19, Corollary 3).

    Only the deployed candidate I's reward G = R^(I) is observed. Each candidate's value
    is imputed as ``g_hat_j = mu_hat_j + 1{I = j} / p_j * (G - mu_hat_j)`` and plugged into
    :func:`removal_contributions`. Given H and the actions, the result is unbiased for
    Delta^rem_i for any fixed outcome model mu_hat, provided every p_j > 0.

    Args:
        selected: index I of the deployed candidate, integer array of shape (...).
        reward: deployed reward G, shape (...).
        p: logged propensities, shape (..., K); must be > 0 (the estimator divides).
        P: leave-one-out propensities, shape (..., K, K).
        mu_hat: outcome model mu_hat_j, shape (..., K).
    """
    p = as_float_array(p, "p")
    check_positive(p, "p")
    mu = as_float_array(mu_hat, "mu_hat")
    check_same_shape(mu, p, "mu_hat", "p")
    sel_onehot = _one_hot(selected, p.shape[-1], p.shape[:-1])
    G = as_float_array(reward, "reward")
    if G.shape != p.shape[:-1]:
        raise ValueError(f"reward must have shape {p.shape[:-1]}, got {G.shape}")
    g_hat = mu + sel_onehot / p * (G[..., None] - mu)
    return removal_contributions(g_hat, p, P)


def winner_take_all_scores(selected, reward, K: int) -> np.ndarray:
    """Winner-take-all credit ``1{I = i} * G`` for every agent i (Theorem 1)."""
    if int(K) != K or K < 1:
        raise ValueError(f"K must be a positive integer, got {K}")
    G = as_float_array(reward, "reward")
    onehot = _one_hot(selected, int(K), G.shape)
    return onehot * G[..., None]


def routing_entropy(p) -> np.ndarray:
    """Shannon entropy (nats) of the routing distribution on the last axis."""
    p = as_float_array(p, "p")
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, -p * np.log(p), 0.0)
    return terms.sum(axis=-1)


def sample_selection(p, rng: np.random.Generator) -> np.ndarray:
    """Draw I ~ p on the last axis for every batch entry (inverse-CDF, vectorised)."""
    p = as_float_array(p, "p")
    u = rng.random(p.shape[:-1] + (1,))
    cdf = np.cumsum(p, axis=-1)
    return np.minimum((u > cdf).sum(axis=-1), p.shape[-1] - 1)


def rerun_slates(scores, g, present, rng: np.random.Generator, tau: float = 1.0, eps: float = 0.0,
                 noise: str = "fixed", n: int | None = None) -> np.ndarray:
    """One rerun of each reduced slate: a draw of G_T, the reward of an exact evaluation (§7).

    The router of Eq. (3) runs on the candidates with ``present`` True only (the others are
    removed from the slate, so exploration is spread over |T| candidates) and deploys I. The
    rerun's reward is g_I with ``noise="fixed"`` (a reward that is a function of the candidate,
    like a checked answer) or a fresh Bernoulli(g_I) draw with ``"bernoulli"``. A slate with no
    candidate deploys nothing: G = 0. An exact evaluation of the removal entry (i, S) is
    ``Y = G_{S+i} - G_S`` from two independent calls.

    Args:
        scores: router scores s(H, A^(j)), shape (..., K).
        g: candidate values g_j, shape (..., K).
        present: booleans, shape (..., K): the candidates of the slate T to rerun.
        rng: a numpy Generator; every batch entry gets its own independent draw.
        n: if given, n independent reruns of every slate (the propensities are computed once).
    Returns G of the broadcast batch shape, with a leading axis of length n if n is given.
    """
    s, g_ = as_float_array(scores, "scores"), as_float_array(g, "g")
    keep = np.asarray(present, dtype=bool)
    try:
        s, g_, keep = np.broadcast_arrays(s, g_, keep)
    except ValueError:
        raise ValueError(f"scores, g and present must broadcast together, got shapes {s.shape}, "
                         f"{g_.shape}, {keep.shape}") from None
    if s.ndim == 0 or s.shape[-1] == 0:
        raise ValueError("scores must have the K candidates on a non-empty last axis")
    if noise not in ("fixed", "bernoulli"):
        raise ValueError(f"noise must be 'fixed' or 'bernoulli', got {noise!r}")
    if n is not None and (int(n) != n or n < 1):
        raise ValueError(f"n must be a positive integer, got {n}")
    empty = ~keep.any(axis=-1)
    # an empty slate deploys nothing; give it a placeholder slate so that Eq. (3) is defined
    p = router_propensities(np.where(keep | empty[..., None], s, -np.inf), tau, eps)
    if n is not None:
        cdf = np.cumsum(p, axis=-1)
        u = rng.random((int(n),) + p.shape[:-1] + (1,))
        sel = np.minimum((u > cdf).sum(axis=-1), p.shape[-1] - 1)
        g_ = np.broadcast_to(g_, (int(n),) + g_.shape)
    else:
        sel = sample_selection(p, rng)
    g_sel = np.take_along_axis(g_, sel[..., None], axis=-1)[..., 0]
    if noise == "bernoulli":
        if ((g_ < 0) | (g_ > 1)).any():
            raise ValueError("g must lie in [0, 1] for Bernoulli rewards")
        g_sel = (rng.random(g_sel.shape) < g_sel).astype(float)
    return np.where(empty, 0.0, g_sel)


def _one_hot(selected, K: int, batch_shape: tuple) -> np.ndarray:
    sel = np.asarray(selected)
    if sel.shape != tuple(batch_shape):
        raise ValueError(f"selected must have shape {tuple(batch_shape)}, got {sel.shape}")
    if not np.issubdtype(sel.dtype, np.integer):
        if np.isnan(sel.astype(float)).any() or (sel != np.round(sel)).any():
            raise ValueError("selected must hold integer candidate indices")
        sel = sel.astype(int)
    if ((sel < 0) | (sel >= K)).any():
        raise ValueError(f"selected must lie in [0, {K})")
    return (sel[..., None] == np.arange(K)).astype(float)


def ipw_outcome_loss(logits, selected, reward, p):
    """Inverse-propensity-weighted cross-entropy of the outcome model on selected feedback.

    The outcome model's logit s_j gives mu_hat_j = sigmoid(s_j). Only the selected
    candidate I has an observed reward G, so the loss is the mean over the batch of
    ``BCE(sigmoid(s_I), G) / p_I``. Weighting by 1/p_I makes it, in expectation over the
    router's draw, the unweighted cross-entropy summed over all K candidates, whose
    minimiser is mu_hat_j = E[R^(j) | H, A^(j)] for every candidate (§6.1, §8), not just
    for the ones the router likes.

    Args:
        logits: torch tensor (B, K) of outcome logits.
        selected: torch long tensor (B,) of selected indices.
        reward: torch tensor (B,) of deployed rewards in [0, 1].
        p: torch tensor (B, K) of logged propensities (> 0 at the selected index).
    """
    import torch
    import torch.nn.functional as F

    selected = torch.as_tensor(selected, dtype=torch.long, device=logits.device)
    reward = torch.as_tensor(reward, dtype=logits.dtype, device=logits.device)
    p = torch.as_tensor(p, dtype=logits.dtype, device=logits.device)
    if logits.ndim != 2 or p.shape != logits.shape:
        raise ValueError(
            f"p must have the shape of logits (B, K), got {tuple(p.shape)} and {tuple(logits.shape)}"
        )
    if selected.shape != logits.shape[:1] or reward.shape != logits.shape[:1]:
        raise ValueError("selected and reward must have shape (B,)")
    p_sel = p.gather(1, selected[:, None]).squeeze(1)
    if (p_sel <= 0).any() or torch.isnan(p_sel).any():
        raise ValueError("p must be strictly positive at the selected candidate (the loss divides by it)")
    s_sel = logits.gather(1, selected[:, None]).squeeze(1)
    bce = F.binary_cross_entropy_with_logits(s_sel, reward, reduction="none")
    return (bce / p_sel).mean()
