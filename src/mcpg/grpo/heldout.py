"""Held-out comparisons of recorded runs: per problem (paired), and over seeds.

- :func:`eval_table`: Table 1's six diagnostics of several runs, with the frozen model's row;
- :func:`paired_row`, :func:`eval_gains`, :func:`compare_runs`: paired per-problem differences of
  held-out correctness (final pool vs frozen base model, final vs untrained pool, one run vs
  another on the same problems) with :func:`mcpg.stats.paired_difference`'s t-interval;
- :func:`per_problem`: one of :data:`MEASURES` per held-out problem;
- :func:`signals_over_seeds`: two signals (or two arms) seed by seed (paired per-problem
  differences) and over seeds (:func:`t_interval` of the per-seed differences: the seeds, not
  the problems, are the sample); :class:`NoPairedSeeds` when no seed has both;
- :func:`compare_signals`: :func:`signals_over_seeds` under each advantage scaling and on each
  measure, as one table; :func:`verdict_table` sums it up per scaling and measure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .. import stats
from ..stats import EVAL_KEYS, mean_ci
from .rundir import Run

__all__ = ["t_interval", "paired_row", "eval_table", "eval_gains", "MEASURES", "per_problem", "compare_runs",
           "NoPairedSeeds", "signals_over_seeds", "compare_signals", "verdict_table"]


def t_interval(x, level: float = 0.95) -> dict:
    """Mean of ``x`` with its Student-t confidence interval: ``mean +- t_{n-1} sd / sqrt(n)``.

    The interval is :func:`mcpg.stats.mean_ci`'s; this wrapper returns it as a dict (with
    ``low``, ``high``, ``sd`` and ``n``) for the frames below, and allows ``n = 1``.

    ``sd`` is the sample standard deviation (ddof 1). Returns ``mean``, ``low``, ``high``,
    ``half_width``, ``sd`` and ``n``; with ``n < 2`` the interval is undefined (NaN). When
    every value is equal the interval has width 0.
    """
    x = np.asarray(x, dtype=float).ravel()
    if x.size == 0:
        raise ValueError("t_interval needs at least one value")
    if np.isnan(x).any():
        raise ValueError("t_interval: x contains NaN")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    n, mean = x.size, float(x.mean())
    sd = float(x.std(ddof=1)) if n > 1 else float("nan")
    half = float(mean_ci(x, level=level)[1]) if n > 1 else float("nan")
    return {"mean": mean, "low": mean - half, "high": mean + half, "half_width": half, "sd": sd, "n": n}


def paired_row(a, b, level: float = 0.95) -> dict:
    """Paired difference ``a - b`` of per-problem outcomes on the same problems, as a table row:
    ``mean_a``, ``mean_b`` and :func:`mcpg.stats.paired_difference`'s t-interval of the
    differences (``mean``, ``low``, ``high``, ``half_width``, ``sd``, ``n``)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    iv = stats.paired_difference(a, b, level)
    return {"mean_a": float(a.mean()), "mean_b": float(b.mean()), "mean": iv.mean, "low": iv.low,
            "high": iv.high, "half_width": iv.half_width, "sd": iv.sd, "n": iv.n}


def eval_table(runs: Run | list[Run], frozen: bool = True) -> pd.DataFrame:
    """Table 1's diagnostics of each finished run, the untrained pool's accuracy, and the frozen model.

    One row per run (its label) with ``EVAL_KEYS``, ``initial_accuracy`` (NaN when not
    recorded) and ``n``; with ``frozen`` a first row ``frozen (single agent)`` holds the base
    model's greedy accuracy of the first run (all runs of one comparison share it).
    """
    runs = [runs] if isinstance(runs, Run) else runs
    done = [r for r in runs if r.eval is not None]
    if not done:
        raise ValueError("no run has an eval.json")
    rows = {}
    if frozen:
        rows["frozen (single agent)"] = {"accuracy": done[0].eval["base_accuracy"], "n": done[0].eval["n"]}
    for r in done:
        rows[r.label] = {**{k: r.eval.get(k) for k in EVAL_KEYS},
                         "initial_accuracy": r.eval.get("initial_accuracy"), "n": r.eval["n"]}
    cols = [*EVAL_KEYS, "initial_accuracy", "n"]
    return pd.DataFrame.from_dict(rows, orient="index").reindex(columns=cols).astype(float)


