"""Chapter 8's grid read beside the simulation: the sentences chapter 7 writes about it.

Chapter 7 quotes chapter 8's recorded LLM grid (arms ``<signal>-<scaling>``, seeds paired;
:func:`mcpg.grpo.verdict.paired_seeds`) and sets the simulation's predictions against it. Each
sentence it writes about an interval goes through :func:`mcpg.stats.compare_reading` (one side
of 0: "is ahead of" / "is behind"; covering 0: "cannot be told apart by these seeds", with both
means) and each about a grid's seeds through :func:`mcpg.stats.seeds_where`, so that the
sentences stay true as seeds are recorded:

- :func:`paired_arms`: two arms of a grid on the seeds both finished, each arm's mean, the
  per-seed differences and their t-interval;
- :func:`arms_sentence`: :func:`mcpg.stats.compare_reading` of :func:`paired_arms` (one seed:
  no interval, said so);
- :func:`interval_against`: where such an interval lies against some values the simulation
  predicts (contains them, lies below or above them, contains some);
- :func:`side_counts`: how many cells of a grid lie on each side of 0, in the same verbs;
- :func:`span`: the range of some values, as text (seeds are named by
  :func:`mcpg.stats.seed_names`, re-exported here as ``seed_names``);
- :func:`recorded_arms`: a recording of ``scripts/ch07_twin.py`` (the twin's predictions or one
  of its ablations) as each arm's per-seed final deployed accuracy;
- :func:`sign_test`: chapter 8's third box's test of one ablation, Bonferroni-corrected over the
  ablations run: the variable *decides the sign*, *moves* it, or is *refuted* as the decider.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ... import stats
from ...stats import seed_names

__all__ = ["NAMES", "paired_arms", "arms_sentence", "interval_against", "side_counts", "seed_names", "span",
           "recorded_arms", "SIGN_VERDICTS", "sign_test"]

NAMES = {"removal": "removal", "wta": "winner-take-all", "oracle": "the oracle"}
"""How the prose names each signal."""

_VERB = {"ahead": "is ahead of {}", "level": "cannot be told apart from {}", "behind": "is behind {}"}


def paired_arms(runs, a: str, b: str, scaling: str = "group", measure: str = "deployed",
                seeds=None) -> dict:
    """``a - b`` on a recorded grid, on the seeds both arms ``<a>-<scaling>`` and ``<b>-<scaling>``
    finished (those of them in ``seeds``, if given).

    Returns ``a``, ``b``, ``mean_a`` and ``mean_b`` (each arm's mean over those seeds),
    ``mean``, ``low``, ``high`` (the per-seed differences' mean and t-interval; NaN bounds with
    one seed), ``n`` and ``diff`` (the per-seed differences, a Series indexed by seed)."""
    from ..verdict import paired_seeds

    p = paired_seeds(runs, a, b, scaling, (measure,))
    if seeds is not None:
        p = p.loc[[s for s in p.index if s in set(seeds)]]
    if p.empty:
        raise ValueError(f"no seed left of {a}-{scaling} and {b}-{scaling}")
    d = p[measure, "difference"]
    low = high = np.nan
    if len(d) > 1:
        iv = stats.paired_difference(p[measure, a], p[measure, b])
        low, high = iv.low, iv.high
    return {"a": a, "b": b, "mean_a": float(p[measure, a].mean()), "mean_b": float(p[measure, b].mean()),
            "mean": float(d.mean()), "low": float(low), "high": float(high), "n": len(d), "diff": d}


def arms_sentence(x: dict, a: str | None = None, b: str | None = None, digits: int = 3) -> str:
    """The sentence :func:`mcpg.stats.compare_reading` writes of :func:`paired_arms`'s ``x``, the
    arms named ``a`` and ``b`` (by default :data:`NAMES`). With one seed there is no interval
    over seeds, and the sentence says so instead of reading one."""
    a = a or NAMES.get(x["a"], x["a"])
    b = b or NAMES.get(x["b"], x["b"])
    if x["n"] < 2:
        return (f"{a} ({x['mean_a']:.{digits}f}) against {b} ({x['mean_b']:.{digits}f}) on one seed, "
                "which gives no interval over seeds")
    return stats.compare_reading(a, b, x["mean_a"], x["mean_b"], x["low"], x["high"], digits)


def interval_against(x: dict, values) -> str:
    """Where the interval of ``x`` (keys ``low``, ``high``, ``n``) lies against ``values``: "contains
    every one of them", "lies below every one of them", "lies above every one of them", or
    "contains k of the n"; "has no interval yet (one seed)" with fewer than two seeds."""
    values = pd.Series(values, dtype=float)
    if values.empty:
        raise ValueError("no values to set the interval against")
    if x["n"] < 2 or np.isnan(x["low"]) or np.isnan(x["high"]):
        return "has no interval yet (one seed)"
    inside = values.between(x["low"], x["high"])
    if inside.all():
        return "contains every one of them"
    if (values > x["high"]).all():
        return "lies below every one of them"
    if (values < x["low"]).all():
        return "lies above every one of them"
    return f"contains {int(inside.sum())} of the {len(values)}"


def side_counts(sides, b: str = "winner-take-all", of: str = "cells") -> str:
    """How many intervals lie on each side of 0, in :func:`mcpg.stats.compare_reading`'s verbs:
    ``sides`` are :func:`mcpg.stats.side_of_zero` labels ("ahead", "level", "behind") of ``a - b``.

    >>> side_counts(["behind", "level", "behind"])
    'is behind winner-take-all in 2 of the 3 cells and cannot be told apart from it in 1'
    """
    sides = pd.Series(list(sides), dtype=object)
    if sides.empty:
        raise ValueError("no interval to count")
    unknown = set(sides) - set(_VERB)
    if unknown:
        raise ValueError(f"not a side of 0: {sorted(unknown)}")
    counts = sides.value_counts()
    parts = []
    for k, (side, n) in enumerate(counts.items()):
        text = _VERB[side].format(b if k == 0 else "it")
        if k > 0:
            text += f" in {n}"
        elif n < len(sides):
            text += f" in {n} of the {len(sides)} {of}"
        else:
            text += f" in all {n} {of}" if n > 1 else f" in 1 of 1 {of}"
        parts.append(text)
    return " and ".join(parts)


def span(values, digits: int = 2, signed: bool = False) -> str:
    """``"low to high"`` of ``values`` at ``digits`` decimals (one value when both round alike)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no value to span")
    f = f"{'+' if signed else ''}.{digits}f"
    lo, hi = format(min(values), f), format(max(values), f)
    return lo if lo == hi else f"{lo} to {hi}"


def recorded_arms(record: dict, measure: str = "accuracy") -> dict:
    """``{(scaling, signal): per-seed values}`` of a recording of ``scripts/ch07_twin.py`` (the
    predictions, or one entry of the ablations' list): each arm's ``measure`` (final deployed
    ``accuracy`` by default) as an array over the recording's seeds, in their order."""
    return {(a["scale_rewards"], a["signal"]): np.asarray(a[measure], dtype=float) for a in record["arms"]}


SIGN_VERDICTS = ("decides the sign", "moves the sign", "refuted as the decider")
"""The third box's three readings of an ablation (chapter 8, 2026-12-07)."""


def _interval(d, level: float) -> dict:
    d = np.asarray(d, dtype=float)
    if d.ndim != 1 or len(d) < 2 or np.isnan(d).any():
        raise ValueError("an interval needs two or more per-seed values and no NaN")
    mean, hw = stats.mean_ci(d, level=level)
    return {"mean": float(mean), "low": float(mean - hw), "high": float(mean + hw),
            "side": str(stats.side_of_zero(mean - hw, mean + hw))}


def sign_test(twin, ablated, n_ablations: int, alpha: float = 0.05) -> dict:
    """Chapter 8's third box's test of one ablation, on the per-seed differences ``twin`` (the
    twin's, e.g. centred removal - winner-take-all) and ``ablated`` (the same difference with one
    variable moved to chapter 7's default), paired by seed (same seeds, same order).

    Every interval is a t-interval at the Bonferroni level ``1 - alpha / n_ablations``. The
    variable *decides the sign* when the twin's interval and the ablation's lie on opposite sides
    of 0 (each excluding it) and the paired difference ``ablated - twin`` excludes 0; it *moves
    the sign* when only the difference excludes 0; it is *refuted as the decider* when the
    difference covers 0. Returns ``twin``, ``ablated`` and ``difference`` (each ``mean``,
    ``low``, ``high``, ``side``: :func:`mcpg.stats.side_of_zero`'s label), ``level``, ``n``,
    ``identical`` (the ablation changed no seed's difference) and ``verdict``."""
    twin, ablated = np.asarray(twin, dtype=float), np.asarray(ablated, dtype=float)
    if twin.shape != ablated.shape:
        raise ValueError(f"the twin and the ablation must be paired by seed: {twin.shape} against "
                         f"{ablated.shape}")
    if n_ablations < 1:
        raise ValueError("n_ablations must be at least 1")
    level = 1 - alpha / n_ablations
    t, a, d = _interval(twin, level), _interval(ablated, level), _interval(ablated - twin, level)
    if d["side"] == "level":
        verdict = SIGN_VERDICTS[2]
    elif {t["side"], a["side"]} == {"ahead", "behind"}:
        verdict = SIGN_VERDICTS[0]
    else:
        verdict = SIGN_VERDICTS[1]
    return {"twin": t, "ablated": a, "difference": d, "level": level, "n": len(twin),
            "identical": bool(np.array_equal(twin, ablated)), "verdict": verdict}
