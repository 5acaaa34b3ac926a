"""Valid training signals: score-function gradients, baselines and variance (paper §5).

An agent i trained by the score-function estimator Ψ_i X ascends E[Ψ_i X]. The raw reward
X = G gives ∇_θi J_sys; this module asks which other signals X = G - B_i do too, and what
they cost in variance, on the exactly enumerated systems of :mod:`mcpg.mechanisms`:

- :func:`baseline_bias` is E[Ψ_i B_i], the amount by which subtracting B_i moves agent i's
  gradient; :func:`is_valid_baseline` checks Lemma 1's condition
  E[B_i | H_l, A^(i)] = E[B_i | H_l], under which that amount is zero.
- :func:`retention_entry` and :func:`removal_entry` are field entries Δ^ρ_{i|S}
  (Eq. 7); :func:`corollary1_table` checks Corollary 1 (every retention entry of agent i's
  layer is gradient-correct) background by background, next to the removal entries,
  which need not be.
- :func:`variance_by_conditioning_set` is Proposition 4's E[Var(G | H, A^(S))] along a
  nested chain; :func:`exact_estimator_variance` and :func:`estimator_variance` are the
  variance of the estimator Ψ_i (G - q^ret(S)) itself, exactly and from draws.

Groups S are bitmasks over all agents of the system (bit k set = agent k in S). In a
pipeline the history H_l of agent i's layer holds the outputs of the earlier layers
(``system.history_agents(i)``), so a layer background S of Corollary 1 is conditioned on
together with those: the conditioning set is ``history_mask(system, i) | S``.

A baseline or signal is spelled in one of three ways, or as a list of K of them, one per
agent:

- ``q_ret(S)``: the retention value q^ret(S) = E[G | H, A^(S)] of Eq. (8), so ``q_ret(0)``
  is E[G | H];
- :data:`NO_BASELINE` (or any float c): the constant c, so that G - B is the raw reward;
- a joint table (numpy array or torch tensor that broadcasts to ``system.joint_shape``: a
  function of the prompt and every action).

A bare int is refused with an error that names these spellings: ``0`` could mean E[G | H]
or "no baseline", and the two give different variances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np
import pandas as pd
import torch

from . import mechanisms
from ._checks import as_float_array
from .mechanisms import Samples, System

__all__ = [
    "NO_BASELINE",
    "RetentionBaseline",
    "q_ret",
    "history_mask",
    "layer_backgrounds",
    "all_cells",
    "conditional_expectation",
    "baseline_tables",
    "baseline_bias",
    "baseline_estimate",
    "is_valid_baseline",
    "signal_bias",
    "retention_entry",
    "removal_entry",
    "layer_removal_entry",
    "corollary1_table",
    "variance_by_conditioning_set",
    "exact_estimator_variance",
    "estimator_variance",
    "group_name",
]

Table = Union[np.ndarray, torch.Tensor]


@dataclass(frozen=True)
class RetentionBaseline:
    """The retention value q^ret(S) = E[G | H, A^(S)] (Eq. 8) used as a baseline or signal.

    Build it with :func:`q_ret`. ``S`` is a bitmask over all agents of the system (bit k set
    = the agent numbered k + 1 in the text is in S).
    """

    S: int

    def __post_init__(self):
        S = self.S
        if isinstance(S, bool) or not isinstance(S, (int, np.integer)) or S < 0:
            raise ValueError(f"S must be a non-negative bitmask, got {S!r}")
        object.__setattr__(self, "S", int(S))


def q_ret(S: int) -> RetentionBaseline:
    """The baseline q^ret(S) = E[G | H, A^(S)] (Eq. 8); ``q_ret(0)`` is E[G | H]."""
    return RetentionBaseline(S)


NO_BASELINE: float = 0.0
"""The constant 0 as a baseline, so that the signal G - B is the raw reward G."""

Baseline = Union[float, RetentionBaseline, Table, Sequence[Union[float, RetentionBaseline, Table]]]


# --- groups ----------------------------------------------------------------------------


def _check_agent(system: System, i: int) -> int:
    if isinstance(i, bool) or int(i) != i or not 0 <= i < system.n_agents:
        raise ValueError(f"i must be an agent index in [0, {system.n_agents}), got {i}")
    return int(i)


def _check_group(system: System, S: int, name: str = "S") -> int:
    if isinstance(S, bool) or not isinstance(S, (int, np.integer)) or not 0 <= S < (1 << system.n_agents):
        raise ValueError(f"{name} must be a bitmask in [0, 2**{system.n_agents}), got {S!r}")
    return int(S)


def history_mask(system: System, i: int) -> int:
    """Bitmask of the agents in layers before agent i's: their outputs are part of H_l (§3)."""
    return sum(1 << k for k in system.history_agents(_check_agent(system, i)))


