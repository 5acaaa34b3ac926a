"""A recorded grid read as a verdict: the paper's Table 1 over seeds, paired seeds, power, health.

Chapter 8 compares credit signals on a grid of recorded runs laid out as
``<grid>/<arm>/seed<k>/`` (arms ``control``, ``wta-<scaling>``, ``removal-<scaling>``,
``oracle-<scaling>``; :func:`mcpg.grpo.rundir.read_comparison` reads them). A training seed changes
the whole trajectory, so the seeds, not the held-out problems, are the replicates: every interval
here is a Student-t interval over seeds (:func:`mcpg.stats.paired_difference` for a difference of
two arms paired by seed, :func:`mcpg.grpo.heldout.t_interval` for one arm), and the per-problem
intervals of one seed (:func:`mcpg.grpo.heldout.compare_runs`) are that seed's evaluation noise only.

- :func:`seed_measures`: per finished run, the paper's Table 1 columns (§8): deployed accuracy,
  the agents' mean (a uniform router), best-of-K (the paper's "Oracle" column), routing entropy,
  the deployed candidate's Brier score, specialization and regret;
- :func:`table1`: Table 1's rows (frozen, control, wta, removal, oracle) for one advantage
  scaling, each cell a mean over seeds with its t-interval; :func:`format_table1` as text;
- :func:`paired_seeds`: two arms seed by seed on the seeds both finished;
  :func:`seed_verdict`: their difference over seeds with its interval, and what the interval
  can exclude (:func:`power`);
- :func:`health_sensitivity`: the verdict on every pair, and again without the pairs whose runs
  fail a health bar (named, nothing dropped silently);
- :func:`control_gains`, :func:`dropouts`, :func:`cut_answer_kinds`: a grid's K = 1 controls,
  its agents that stop answering, a probe's cut answers by kind;
- :func:`arms_over_seeds`: named arms against named references (chapter 9's budgeted arms
  against removal alone, the oracle and the uniform allocation), over the seeds each pair holds;
  :func:`config_departures`: where a run's configuration departs from a reference run's;
- figures: :func:`paired_seed_figure` (one line per seed from one arm to the other),
  :func:`arm_figure` (a dot per seed, the mean with its interval), :func:`cost_figure` (a
  measure against the reward queries each arm paid, one line per allocation from budget 0 to
  the oracle), :func:`eq19_figure` (Eq. 19 against the exact removal contribution on logged
  slates).

Only numpy, pandas, :mod:`mcpg.stats` and :mod:`mcpg.grpo.runs` are imported at module level;
matplotlib is imported by the figures.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from .. import stats
from .health import HEALTH_BARS, feedback_table, health_table
from .heldout import NoPairedSeeds, eval_gains, signals_over_seeds, t_interval
from .rundir import Run
from .runs import probe_answers

__all__ = ["TABLE1_ROWS", "TABLE1_COLUMNS", "seed_measures", "table1", "format_table1", "paired_seeds",
           "seed_verdict", "power", "seeds_needed", "seeds_for_power", "health_sensitivity", "cut_failures",
           "control_gains",
           "dropouts", "cut_answer_kinds", "arms_over_seeds", "config_departures", "paired_seed_figure",
           "arm_figure", "cost_figure", "eq19_figure"]

TABLE1_ROWS = ("frozen", "control", "wta", "removal", "oracle")
"""Table 1's rows as this book records them (the frozen base model, the K = 1 positive control,
and the three routed signals; the oracle trains on the exact removal contribution)."""

TABLE1_COLUMNS = ("deployed", "agents' mean", "best-of-K", "entropy", "brier", "specialization", "regret")
"""Held-out measures, deployed accuracy first (the paper's claim); ``best-of-K`` is the paper's
"Oracle" column (some agent right), ``regret`` = best-of-K - deployed."""

_EVAL = {"deployed": "accuracy", "agents' mean": "uniform_accuracy", "best-of-K": "best_of_k",
         "entropy": "entropy", "brier": "brier", "specialization": "specialization", "regret": "regret"}
_ROUTING = ("entropy", "brier", "specialization", "regret")


def seed_measures(runs: list[Run]) -> pd.DataFrame:
    """Table 1's columns (:data:`TABLE1_COLUMNS`) of every finished run, indexed by ``(arm, seed)``,
    with ``scaling`` (the run's ``scale_rewards``) and ``signal``. A one-agent run has no routing:
    its entropy, Brier, specialization and regret are NaN. The frozen model is the row
    ``("frozen", seed)`` of every seed (its deployed accuracy only: it answers alone)."""
    rows = {}
    for r in runs:
        if r.eval is None:
            continue
        seed = int(r.config.get("seed", 0))
        row = {c: np.nan if r.eval.get(k) is None else float(r.eval[k]) for c, k in _EVAL.items()}
        if len(r.agents) == 1:
            row.update({c: np.nan for c in _ROUTING})
        rows[r.arm, seed] = {**row, "scaling": r.scale_rewards, "signal": r.signal}
        frozen = {c: np.nan for c in TABLE1_COLUMNS}
        frozen["deployed"] = float(r.eval["base_accuracy"])
        rows.setdefault(("frozen", seed), {**frozen, "scaling": "", "signal": "frozen"})
    if not rows:
        raise ValueError("no run has an eval.json")
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index = pd.MultiIndex.from_tuples(out.index, names=["arm", "seed"])
    return out.sort_index()


def _arm_of(row: str, scaling: str) -> str:
    return row if row in ("frozen", "control") else f"{row}-{scaling}"


def table1(runs: list[Run], scaling: str = "group", level: float = 0.95) -> pd.DataFrame:
    """Table 1 for one advantage scaling: rows :data:`TABLE1_ROWS` (the routed ones are the arms
    ``<signal>-<scaling>``), columns ``(measure, stat)`` with ``stat`` in ``mean``, ``low``,
    ``high``: the mean over the arm's finished seeds and its t-interval (NaN bounds with one
    seed); a last column ``("seeds", "n")`` counts them. A row no run recorded is left out."""
    m = seed_measures(runs)
    out, seeds = {}, {}
    for row in TABLE1_ROWS:
        arm = _arm_of(row, scaling)
        if arm not in m.index.get_level_values("arm"):
            continue
        g = m.xs(arm, level="arm")
        seeds[row] = len(g)
        for c in TABLE1_COLUMNS:
            v = g[c].dropna().to_numpy()
            ci = t_interval(v, level) if v.size else {"mean": np.nan, "low": np.nan, "high": np.nan}
            for stat in ("mean", "low", "high"):
                out[row, (c, stat)] = ci[stat]
    table = pd.Series(out).unstack(0).T if out else pd.DataFrame()
    table = table.reindex(columns=pd.MultiIndex.from_tuples(
        [(c, s) for c in TABLE1_COLUMNS for s in ("mean", "low", "high")]))
    table = table.reindex([r for r in TABLE1_ROWS if r in seeds])
    table["seeds", "n"] = pd.Series(seeds)
    return table


def format_table1(table: pd.DataFrame, digits: int = 3) -> pd.DataFrame:
    """:func:`table1` as text: ``mean [low, high]`` per cell, the mean alone where there is no
    interval (one seed, or every seed equal), ``–`` where the measure does not apply. The frozen
    model's ``seeds`` is ``–`` too: it answers the same held-out problems for every seed, one
    measurement however many seeds the grid has."""
    def cell(mean, low, high):
        if np.isnan(mean):
            return "–"
        if np.isnan(low) or high - low < 10 ** -(digits + 1):
            return f"{mean:.{digits}f}"
        return f"{mean:.{digits}f} [{low:.{digits}f}, {high:.{digits}f}]"
    cols = {c: [cell(*table.loc[r, [(c, "mean"), (c, "low"), (c, "high")]]) for r in table.index]
            for c in TABLE1_COLUMNS}
    out = pd.DataFrame(cols, index=table.index)
    out["seeds"] = [("–" if r == "frozen" else int(n)) for r, n in table["seeds", "n"].items()]
    return out


def paired_seeds(runs: list[Run], a: str = "removal", b: str = "wta", scaling: str = "group",
                 columns=TABLE1_COLUMNS) -> pd.DataFrame:
    """Arms ``<a>-<scaling>`` and ``<b>-<scaling>`` on the seeds both finished, one row per seed;
    columns ``(measure, a)``, ``(measure, b)``, ``(measure, "difference")`` (``a - b``).
    Raises ``ValueError`` when no seed has both."""
    m = seed_measures(runs)
    arm_a, arm_b = f"{a}-{scaling}", f"{b}-{scaling}"
    have = m.index.get_level_values("arm")
    if arm_a not in have or arm_b not in have:
        raise ValueError(f"no seed with finished runs of both {arm_a!r} and {arm_b!r}")
    ma, mb = m.xs(arm_a, level="arm"), m.xs(arm_b, level="arm")
    seeds = sorted(set(ma.index) & set(mb.index))
    if not seeds:
        raise ValueError(f"no seed with finished runs of both {arm_a!r} and {arm_b!r}")
    out = {}
    for c in columns:
        out[c, a] = ma.loc[seeds, c].astype(float)
        out[c, b] = mb.loc[seeds, c].astype(float)
        out[c, "difference"] = out[c, a] - out[c, b]
    table = pd.DataFrame(out)
    table.index.name = "seed"
    return table


def power(differences, level: float = 0.95, target: float | None = None, seeds=(10,)) -> dict:
    """What a t-interval over paired seeds can tell apart.

    ``differences`` are the per-seed differences. Returns ``n``, ``mean``, ``low``, ``high``,
    ``half_width``, ``sd``, ``excludes_zero``; ``contains_target`` (whether ``target``, e.g. the
    paper's gap, lies inside the interval; None without a target); and for each ``k`` in
    ``seeds`` the half-width ``half_width_<k>`` that ``k`` seeds would give at the same spread,
    ``t_{k-1} sd / sqrt(k)``: the smallest difference from the observed mean they could exclude.
    """
    d = np.asarray(differences, dtype=float)
    if d.size < 2:
        raise ValueError("power needs the differences of at least two seeds")
    iv = stats.paired_difference(d, np.zeros_like(d), level)
    out = {"n": iv.n, "mean": iv.mean, "low": iv.low, "high": iv.high, "half_width": iv.half_width,
           "sd": iv.sd, "excludes_zero": iv.excludes_zero(),
           "contains_target": None if target is None else bool(iv.low <= target <= iv.high)}
    for k in seeds:
        out[f"half_width_{k}"] = float(stats.t_quantile(level, k - 1) * iv.sd / np.sqrt(k))
    return out


def seeds_needed(sd: float, half_width: float, level: float = 0.95) -> int:
    """The fewest paired seeds whose t-interval, at the per-seed spread ``sd``, has a half-width
    of at most ``half_width``: the smallest n with ``t_{n-1} sd / sqrt(n) <= half_width``."""
    if sd <= 0 or half_width <= 0:
        raise ValueError(f"sd and half_width must be positive, got {sd} and {half_width}")
    n = 2
    while stats.t_quantile(level, n - 1) * sd / np.sqrt(n) > half_width:
        n += 1
    return n


def seeds_for_power(sd: float, effect: float, power: float = 0.8, level: float = 0.95) -> int:
    """The fewest paired seeds at which a two-sided paired t-test at ``level`` detects a true
    mean difference ``effect``, at the per-seed spread ``sd``, with probability ``power``.

    The power of n seeds is ``P(|T| > t_{n-1})`` for T noncentral t with n − 1 degrees of
    freedom and noncentrality ``effect sqrt(n) / sd``. (:func:`seeds_needed` asks something
    else: the seeds whose interval's half-width is at most a size, which detects a difference
    of that size only about half the time.)"""
    from scipy import stats as st

    if sd <= 0 or effect == 0 or not 0 < power < 1:
        raise ValueError("sd must be positive, effect non-zero and power in (0, 1); "
                         f"got {sd}, {effect}, {power}")
    n = 2
    while True:
        crit = st.t.ppf(1 - (1 - level) / 2, n - 1)
        nc = abs(effect) * np.sqrt(n) / sd
        if st.nct.sf(crit, n - 1, nc) + st.nct.cdf(-crit, n - 1, nc) >= power:
            return n
        n += 1


def seed_verdict(runs: list[Run], a: str = "removal", b: str = "wta", scaling: str = "group",
                 measures=("deployed", "agents' mean", "best-of-K"), level: float = 0.95,
                 target: float | None = None) -> pd.DataFrame:
    """``a - b`` over the seeds both arms finished, per measure: the mean of the per-seed
    differences with its t-interval and :func:`power` (one row per measure), plus ``below 0`` /
    ``above 0``, the number of seeds on which ``a`` is behind / ahead."""
    p = paired_seeds(runs, a, b, scaling, measures)
    rows = {}
    for c in measures:
        d = p[c, "difference"].to_numpy()
        rows[c] = {**power(d, level, target), "below 0": int((d < 0).sum()), "above 0": int((d > 0).sum())}
    return pd.DataFrame.from_dict(rows, orient="index")


def health_sensitivity(runs: list[Run], a: str = "removal", b: str = "wta", scaling: str = "group",
                       measure: str = "deployed", level: float = 0.95) -> pd.DataFrame:
    """The verdict ``a - b`` on ``measure`` over paired seeds, with and without the pairs whose runs
    fail a health bar, so that no run is dropped silently.

    Rows: ``every pair``; ``cut in training <= bar`` (both runs' cut share over their last five
    updates at most ``HEALTH_BARS["truncated"]``); ``every bar`` (both runs ``healthy`` in
    :func:`mcpg.grpo.health.health_table`); ``and cut held-out <= bar`` (also the held-out greedy
    answers' cut share at most the same bar). Columns: ``mean``, ``low``, ``high`` (NaN with
    fewer than two pairs), ``pairs``, ``left out`` (the seeds left out, named for prose: "seeds 6
    and 8", or "none") and ``left-out seeds`` (the same seeds as a tuple of ints, for code).
    """
    h = health_table(runs)
    p = paired_seeds(runs, a, b, scaling, (measure,))
    arms = (f"{a}-{scaling}", f"{b}-{scaling}")
    bar = HEALTH_BARS["truncated"]
    tests = {"every pair": lambda r: True,
             "cut in training <= bar": lambda r: r["cut"] <= bar,
             "every bar": lambda r: bool(r["healthy"]),
             "and cut held-out <= bar": lambda r: bool(r["healthy"]) and r["cut, held-out"] <= bar}
    rows = {}
    for name, ok in tests.items():
        keep = [s for s in p.index if all(ok(h.loc[(arm, s)]) for arm in arms)]
        d = p.loc[keep, (measure, "difference")].to_numpy()
        ci = t_interval(d, level) if d.size else {"mean": np.nan, "low": np.nan, "high": np.nan}
        out = tuple(int(s) for s in p.index if s not in keep)
        rows[name] = {"mean": ci["mean"], "low": ci["low"], "high": ci["high"], "pairs": len(keep),
                      "left out": stats.seed_names(out) if out else "none", "left-out seeds": out}
    return pd.DataFrame.from_dict(rows, orient="index")


def cut_failures(runs: list[Run], scaling: str = "group", signals=("removal", "wta")) -> dict[str, pd.Series]:
    """For each of ``signals`` under ``scaling``, by seed: whether its run fails a cut measure, its
    cut share over its last five updates or its held-out greedy answers' cut share above
    ``HEALTH_BARS["truncated"]`` (columns ``cut`` and ``cut, held-out`` of
    :func:`mcpg.grpo.health.health_table`). The runs the last rows of :func:`health_sensitivity`
    leave out by their cuts."""
    h = health_table(runs)
    bar = HEALTH_BARS["truncated"]
    fails = (h["cut"] > bar) | (h["cut, held-out"] > bar)
    return {s: fails.xs(f"{s}-{scaling}", level="arm") for s in signals}


def control_gains(runs: list[Run], bar: float = 0.10) -> pd.DataFrame:
    """A grid's K = 1 controls (arm ``control``), one row per seed: the frozen and trained held-out
    accuracy, the paired per-problem gain with its t-interval (``gain``, ``low``, ``high``),
    whether it clears the bar (a gain of at least ``bar`` whose interval lies above 0), and the
    share cut over the last five updates."""
    rows = {}
    for r in sorted((r for r in runs if r.arm == "control" and r.eval is not None),
                    key=lambda r: r.config.get("seed", 0)):
        g = eval_gains(r).loc["trained - frozen base"]
        rows[int(r.config.get("seed", 0))] = {
            "frozen": r.eval["base_accuracy"], "trained": r.eval["accuracy"], "gain": g["mean"],
            "low": g["low"], "high": g["high"], "clears the bar": bool(g["mean"] >= bar and g["low"] > 0),
            "cut, last 5 updates": float(r.metrics.sort_values("update")["truncated"].tail(5).mean())}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index.name = "seed"
    return out


def dropouts(runs: list[Run], below: float = 0.10) -> pd.DataFrame:
    """Per finished routed run, indexed by ``(arm, seed)``: its agents right on fewer than ``below``
    of the held-out problems at the end (``dropped``, a count, and ``agents``, their names), and
    the lowest agent accuracy before training (``lowest start``; NaN when not recorded)."""
    rows = {}
    for r in runs:
        if r.eval is None or len(r.agents) == 1:
            continue
        acc = np.asarray(r.eval["agent_accuracy"], dtype=float)
        start = r.eval.get("initial_agent_accuracy")
        rows[r.arm, int(r.config.get("seed", 0))] = {
            "signal": r.signal, "dropped": int((acc < below).sum()),
            "agents": ", ".join(n for n, x in zip(r.agents, acc) if x < below),
            "lowest start": float(min(start)) if start else np.nan}
    out = pd.DataFrame.from_dict(rows, orient="index")
    out.index = pd.MultiIndex.from_tuples(out.index, names=["arm", "seed"])
    return out.sort_index()


def cut_answer_kinds(folder: str | os.PathLike) -> pd.DataFrame:
    """Per probed run and agent, the shares of its held-out answers cut, by kind, and its first cut
    answer (36 characters), from the folders ``scripts/ch08_cut_answers.py`` writes under
    ``folder`` (one per run: ``summary.json`` and ``samples.jsonl``). The answers are read through
    :func:`mcpg.grpo.runs.probe_answers`, which refuses answers that are not the graded ones."""
    rows, first_cut = {}, {}
    for path in sorted(Path(folder).glob("*/summary.json")):
        summary = json.loads(path.read_text())
        cut = probe_answers(path.parent).query("cut")
        for k, name in enumerate(summary["agent_names"]):
            rows[path.parent.name, name] = summary["per_agent"][k]
            first = cut.loc[cut["agent"] == k, "text"].head(1).tolist()
            first_cut[path.parent.name, name] = "".join(first)[:36].replace("\n", " / ")
    if not rows:
        raise FileNotFoundError(f"{folder} holds no probe folder with a summary.json")
    kinds = pd.DataFrame(rows).T.drop(columns="answers", errors="ignore")
    kinds.columns = [c.replace("cut, ", "") for c in kinds.columns]
    kinds["first cut answer"] = pd.Series(first_cut)
    return kinds.rename_axis(["run", "agent"])


def arms_over_seeds(runs: list[Run], pairs, measures=("uniform", "deployed"),
                    level: float = 0.95) -> pd.DataFrame:
    """Each ``(arm, reference)`` of ``pairs`` over the seeds both arms finished, on each of
    ``measures`` (:data:`mcpg.grpo.heldout.MEASURES`), arms named by
    :attr:`~mcpg.grpo.rundir.Run.arm`.

    One row per pair and measure, indexed by ``(arm, reference, measure)``: ``difference`` (the
    mean over seeds of the per-seed paired per-problem differences, ``arm - reference``),
    ``low`` and ``high`` (the t-interval of those per-seed differences; NaN with one seed),
    ``n`` (the seeds) and ``seeds`` (which ones). A pair with no seed in common, or whose
    reference is None, is left out, so the table holds whatever has been recorded (it is empty,
    with these columns, when nothing has)."""
    rows = {}
    for arm, ref in pairs:
        if ref is None:
            continue
        for measure in measures:
            try:
                t = signals_over_seeds(runs, a=arm, b=ref, level=level, measure=measure, by="arm")
            except NoPairedSeeds:
                break
            over = t.loc["over seeds"]
            seeds = ", ".join(row.removeprefix("seed ") for row in t.index if row != "over seeds")
            rows[arm, ref, measure] = {"difference": float(over["difference"]), "low": float(over["low"]),
                                       "high": float(over["high"]), "n": int(over["n"]), "seeds": seeds}
    index = pd.MultiIndex.from_arrays([[k[i] for k in rows] for i in range(3)],
                                      names=["arm", "reference", "measure"])
    columns = ["difference", "low", "high", "n", "seeds"]
    return pd.DataFrame([rows[k] for k in rows], index=index, columns=columns)


def config_departures(run: Run, reference: Run, ignore=("seed",)) -> dict:
    """Where ``run``'s resolved configuration departs from ``reference``'s: ``{key: (run's value,
    reference's value)}`` for every key both hold with different values, ``ignore`` aside, and
    ``{key: (run's value, None)}`` for every key only ``run`` holds (an engine newer than the
    reference's). Empty when the run is the reference's configuration."""
    a, b = run.config, reference.config
    out = {k: (a[k], b[k]) for k in a if k in b and k not in ignore and a[k] != b[k]}
    out.update({k: (a[k], None) for k in a if k not in b and k not in ignore})
    return out


def paired_seed_figure(panels: dict, a: str = "removal", b: str = "wta", ax=None):
    """One line per seed from arm ``b`` to arm ``a``, one panel per entry of ``panels``
    (``{title: paired}``, each a :func:`paired_seeds` frame; its first measure is drawn), with the
    mean over seeds and its t-interval at each end. Returns the figure."""
    import matplotlib.pyplot as plt

    from ..plotting import METHOD_COLORS
    axes = ax if ax is not None else plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.4),
                                                 sharey=True, squeeze=False)[1][0]
    for axis, (title, p) in zip(np.atleast_1d(axes), panels.items()):
        measure = p.columns[0][0]
        for seed, row in p.iterrows():
            axis.plot([0, 1], [row[measure, b], row[measure, a]], color="0.55", lw=1, marker="o", ms=4)
            axis.annotate(f"{seed}", (1.04, row[measure, a]), fontsize=7, va="center", color="0.4")
        for x, arm in ((0, b), (1, a)):
            ci = t_interval(p[measure, arm])
            err = None if np.isnan(ci["half_width"]) else ci["half_width"]
            axis.errorbar(x + (-0.12 if x == 0 else 0.2), ci["mean"], yerr=err, fmt="s",
                          color=METHOD_COLORS.get(arm, "k"), capsize=4)
        axis.set_xticks([0, 1], [b, a])
        axis.set_xlim(-0.35, 1.35)
        axis.set_title(f"{title} (n = {len(p)} seeds)", fontsize=9)
    np.atleast_1d(axes)[0].set_ylabel(f"held-out {p.columns[0][0]} accuracy")
    fig = np.atleast_1d(axes)[0].figure
    fig.tight_layout()
    return fig


def arm_figure(runs: list[Run], title: str, measures=("deployed", "agents' mean", "best-of-K"),
               order=None):
    """A grid's routed arms on held-out measures: a dot per seed, the mean over seeds with its
    t-interval, the frozen model as a grey line. Returns the figure."""
    import matplotlib.pyplot as plt

    from ..plotting import METHOD_COLORS
    m = seed_measures(runs).drop(index=["frozen", "control"], level="arm", errors="ignore")
    arms = order or sorted(set(m.index.get_level_values("arm")))
    fig, axes = plt.subplots(1, len(measures), figsize=(3.4 * len(measures), 3.4), sharey=True)
    base = seed_measures(runs).xs("frozen", level="arm")["deployed"].mean()
    for ax, c in zip(np.atleast_1d(axes), measures):
        for x, arm in enumerate(arms):
            g = m.xs(arm, level="arm")
            v = g[c].to_numpy(dtype=float)
            color = METHOD_COLORS.get(g["signal"].iloc[0], "k")
            ax.scatter(np.full(len(v), x), v, color=color, alpha=0.5, s=16)
            ci = t_interval(v)
            err = None if np.isnan(ci["half_width"]) else ci["half_width"]
            ax.errorbar(x + 0.18, ci["mean"], yerr=err, fmt="o", color=color, capsize=3)
        ax.axhline(base, color="grey", lw=1)
        ax.set_xticks(range(len(arms)), arms, rotation=35, ha="right")
        ax.set_title(c)
        ax.set_ylim(0, 1)
    np.atleast_1d(axes)[0].set_ylabel("held-out accuracy")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def cost_figure(runs: list[Run], measure: str = "deployed", colors: dict | None = None, ax=None):
    """A held-out ``measure`` against what each arm paid in reward queries beyond the deployed
    ones (paper §7's cost, :func:`mcpg.grpo.health.feedback_table`): a dot per run at its own
    cost, the arm's mean over seeds (a bar) with its t-interval at its mean cost, and one line per
    allocation (the ``allocation`` of its budgeted removal arms, ``colors[allocation]``) through
    its arms in the order of their budget. Budget 0 (``removal`` without a budget) and budget 1
    (the ``oracle``, the same for every allocation) are drawn in black and join every line when
    the runs hold one arm of each. A run that fails a health bar (``healthy`` of
    :func:`mcpg.grpo.health.health_table`) is a hollow dot. The cost axis is linear up to the
    smallest cost paid, then logarithmic. Returns the figure."""
    import matplotlib.pyplot as plt

    fb = feedback_table(runs)
    healthy = health_table(runs)["healthy"].reindex(fb.index).astype(bool).to_numpy()
    finished = [r for r in runs if r.eval is not None]
    signal = {r.arm: r.signal for r in finished}
    alloc = {r.arm: r.config.get("allocation", "sqrt") for r in finished
             if r.signal == "removal" and 0 < float(r.config.get("exact_budget", 0.0)) < 1}
    ends = ([a for a in signal if signal[a] == "removal" and a not in alloc],
            [a for a in signal if signal[a] == "oracle"])
    allocs = sorted(set(alloc.values()))
    colors = {**{a: f"C{i}" for i, a in enumerate(allocs)}, **(colors or {})}
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 4.0))
    means = {}
    for arm, g in fb.groupby(level="arm"):
        color = colors[alloc[arm]] if arm in alloc else "black"
        # allocations at one budget pay about the same: set them apart by a few per cent
        shift = 1 + 0.05 * (allocs.index(alloc[arm]) - (len(allocs) - 1) / 2) if arm in alloc else 1
        x, y = g["feedback cost"].to_numpy(float) * shift, g[measure].to_numpy(float)
        ok = healthy[fb.index.get_locs([arm])]
        ax.scatter(x[ok], y[ok], color=color, alpha=0.35, s=16)
        ax.scatter(x[~ok], y[~ok], facecolors="none", edgecolors=color, s=22)
        ci = t_interval(y)
        err = None if np.isnan(ci["half_width"]) else ci["half_width"]
        means[arm] = (x.mean(), ci["mean"])
        ax.errorbar(*means[arm], yerr=err, fmt="_", ms=14, mew=2, color=color, capsize=3, zorder=3)
    start, end = (e if len(e) == 1 else [] for e in ends)
    budget = fb["budget"].groupby(level="arm").first()
    for a in allocs:
        arms = start + sorted((m for m in alloc if alloc[m] == a), key=budget.get) + end
        ax.plot(*zip(*(means[m] for m in arms)), "-", color=colors[a], label=a)
    for arm, name in ((start, "removal alone"), (end, "oracle")):
        if arm:
            ax.annotate(name, means[arm[0]], xytext=(6, -12), textcoords="offset points", fontsize=8)
    paid = fb["feedback cost"][fb["feedback cost"] > 0]
    if len(paid):
        ax.set_xscale("symlog", linthresh=float(paid.min()))
    ax.set(xlabel="reward queries beyond the deployed ones, per run", ylabel=f"held-out {measure} accuracy")
    if not healthy.all():
        ax.scatter([], [], facecolors="none", edgecolors="0.3", s=22, label="fails a health bar")
    if allocs or not healthy.all():
        ax.legend(title="allocation" if allocs else None, fontsize=8)
    return ax.figure


def eq19_figure(sc: pd.DataFrame, title: str, ax=None, frame: float | None = None):
    """Eq. (19) from one draw (dots: deployed, crosses: not) and its exact expectation over the
    router's draw (circles) against the exact removal contribution, on the rows of
    :func:`mcpg.grpo.slate_diagnostics.slate_credit`. Corollary 3 puts the circles on the diagonal.

    ``frame``: the credit axis is cut at ±``frame`` and the credits beyond it are counted in a
    note (Eq. 19 divides a deployed reward by its propensity, so a rarely drawn candidate's
    reward gives a heavy tail that would squash every other point); None shows every credit."""
    import matplotlib.pyplot as plt

    from ..plotting import METHOD_COLORS
    if ax is None:
        _, ax = plt.subplots(figsize=(5.6, 4.2))
    for dep, marker in ((True, "o"), (False, "x")):
        d = sc[sc["deployed"] == dep]
        ax.scatter(d["oracle"], d["removal"], marker=marker, alpha=0.6, color=METHOD_COLORS["removal"],
                   label=f"Eq. 19, one draw ({'deployed' if dep else 'not deployed'})")
    ax.scatter(sc["oracle"], sc["removal_expected"], s=60, facecolors="none", edgecolors="black",
               label="Eq. 19 averaged over I ~ p (exact)")
    lim = [min(sc["oracle"].min(), sc["removal"].min()), max(sc["oracle"].max(), sc["removal"].max())]
    ax.plot(lim, lim, color="grey", lw=1)
    ax.set(xlabel="exact removal contribution (oracle)", ylabel="removal credit", title=title)
    if frame is not None:
        out = sc["removal"].abs() > frame
        ax.set_ylim(-frame, frame)
        if out.any():
            ax.text(0.02, 0.02, f"{int(out.sum())} one-draw credits beyond ±{frame:g} "
                    f"(from {sc['removal'].min():+.1f} to {sc['removal'].max():+.1f})",
                    transform=ax.transAxes, fontsize=7, va="bottom")
    ax.legend(fontsize=8, loc="upper left")
    return ax.figure
