"""Set functions, contribution fields and the Shapley value (paper §4, Appendix B.3-B.4).

A set function over ``n`` agents is a float array ``v`` of length ``2**n`` indexed by
bitmask: bit ``i`` of the index is set when agent ``i`` is in the group, so ``v[0]`` is
``v(∅)`` and ``v[1 << i]`` is ``v({i})``.

Everything is vectorised: the only Python loops run over the ``n`` agents, never over the
``2**n`` groups. The trick is that ``v.reshape(-1, 2, 2**i)`` puts the groups without agent
``i`` at ``[:, 0, :]`` and the same groups with ``i`` added at ``[:, 1, :]``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ._checks import as_float_array, set_function

__all__ = [
    "additive_game",
    "best_scalar_contributions",
    "contribution_field",
    "group",
    "interaction_spread",
    "is_additive",
    "mask_to_set",
    "ordered_sum",
    "ordered_totality_system",
    "random_game",
    "scalar_contributions",
    "set_function_from_callable",
    "set_to_mask",
    "shapley_value",
    "subset_sizes",
    "unanimity_game",
]


def _pairs(x: np.ndarray, i: int) -> np.ndarray:
    """View of ``x`` (last axis of length 2**n) as ``(..., 2**n / 2**(i+1), 2, 2**i)``.

    ``[..., 0, :]`` holds the groups S without agent ``i``, ``[..., 1, :]`` the groups S ∪ {i},
    in the same order.
    """
    return x.reshape(*x.shape[:-1], -1, 2, 1 << i)


def subset_sizes(n: int) -> np.ndarray:
    """Size |S| of every group S ⊆ {0, ..., n-1}: the popcount of each mask, shape (2**n,)."""
    sizes = np.zeros(1 << n, dtype=np.int64)
    for i in range(n):
        _pairs(sizes, i)[:, 1, :] += 1
    return sizes


def mask_to_set(mask: int) -> frozenset[int]:
    """The group of agents whose bits are set in ``mask``."""
    mask = int(mask)
    if mask < 0:
        raise ValueError("mask must be non-negative")
    return frozenset(i for i in range(mask.bit_length()) if mask >> i & 1)


def set_to_mask(agents: Iterable[int]) -> int:
    """The bitmask of a group of agents (inverse of :func:`mask_to_set`)."""
    mask = 0
    for i in agents:
        if int(i) < 0:
            raise ValueError("agents must be non-negative indices")
        mask |= 1 << int(i)
    return mask


def group(*numbers: int) -> int:
    """The bitmask of the agents numbered ``numbers`` as in the paper's text, from 1.

    The text numbers agents 1, ..., K; bitmasks (and code) count from 0, so agent k is bit
    k - 1: ``group(2) == 0b010``, ``group(1, 3) == 0b101`` and ``group() == 0`` (∅).
    """
    mask = 0
    for k in numbers:
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"agent numbers start at 1, got {k!r}")
        mask |= 1 << (int(k) - 1)
    return mask


def set_function_from_callable(n: int, f: Callable[[frozenset[int]], float]) -> np.ndarray:
    """Tabulate ``v(S) = f(S)`` for every S ⊆ {0, ..., n-1} (calls ``f`` 2**n times)."""
    v = np.array([f(mask_to_set(m)) for m in range(1 << n)], dtype=float)
    return set_function(v, "f")[0]


def additive_game(weights) -> np.ndarray:
    """The additive set function v(S) = Σ_{i∈S} w_i (Proposition 2 (iii)), v(∅) = 0."""
    w = as_float_array(weights, "weights")
    if w.ndim != 1:
        raise ValueError(f"weights must be 1-d, got shape {w.shape}")
    v = np.zeros(1 << w.size)
    for i, wi in enumerate(w):
        _pairs(v, i)[:, 1, :] += wi
    return v


def unanimity_game(n: int, T: int) -> np.ndarray:
    """The unanimity game of a group T: v(S) = 1 if T ⊆ S, else 0.

    Its only Harsanyi dividend is m(T) = 1 (v(S) = Σ_{U⊆S} m(U)), so ``additive_game(w) +
    c * unanimity_game(n, T)`` with |T| = 2 is a game whose agents interact on one pair only
    (Proposition 2 (ii) fails for the two agents of T and holds for every other agent).
    ``T`` is a bitmask over n agents.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if isinstance(T, bool) or not isinstance(T, (int, np.integer)) or not 0 <= T < 1 << n:
        raise ValueError(f"T must be a bitmask over {n} agents, got {T!r}")
    S = np.arange(1 << n)
    return ((S & T) == T).astype(float)


