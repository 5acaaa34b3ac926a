"""Exact analysis of a (trained) pool: Theorem 1's gradients, bias and gains, and the private-utility game.

Part of :mod:`mcpg.grpo.simulated` (chapter 7).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ...mechanisms import (
    RoutedPool,
    private_utilities,
    private_utility_gradients,
    system_gradient,
    system_value,
)
from .loop import SimRun
from .pool import SimConfig, _check_seeds, _one_thread, _positive_int, calibrated_router, candidate_features

__all__ = [
    "exact_pool",
    "unilateral_deviations",
    "theorem1_diagnostics",
    "theorem1_trajectory",
    "profile_values",
    "profile_table",
]


def exact_pool(cfg: SimConfig, logits, weights, type_index: int) -> tuple[RoutedPool, np.ndarray]:
    """The questions of one type as an exactly enumerated :class:`~mcpg.mechanisms.RoutedPool`.

    A prompt is ``H = (Z, flips)``: the hidden correct answer and the M check flips, with
    probability ``q_t(Z) f^{#flips} (1 - f)^{M - #flips}`` (answers with ``q_t(Z) = 0`` are
    left out; with ``cfg.unsolvable > 0`` also ``Z = M``, no candidate right, with
    probability ``unsolvable``). Agent k's logits are ``logits[k, type_index]`` at every prompt (agents see
    only the type); ``g_j(H, a) = 1{a = Z}``; the router's score of agent k answering a is
    ``weights . candidate_features(t, a, k, check(H, a))``, with ``cfg``'s tau and eps.

    Args:
        logits: (K, T, M) agents' logits.
        weights: (F,) router weights (e.g. a :class:`SimRun`'s ``router[s, c]`` or
            :func:`calibrated_router`).
        type_index: t.

    Returns:
        the pool and the prompts' correct answers Z, shape (n_H,).
    """
    K, T, M = cfg.n_agents, cfg.n_types, cfg.n_answers
    theta = np.asarray(logits, dtype=float)
    w = np.asarray(weights, dtype=float)
    if theta.shape != (K, T, M):
        raise ValueError(f"logits must have shape ({K}, {T}, {M}), got {theta.shape}")
    if w.shape != (cfg.n_features,):
        raise ValueError(f"weights must have shape ({cfg.n_features},), got {w.shape}")
    if np.isnan(theta).any() or np.isnan(w).any():
        raise ValueError("logits and weights must not contain NaN")
    if (
        isinstance(type_index, bool)
        or not isinstance(type_index, (int, np.integer))
        or not 0 <= type_index < T
    ):
        raise ValueError(f"type_index must be an integer in [0, {T}), got {type_index!r}")
    # P(Z = a), a < M, and (with cfg.unsolvable > 0) Z = M: no candidate right
    q = np.append(cfg.solvable_answer_probs()[type_index], cfg.unsolvable)
    f = cfg.check_flip
    flips = (np.arange(2**M)[:, None] >> np.arange(M)) & 1  # (2^M, M)
    p_flip = np.prod(np.where(flips == 1, f, 1 - f), axis=1)
    zs = np.flatnonzero(q > 0)
    z = np.repeat(zs, 2**M)
    fl = np.tile(flips, (len(zs), 1))
    probs = q[z] * np.tile(p_flip, len(zs))
    g = (np.arange(M)[None, :] == z[:, None]).astype(float)  # (n_H, M)
    checks = np.logical_xor(g == 1, fl == 1).astype(float)
    n_H = len(z)
    answers = np.broadcast_to(np.arange(M)[None, :, None], (n_H, M, K))
    feats = candidate_features(
        cfg, np.full((n_H, M), type_index), answers, np.broadcast_to(checks[:, :, None], (n_H, M, K))
    )
    scores = (feats.numpy() @ w).transpose(2, 0, 1)  # (K, n_H, M)
    pool = RoutedPool(
        np.broadcast_to(theta[:, type_index][:, None, :], (K, n_H, M)),
        g,
        scores,
        tau=cfg.router_tau,
        eps=cfg.router_eps,
        prompt_probs=probs / probs.sum(),
        noise="fixed",
    )
    return pool, z


def _given_agent_action(pool: RoutedPool, X: torch.Tensor, i: int) -> torch.Tensor:
    """``sum_H P(H) E[X | H, A^(i) = a]`` for every action a of agent i, shape (M,): the
    others drawn from their policies, agent i's action fixed to a."""
    K = pool.n_agents
    w = torch.as_tensor(pool.prompt_probs, dtype=X.dtype).reshape((-1,) + (1,) * K)
    for k, pi in enumerate(pool.policies()):
        if k != i:
            shape = [pi.shape[0]] + [1] * K
            shape[k + 1] = pi.shape[1]
            w = w * pi.detach().reshape(shape)
    dims = [d for d in range(K + 1) if d != i + 1]
    return (w * X.detach()).sum(dim=dims)