def eval_gains(run: Run, level: float = 0.95) -> pd.DataFrame:
    """Paired held-out gains of one run, per problem, with t-intervals.

    Rows: ``trained - frozen base`` (``correct`` vs ``base_correct``), ``trained - untrained pool``
    (``correct`` vs ``initial_correct``) and ``untrained pool - frozen base``; rows whose lists
    the run did not record are left out. Columns as :func:`paired_row`.
    """
    e = run.eval
    if e is None or "correct" not in e:
        raise ValueError(f"{run.path}: eval.json has no per-problem 'correct' list (an older recording)")
    pairs = {"trained - frozen base": ("correct", "base_correct"),
             "trained - untrained pool": ("correct", "initial_correct"),
             "untrained pool - frozen base": ("initial_correct", "base_correct")}
    rows = {name: paired_row(e[a], e[b], level) for name, (a, b) in pairs.items() if a in e and b in e}
    return pd.DataFrame.from_dict(rows, orient="index")


MEASURES = ("deployed", "uniform", "best_of_k")
"""Per-problem held-out measures of a pool (:func:`per_problem`): what the router deploys, and
two that read the actors apart from the router."""


def per_problem(run: Run, measure: str = "deployed") -> np.ndarray:
    """One held-out measure per problem from a run's eval.json.

    - ``deployed``: the deployed answer is right (``correct``);
    - ``uniform``: the share of agents right, i.e. the deployed reward under a uniform router;
    - ``best_of_k``: some agent is right.

    The last two come from ``agent_correct`` and do not depend on the router.
    """
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    e = run.eval
    if e is None or "correct" not in e:
        raise ValueError(f"{run.path}: eval.json has no per-problem lists (unfinished or an older recording)")
    if measure == "deployed":
        return np.asarray(e["correct"], dtype=float)
    agents = np.asarray(e["agent_correct"], dtype=float)
    return agents.mean(1) if measure == "uniform" else agents.max(1)


def compare_runs(a: Run, b: Run, level: float = 0.95, measure: str = "deployed") -> dict:
    """Paired difference of two runs' held-out ``measure`` (:func:`per_problem`; ``a - b``) on the
    same problems. Refuses runs whose held-out problems may differ (task, data, data_seed,
    eval_problems).
    """
    for key in ("task", "data_dir", "data_seed", "eval_problems"):
        if a.config.get(key) != b.config.get(key):
            raise ValueError(f"runs differ in config key {key!r}: their held-out problems are not paired")
    if a.eval is None or b.eval is None or "correct" not in a.eval or "correct" not in b.eval:
        raise ValueError("both runs need an eval.json with a per-problem 'correct' list")
    return paired_row(per_problem(a, measure), per_problem(b, measure), level)


class NoPairedSeeds(ValueError):
    """No seed has finished runs of both arms that :func:`signals_over_seeds` was asked to pair."""


def signals_over_seeds(runs: list[Run], a: str = "removal", b: str = "wta",
                       level: float = 0.95, measure: str = "deployed", by: str = "signal") -> pd.DataFrame:
    """Signal ``a`` against signal ``b``: held-out accuracy seed by seed, and over seeds.

    One row ``seed k`` per seed that both signals finished: their accuracies and the paired
    per-problem difference ``a - b`` with its t-interval (:func:`compare_runs`), plus each
    run's paired gain over the frozen model (``gain_a``, ``gain_b``; for ``measure`` other than
    ``deployed``, the frozen model answers alone, so the gain is the measure against its single
    answer). ``measure`` is one of :data:`MEASURES`. A last row ``over seeds``
    holds the means over seeds and, as ``low``/``high``, the t-interval of the per-seed
    differences, whose ``n`` is the number of seeds (NaN with one seed): a training seed
    changes the whole trajectory, so seeds, not problems, are the independent replicates.

    ``by="arm"`` names ``a`` and ``b`` by :attr:`~mcpg.grpo.rundir.Run.arm` instead (``removal-b0.1-group``
    against ``removal-group``: one signal, two configurations). Raises :class:`NoPairedSeeds`
    when no seed has both, and ``ValueError`` when two runs share a name and seed (a grid's
    K = 1 control is a ``wta`` run too: leave it out).
    """
    if by not in ("signal", "arm"):
        raise ValueError(f"by must be 'signal' or 'arm', got {by!r}")
    finished = {}
    for r in runs:
        if r.eval is None:
            continue
        key = (r.signal if by == "signal" else r.arm, r.config.get("seed", 0))
        if key in finished:  # a control beside its grid's wta arm, say: which one is meant?
            raise ValueError(f"two finished runs of {by} {key[0]!r}, seed {key[1]}: "
                             f"{finished[key].path} and {r.path}; pass one per {by} and seed")
        finished[key] = r
    seeds = sorted(s for (name, s) in finished if name == a and (b, s) in finished)
    if not seeds:
        raise NoPairedSeeds(f"no seed with finished runs of both {a!r} and {b!r}")
    rows = {}
    def gain(run: Run) -> float:
        return float((per_problem(run, measure) - np.asarray(run.eval["base_correct"], float)).mean())

    for s in seeds:
        d = compare_runs(finished[a, s], finished[b, s], level, measure)
        rows[f"seed {s}"] = {a: d["mean_a"], b: d["mean_b"], "difference": d["mean"], "low": d["low"],
                             "high": d["high"], "n": d["n"], f"gain_{a}": gain(finished[a, s]),
                             f"gain_{b}": gain(finished[b, s])}
    table = pd.DataFrame.from_dict(rows, orient="index")
    over = t_interval(table["difference"], level)
    rows["over seeds"] = {**table.mean().to_dict(), "low": over["low"], "high": over["high"], "n": len(seeds)}
    return pd.DataFrame.from_dict(rows, orient="index")