def random_game(n: int, rng=None, interaction: float = 1.0) -> np.ndarray:
    """A random set function with v(∅) = 0 and interactions of every order.

    Built from Harsanyi dividends m(T) (v(S) = Σ_{T⊆S} m(T)): singletons get m({i}) ~ N(0, 1),
    groups with |T| ≥ 2 get ``interaction`` · N(0, 1) / |T|. ``interaction=0`` gives an
    additive game. ``rng`` is a ``numpy.random.Generator`` or a seed.
    """
    rng = np.random.default_rng(rng)
    sizes = subset_sizes(n)
    m = rng.standard_normal(1 << n)
    m = np.where(sizes <= 1, m, interaction * m / np.maximum(sizes, 1))
    m[0] = 0.0
    for i in range(n):  # zeta transform: v(S) = Σ_{T ⊆ S} m(T)
        p = _pairs(m, i)
        p[:, 1, :] += p[:, 0, :]
    return m


def contribution_field(v) -> np.ndarray:
    """The contribution field of Proposition 3 (Eq. 7): Δ_{i|S} = v(S ∪ {i}) − v(S).

    Parameters: ``v``, float array of length 2**n. Returns an array of shape (n, 2**n) whose
    entry ``[i, S]`` is Δ_{i|S} for i ∉ S and NaN for i ∈ S (no such entry).
    """
    v, n = set_function(v, "v")
    field = np.empty((n, v.size))
    for i in range(n):
        pv, pf = _pairs(v, i), _pairs(field[i], i)
        np.subtract(pv[:, 1, :], pv[:, 0, :], out=pf[:, 0, :])
        pf[:, 1, :] = np.nan
    return field


def _shapley_weights(n: int) -> np.ndarray:
    """|S|!(n−|S|−1)!/n! = 1 / (n · C(n−1, |S|)) for every mask (meaningful where i ∉ S)."""
    table = np.array([1.0 / (n * math.comb(n - 1, k)) for k in range(n)] + [0.0])
    return table[subset_sizes(n)]


def shapley_value(v) -> np.ndarray:
    """The Shapley value (Shapley, 1953; §4): φ_i = Σ_{S ∌ i} |S|!(n−|S|−1)!/n! · Δ_{i|S}.

    The average of the contribution field over the backgrounds met when agents join in a
    uniformly random order. Computed agent by agent without building the field.
    ``v``: float array of length 2**n. Returns shape (n,).
    """
    v, n = set_function(v, "v")
    if n == 0:
        return np.zeros(0)
    w = _shapley_weights(n)
    phi = np.empty(n)
    for i in range(n):
        pv = _pairs(v, i)
        phi[i] = np.sum(_pairs(w, i)[:, 0, :] * (pv[:, 1, :] - pv[:, 0, :]))
    return phi


def is_additive(v, atol: float = 1e-9) -> bool:
    """Whether v(S) = Σ_{i∈S} v({i}) for every S, including v(∅) = 0 (Proposition 2 (iii))."""
    v, n = set_function(v, "v")
    return bool(np.allclose(v, additive_game(v[1 << np.arange(n)]), rtol=0.0, atol=atol))


def scalar_contributions(v, atol: float = 1e-9) -> np.ndarray | None:
    """One scalar per agent satisfying totality, or None when none exists (Proposition 2).

    Scalars Δ_i with Σ_{i∈S} Δ_i = v(S) for every S exist iff v is additive, and are then
    Δ_i = v({i}) (Appendix B.3). ``v``: float array of length 2**n. Returns shape (n,) or None.
    """
    v, n = set_function(v, "v")
    return v[1 << np.arange(n)].copy() if is_additive(v, atol) else None


