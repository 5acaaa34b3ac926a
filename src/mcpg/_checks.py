"""Input checks shared by the library: every bad argument raises a ValueError that names it."""

from __future__ import annotations

import numpy as np


def as_float_array(x, name: str) -> np.ndarray:
    """Return ``x`` as a float array, refusing NaN with a ValueError naming ``name``."""
    arr = np.asarray(x, dtype=float)
    if np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    return arr


def check_nonnegative(arr: np.ndarray, name: str) -> None:
    """Refuse negative entries of ``arr``."""
    if (np.asarray(arr) < 0).any():
        raise ValueError(f"{name} must be non-negative")


def check_positive(arr: np.ndarray, name: str) -> None:
    """Refuse zero or negative entries of ``arr`` (used where an estimator divides by it)."""
    if (np.asarray(arr) <= 0).any():
        raise ValueError(f"{name} must be strictly positive (an estimator divides by it)")


def check_same_shape(a: np.ndarray, b: np.ndarray, name_a: str, name_b: str) -> None:
    """Refuse arrays whose shapes differ."""
    if np.shape(a) != np.shape(b):
        raise ValueError(f"{name_a} has shape {np.shape(a)} but {name_b} has shape {np.shape(b)}")


def leave_one_out(P, p: np.ndarray) -> np.ndarray:
    """``P`` as a float array of leave-one-out propensities ``P^{-i}_j`` for the propensities
    ``p`` (shape ``(..., K)``): refused unless its shape is ``(..., K, K)``."""
    P = as_float_array(P, "P")
    if P.shape != p.shape + p.shape[-1:]:
        raise ValueError(f"P must have shape {p.shape + p.shape[-1:]}, got {P.shape}")
    return P


def set_function(v, name: str = "v") -> tuple[np.ndarray, int]:
    """Check a set function stored as an array of length 2**n indexed by bitmask; return (v, n)."""
    arr = as_float_array(v, name)
    if arr.ndim != 1 or arr.size == 0 or arr.size & (arr.size - 1):
        raise ValueError(f"{name} must be a 1-d array of length 2**n, got shape {arr.shape}")
    return arr, arr.size.bit_length() - 1