def _layer_mask(system: System, i: int) -> int:
    for layer in system.layers:
        if i in layer:
            return sum(1 << k for k in layer)
    raise ValueError(f"i={i} is not an agent of this system")


def layer_backgrounds(system: System, i: int) -> list[int]:
    """Corollary 1's conditioning sets for agent i: H_l's agents together with each S ⊆ N_l \\ {i}.

    For a pool (one layer) these are all groups S ∌ i; for a chain of singleton layers
    there is one, the agents before i.
    """
    i = _check_agent(system, i)
    others = _layer_mask(system, i) & ~(1 << i)
    hist = history_mask(system, i)
    return [hist | S for S in range(1 << system.n_agents) if S & ~others == 0]


def group_name(S: int, names: Sequence[str]) -> str:
    """A group as a set of agent names, e.g. ``{planner,critic}``; ``∅`` for the empty group."""
    if S < 0 or S >= 1 << len(names):
        raise ValueError(f"S must be a bitmask over {len(names)} agents, got {S}")
    return "{" + ",".join(names[k] for k in range(len(names)) if (S >> k) & 1) + "}" if S else "∅"


# --- exact expectations ----------------------------------------------------------------


def all_cells(system: System) -> Samples:
    """Every joint outcome (H, A) once, as :class:`mcpg.mechanisms.Samples` (reward = E[G | H, A]).

    Lets anything defined on draws (the scores Ψ_i, per-draw signals) be evaluated on the
    whole joint, so that its expectation is an exact weighted sum.
    """
    idx = np.unravel_index(np.arange(int(np.prod(system.joint_shape))), system.joint_shape)
    return Samples(h=idx[0], actions=np.stack(idx[1:], axis=1),
                   reward=system.reward_mean().detach().numpy().ravel())


def _joint(system: System, X, name: str) -> np.ndarray:
    arr = X.detach().cpu().numpy() if torch.is_tensor(X) else X
    arr = as_float_array(arr, name)
    try:
        return np.broadcast_to(arr, system.joint_shape).copy()
    except ValueError:
        raise ValueError(f"{name} must broadcast to the joint shape {system.joint_shape}, "
                         f"got {arr.shape}") from None


def _joint_prob(system: System) -> np.ndarray:
    return system.joint_prob().detach().numpy()


def conditional_expectation(system: System, X, S: int) -> np.ndarray:
    """E[X | H, A^(S)] over the joint (the other agents drawn from their policies given A^(S)).

    ``X`` is a joint table (a function of H and every action). For X = E[G | H, A] this is
    q^ret(S) of Eq. (8). Returns an array of the joint shape.
    """
    S = _check_group(system, S)
    X = _joint(system, X, "X")
    P = _joint_prob(system)
    axes = tuple(k + 1 for k in range(system.n_agents) if not (S >> k) & 1)
    if not axes:
        return np.array(X)
    num = (P * X).sum(axis=axes, keepdims=True)
    den = P.sum(axis=axes, keepdims=True)
    return np.broadcast_to(num / den, system.joint_shape).copy()


def _is_bare_int(b) -> bool:
    """An int, a bool, or a 0-d integer or boolean array or tensor: a bitmask or a constant?"""
    if isinstance(b, (bool, int, np.integer, np.bool_)):
        return True
    if torch.is_tensor(b):
        return b.ndim == 0 and not (b.is_floating_point() or b.is_complex())
    if isinstance(b, np.ndarray):
        return b.ndim == 0 and (np.issubdtype(b.dtype, np.integer) or b.dtype == np.bool_)
    return False


