"""Outcome models learned from filtered feedback, and the exact moments of the removal estimate.

Paper §6.1 (Eq. 19, Corollary 3) and §8. In a routed system only the deployed candidate's
reward G = R^(I) is observed. Two things are built from such data:

- an **outcome model** mu_hat_j ~ E[R^(j) | features of candidate j], trained on selected
  feedback only, by the inverse-propensity-weighted cross-entropy of
  :func:`mcpg.routing.ipw_outcome_loss` (whose expectation over the router's draw is the
  cross-entropy summed over *all* K candidates) or, for comparison, by the unweighted
  cross-entropy of the selected candidates (:func:`selected_cross_entropy`), which fits
  the candidates the router likes and is biased wherever selection depends on the
  candidate beyond what the model sees;
- the **doubly robust removal contribution** of Eq. (19), whose exact conditional mean and
  variance given (H, A) are :func:`dr_removal_moments` (winner-take-all beside it:
  :func:`wta_moments`).

Calibration is measured with :func:`brier_score` and :func:`reliability_curve`.
:func:`candidate_cells` and :func:`cell_targets` give, for a :class:`~mcpg.mechanisms.RoutedPool`,
the exact limits the two outcome-model fits converge to.

Conventions follow :mod:`mcpg.routing`: the K candidates of a slate sit on the last axis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from . import routing
from ._checks import as_float_array, check_positive, check_same_shape, leave_one_out

__all__ = [
    "OutcomeModel",
    "fit_outcome_model",
    "selected_cross_entropy",
    "brier_score",
    "reliability_curve",
    "candidate_cells",
    "cell_targets",
    "cell_table",
    "candidate_table",
    "enumerate_feedback",
    "enumerate_reward_aware_feedback",
    "draw_feedback",
    "dr_removal_moments",
    "wta_moments",
    "cell_mean_predictions",
]

_NOISES = ("bernoulli", "fixed")


def _check_noise(noise: str) -> str:
    if noise not in _NOISES:
        raise ValueError(f"noise must be 'bernoulli' or 'fixed', got {noise!r}")
    return noise


def _reward_variance(g: np.ndarray, noise: str) -> np.ndarray:
    """Var(R^(j) | H, A^(j)): g (1 - g) for Bernoulli rewards, 0 for fixed ones."""
    if _check_noise(noise) == "fixed":
        return np.zeros_like(g)
    if ((g < 0) | (g > 1)).any():
        raise ValueError("g must lie in [0, 1] for Bernoulli rewards")
    return g * (1.0 - g)


# --- the outcome model --------------------------------------------------------------------


def selected_cross_entropy(logits: torch.Tensor, selected, reward) -> torch.Tensor:
    """Unweighted cross-entropy of the selected candidates: mean of ``BCE(sigmoid(s_I), G)``.

    The comparison for :func:`mcpg.routing.ipw_outcome_loss`: the same loss with every
    propensity set to 1. Its minimiser is E[R^(j) | features, I = j], the reward of the
    candidates *as the router selects them*, not E[R^(j) | features].
    """
    return routing.ipw_outcome_loss(logits, selected, reward, torch.ones_like(logits))


class _Tabular(nn.Module):
    """One logit per cell: a saturated logistic model of integer cell ids."""

    def __init__(self, n_cells: int):
        super().__init__()
        self.logit = nn.Parameter(torch.zeros(n_cells, dtype=torch.float64))

    def forward(self, cells: torch.Tensor) -> torch.Tensor:
        return self.logit[cells]


@dataclass
class OutcomeModel:
    """A fitted outcome model: ``mu_hat = sigmoid(s(features))``.

    Attributes:
        net: the torch module mapping features to logits.
        categorical: True when the features are integer cell ids (a tabular model).
        weighted: whether it was trained with the inverse-propensity weights.
        n_features: the feature dimension (float features) or the number of cells.
        loss: the training objective at the end of fitting.
        n_evals: objective evaluations used by L-BFGS.
        history: the objective at each evaluation.
    """

    net: nn.Module
    categorical: bool
    weighted: bool
    n_features: int
    loss: float = float("nan")
    n_evals: int = 0
    history: list[float] = field(default_factory=list)

    def _tensor(self, features) -> torch.Tensor:
        if self.categorical:
            cells = np.asarray(features)
            if not np.issubdtype(cells.dtype, np.integer):
                raise ValueError("features must be integer cell ids for a tabular outcome model")
            if cells.size and (cells.min() < 0 or cells.max() >= self.n_features):
                raise ValueError(f"features must be cell ids in [0, {self.n_features})")
            return torch.as_tensor(cells, dtype=torch.long)
        x = as_float_array(features, "features")
        if x.ndim < 1 or x.shape[-1] != self.n_features:
            raise ValueError(f"features must have last axis {self.n_features}, got shape {x.shape}")
        return torch.as_tensor(x, dtype=torch.float64)

    @torch.no_grad()
    def logits(self, features) -> np.ndarray:
        """Outcome logits s: shape ``features.shape`` (cells) or ``features.shape[:-1]``."""
        out = self.net(self._tensor(features))
        return out.squeeze(-1).numpy() if not self.categorical else out.numpy()

    def predict(self, features) -> np.ndarray:
        """mu_hat = sigmoid(s), the estimated probability that each candidate is correct."""
        return 1.0 / (1.0 + np.exp(-self.logits(features)))


def fit_outcome_model(features, selected, reward, p, weighted: bool = True, hidden: int = 0,
                      n_cells: int | None = None, l2: float = 1e-6, max_iter: int = 500,
                      seed: int = 0) -> OutcomeModel:
    """Fit an outcome model on filtered feedback (paper §6.1, §8).

    Minimises, by full-batch L-BFGS, ``L(phi) + l2 / 2 * |phi|^2`` where L is
    :func:`mcpg.routing.ipw_outcome_loss` (``weighted=True``: mean of BCE(s_I, G) / p_I,
    whose expectation over I ~ p is sum_j BCE(s_j, R^(j)), so its minimiser is
    E[R^(j) | features] for every candidate) or :func:`selected_cross_entropy`
    (``weighted=False``: mean of BCE(s_I, G), minimiser E[R^(j) | features, I = j]).

    Args:
        features: either integer cell ids, shape (B, K) (a tabular model, one logit per
            cell: the fit is then the (weighted) mean reward of each cell, and the loss is
            evaluated from per-cell sums, which equal L on the raw slates), or float
            features, shape (B, K, d) (logistic regression when ``hidden == 0``, else a
            one-hidden-layer tanh network of width ``hidden``).
        selected: selected index I of each slate, ints of shape (B,).
        reward: deployed reward G in [0, 1], shape (B,).
        p: logged propensities, shape (B, K); positive at the selected candidate.
        weighted: use the inverse-propensity weights (True) or not (False).
        n_cells: number of cells for integer features (default: max id + 1).
        l2: ridge penalty on the parameters; it keeps the logits of cells whose rewards are
            all 0 or all 1 finite, and such a tabular cell's fit is then off by exactly
            ``l2 * B * |s| / n_eff`` (logit s; n_eff its deployments, each counted 1/p when
            weighted). The data term is a mean over the B slates, so keep ``l2 * B`` small
            against the number of samples in the smallest cell.
        max_iter: L-BFGS iterations.
        seed: seed of the network's initialisation (float features with hidden > 0).
    """
    sel = np.asarray(selected)
    if sel.ndim != 1 or not np.issubdtype(sel.dtype, np.integer):
        raise ValueError(f"selected must be a 1-d integer array, got dtype {sel.dtype} shape {sel.shape}")
    B = sel.shape[0]
    if B == 0:
        raise ValueError("selected must hold at least one slate")
    G = as_float_array(reward, "reward")
    if G.shape != (B,):
        raise ValueError(f"reward must have shape ({B},), got {G.shape}")
    if ((G < 0) | (G > 1)).any():
        raise ValueError("reward must lie in [0, 1] (the cross-entropy needs a probability target)")
    pp = as_float_array(p, "p")
    if pp.ndim != 2 or pp.shape[0] != B:
        raise ValueError(f"p must have shape ({B}, K), got {pp.shape}")
    K = pp.shape[1]
    if ((sel < 0) | (sel >= K)).any():
        raise ValueError(f"selected must lie in [0, {K})")
    if weighted:
        check_positive(pp[np.arange(B), sel], "p")
    if not (l2 >= 0 and np.isfinite(l2)):
        raise ValueError(f"l2 must be a non-negative number, got {l2}")
    if int(max_iter) != max_iter or max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {max_iter}")
    if int(hidden) != hidden or hidden < 0:
        raise ValueError(f"hidden must be a non-negative integer, got {hidden}")

    feats = np.asarray(features)
    categorical = np.issubdtype(feats.dtype, np.integer)
    if categorical:
        if feats.shape != (B, K):
            raise ValueError(f"features (integer cell ids) must have shape ({B}, {K}), got {feats.shape}")
        if feats.min() < 0:
            raise ValueError("features must be non-negative cell ids")
        n = int(feats.max()) + 1 if n_cells is None else int(n_cells)
        if feats.max() >= n:
            raise ValueError(f"n_cells={n_cells} is smaller than the largest cell id + 1")
        net: nn.Module = _Tabular(n)
        x = torch.as_tensor(feats, dtype=torch.long)
    else:
        feats = as_float_array(feats, "features")
        if feats.ndim != 3 or feats.shape[:2] != (B, K):
            raise ValueError(
                f"features must have shape ({B}, {K}, d) or be integer cells ({B}, {K}), got {feats.shape}"
            )
        n = feats.shape[2]
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = (nn.Linear(n, 1) if hidden == 0 else
                   nn.Sequential(nn.Linear(n, hidden), nn.Tanh(), nn.Linear(hidden, 1))).double()
        x = torch.as_tensor(feats, dtype=torch.float64)

    sel_t = torch.as_tensor(sel, dtype=torch.long)
    G_t = torch.as_tensor(G, dtype=torch.float64)
    p_t = torch.as_tensor(pp if weighted else np.ones_like(pp), dtype=torch.float64)
    if categorical:
        # A saturated model's loss depends on the data only through each cell's total weight
        # W_c = sum 1/p_I and weighted reward Y_c = sum G/p_I over the slates whose selected
        # candidate falls in cell c: BCE(s, G) = softplus(s) - G s, so the mean over slates
        # of BCE(s_I, G) / p_I is exactly sum_c (W_c softplus(s_c) - Y_c s_c) / B. Same
        # objective as routing.ipw_outcome_loss on the raw slates, at O(cells) per step.
        c_sel = feats[np.arange(B), sel]
        w_sel = 1.0 / (pp[np.arange(B), sel] if weighted else np.ones(B))
        W_c = torch.as_tensor(np.bincount(c_sel, weights=w_sel, minlength=n) / B)
        Y_c = torch.as_tensor(np.bincount(c_sel, weights=w_sel * G, minlength=n) / B)

    def data_loss() -> torch.Tensor:
        if categorical:
            s = net.logit
            return (W_c * nn.functional.softplus(s) - Y_c * s).sum()
        return routing.ipw_outcome_loss(net(x).squeeze(-1), sel_t, G_t, p_t)

    def objective() -> torch.Tensor:
        return data_loss() + 0.5 * l2 * sum((w**2).sum() for w in net.parameters())

    opt = torch.optim.LBFGS(net.parameters(), lr=1.0, max_iter=int(max_iter), tolerance_grad=1e-10,
                            tolerance_change=1e-14, history_size=20, line_search_fn="strong_wolfe")
    history: list[float] = []

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = objective()
        loss.backward()
        history.append(float(loss.detach()))
        return loss

    opt.step(closure)
    with torch.no_grad():
        final = float(objective())
    return OutcomeModel(net=net, categorical=bool(categorical), weighted=bool(weighted), n_features=n,
                        loss=final, n_evals=len(history), history=history)


# --- calibration --------------------------------------------------------------------------


def _prob_outcome(prob, outcome, weights=None):
    q = as_float_array(prob, "prob")
    y = as_float_array(outcome, "outcome")
    check_same_shape(q, y, "prob", "outcome")
    if ((q < 0) | (q > 1)).any():
        raise ValueError("prob must lie in [0, 1]")
    if ((y < 0) | (y > 1)).any():
        raise ValueError("outcome must lie in [0, 1]")
    if q.size == 0:
        raise ValueError("prob must not be empty")
    if weights is None:
        return q, y, np.ones_like(q)
    w = as_float_array(weights, "weights")
    check_same_shape(q, w, "prob", "weights")
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    return q, y, w


def brier_score(prob, outcome, weights=None) -> float:
    """Brier score: the (weighted) mean of (mu_hat - R)^2 over the given candidates.

    0 is perfect; always predicting 1/2 scores 1/4 on 0/1 outcomes. The paper's Table 1
    reports it on the deployed candidate (§8); on all candidates it measures what the
    doubly robust estimate needs (every mu_hat_j, including rarely selected ones).
    """
    q, y, w = _prob_outcome(prob, outcome, weights)
    return float(np.sum(w * (q - y) ** 2) / np.sum(w))


def reliability_curve(prob, outcome, n_bins: int = 10, weights=None):
    """Reliability diagram data: in each bin of predicted probability, the mean prediction
    against the observed frequency of R = 1 (a calibrated model lies on the diagonal).

    Bins are equal-width on [0, 1]; empty bins are dropped. Returns a pandas DataFrame
    with columns ``bin``, ``predicted``, ``observed``, ``count`` (number of candidates,
    unweighted) and ``se`` (binomial standard error of ``observed``).
    """
    import pandas as pd

    q, y, w = _prob_outcome(prob, outcome, weights)
    if int(n_bins) != n_bins or n_bins < 1:
        raise ValueError(f"n_bins must be a positive integer, got {n_bins}")
    q, y, w = q.ravel(), y.ravel(), w.ravel()
    b = np.minimum((q * n_bins).astype(int), int(n_bins) - 1)
    sw = np.bincount(b, weights=w, minlength=n_bins)
    keep = sw > 0
    pred = np.bincount(b, weights=w * q, minlength=n_bins)[keep] / sw[keep]
    obs = np.bincount(b, weights=w * y, minlength=n_bins)[keep] / sw[keep]
    count = np.bincount(b, minlength=n_bins)[keep]
    se = np.sqrt(obs * (1 - obs) / np.maximum(count, 1))
    return pd.DataFrame(
        {"bin": np.flatnonzero(keep), "predicted": pred, "observed": obs, "count": count, "se": se}
    )


# --- cells of a routed pool and the limits of the two fits --------------------------------

_BY = ("agent", "answer")


def _cell_ids(h, actions, K: int, M: int, by: str) -> np.ndarray:
    """Cell of candidate j: (H, j) for ``by="agent"``, (H, j, A^(j)) for ``by="answer"``."""
    if by not in _BY:
        raise ValueError(f"by must be 'agent' or 'answer', got {by!r}")
    j = np.arange(K)
    base = np.asarray(h)[..., None] * K + j
    return base if by == "agent" else base * M + np.asarray(actions)


def candidate_cells(pool, samples, by: str = "agent") -> tuple[np.ndarray, int]:
    """Integer features for a tabular outcome model of a :class:`~mcpg.mechanisms.RoutedPool`.

    ``by="agent"``: candidate j of a slate on prompt H falls in cell (H, j), so the model
    sees which agent answered which prompt but not the answer (coarser than what a
    candidate-reading router sees). ``by="answer"``: cell (H, j, A^(j)), everything the
    router reads about candidate j. Returns (cells of shape (n, K), number of cells).
    """
    K, M, n_H = pool.n_agents, pool.n_actions, pool.n_prompts
    cells = _cell_ids(samples.h, samples.actions, K, M, by)
    return cells, n_H * K * (M if by == "answer" else 1)


def cell_table(pool, predictions, by: str = "agent") -> np.ndarray:
    """A tabular outcome model's predictions, one per cell of :func:`candidate_cells`, as the
    per-candidate table mu_hat_j(h, a) of shape (K, n_H, M).

    Entry [j, h, a] is the prediction for cell (h, j) (``by="agent"``: the same for every
    answer a) or (h, j, a) (``by="answer"``). The table is what
    :class:`~mcpg.mechanisms.RoutedPool` takes as candidate values (the plug-in estimate of
    §6.1 puts mu_hat in place of g) and what :func:`candidate_table` lifts to every joint
    action.
    """
    if by not in _BY:
        raise ValueError(f"by must be 'agent' or 'answer', got {by!r}")
    K, M, n_H = pool.n_agents, pool.n_actions, pool.n_prompts
    n = n_H * K * (M if by == "answer" else 1)
    predictions = np.asarray(predictions, dtype=float)
    if predictions.shape != (n,):
        raise ValueError(f"predictions must have shape ({n},), one per cell, got {predictions.shape}")
    j, h, a = np.indices((K, n_H, M))
    cells = h * K + j if by == "agent" else (h * K + j) * M + a
    return predictions[cells]


def cell_targets(pool, by: str = "agent") -> dict[str, np.ndarray]:
    """Exact population quantities per cell of :func:`candidate_cells`, by enumeration.

    Returns arrays indexed by cell:

    - ``mean``: E[R^(j) | cell], over all candidates in the cell (on-policy): the limit of
      the inverse-propensity-weighted fit (a tabular model);
    - ``selected_mean``: E[R^(j) | cell, I = j], over the candidates the router selects:
      the limit of the unweighted fit;
    - ``selection_rate``: P(I = j | cell);
    - ``mass``: P(cell) for candidate j, i.e. the probability that a slate's j-th candidate
      falls in the cell (sums to K over cells).

    With ``by="answer"`` condition (17) makes ``selected_mean == mean`` (where the rate is
    positive); with ``by="agent"`` they differ when the router reads the answer.
    """
    K, M = pool.n_agents, pool.n_actions
    P = pool.joint_prob().detach().numpy()
    g, p = pool.candidate_values(), pool.propensities()
    idx = np.indices(pool.joint_shape)
    cells = _cell_ids(idx[0], np.moveaxis(idx[1:], 0, -1), K, M, by).ravel()
    n = pool.n_prompts * K * (M if by == "answer" else 1)
    w = np.broadcast_to(P[..., None], g.shape).ravel()
    mass = np.bincount(cells, weights=w, minlength=n)
    sel = np.bincount(cells, weights=w * p.ravel(), minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return {
            "mean": np.bincount(cells, weights=w * g.ravel(), minlength=n) / mass,
            "selected_mean": np.bincount(cells, weights=w * (p * g).ravel(), minlength=n) / sel,
            "selection_rate": sel / mass,
            "mass": mass,
        }


def candidate_table(pool, table) -> np.ndarray:
    """Lift a per-candidate table to every joint action of a routed pool.

    ``table`` has shape (K, n_H, M) (entry [j, h, a]: a value of agent j's answer a to
    prompt h, e.g. an outcome model mu_hat_j(h, a)) or (n_H, M) (shared by the agents).
    Returns shape (n_H, M, ..., M, K) whose [h, a_1, ..., a_K, j] entry is table[j, h, a_j],
    aligned with ``pool.candidate_values()`` and ``pool.propensities()``.
    """
    return pool.per_candidate(table, "table")


# --- filtered feedback: enumeration, draws and exact moments ------------------------------


def _slate(g, p) -> tuple[np.ndarray, np.ndarray]:
    g, p = as_float_array(g, "g"), as_float_array(p, "p")
    check_same_shape(g, p, "g", "p")
    if g.ndim == 0 or g.shape[-1] == 0:
        raise ValueError("g must hold the K candidates on a non-empty last axis")
    if ((p < 0) | (p > 1)).any() or not np.allclose(p.sum(-1), 1.0):
        raise ValueError("p must be probability vectors on the last axis")
    return g, p


def enumerate_feedback(g, p, noise: str = "bernoulli") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every filtered-feedback outcome (I, G) of a slate, with its probability given (H, A).

    With Bernoulli rewards the outcomes are (I = j, G = r) for j < K, r in {0, 1}, of
    probability p_j g_j^r (1 - g_j)^(1 - r); with fixed rewards (I = j, G = g_j), of
    probability p_j. Summing ``prob * estimator(selected, reward)`` over the leading axis
    is the exact expectation of any estimator over the router's draw and the reward noise.

    Args:
        g: candidate values g_j(H, A^(j)), shape (..., K).
        p: propensities, shape (..., K).
    Returns the arrays selected (ints), reward and prob, each of shape (O, ...), with
    O = 2K outcomes (Bernoulli) or K (fixed).
    """
    g, p = _slate(g, p)
    K, batch = g.shape[-1], g.shape[:-1]
    j = np.arange(K).reshape((K,) + (1,) * len(batch))
    gj, pj = np.moveaxis(g, -1, 0), np.moveaxis(p, -1, 0)
    if _check_noise(noise) == "fixed":
        return np.broadcast_to(j, (K,) + batch).copy(), gj.copy(), pj.copy()
    if ((g < 0) | (g > 1)).any():
        raise ValueError("g must lie in [0, 1] for Bernoulli rewards")
    selected = np.concatenate([np.broadcast_to(j, (K,) + batch)] * 2)
    reward = np.concatenate([np.zeros((K,) + batch), np.ones((K,) + batch)])
    prob = np.concatenate([pj * (1 - gj), pj * gj])
    return selected, reward, prob