@_one_thread
def unilateral_deviations(cfg: SimConfig, logits, weights) -> dict[str, np.ndarray]:
    """What each agent would get, and what the system would get, if that agent alone
    switched its answer to one type (exact, on :func:`exact_pool`).

    Returns:
        ``J``: J_sys (scalar array), the expected deployed reward under the current
        policies and Eq. (3) routing; ``U``: (K,) private utilities ``U_i = E[1{I=i} G]``
        (``sum_i U_i = J``); ``J_dev[i, t, a]``: J_sys if agent i always answered a on type
        t (everything else unchanged); ``U_dev[i, t, a]``: agent i's own U_i in that case.
    """
    K, T, M = cfg.n_agents, cfg.n_types, cfg.n_answers
    wt = cfg.type_distribution()
    J_t = np.zeros(T)
    U_t = np.zeros((T, K))
    Jd = np.zeros((K, T, M))
    Ud = np.zeros((K, T, M))
    for t in range(T):
        pool, _ = exact_pool(cfg, logits, weights, t)
        with torch.no_grad():
            J_t[t] = float(system_value(pool))
            U_t[t] = private_utilities(pool).numpy()
            G = pool.reward_mean()
            for i in range(K):
                Jd[i, t] = _given_agent_action(pool, G, i).numpy()
                Ud[i, t] = _given_agent_action(pool, pool.winner_return(i), i).numpy()
    J = float(wt @ J_t)
    U = wt @ U_t
    # switching on type t changes only that type's term
    J_dev = J + wt[None, :, None] * (Jd - J_t[None, :, None])
    U_dev = U[:, None, None] + wt[None, :, None] * (Ud - U_t.T[:, :, None])
    return {"J": np.asarray(J), "U": U, "J_dev": J_dev, "U_dev": U_dev}