def ordered_sum(field, order: Sequence[int]) -> float:
    """Σ_t Δ_{i_t | {i_1, ..., i_{t−1}}} along ``order`` = (i_1, ..., i_m): ordered totality (Prop. 3).

    For the contribution field this telescopes to v(S) − v(∅), S = {i_1, ..., i_m}
    (Proposition 3, Appendix B.4). ``field``: array (n, 2**n); ``order``: distinct agents.
    """
    field = np.asarray(field, dtype=float)
    order = [int(i) for i in order]
    if len(set(order)) != len(order) or any(not 0 <= i < field.shape[0] for i in order):
        raise ValueError(f"order must list distinct agents in 0..{field.shape[0] - 1}, got {order}")
    total, mask = 0.0, 0
    for i in order:
        total += field[i, mask]
        mask |= 1 << i
    return float(total)


def best_scalar_contributions(v) -> tuple[np.ndarray, float]:
    """Least-squares scalars for the totality equations Σ_{i∈S} Δ_i = v(S), all S (Proposition 2 (i)).

    Solves the 2**n equations in the n unknowns without assuming Proposition 2, and returns
    the best scalars and the largest remaining violation max_S |Σ_{i∈S} Δ_i − v(S)|. Scalars
    satisfying totality exist exactly when that violation is zero (to rounding). Compare
    :func:`scalar_contributions`, which uses the proposition (additivity) instead.
    ``v``: float array of length 2**n. Returns (shape (n,), float).
    """
    v, n = set_function(v, "v")
    members = ((np.arange(v.size)[:, None] >> np.arange(n)) & 1).astype(float)
    if n == 0:
        return np.zeros(0), float(abs(v[0]))
    delta = np.linalg.lstsq(members, v, rcond=None)[0]
    return delta, float(np.abs(members @ delta - v).max())


def interaction_spread(v) -> np.ndarray:
    """Range over backgrounds of each agent's field, max_S Δ_{i|S} − min_S Δ_{i|S} (Prop. 2 (ii)).

    Zero for agent i exactly when adding i changes the value by the same amount against every
    background: the no-interaction condition (ii) of Proposition 2, checked on the field
    directly. ``v``: float array of length 2**n. Returns shape (n,).
    """
    field = contribution_field(v)
    if field.shape[0] == 0:
        return np.zeros(0)
    return np.nanmax(field, axis=1) - np.nanmin(field, axis=1)


def ordered_totality_system(n: int) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """The linear system of ordered totality (Proposition 3) over every ordering of every group.

    Unknowns: the n·2**(n−1) entries Δ_{i|S}, i ∉ S, listed in ``entries`` as (i, S). One
    equation per group S ⊆ N and ordering (i_1, ..., i_m) of it, for m ≥ 1:
    Σ_t Δ_{i_t | {i_1, ..., i_{t−1}}} = v(S). Returns (A, groups, entries): the 0/1 matrix A
    (one row per equation), the group S of each row (so the right-hand side is v[groups]),
    and the unknowns. A has full column rank, so the solution is unique (the "only if" of
    Proposition 3), and it is :func:`contribution_field` when v(∅) = 0.
    """
    if isinstance(n, bool) or int(n) != n or not 0 <= n <= 6:
        raise ValueError(f"n must be an integer in [0, 6] (the system grows like n!), got {n}")
    n = int(n)
    entries = [(i, S) for i in range(n) for S in range(1 << n) if not S >> i & 1]
    column = {e: k for k, e in enumerate(entries)}
    rows, groups = [], []
    for S in range(1, 1 << n):
        for order in itertools.permutations(sorted(mask_to_set(S))):
            row, before = np.zeros(len(entries)), 0
            for i in order:
                row[column[(i, before)]] = 1.0
                before |= 1 << i
            rows.append(row)
            groups.append(S)
    A = np.array(rows).reshape(len(rows), len(entries))
    return A, np.array(groups, dtype=np.int64), entries