def enumerate_reward_aware_feedback(g, scores, bonus: float, tau: float = 1.0,
                                    eps: float = 0.0) -> dict[str, np.ndarray]:
    """Every outcome of a slate whose router sees the reward noise: condition (17) fails.

    Rewards are Bernoulli, R^(j) ~ Bernoulli(g_j) independently given (H, A), and the judge
    scores candidate j as ``s_j + bonus * R^(j)``: it reads the realised reward, not only the
    candidate. The router of Eq. (3) then draws I, and G = R^(I). With bonus != 0 and
    0 < g_j < 1, E[R^(j) | H, A, I = j] differs from g_j, which is what (17) forbids.

    The outcomes are the pairs (R^(1:K), I), O = 2^K K of them. Summing ``prob * x`` over the
    leading axis is the exact E[x | H, A] for any x of the outcome, e.g.:

    - the propensities given (H, A), P(I = j | H, A): the sum of ``prob * p``;
    - the leave-one-out ones, P(I^{-i} = j | H, A): the sum of ``prob * P``;
    - the removal contribution E[G - G^{-i}_route | H, A] (the reduced slate's router sees
      the same rewards): the sum of ``prob * (sum_j (p_j - P_ij) rewards_j)``.

    Args:
        g: g_j = E[R^(j) | H, A^(j)] in [0, 1], shape (..., K).
        scores: the judge's scores s(H, A^(j)) before it sees the rewards, shape (..., K).
        bonus: what a reward of 1 adds to a candidate's score.
        tau, eps: the router's temperature and exploration (Eq. 3).
    Returns a dict of arrays: ``selected`` and ``reward`` (I and G) and ``prob`` (the
    outcome's probability given (H, A)), each of shape (O, ...); ``rewards`` (every R^(j)),
    ``p`` (the router's propensities given (H, A) and the rewards), each (O, ..., K); and
    ``P`` (the leave-one-out propensities given them), (O, ..., K, K).
    """
    g, s = as_float_array(g, "g"), as_float_array(scores, "scores")
    check_same_shape(g, s, "g", "scores")
    if g.ndim == 0 or g.shape[-1] == 0:
        raise ValueError("g must hold the K candidates on a non-empty last axis")
    if ((g < 0) | (g > 1)).any():
        raise ValueError("g must lie in [0, 1] for Bernoulli rewards")
    if not np.isfinite(bonus):
        raise ValueError(f"bonus must be finite, got {bonus}")
    K, batch = g.shape[-1], g.shape[:-1]
    R = ((np.arange(2**K)[:, None] >> np.arange(K)) & 1).astype(float)  # (2^K, K)
    Rb = R.reshape((2**K,) + (1,) * len(batch) + (K,))
    prob_R = np.prod(np.where(Rb == 1.0, g, 1.0 - g), axis=-1)  # (2^K, ...)
    p_R = routing.router_propensities(s + bonus * Rb, tau, eps)  # (2^K, ..., K)
    P_R = routing.leave_one_out_propensities(s + bonus * Rb, tau, eps)
    # outcome (r, j) at index r * K + j: rewards r, deployed candidate j
    rewards = np.repeat(np.broadcast_to(Rb, (2**K,) + g.shape), K, axis=0)
    sel = np.broadcast_to(np.tile(np.arange(K), 2**K).reshape((-1,) + (1,) * len(batch)),
                          (2**K * K,) + batch)
    prob = (prob_R[..., None] * p_R).reshape((2**K,) + batch + (K,))
    prob = np.moveaxis(prob, -1, 1).reshape((2**K * K,) + batch)
    reward = np.take_along_axis(rewards, sel[..., None], axis=-1)[..., 0]
    return {"selected": sel.copy(), "reward": reward, "prob": prob, "rewards": rewards,
            "p": np.repeat(p_R, K, axis=0), "P": np.repeat(P_R, K, axis=0)}