def compare_signals(runs: list[Run], a: str = "removal", b: str = "wta", measures=MEASURES,
                    level: float = 0.95) -> pd.DataFrame:
    """:func:`signals_over_seeds` of ``a`` against ``b`` under each advantage scaling
    (``config["scale_rewards"]``) and on each of ``measures``, as one table indexed by
    ``(scaling, measure, row)``, ``row`` being ``seed k`` or ``over seeds``. A scaling under which
    no seed has both signals finished is left out.
    """
    frames = {}
    scalings = sorted({r.scale_rewards for r in runs})
    for sc in scalings:
        sub = [r for r in runs if r.scale_rewards == sc]
        for measure in measures:
            try:
                t = signals_over_seeds(sub, a, b, level, measure)
            except NoPairedSeeds:
                break
            frames[sc, measure] = t
    if not frames:
        raise NoPairedSeeds(f"no seed with finished runs of both {a!r} and {b!r} under any scaling")
    out = pd.concat(frames, names=["scaling", "measure", "row"])
    # levels in the order of appearance (seed rows before "over seeds"), so that .loc is lexsorted
    levels = [list(dict.fromkeys(out.index.get_level_values(i))) for i in range(3)]
    codes = [[lv.index(v) for v in out.index.get_level_values(i)] for i, lv in enumerate(levels)]
    out.index = pd.MultiIndex(levels=levels, codes=codes, names=out.index.names)
    return out


def verdict_table(runs: list[Run], a: str = "removal", b: str = "wta", measures=MEASURES,
                  level: float = 0.95) -> pd.DataFrame:
    """The verdict on ``a`` against ``b`` per advantage scaling and held-out measure, indexed by
    ``(scaling, measure)``, from :func:`compare_signals`.

    Columns: ``difference``, ``low``, ``high`` (``a - b``: the mean over seeds of the per-seed
    paired differences and its t-interval; NaN bounds with one seed), ``seeds``, and the
    number of seeds whose paired per-problem interval lies ``below 0``, includes 0 (``level``)
    or lies ``above 0``. The counts say whether the seeds agree in sign; the interval whether
    their mean is told apart from 0 with so few of them.
    """
    table = compare_signals(runs, a, b, measures, level)
    rows = {}
    for (sc, measure), g in table.groupby(level=["scaling", "measure"], sort=False):
        seeds = g.drop(index="over seeds", level="row")
        over = g.xs("over seeds", level="row").iloc[0]
        rows[sc, measure] = {
            "difference": float(over["difference"]), "low": float(over["low"]),
            "high": float(over["high"]), "seeds": len(seeds),
            "below 0": int((seeds["high"] < 0).sum()),
            "level": int(((seeds["low"] <= 0) & (seeds["high"] >= 0)).sum()),
            "above 0": int((seeds["low"] > 0).sum())}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index = pd.MultiIndex.from_tuples(out.index, names=["scaling", "measure"])
    return out


def _held_out(e: dict) -> dict:
    """An eval.json's held-out measures read apart from the router: deployed, the agents' mean
    (a uniform router) and best-of-K."""
    return {"deployed": float(e["accuracy"]), "agents' mean": float(e.get("uniform_accuracy", np.nan)),
            "best_of_k": float(e.get("best_of_k", np.nan))}


def _by_arm_and_seed(runs: Run | list[Run], row) -> pd.DataFrame:
    """``row(run)`` of every finished run (one with an eval.json), indexed by ``(arm, seed)``."""
    rows = {(r.arm, int(r.config.get("seed", 0))): row(r)
            for r in ([runs] if isinstance(runs, Run) else runs) if r.eval is not None}
    if not rows:
        raise ValueError("no run has an eval.json")
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index = pd.MultiIndex.from_tuples(table.index, names=["arm", "seed"])
    return table.sort_index()