def baseline_tables(system: System, B: Baseline, name: str = "B") -> list[np.ndarray]:
    """One joint table per agent from a baseline argument (see the module docstring).

    ``q_ret(S)`` becomes q^ret(S) = E[G | H, A^(S)]; a float or a table is shared by every
    agent; a list gives agent i its i-th entry. A bare int (or bool, or 0-d integer array or
    tensor) raises ValueError (is ``0`` E[G | H] or no baseline?). Returns K arrays of the
    joint shape.
    """
    K = system.n_agents

    def one(b, nm):
        if isinstance(b, RetentionBaseline):
            return mechanisms.retention_value(system, _check_group(system, b.S, nm)).numpy()
        if _is_bare_int(b):
            S = int(b.item()) if hasattr(b, "item") else int(b)
            raise ValueError(
                f"{nm}={b!r} is ambiguous: write q_ret({S}) for q^ret(S) = E[G | H, A^(S)] "
                f"(q_ret(0) is E[G | H]), or NO_BASELINE or a float for a constant")
        return _joint(system, b, nm)

    if isinstance(B, (list, tuple)):
        if len(B) != K:
            raise ValueError(f"{name} must hold one entry per agent ({K}), got {len(B)}")
        return [one(b, f"{name}[{i}]") for i, b in enumerate(B)]
    t = one(B, name)
    return [t] * K


def baseline_bias(system: System, B: Baseline) -> list[np.ndarray]:
    """E[Ψ_i B_i] for every agent, exactly: what subtracting B_i does to agent i's gradient.

    E[Ψ_i (G - B_i)] = ∇_θi J_sys - E[Ψ_i B_i]. Lemma 1: the bias is zero when
    E[B_i | H_l, A^(i)] = E[B_i | H_l] (see :func:`is_valid_baseline`). Returns one array of
    shape θ_i.shape per agent.
    """
    tables = baseline_tables(system, B, "B")
    return [mechanisms.score_expectation(system, t)[i] for i, t in enumerate(tables)]


def baseline_estimate(system: System, samples: Samples, B: Baseline) -> list[tuple[np.ndarray, np.ndarray]]:
    """Score-function estimates of E[Ψ_i (G - B_i)] from draws, with standard errors (Lemma 1).

    G is each draw's realised reward and B_i the baseline's value at the draw. Returns, per
    agent, (mean, standard error) of shape θ_i.shape; by Lemma 1 the mean estimates
    ∇_θi J_sys when B_i is valid and ∇_θi J_sys - E[Ψ_i B_i] in general.
    """
    tables = baseline_tables(system, B, "B")
    idx = samples.index()
    signal = np.stack([samples.reward - t[idx] for t in tables], axis=1)
    return mechanisms.score_function_estimate(system, samples, signal)


def is_valid_baseline(system: System, i: int, B: Baseline, atol: float = 1e-10) -> bool:
    """Lemma 1's condition for agent i: E[B_i | H_l, A^(i)] = E[B_i | H_l] everywhere.

    H_l is the prompt together with the outputs of the layers before agent i's. The
    condition is sufficient for E[Ψ_i B_i] = 0, not necessary.
    """
    i = _check_agent(system, i)
    if not np.isfinite(atol) or atol < 0:
        raise ValueError(f"atol must be a non-negative number, got {atol}")
    b = baseline_tables(system, B, "B")[i]
    hist = history_mask(system, i)
    with_i = conditional_expectation(system, b, hist | (1 << i))
    without = conditional_expectation(system, b, hist)
    return bool(np.allclose(with_i, without, rtol=0.0, atol=atol))


def signal_bias(system: System, X: Baseline) -> list[np.ndarray]:
    """E[Ψ_i X_i] - ∇_θi J_sys for every agent: zero exactly when X_i is gradient-correct.

    ``X`` as for baselines; ``q_ret(S)`` means the signal q^ret(S), rarely what you want,
    so pass the joint table G - q^ret(S) (or a field entry) for a signal.
    """
    tables = baseline_tables(system, X, "X")
    grads = mechanisms.system_gradient(system)
    return [mechanisms.score_expectation(system, t)[i] - grads[i] for i, t in enumerate(tables)]


def retention_entry(system: System, i: int, S: int) -> np.ndarray:
    """Δ^ret_{i|S} = q^ret(S ∪ {i}) - q^ret(S) over the joint (Eq. 7 with Eq. 8).

    ``S`` is the conditioning set over all agents (for Corollary 1, one of
    :func:`layer_backgrounds`); it must not contain i.
    """
    i, S = _check_agent(system, i), _check_group(system, S)
    if (S >> i) & 1:
        raise ValueError(f"S must not contain agent i={i}")
    q = lambda T: mechanisms.retention_value(system, T).numpy()  # noqa: E731
    return q(S | (1 << i)) - q(S)


def removal_entry(system: System, i: int, S: int) -> np.ndarray:
    """Δ^rem_{i|S} = q^rem(S ∪ {i}) - q^rem(S) over the joint (§4); NaN where a reduced system is undefined.

    Raises ValueError for a system without a removal rule (``system.removal_value``).
    """
    i, S = _check_agent(system, i), _check_group(system, S)
    if not _defines_removal(system):
        raise ValueError(f"system ({type(system).__name__}) defines no removal rule")
    if (S >> i) & 1:
        raise ValueError(f"S must not contain agent i={i}")
    return (system.removal_value(S | (1 << i)) - system.removal_value(S)).numpy()