def draw_feedback(
    g, p, n: int, rng: np.random.Generator, noise: str = "bernoulli"
) -> tuple[np.ndarray, np.ndarray]:
    """n independent filtered-feedback draws at fixed slates: I ~ p, then G = R^(I).

    Only (I, G) is returned: the other candidates' rewards are never observed.
    Returns selected and reward, each of shape (n, ...).
    """
    g, p = _slate(g, p)
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    _check_noise(noise)
    shape = (int(n),) + g.shape
    sel = routing.sample_selection(np.broadcast_to(p, shape), rng)
    g_sel = np.take_along_axis(np.broadcast_to(g, shape), sel[..., None], axis=-1)[..., 0]
    if noise == "fixed":
        return sel, g_sel.copy()
    if ((g < 0) | (g > 1)).any():
        raise ValueError("g must lie in [0, 1] for Bernoulli rewards")
    return sel, (rng.random(g_sel.shape) < g_sel).astype(float)


def dr_removal_moments(g, p, P, mu_hat, noise: str = "bernoulli") -> tuple[np.ndarray, np.ndarray]:
    """Exact mean and variance of the doubly robust removal contribution (Eq. 19) given (H, A).

    With w_ij = p_j - p^{-i}_j (and p^{-i}_i = 0), Eq. (19) is
    Delta_hat_i = sum_j w_ij mu_j + w_iI (G - mu_I) / p_I, so over I ~ p and G = R^(I):

    - mean_i = sum_j w_ij g_j = Delta^rem_i, whatever mu_hat is (Corollary 3);
    - var_i = sum_j w_ij^2 (v_j + (g_j - mu_j)^2) / p_j - (sum_j w_ij (g_j - mu_j))^2,

    where v_j = Var(R^(j) | H, A^(j)) (g_j (1 - g_j) for Bernoulli rewards, 0 for fixed).
    The 1 / p_j makes the variance grow without bound as a propensity goes to 0 unless
    the matching w_ij (g_j - mu_j) and w_ij v_j vanish; a perfect outcome model with fixed
    rewards gives variance 0.

    Args:
        g: candidate values, (..., K); p: propensities, (..., K), all > 0;
        P: leave-one-out propensities, (..., K, K); mu_hat: outcome model, (..., K).
    Returns the pair (mean, var), each of shape (..., K), whose entry i is about agent i's
    removal contribution.
    """
    g, p = _slate(g, p)
    check_positive(p, "p")
    mu = as_float_array(mu_hat, "mu_hat")
    check_same_shape(mu, g, "mu_hat", "g")
    P = leave_one_out(P, p)
    v = _reward_variance(g, noise)
    w = p[..., None, :] - P  # (..., i, j)
    b = (g - mu)[..., None, :]
    mean = np.sum(w * g[..., None, :], axis=-1)
    var = np.sum(w**2 * (v[..., None, :] + b**2) / p[..., None, :], axis=-1) - np.sum(w * b, axis=-1) ** 2
    return mean, np.maximum(var, 0.0)


