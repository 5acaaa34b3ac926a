"""The experiment harness: many seeds, paired differences with t-intervals, summary tables, curves.

Part of :mod:`mcpg.grpo.simulated` (chapter 7). Intervals are Student-t over seeds
(:mod:`mcpg.stats`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ... import stats
from .loop import train_pool
from .pool import EVAL_KEYS, METHODS, SimConfig, _check_method, _check_seeds

__all__ = [
    "GRID_AXES",
    "compare_methods",
    "summary_table",
    "paired_difference",
    "plot_curves",
    "load_grid",
    "grid_differences",
    "load_reversal",
]


def compare_methods(cfg: SimConfig, methods: Sequence[str] = METHODS, seeds: Sequence[int] = range(10)):
    """Train every method on the same seeds; returns ``(frame, runs)``.

    ``frame`` is the long DataFrame of all runs (:meth:`SimRun.frame`, concatenated) and
    ``runs`` maps each method to its :class:`SimRun`. A seed fixes the initial policies,
    the held-out questions and the first rollouts, so the methods are compared on common
    random numbers and differences can be paired by seed.
    """
    import pandas as pd

    methods = list(methods)
    if not methods:
        raise ValueError("methods must name at least one method")
    for m_ in methods:
        _check_method(m_)
    seeds = _check_seeds(seeds)
    runs = {m_: train_pool(cfg, m_, seeds) for m_ in methods}
    return pd.concat([r.frame() for r in runs.values()], ignore_index=True), runs


def summary_table(
    frame,
    keys: Sequence[str] = EVAL_KEYS,
    level: float = 0.95,
    update: int | None = None,
    formatted: bool = False,
    digits: int = 3,
):
    """Mean and t-interval half-width of each metric per method, at one update (default: the last).

    Returns a DataFrame indexed by method with, for each key, the columns ``key`` (mean)
    and ``key ±`` (half-width of the Student-t interval over seeds, :func:`mcpg.stats.mean_ci`),
    and ``seeds``. With ``formatted=True``, one text column per key instead,
    ``"mean ± half-width"`` with ``digits`` decimals.
    """
    missing = [k for k in keys if k not in frame.columns]
    if missing:
        raise ValueError(f"keys not in frame: {missing}")
    u = frame["update"].max() if update is None else update
    at = frame[frame["update"] == u]
    if at.empty:
        raise ValueError(f"no rows at update {u}")
    table = stats.summary_table(
        at, keys, by="method", unit="seed", level=level, formatted=formatted, digits=digits
    )
    table = table.rename(columns={"n": "seeds"})
    table.index.name = None
    return table


def paired_difference(
    runs: dict, a: str, b: str, key: str = "accuracy", level: float = 0.95
) -> stats.Interval:
    """Mean over seeds of ``key`` under method a minus under method b at the last update, with
    its Student-t interval (:func:`mcpg.stats.paired_difference`; runs on the same seeds).

    Unpacks as ``(mean, half-width, number of seeds)``.
    """
    if a not in runs or b not in runs:
        raise ValueError(f"runs must hold both {a!r} and {b!r}")
    if runs[a].seeds != runs[b].seeds:
        raise ValueError("the two runs must use the same seeds to be paired")
    if key not in runs[a].metrics:
        raise ValueError(f"unknown key {key!r}")
    return stats.paired_difference(runs[a].metrics[key][:, -1], runs[b].metrics[key][:, -1], level=level)


def plot_curves(frame, keys: Sequence[str], axes=None, level: float = 0.95, labels: dict | None = None):
    """One panel per metric: the mean over seeds against updates, with a shaded confidence band.

    Bands are Student-t intervals over seeds. Colours are :data:`mcpg.plotting.METHOD_COLORS`.
    Returns the axes.
    """
    import matplotlib.pyplot as plt

    from ...plotting import METHOD_COLORS

    keys = list(keys)
    if axes is None:
        _, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), squeeze=False)
        axes = axes[0]
    axes = np.atleast_1d(axes).ravel()
    if len(axes) < len(keys):
        raise ValueError(f"axes must hold at least {len(keys)} panels")
    labels = labels or {}
    for ax, key in zip(axes, keys):
        if key not in frame.columns:
            raise ValueError(f"key {key!r} not in frame")
        for method, g in frame.groupby("method", sort=False):
            wide = g.pivot(index="seed", columns="update", values=key)
            mean, hw = stats.mean_ci(wide.to_numpy(), axis=0, level=level)
            x = wide.columns.to_numpy()
            color = METHOD_COLORS.get(method)
            ax.plot(x, mean, color=color, label=f"{method} ({len(wide)} seeds)")
            ax.fill_between(x, mean - hw, mean + hw, color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel("update")
        ax.set_ylabel(labels.get(key, key))
    return axes


GRID_AXES: tuple[str, ...] = ("router_lr", "router_steps", "router_eps", "learning_rate")
"""The settings varied by chapter 7's robustness grid (``scripts/ch07_grid.py``)."""