def layer_removal_entry(system: System, i: int, S: int) -> np.ndarray:
    """The paper's per-layer removal entry Δ^rem_{i|S}, S ⊆ N_l \\ {i} (§4), over the joint.

    q^rem_l(T) = E[G^rem_{l,T} | H_l, A_l^(T)]: the agents of layer l outside T are deleted,
    the earlier layers are fixed through H_l, and the later layers still act (drawn from their
    policies in the reduced system). Returns q^rem_l(S ∪ {i}) - q^rem_l(S), NaN everywhere
    when either reduced system is undefined (in a pipeline, deleting an agent whose successor
    needs its output). For a pool (one layer) this is :func:`removal_entry`. ``S`` holds
    agents of i's layer only (not the history, unlike :func:`retention_entry`).
    """
    i, S = _check_agent(system, i), _check_group(system, S)
    if not _defines_removal(system):
        raise ValueError(f"system ({type(system).__name__}) defines no removal rule")
    layer = _layer_mask(system, i)
    if S & ~(layer & ~(1 << i)):
        raise ValueError(f"S must hold agents of agent i={i}'s layer other than i")
    hist = history_mask(system, i)
    later = ((1 << system.n_agents) - 1) & ~hist & ~layer

    def q_rem(T: int) -> np.ndarray:
        reduced = system.removal_value(hist | T | later).detach().numpy()
        if np.isnan(reduced).any():
            return np.full(system.joint_shape, np.nan)
        return conditional_expectation(system, reduced, hist | T)

    return q_rem(S | (1 << i)) - q_rem(S)


def _defines_removal(system: System) -> bool:
    try:
        system.removal_value(0)
    except NotImplementedError:
        return False
    return True


def _max_error(system: System, i: int, X: np.ndarray, grad: np.ndarray) -> float:
    if np.isnan(X).any():
        return float("nan")
    return float(np.abs(mechanisms.score_expectation(system, X)[i] - grad).max())


def corollary1_table(system: System, agent_names: Sequence[str] | None = None,
                     include_out_of_scope: bool = False) -> pd.DataFrame:
    """Corollary 1 checked exactly, one row per agent i and background S.

    For each i and each conditioning set S of :func:`layer_backgrounds` (the history H_l
    and any S' ⊆ N_l \\ {i}), the maximum over θ_i's coordinates of

    - ``ret_entry_error``: |E[Ψ_i Δ^ret_{i|S'}] - ∇_θi J_sys|,
    - ``ret_residual_error``: |E[Ψ_i (G - q^ret_l(S'))] - ∇_θi J_sys|,
    - ``rem_entry_error``: |E[Ψ_i Δ^rem_{i|S'}] - ∇_θi J_sys| for the paper's per-layer removal
      entry (:func:`layer_removal_entry`); NaN where removal is undefined, outside Corollary 1's
      scope (the paper defines no removal entry there), and everywhere for a system that
      defines no removal rule, such as a bare reward table,

    next to ``grad_max`` = max |∇_θi J_sys| for scale. The row names the entry in the paper's
    notation: ``layer`` (l, from 1), ``H_l`` (the agents whose outputs H_l holds), ``S_l``
    (the layer background S'), and ``S`` (the whole conditioning set, H_l's agents and S').
    Corollary 1 says the first two are zero; the third need not be. With
    ``include_out_of_scope`` every S ∌ i over all agents appears, and ``in_scope`` marks
    Corollary 1's: in a pipeline, backgrounds that miss part of H_l or contain a later agent
    are outside it, and can fail.
    """
    K = system.n_agents
    names = list(agent_names) if agent_names is not None else [str(k + 1) for k in range(K)]
    if len(names) != K:
        raise ValueError(f"agent_names must hold {K} names, got {len(names)}")
    grads = mechanisms.system_gradient(system)
    G = system.reward_mean().detach().numpy()
    has_removal = _defines_removal(system)
    rows = []
    layer_of = {k: ell for ell, layer in enumerate(system.layers, start=1) for k in layer}
    for i in range(K):
        scope = set(layer_backgrounds(system, i))
        hist = history_mask(system, i)
        if include_out_of_scope:
            backgrounds = [S for S in range(1 << K) if not (S >> i) & 1]
        else:
            backgrounds = sorted(scope)
        for S in backgrounds:
            q_S = mechanisms.retention_value(system, S).numpy()
            in_scope = S in scope
            rows.append({
                "agent": names[i],
                "layer": layer_of[i],
                "H_l": group_name(hist, names),
                "S_l": group_name(S & ~hist, names) if in_scope else "",
                "S": group_name(S, names),
                "in_scope": in_scope,
                "grad_max": float(np.abs(grads[i]).max()),
                "ret_entry_error": _max_error(system, i, retention_entry(system, i, S), grads[i]),
                "ret_residual_error": _max_error(system, i, G - q_S, grads[i]),
                "rem_entry_error": (_max_error(system, i, layer_removal_entry(system, i, S & ~hist),
                                               grads[i])
                                    if has_removal and in_scope else float("nan")),
            })
    table = pd.DataFrame(rows)
    return table if include_out_of_scope else table.drop(columns="in_scope")