def wta_moments(g, p, noise: str = "bernoulli") -> tuple[np.ndarray, np.ndarray]:
    """Exact mean and variance of the winner-take-all score 1{I = i} G given (H, A) (Theorem 1).

    mean_i = p_i g_i (agent i's share, not its removal contribution);
    var_i = p_i (v_i + g_i^2) - (p_i g_i)^2. Bounded by 1/4 for rewards in [0, 1], whatever
    the propensities: winner-take-all never divides by p.
    """
    g, p = _slate(g, p)
    v = _reward_variance(g, noise)
    return p * g, p * (v + g**2) - (p * g) ** 2


def cell_mean_predictions(cells, selected, reward, n_cells: int, folds=None, prior: float = 0.5,
                          strength: float = 1.0) -> np.ndarray:
    """A tabular outcome model fitted on selected feedback, predicted for every candidate of every slate.

    The model is the shrunken mean of the observed rewards in each cell,
    ``(sum of G over deployed candidates in the cell + strength * prior) / (count + strength)``
    (only the deployed candidate I of a slate has an observed reward). With cells that see
    everything the router reads (``candidate_cells(..., by="answer")``), condition (17)
    makes the selected-feedback mean consistent for g_j without weights.

    Args:
        cells: cell of each candidate, shape (n, K) (:func:`candidate_cells`).
        selected, reward: the logged I and G, shape (n,).
        n_cells: the number of cells.
        folds: None: **in-sample**, every slate's predictions come from one fit on all n
            slates, its own included; an integer array (n,) of fold labels: **cross-fitted**,
            slate t's predictions come from a fit on the slates of the other folds only.
        prior, strength: the shrinkage towards ``prior`` (pseudo-observations).

    Returns mu_hat of shape (n, K). Corollary 3 asks for a fixed or cross-fitted model:
    in-sample predictions depend on the slate's own G, and Eq. (19) is then biased.
    """
    cells = np.asarray(cells)
    sel = np.asarray(selected)
    G = np.asarray(reward, dtype=float)
    n = len(G)
    if cells.ndim != 2 or cells.shape[0] != n or sel.shape != (n,):
        raise ValueError(f"cells must have shape (n, K) and selected, reward shape (n,); got {cells.shape}, "
                         f"{sel.shape}, {G.shape}")
    if not strength > 0:
        raise ValueError(f"strength must be positive, got {strength}")
    obs = cells[np.arange(n), sel]  # the deployed candidate's cell
    if folds is None:
        s = np.bincount(obs, weights=G, minlength=n_cells)
        c = np.bincount(obs, minlength=n_cells).astype(float)
        return ((s + strength * prior) / (c + strength))[cells]
    folds = np.asarray(folds)
    if folds.shape != (n,):
        raise ValueError(f"folds must have shape ({n},), got {folds.shape}")
    out = np.empty(cells.shape, dtype=float)
    s_all = np.bincount(obs, weights=G, minlength=n_cells)
    c_all = np.bincount(obs, minlength=n_cells).astype(float)
    for f in np.unique(folds):
        inf = folds == f
        s = s_all - np.bincount(obs[inf], weights=G[inf], minlength=n_cells)
        c = c_all - np.bincount(obs[inf], minlength=n_cells)
        out[inf] = ((s + strength * prior) / (c + strength))[cells[inf]]
    return out
