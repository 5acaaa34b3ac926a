"""Set functions, contribution fields and the Shapley value (paper §4, Appendix B.3-B.4).

A set function over ``n`` agents is a float array ``v`` of length ``2**n`` indexed by
bitmask: bit ``i`` of the index is set when agent ``i`` is in the group, so ``v[0]`` is
``v(∅)`` and ``v[1 << i]`` is ``v({i})``.

Everything is vectorised: the only Python loops run over the ``n`` agents, never over the
``2**n`` groups. The trick is that ``v.reshape(-1, 2, 2**i)`` puts the groups without agent
``i`` at ``[:, 0, :]`` and the same groups with ``i`` added at ``[:, 1, :]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from ._checks import as_float_array, set_function

__all__ = [
    "additive_game",
    "contribution_field",
    "is_additive",
    "mask_to_set",
    "ordered_sum",
    "random_game",
    "scalar_contributions",
    "set_function_from_callable",
    "set_to_mask",
    "shapley_value",
    "subset_sizes",
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
    """Σ_t Δ_{i_t | {i_1, ..., i_{t−1}}} along ``order`` = (i_1, ..., i_m): ordered totality (Eq. 6).

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