@_one_thread
def theorem1_diagnostics(cfg: SimConfig, logits, weights) -> dict[str, np.ndarray]:
    """Theorem 1 on a (trained) pool, exactly.

    Returns, per agent i (arrays of shape (K,), gradients taken with respect to agent i's
    per-type logits, weighted by the type frequencies):

    - ``grad_J``, ``grad_U``, ``bias``: the norms of ``nabla_i J_sys``, ``nabla_i U_i`` and
      of ``b_i = E[Psi_i D_i]`` (the displaced competitor return,
      :func:`~mcpg.mechanisms.winner_take_all_bias`);
    - ``identity_error``: ``max |nabla_i J_sys - nabla_i U_i - b_i|`` (Theorem 1 says 0);
    - ``cosine``: the cosine between ``nabla_i U_i`` (what winner-take-all ascends) and
      ``nabla_i J_sys``;
    - ``private_gain``: ``max_{t, a} U_dev - U_i``, what agent i could still gain for itself
      by switching its answer to one type (0 at an equilibrium of private utilities);
    - ``system_gain``: ``max_{t, a} J_dev - J_sys``, what the system would gain if agent i
      made the switch that is best for the system.
    """
    from ...mechanisms import winner_take_all_bias

    K, T, M = cfg.n_agents, cfg.n_types, cfg.n_answers
    wt = cfg.type_distribution()
    gJ = np.zeros((K, T, M))
    gU = np.zeros((K, T, M))
    b = np.zeros((K, T, M))
    for t in range(T):
        pool, _ = exact_pool(cfg, logits, weights, t)
        # each per-prompt copy of the type's logits gets its share: sum over prompts
        gJ[:, t] = wt[t] * np.stack([x.sum(0) for x in system_gradient(pool)])
        gU[:, t] = wt[t] * np.stack([x.sum(0) for x in private_utility_gradients(pool)])
        b[:, t] = wt[t] * np.stack([x.sum(0) for x in winner_take_all_bias(pool)])
    dev = unilateral_deviations(cfg, logits, weights)
    flat = lambda x: x.reshape(K, -1)  # noqa: E731
    nJ, nU = np.linalg.norm(flat(gJ), axis=1), np.linalg.norm(flat(gU), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = (flat(gJ) * flat(gU)).sum(1) / (nJ * nU)
    return {
        "grad_J": nJ,
        "grad_U": nU,
        "bias": np.linalg.norm(flat(b), axis=1),
        "identity_error": np.abs(flat(gJ - gU - b)).max(1),
        "cosine": cos,
        "private_gain": flat(dev["U_dev"]).max(1) - dev["U"],
        "system_gain": flat(dev["J_dev"]).max(1) - dev["J"],
    }


@_one_thread
def profile_values(
    cfg: SimConfig, profiles, weights, type_index: int, sharpness: float = 40.0
) -> tuple[np.ndarray, np.ndarray]:
    """J_t and every U_i when the agents answer type ``type_index`` deterministically.

    Args:
        profiles: answer profiles, shape (n, K): row r gives agent k the answer
            ``profiles[r, k]`` on type t (logits ``sharpness * onehot``).
        weights: router weights, shape (F,) for all profiles or (n, F), one per profile.

    Returns ``J`` of shape (n,) (expected deployed reward on type-t questions) and ``U`` of
    shape (n, K) (private utilities ``E[1{I = i} G | type t]``; each row sums to J).
    """
    K, T, M = cfg.n_agents, cfg.n_types, cfg.n_answers
    prof = np.asarray(profiles)
    if prof.ndim != 2 or prof.shape[1] != K or ((prof < 0) | (prof >= M)).any():
        raise ValueError(f"profiles must have shape (n, {K}) with answers in [0, {M})")
    if not (np.isfinite(sharpness) and sharpness > 0):
        raise ValueError(f"sharpness must be positive, got {sharpness}")
    w = np.asarray(weights, dtype=float)
    if w.shape == (cfg.n_features,):
        w = np.broadcast_to(w, (len(prof), cfg.n_features))
    if w.shape != (len(prof), cfg.n_features):
        raise ValueError(f"weights must have shape ({cfg.n_features},) or ({len(prof)}, {cfg.n_features})")
    J = np.zeros(len(prof))
    U = np.zeros((len(prof), K))
    for r, (p_, w_) in enumerate(zip(prof, w)):
        theta = np.zeros((K, T, M))
        theta[np.arange(K), type_index, p_] = sharpness
        pool, _ = exact_pool(cfg, theta, w_, type_index)
        with torch.no_grad():
            J[r] = float(system_value(pool))
            U[r] = private_utilities(pool).numpy()
    return J, U


def profile_table(cfg: SimConfig, type_index: int, weights=None, sharpness: float = 40.0):
    """Every way the K agents can each give one answer to one type, exactly (Theorem 1's game).

    For each profile (a_1, ..., a_K) (agents deterministic on type ``type_index``),
    :func:`profile_values` gives J_t = E[G | type t] and each agent's private utility
    U_i = E[1{I=i} G | type t]. A profile is an equilibrium of private utilities when no
    agent can raise its own U_i by changing its answer alone (where winner-take-all
    training can come to rest), and best for the system when it maximises J_t.

    Args:
        weights: router weights (F,); default :func:`calibrated_router`.
        sharpness: deterministic policies are logits ``sharpness * onehot(a)``.

    Returns a DataFrame, one row per profile, sorted by J_t (descending): ``profile``,
    ``distinct`` answers, ``J``, ``U_1..U_K``, ``equilibrium``, ``best``.
    """
    import itertools

    import pandas as pd

    K, M = cfg.n_agents, cfg.n_answers
    w = calibrated_router(cfg) if weights is None else np.asarray(weights, dtype=float)
    profs = list(itertools.product(range(M), repeat=K))
    J, U = profile_values(cfg, np.array(profs), w, type_index, sharpness)
    values = {p_: (J[r], U[r]) for r, p_ in enumerate(profs)}
    best = J.max()
    rows = []
    for prof, (Jp, Up) in values.items():
        eq = all(
            values[prof[:i] + (a,) + prof[i + 1 :]][1][i] <= Up[i] + 1e-12
            for i in range(K)
            for a in range(M)
            if a != prof[i]
        )
        rows.append(
            {
                "profile": prof,
                "distinct": len(set(prof)),
                "J": Jp,
                **{f"U_{i + 1}": Up[i] for i in range(K)},
                "equilibrium": eq,
                "best": Jp >= best - 1e-12,
            }
        )
    return pd.DataFrame(rows).sort_values("J", ascending=False, ignore_index=True)


def theorem1_trajectory(run: SimRun, every: int = 1, seeds: Sequence[int] | None = None):
    """:func:`theorem1_diagnostics` at the checkpoints of a run, as a long DataFrame.

    Args:
        run: a :class:`SimRun` (its logits and router weights at each checkpoint are used).
        every: use every this many checkpoints (the last is always included).
        seeds: a subset of the run's seeds (default all).

    Returns one row per (seed, update, agent) with the columns of
    :func:`theorem1_diagnostics` and ``method``.
    """
    import pandas as pd

    _positive_int(every, "every")
    seeds = run.seeds if seeds is None else _check_seeds(seeds)
    unknown = set(seeds) - set(run.seeds)
    if unknown:
        raise ValueError(f"seeds {sorted(unknown)} are not in the run")
    n = len(run.updates)
    cks = sorted(set(range(0, n, every)) | {n - 1})
    rows = []
    for seed in seeds:
        si = run.seeds.index(seed)
        for c in cks:
            d = theorem1_diagnostics(run.cfg, run.logits[si, c], run.router[si, c])
            for i in range(run.cfg.n_agents):
                rows.append(
                    {
                        "method": run.method,
                        "seed": seed,
                        "update": int(run.updates[c]),
                        "agent": i,
                        **{k: float(v[i]) for k, v in d.items()},
                    }
                )
    return pd.DataFrame(rows)
