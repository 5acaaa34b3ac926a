"""Intervals, paired differences and summary tables: how the book reports a Monte Carlo or a seed sweep.

Every interval in the book is a Student-t interval on a sample mean,
``mean ± t_{n-1, (1+level)/2} * sd / sqrt(n)``: exact for normal data and, for the many
draws of a Monte Carlo, indistinguishable from the normal approximation. With ten seeds
the difference matters (``t_9 = 2.262`` against ``z = 1.960`` at 95%), so no quantile is
hard-coded anywhere; :func:`t_quantile` gives it.

Comparisons of training methods are *paired* by seed (:func:`paired_difference`): a seed
fixes the initial policies, the held-out questions and the first rollouts, so the per-seed
difference removes what two methods share.

This module also holds the vocabulary of the paper's experiment (§8, Table 1) that several
modules share: the six held-out diagnostics :data:`EVAL_KEYS` and the keyword specialties
:data:`SPECIALTIES`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = [
    "holm",
    "EVAL_KEYS",
    "SPECIALTIES",
    "t_quantile",
    "mean_se",
    "mean_ci",
    "half_width",
    "Interval",
    "paired_difference",
    "summary_table",
    "format_interval",
    "format_bounds",
    "side_of_zero",
    "compare_reading",
    "seeds_where",
    "seed_names",
    "join_words",
    "roc_auc",
    "within_slate_auc",
]

EVAL_KEYS: tuple[str, ...] = ("accuracy", "entropy", "brier", "specialization", "oracle", "regret")
"""The six held-out diagnostics of the paper's Table 1, in its order (§8, "Evaluation and results")."""

SPECIALTIES: tuple[str, ...] = ("money", "time", "geometry")
"""This book's keyword specialties of the three agents (the paper's §8 names no keywords),
in the agents' order."""


def t_quantile(level: float, df) -> np.ndarray:
    """The two-sided Student-t quantile ``t_{df, (1 + level) / 2}`` (``df = inf``: the normal one)."""
    from scipy.stats import t

    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    df = np.asarray(df, dtype=float)
    if np.isnan(df).any() or (df <= 0).any():
        raise ValueError("df must be positive")
    return t.ppf(0.5 + level / 2, df)


