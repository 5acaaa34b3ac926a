"""Ready-made small systems for the book's chapters and tests (paper §3-§5).

- :func:`planner_solver_critic`: the collaborative pipeline the paper names in §3 and §4,
  a chain of three singleton layers (planner -> solver -> critic) in which each agent reads
  the previous agent's output. Removal (§4) breaks on it wherever an intermediate agent
  is deleted; retention is defined for every group.
- :func:`random_pipeline` and :func:`random_parallel_pool`: random small systems for
  property-based tests (random policies and rewards).
- :func:`random_team`: a parallel team whose reward is mostly the average of what each
  agent adds, plus a tunable interaction: the teammates' variation is then noise in each
  agent's reward, which baselines conditioned on them remove (Proposition 4).
- :func:`layer_fields`: the paper's per-layer fields (§4): for agent i in layer l, the
  entries Δ^rho_{i|S}, S ⊆ N_l \\ {i}, of q^rho_l(S) = E[G | H_l, A_l^(S)] (retention) and of
  the reduced system with the layer's agents outside S deleted (removal), at one outcome.
- :func:`valuation_fields`: the book's extension to every group of agents across layers:
  the retention and removal valuations v(S) = q(S) - q(∅) of a
  system at one outcome (Eq. 7) and their contribution fields, with the removal field
  left undefined (NaN) wherever one of its endpoints is.

All builders return :mod:`mcpg.mechanisms` systems, whose expectations are exact sums.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from . import fields, mechanisms, signals
from ._checks import as_float_array

__all__ = [
    "PSC_AGENTS",
    "PSC_ACTIONS",
    "planner_solver_critic",
    "random_pipeline",
    "random_parallel_pool",
    "random_team",
    "valuation_fields",
    "layer_fields",
]

#: Agent names of :func:`planner_solver_critic`, in layer order (agent 0 acts first).
PSC_AGENTS = ("planner", "solver", "critic")
#: Action names of each agent of :func:`planner_solver_critic` (action 0, action 1).
PSC_ACTIONS = {"planner": ("vague", "precise"), "solver": ("wrong", "right"), "critic": ("pass", "revise")}


def _probabilities(x, name: str, shape: tuple[int, ...]) -> np.ndarray:
    arr = as_float_array(x, name)
    try:
        arr = np.broadcast_to(arr, shape).astype(float)
    except ValueError:
        raise ValueError(f"{name} must broadcast to shape {shape}, got {arr.shape}") from None
    if ((arr <= 0) | (arr >= 1)).any() and name in ("plan", "solve", "revise"):
        raise ValueError(f"{name} must lie strictly between 0 and 1 (it is a policy's probability)")
    if ((arr < 0) | (arr > 1)).any():
        raise ValueError(f"{name} must lie in [0, 1]")
    return arr


def _binary_logits(p: np.ndarray) -> np.ndarray:
    """Softmax logits (0, log(p / (1 - p))) of a two-action policy with P(action 1) = p."""
    return np.stack([np.zeros_like(p), np.log(p) - np.log1p(-p)], axis=-1)


def planner_solver_critic(
    plan=(0.5, 0.4),
    solve=((0.6, 0.9), (0.2, 0.6)),
    revise=(0.8, 0.2),
    fix=((0.6, 0.8), (0.3, 0.6)),
    keep=0.9,
    prompt_probs=None,
    noise: str = "bernoulli",
) -> mechanisms.Pipeline:
    """A planner -> solver -> critic pipeline (paper §3, §4), two actions per agent.

    The prompt H is ``easy`` (0) or ``hard`` (1). The planner writes a ``vague`` (0) or
    ``precise`` (1) plan; the solver reads it and answers ``wrong`` (0) or ``right`` (1);
    the critic reads the answer and lets it ``pass`` (0) or asks to ``revise`` (1) it.
    G = 1 when the deployed answer is right (Bernoulli with the tabled mean).

    Args:
        plan: P(precise plan | H), shape (n_H,).
        solve: P(right answer | H, plan), shape (n_H, 2).
        revise: P(revise | H, answer), shape (n_H, 2) or (2,) (indexed by answer).
        fix: P(a wrong answer becomes right when revised | H, plan), shape (n_H, 2):
            a precise plan helps the revision, so the planner also acts on G directly.
        keep: P(a right answer stays right when revised), scalar or (n_H,).
        prompt_probs: P(H), uniform if omitted.
        noise: ``"bernoulli"`` (G in {0, 1}) or ``"fixed"`` (G is the tabled mean).

    Removal (§4) is defined for the groups ∅, {planner}, {planner, solver} and the full
    group: deployed alone, a plan answers nothing (reward 0), and planner + solver deploy
    the solver's answer (reward 1 if right). Every other group deletes an agent whose
    successor needs its output, so q^rem is NaN there; q^ret is defined everywhere.

    Returns:
        a :class:`mcpg.mechanisms.Pipeline` with agents 0, 1, 2 = planner, solver, critic.
    """
    plan = as_float_array(plan, "plan")
    if plan.ndim != 1 or plan.size < 1:
        raise ValueError(f"plan must be a 1-d array of P(precise | H), got shape {plan.shape}")
    n_H = plan.size
    plan = _probabilities(plan, "plan", (n_H,))
    solve = _probabilities(solve, "solve", (n_H, 2))
    revise = _probabilities(revise, "revise", (n_H, 2))
    fix = _probabilities(fix, "fix", (n_H, 2))
    keep = _probabilities(keep, "keep", (n_H,))

    planner = _binary_logits(plan)                       # (n_H, 2)
    solver = _binary_logits(solve)                       # (n_H, plan, answer)
    critic = _binary_logits(revise)                      # (n_H, answer, verdict)
    reward = np.empty((n_H, 2, 2, 2))                    # (H, plan, answer, verdict)
    answer = np.array([0.0, 1.0])
    reward[:, :, :, 0] = answer[None, None, :]           # pass: right iff the answer is right
    reward[:, :, 0, 1] = fix                             # revise a wrong answer: fixed w.p. fix[H, plan]
    reward[:, :, 1, 1] = keep[:, None]                   # revise a right answer: kept w.p. keep[H]
    prefix = [np.zeros((n_H, 2)),                        # a plan alone answers nothing
              np.broadcast_to(answer, (n_H, 2, 2)).copy()]  # planner + solver: the answer is deployed
    return mechanisms.Pipeline([planner, solver, critic], reward, prefix_rewards=prefix,
                               prompt_probs=prompt_probs, noise=noise)


def _check_sizes(K, n_prompts, n_actions, min_K: int) -> tuple[int, int]:
    """Refuse bad sizes of a random system with a ValueError naming the argument."""
    if int(K) != K or K < min_K:
        raise ValueError(f"K must be an integer >= {min_K}, got {K}")
    if int(n_prompts) != n_prompts or n_prompts < 1:
        raise ValueError(f"n_prompts must be a positive integer, got {n_prompts}")
    if int(n_actions) != n_actions or n_actions < 2:
        raise ValueError(f"n_actions must be an integer >= 2, got {n_actions}")
    return int(n_prompts), int(n_actions)


def random_pipeline(rng: np.random.Generator, K: int = 3, n_prompts: int = 2, n_actions: int = 2,
                    logit_scale: float = 1.0, noise: str = "bernoulli") -> mechanisms.Pipeline:
    """A random chain of K singleton layers: random policies, rewards in [0, 1], prefix rewards."""
    H, M = _check_sizes(K, n_prompts, n_actions, min_K=2)
    logits = [logit_scale * rng.normal(size=(H, M))]
    logits += [logit_scale * rng.normal(size=(H, M, M)) for _ in range(int(K) - 1)]
    reward = rng.uniform(size=(H,) + (M,) * int(K))
    prefix = [rng.uniform(size=(H,) + (M,) * (k + 1)) for k in range(int(K) - 1)]
    return mechanisms.Pipeline(logits, reward, prefix_rewards=prefix, noise=noise)


def random_parallel_pool(rng: np.random.Generator, K: int = 3, n_prompts: int = 2, n_actions: int = 2,
                         logit_scale: float = 1.0, noise: str = "bernoulli") -> mechanisms.ParallelPool:
    """One layer of K agents with random policies and a random reward table E[G | H, A] in [0, 1]."""
    H, M = _check_sizes(K, n_prompts, n_actions, min_K=1)
    logits = logit_scale * rng.normal(size=(int(K), H, M))
    return mechanisms.ParallelPool(logits, rng.uniform(size=(H,) + (M,) * int(K)), noise=noise)


def random_team(rng: np.random.Generator, K: int = 4, n_prompts: int = 2, n_actions: int = 3,
                interaction: float = 0.2, logit_scale: float = 1.0,
                noise: str = "fixed") -> mechanisms.ParallelPool:
    """A parallel team: E[G | H, A] = (1 - λ) mean_j w_j(H, A^(j)) + λ u(H, A), λ = ``interaction``.

    w_j(H, a) and u(H, A) are uniform on [0, 1], so E[G | H, A] lies in [0, 1]. With λ = 0 the
    valuation of every outcome is additive (Proposition 2); λ = 1 is a random reward table.
    """
    if not 0.0 <= interaction <= 1.0:
        raise ValueError(f"interaction must lie in [0, 1], got {interaction}")
    if int(K) != K or K < 1:
        raise ValueError(f"K must be a positive integer, got {K}")
    if int(n_prompts) != n_prompts or n_prompts < 1:
        raise ValueError(f"n_prompts must be a positive integer, got {n_prompts}")
    if int(n_actions) != n_actions or n_actions < 2:
        raise ValueError(f"n_actions must be an integer >= 2, got {n_actions}")
    K, H, M = int(K), int(n_prompts), int(n_actions)
    shape = (H,) + (M,) * K
    w = rng.uniform(size=(K, H, M))
    additive = sum(w[j].reshape((H,) + tuple(M if k == j else 1 for k in range(K))) for j in range(K)) / K
    reward = (1.0 - interaction) * np.broadcast_to(additive, shape) + interaction * rng.uniform(size=shape)
    logits = logit_scale * rng.normal(size=(K, H, M))
    return mechanisms.ParallelPool(logits, reward, noise=noise)


def _outcome(system: mechanisms.System, h, actions) -> np.ndarray:
    """``actions`` as an array, after checking that ``h`` is one of the system's prompts and
    that ``actions`` holds one action index per agent."""
    K = system.n_agents
    if int(h) != h or not 0 <= h < system.n_prompts:
        raise ValueError(f"h must be a prompt index in [0, {system.n_prompts}), got {h}")
    a = np.asarray(actions)
    if a.shape != (K,) or (a != np.round(a)).any() or ((a < 0) | (a >= system.n_actions)).any():
        raise ValueError(f"actions must hold {K} action indices in [0, {system.n_actions})")
    return a


def valuation_fields(system: mechanisms.System, h: int, actions: Sequence[int]) -> dict[str, np.ndarray]:
    """Retention and removal valuations at one outcome (Eq. 7) and their contribution fields.

    v^rho(S) = q^rho(S) - q^rho(∅) at prompt ``h`` and joint action ``actions``, for
    rho = retention (q^ret(S) = E[G | H, A^(S)], Eq. 8) and removal (the reduced system with
    the agents outside S deleted). The removal field Δ^rem_{i|S} is NaN wherever q^rem(S)
    or q^rem(S ∪ {i}) is undefined (a pipeline left without an input), as well as where
    i ∈ S.

    Returns:
        dict with ``v_ret``, ``v_rem`` (shape (2**K,)) and ``field_ret``, ``field_rem``
        (shape (K, 2**K), indexed as :func:`mcpg.fields.contribution_field`).
    """
    K = system.n_agents
    a = _outcome(system, h, actions)
    v_ret = mechanisms.valuation_at(mechanisms.retention_values(system), h, a)
    v_rem = mechanisms.valuation_at(mechanisms.removal_values(system), h, a)
    undefined = np.isnan(v_rem)
    field_rem = fields.contribution_field(np.where(undefined, 0.0, v_rem))
    for i in range(K):  # an entry with an undefined endpoint is undefined
        S = np.arange(1 << K)
        field_rem[i, undefined[S] | undefined[S | (1 << i)]] = np.nan
    return {"v_ret": v_ret, "v_rem": v_rem, "field_ret": fields.contribution_field(v_ret),
            "field_rem": field_rem}


def layer_fields(system: mechanisms.System, h: int, actions: Sequence[int],
                 agent_names: Sequence[str] | None = None) -> pd.DataFrame:
    """The paper's per-layer contribution fields at one outcome (§4, Eq. 7-8).

    For agent i in layer l with history H_l (the prompt and the outputs of the earlier
    layers), and every S ⊆ N_l \\ {i}:

    - retention: q^ret_l(S) = E[G | H_l, A_l^(S)] (the layer's agents outside S and all later
      layers drawn from their policies), Δ^ret_{i|S} = q^ret_l(S ∪ {i}) − q^ret_l(S);
    - removal: q^rem_l(S) = E[G^rem | H_l, A_l^(S)] for the reduced system in which the
      agents of layer l outside S are deleted (earlier layers fixed through H_l, later layers
      still acting); NaN where that system is undefined (a later agent left without input).

    For a pool (one layer) this is the field over all groups S ∌ i; for a chain of singleton
    layers there is one entry per agent, S = ∅. Returns one row per (i, S) with columns
    ``agent``, ``layer`` (1-based), ``H_l`` (the earlier agents), ``S``, ``ret``, ``rem``.
    """
    K = system.n_agents
    a = _outcome(system, h, actions)
    names = list(agent_names) if agent_names is not None else [str(k + 1) for k in range(K)]
    if len(names) != K:
        raise ValueError(f"agent_names must hold {K} names, got {len(names)}")
    at = (int(h), *[int(x) for x in a])
    full = (1 << K) - 1
    rows = []
    for ell, layer in enumerate(system.layers, start=1):
        hist = signals.history_mask(system, layer[0])
        layer_mask = sum(1 << k for k in layer)
        later = full & ~hist & ~layer_mask

        def q_ret(S, hist=hist):
            return mechanisms.retention_value(system, hist | S).numpy()[at]

        def q_rem(S, hist=hist, later=later):
            reduced = system.removal_value(hist | S | later).numpy()
            if np.isnan(reduced).any():  # the reduced system is undefined
                return float("nan")
            return signals.conditional_expectation(system, reduced, hist | S)[at]

        for i in layer:
            others = layer_mask & ~(1 << i)
            for S in range(1 << K):
                if S & ~others:
                    continue
                rows.append({"agent": names[i], "layer": ell, "H_l": signals.group_name(hist, names),
                             "S": signals.group_name(S, names),
                             "ret": float(q_ret(S | 1 << i) - q_ret(S)),
                             "rem": float(q_rem(S | 1 << i) - q_rem(S))})
    return pd.DataFrame(rows)