# --- variance ---------------------------------------------------------------------------


def variance_by_conditioning_set(system: System, chain: Sequence[int]) -> np.ndarray:
    """E[Var(G | H, A^(S))] for each S of a nested chain S_0 ⊆ S_1 ⊆ ... (Proposition 4).

    Proposition 4 says the result is non-increasing along the chain. Raises ValueError if
    ``chain`` is not nested.
    """
    chain = [_check_group(system, S, "chain") for S in chain]
    if not chain:
        raise ValueError("chain must hold at least one group")
    for S, T in zip(chain, chain[1:]):
        if S & ~T:
            raise ValueError(f"chain must be nested (each group contains the previous), but {S} ⊄ {T}")
    return np.array([mechanisms.expected_conditional_variance(system, S) for S in chain])


def _squared_score_norms(system: System) -> list[np.ndarray]:
    """‖Ψ_i‖² at every joint outcome, one joint-shaped array per agent."""
    psi = system.score_vectors(all_cells(system))
    return [(p.reshape(len(p), -1) ** 2).sum(axis=1).reshape(system.joint_shape) for p in psi]


def exact_estimator_variance(system: System, B: Baseline) -> np.ndarray:
    """Per-draw variance of agent i's estimator Ψ_i (G - B_i), summed over θ_i's coordinates.

    E‖Ψ_i (G - B_i)‖² - ‖E[Ψ_i (G - B_i)]‖², computed exactly with the reward's own noise:
    E[(G - B)² | H, A] = E[G² | H, A] - 2 B E[G | H, A] + B². A Monte Carlo average of n
    draws has this variance divided by n. Returns shape (K,).
    """
    tables = baseline_tables(system, B, "B")
    P = _joint_prob(system)
    G1 = system.reward_mean().detach().numpy()
    G2 = system.reward_second_moment().detach().numpy()
    norms = _squared_score_norms(system)
    out = np.empty(system.n_agents)
    for i, (b, n2) in enumerate(zip(tables, norms)):
        second = float((P * n2 * (G2 - 2 * b * G1 + b**2)).sum())
        mean = mechanisms.score_expectation(system, G1 - b)[i]
        out[i] = second - float((mean**2).sum())
    return out


def estimator_variance(system: System, samples: Samples, baseline: Baseline) -> tuple[np.ndarray, np.ndarray]:
    """Monte Carlo variance of Ψ_i (G - B_i) from draws, summed over θ_i's coordinates.

    The per-draw terms t_n = Ψ_i(draw n) (G_n - B_i(H_n, A_n)) use the drawn rewards G_n and
    the baseline's value at each draw (``q_ret(S)`` means q^ret(S)). Returns per agent the
    sample total variance mean‖t_n - t̄‖² and its standard error std(‖t_n - t̄‖²)/√n,
    each of shape (K,). Compare with :func:`exact_estimator_variance`.
    """
    n = len(samples)
    if n < 2:
        raise ValueError("samples must hold at least two draws")
    tables = baseline_tables(system, baseline, "baseline")
    psi = system.score_vectors(samples)
    idx = samples.index()
    var, se = np.empty(system.n_agents), np.empty(system.n_agents)
    for i, (b, p) in enumerate(zip(tables, psi)):
        t = p.reshape(n, -1) * (samples.reward - b[idx])[:, None]
        d2 = ((t - t.mean(axis=0)) ** 2).sum(axis=1) * n / (n - 1)
        var[i], se[i] = d2.mean(), d2.std(ddof=1) / np.sqrt(n)
    return var, se