def mean_se(x, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Sample mean and its standard error ``sd / sqrt(n)`` (unbiased sd) along ``axis``."""
    x = np.asarray(x, dtype=float)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis")
    n = x.shape[axis]
    if n < 2:
        raise ValueError("x needs at least two samples along axis for a standard error")
    return x.mean(axis=axis), x.std(axis=axis, ddof=1) / np.sqrt(n)


def half_width(se, n=None, level: float = 0.95):
    """Half-width of a ``level`` interval from a standard error: ``t_{n-1} * se`` (normal if n is None)."""
    df = np.inf if n is None else np.asarray(n, dtype=float) - 1
    return t_quantile(level, df) * np.asarray(se, dtype=float)


def mean_ci(x, axis: int = 0, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    """Mean and half-width of the Student-t confidence interval along ``axis``.

    ``half-width = t_{n-1, (1 + level)/2} * sd / sqrt(n)`` with the unbiased sd: for ten
    seeds at 95% the multiplier is 2.262, not 1.96.
    """
    m, se = mean_se(x, axis=axis)
    n = np.asarray(x).shape[axis]
    return m, half_width(se, n=n, level=level)


@dataclass(frozen=True)
class Interval:
    """A mean with its ``level`` interval over ``n`` samples (``sd``: their standard deviation).

    Unpacks as ``mean, half_width, n`` (the tuple the chapters print).
    """

    mean: float
    half_width: float
    n: int
    sd: float
    level: float = 0.95

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def excludes_zero(self) -> bool:
        """True when the interval lies entirely on one side of 0."""
        return bool(self.low > 0 or self.high < 0)

    def __iter__(self):
        return iter((self.mean, self.half_width, self.n))

    def __str__(self) -> str:
        return f"{self.mean:+.3f} ± {self.half_width:.3f} ({self.level:.0%}, t_{self.n - 1}, n = {self.n})"


def side_of_zero(low, high, labels=("ahead", "level", "behind")):
    """Where an interval ``[low, high]`` lies against 0: ``labels[0]`` wholly above it
    (``low > 0``), ``labels[2]`` wholly below it (``high < 0``), ``labels[1]`` covering it
    (the case :meth:`Interval.excludes_zero` is False). Elementwise over arrays and Series (an
    array of labels); a string for scalars."""
    out = np.select([np.asarray(low) > 0, np.asarray(high) < 0], [labels[0], labels[2]],
                    labels[1])
    return out.item() if out.ndim == 0 else out


def compare_reading(a: str, b: str, mean_a: float, mean_b: float, low: float, high: float,
                    digits: int = 3, unit: str = "seeds", difference: float | None = None,
                    verbs: tuple[str, str] = ("is ahead of", "is behind")) -> str:
    """The sentence the book writes about a difference ``a - b`` with interval ``[low, high]``.

    Two rules keep it true to the interval. An interval that lies on one side of 0 says
    ``a`` *is ahead of* or *is behind* ``b`` (``verbs``; e.g. ``("is above", "is below")`` for
    a measure where lower is better, such as a Brier score); one that covers 0 says the
    ``unit`` *cannot tell them apart*, never that one reaches, matches or is level with the
    other, and still says which way it leans on average. Both means are always given, and the
    interval. ``difference``: the mean of the paired differences when the caller has it (it
    equals ``mean_a - mean_b`` over the same seeds up to rounding), else ``mean_a - mean_b``:

    >>> compare_reading("uniform", "the oracle", 0.328, 0.604, -0.77, 0.22)
    'uniform (0.328) and the oracle (0.604) cannot be told apart by these seeds (behind on \
average; difference -0.276 [-0.770, +0.220])'
    """
    d = mean_a - mean_b if difference is None else difference
    bounds = format_bounds(d, low, high, digits)
    means = f"{a} ({mean_a:.{digits}f})", f"{b} ({mean_b:.{digits}f})"
    side = side_of_zero(low, high)
    if side != "level":
        verb = verbs[0] if side == "ahead" else verbs[1]
        return f"{means[0]} {verb} {means[1]} (difference {bounds})"
    up, down = (v.removeprefix("is ").removesuffix(" of") for v in verbs)
    lean = f"{up} on average" if d > 0 else f"{down} on average" if d < 0 else "equal on average"
    return f"{means[0]} and {means[1]} cannot be told apart by these {unit} ({lean}; difference {bounds})"


def seeds_where(holds, noun: str = "seed") -> str:
    """On which seeds a statement about a grid holds: ``holds`` maps each seed to True or False
    (a dict or a Series). "on all 10 seeds", "on no seed (0 of 10)", or the seeds by name with
    their count ("on seeds 0, 1 and 5 (3 of 10)"): a statement about a grid holds on every seed
    it has now, or names the seeds."""
    items = sorted(dict(holds).items())
    if not items:
        raise ValueError("holds is empty: no seed to read")
    yes = [k for k, v in items if bool(v)]
    n = len(items)
    if len(yes) == n:
        return f"on all {n} {noun}s" if n > 1 else f"on the one {noun}"
    if not yes:
        return f"on no {noun} (0 of {n})"
    return f"on {seed_names(yes, noun)} ({len(yes)} of {n})"


def join_words(items) -> str:
    """Phrases joined as prose: "a", "a and b", "a, b and c" (no serial comma)."""
    xs = [str(x) for x in items]
    if not xs:
        raise ValueError("nothing to join")
    return xs[0] if len(xs) == 1 else f"{', '.join(xs[:-1])} and {xs[-1]}"


def seed_names(seeds, noun: str = "seed") -> str:
    """The seeds by name, in the order given: "seed 3", "seeds 3 and 6", "seeds 0, 3, 6 and 9".
    The words :func:`seeds_where` uses for the seeds a statement holds on, for prose that
    names seeds without a count."""
    xs = [str(k) for k in seeds]
    if not xs:
        raise ValueError("no seed to name")
    return f"{noun}{'s' * (len(xs) > 1)} {join_words(xs)}"


def holm(pvalues: dict) -> dict:
    """Holm's step-down adjusted p-values of a family of tests, ``{name: p}`` to ``{name: p_adj}``.

    Sorted p_(1) ≤ … ≤ p_(n), the adjusted value of the i-th is ``max_{j ≤ i} min(1, (n − j + 1)
    p_(j))``; a test is kept at family-wise level α when its adjusted value is below α. Holm's
    rule controls the family-wise error as Bonferroni's does (``n p``) and never keeps fewer.
    """
    out, running, n = {}, 0.0, len(pvalues)
    for i, key in enumerate(sorted(pvalues, key=pvalues.get)):
        p = float(pvalues[key])
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"p-value of {key!r} must lie in [0, 1], got {p}")
        running = max(running, min(1.0, (n - i) * p))
        out[key] = running
    return out


def paired_difference(a, b, level: float = 0.95) -> Interval:
    """The mean of the paired differences ``a - b`` with its t-interval.

    ``a[s]`` and ``b[s]`` must be measured on the same unit s (a seed shared by two
    training methods); NaN pairs are an error.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-d arrays of the same length, got {a.shape} and {b.shape}")
    d = a - b
    if np.isnan(d).any():
        raise ValueError("a and b must not contain NaN")
    m, hw = mean_ci(d, level=level)
    return Interval(float(m), float(hw), len(d), float(d.std(ddof=1)), level)


def format_interval(mean, hw, digits: int = 3, signed: bool = False) -> str:
    """``"mean ± half-width"`` with ``digits`` decimals."""
    sign = "+" if signed else ""
    return f"{mean:{sign}.{digits}f} ± {hw:.{digits}f}"


def format_bounds(mean, low, high, digits: int = 3) -> str:
    """``"+mean [+low, +high]"``, signed, with ``digits`` decimals; ``"+mean (no interval)"``
    when a bound is NaN (a t-interval over a single seed has none)."""
    if np.isnan(low) or np.isnan(high):
        return f"{mean:+.{digits}f} (no interval)"
    return f"{mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"


def summary_table(
    frame,
    keys: Sequence[str],
    by: str = "method",
    unit: str = "seed",
    level: float = 0.95,
    formatted: bool = False,
    digits: int = 3,
):
    """Mean and t-interval half-width of each column of ``keys`` per group of ``by``.

    Args:
        frame: a long DataFrame, one row per unit (a seed) and group.
        keys: the columns to summarise.
        by: the grouping column (the method); groups keep their order of appearance.
        unit: the column that counts the samples (reported as ``n``).
        formatted: one text column ``"mean ± half-width"`` per key instead of two numbers.

    Returns a DataFrame indexed by ``by`` with columns ``key`` and ``key ±`` (or the text
    columns) and ``n``. A group with fewer than two non-NaN values gets a NaN half-width.
    """
    import pandas as pd

    keys = list(keys)
    missing = [k for k in keys + [by] if k not in frame.columns]
    if missing:
        raise ValueError(f"columns not in frame: {missing}")
    rows = {}
    for name, g in frame.groupby(by, sort=False):
        row = {}
        for k in keys:
            x = g[k].dropna().to_numpy(dtype=float)
            if len(x) >= 2:
                mean, hw = mean_ci(x, level=level)
            else:
                mean, hw = (x.mean() if len(x) else np.nan), np.nan
            row[k], row[k + " ±"] = float(mean), float(hw)
        row["n"] = int(g[unit].nunique()) if unit in g.columns else len(g)
        rows[name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = by
    if not formatted:
        return table
    out = pd.DataFrame(
        {k: [format_interval(m, h, digits) for m, h in zip(table[k], table[k + " ±"])] for k in keys},
        index=table.index,
    )
    out["n"] = table["n"]
    return out


def roc_auc(scores, labels) -> float | None:
    """Area under the ROC curve of ``scores`` for binary ``labels``: the probability that a
    random positive scores above a random negative, ties counting one half (the Mann-Whitney
    statistic divided by ``n_pos * n_neg``). None when one class is absent.

    0.5 is a score that carries no information; 1 separates perfectly; below 0.5 ranks the
    wrong way round.
    """
    s = np.asarray(scores, dtype=float).ravel()
    y = np.asarray(labels).ravel()
    if s.shape != y.shape:
        raise ValueError(f"scores and labels must have the same length, got {s.size} and {y.size}")
    if np.isnan(s).any():
        raise ValueError("scores contain NaN")
    if not np.isin(y, (0, 1, True, False)).all():
        raise ValueError("labels must be 0/1 or boolean")
    y = y.astype(bool)
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return None
    # average ranks (ties share their mean rank);
    # AUC = (rank sum of positives - n_pos (n_pos + 1) / 2) / (n_pos n_neg)
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(s.size, dtype=float)
    sorted_s = s[order]
    i = 0
    while i < s.size:
        j = i
        while j + 1 < s.size and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def within_slate_auc(mu_hat, R) -> float | None:
    """The router's AUC within slates: over every pair (right, wrong) of candidates of the same
    problem, the probability that the right one has the higher ``mu_hat`` (ties one half).
    This is what routing needs: a slate is won by ranking its own candidates. ``mu_hat`` and
    ``R`` have shape (problems, K); None when no slate mixes right and wrong answers."""
    mu, R = np.asarray(mu_hat, dtype=float), np.asarray(R, dtype=float) > 0
    if mu.shape != R.shape or mu.ndim != 2:
        raise ValueError(f"mu_hat and R must both have shape (problems, K), got {mu.shape} and {R.shape}")
    diff = mu[:, :, None] - mu[:, None, :]  # [b, right j, wrong l]
    pair = R[:, :, None] & ~R[:, None, :]
    n = int(pair.sum())
    if n == 0:
        return None
    return float(((diff > 0) + 0.5 * (diff == 0))[pair].sum() / n)