def load_grid(path):
    """Read a robustness grid written by ``scripts/ch07_grid.py``.

    Returns ``(meta, frame)``: ``meta`` holds the command, commit, date, machine, seeds and
    axes; ``frame`` is long, one row per (cell, scaling, method, seed), with the columns of
    ``GRID_AXES``, ``scale_rewards``, ``method``, ``seed`` and every stored final metric.
    The frozen pool does not depend on the actor's learning rate or the scaling: its rows have
    ``learning_rate`` NaN and ``scale_rewards`` ``"n/a"``.
    """
    import json
    from pathlib import Path

    import pandas as pd

    data = json.loads(Path(path).read_text())
    rows = []
    for r in data["results"]:
        cell = {k: (np.nan if r["cell"].get(k) is None else r["cell"][k]) for k in GRID_AXES}
        for si, seed in enumerate(r["seeds"]):
            rows.append(
                {
                    **cell,
                    "scale_rewards": r["scale_rewards"],
                    "method": r["method"],
                    "seed": seed,
                    **{k: v[si] for k, v in r["final"].items()},
                }
            )
    meta = {k: v for k, v in data.items() if k != "results"}
    return meta, pd.DataFrame(rows)


def grid_differences(
    frame, a: str, b: str, key: str = "accuracy", level: float = 0.95, by: Sequence[str] | None = None
):
    """Paired (by seed) differences ``key(a) - key(b)`` in every (cell, scaling) of a grid frame.

    A cell is a combination of the columns ``by`` (default ``GRID_AXES``; for the reversal grid
    of :func:`load_reversal`, e.g. ``("agents", "unsolvable", "check_flip")``).
    Returns one row per cell and scaling with the columns of ``by``, ``scale_rewards``, ``mean``,
    ``half_width`` (Student-t, :func:`mcpg.stats.paired_difference`), ``n``, ``low``, ``high``.
    """
    import pandas as pd

    by = list(GRID_AXES if by is None else by)
    for m in (a, b):
        if m not in set(frame["method"]):
            raise ValueError(f"method {m!r} not in the grid")
    rows = []
    for keys, g in frame[frame["method"].isin([a, b])].groupby(by + ["scale_rewards"], sort=False):
        wide = g.pivot(index="seed", columns="method", values=key)
        if a not in wide or b not in wide:
            continue
        iv = stats.paired_difference(wide[a].to_numpy(), wide[b].to_numpy(), level=level)
        rows.append(
            {
                **dict(zip(by + ["scale_rewards"], keys)),
                "mean": iv.mean,
                "half_width": iv.half_width,
                "n": iv.n,
                "low": iv.low,
                "high": iv.high,
            }
        )
    return pd.DataFrame(rows)


def load_reversal(path):
    """Read the reversal grid written by ``scripts/ch07_reversal.py``.

    Returns ``(meta, frame, diagnostics)``: ``meta`` holds the command, commit, date, machine,
    seeds and cells; ``frame`` is long, one row per (cell, scaling, method, seed), with the
    cell's keys (``agents``, ``unsolvable``, ``check_flip``), ``scale_rewards``, ``method``,
    ``seed`` and every stored final metric; ``diagnostics`` likewise, one row per (cell,
    scaling, method, checkpoint, seed), with the columns of
    :func:`~mcpg.grpo.simulated.rollout_diagnostics` and ``checkpoint`` ("middle" or "last").
    """
    import json
    from pathlib import Path

    import pandas as pd

    data = json.loads(Path(path).read_text())
    rows, diag = [], []
    for r in data["results"]:
        head = {**r["cell"], "scale_rewards": r["scale_rewards"], "method": r["method"]}
        for si, seed in enumerate(r["seeds"]):
            rows.append({**head, "seed": seed, **{k: v[si] for k, v in r["final"].items()}})
            for name, d in r.get("diagnostics", {}).items():
                diag.append({**head, "checkpoint": name, "update": d["update"], "seed": seed,
                             **{k: v[si] for k, v in d.items() if k != "update"}})
    meta = {k: v for k, v in data.items() if k != "results"}
    return meta, pd.DataFrame(rows), pd.DataFrame(diag)
