"""The escape into cut answers: chapter 8's hypothesis H2, measured on logged slates.

Under ``mask_truncated_completions`` (DAPO's overlong filtering) a completion cut at the token
budget keeps its place in its GRPO group, so its credit enters the group's advantages, but it
gets no gradient. In a group with no right candidate (one agent's m completions of a problem
none of whose candidates, on any slate, is right) winner-take-all credits 0 everywhere, while
Eq. (19)'s credit is the outcome model's term alone (paper §6.1). H2 says: standardised, the
*finished* completions of such groups receive a negative mean advantage, and the share of cut
completions rises after the updates where that mean is most negative.

- :func:`finish_advantages`: update by update, the mean advantage of finished and of cut
  completions in groups with and without a right candidate, recomputed as the run computed it
  (:func:`mcpg.grpo.objective.group_advantages` of the logged ``score``, its group and the run's
  ``scale_rewards``), and the share of cut completions;
- :func:`pooled_fin`: ``a_fin`` pooled over the updates of one run or several (H2a's measure);
- :func:`follows`: whether the cut share follows that mean, over several runs: the mean of the
  per-run Spearman correlations between ``a_fin(t)`` and ``c(t+1) - c(t)``, with a permutation
  test that shuffles the updates within each run;
- :func:`escape_figure`: both, drawn per run (the cut share by update; ``a_fin(t)`` against
  the next update's change in it).

Slates logged before the engine recorded each candidate's ``cut`` flag (the grid of record at
``dfdbc84``) cannot be read here: :func:`finish_advantages` says so.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy.stats import rankdata, spearmanr

from .objective import ADVANTAGE_EPS, group_advantages
from .rundir import Run

__all__ = ["slate_advantages", "finish_advantages", "pooled_fin", "follows", "escape_figure"]


def slate_advantages(score, m: int, scale_rewards: str, eps: float = ADVANTAGE_EPS) -> np.ndarray:
    """The advantages a run trained on, from its logged credit ``score`` ``(B*m, K)`` (the logged
    layout: problem by problem, m slates each): each agent's group is its m completions of one
    problem (:func:`mcpg.grpo.objective.group_advantages`); with ``scale_rewards="batch"`` the
    batch is the B problems of the update, as in the engine. Returns ``(B*m, K)``."""
    s = np.asarray(score, dtype=float)
    if s.ndim != 2 or s.shape[0] % m:
        raise ValueError(f"score must be (B*m, K) with m = {m} dividing its rows, got {s.shape}")
    B, K = s.shape[0] // m, s.shape[1]
    return group_advantages(s.reshape(B, m, K), scale_rewards, eps, axis=-2,
                            batch_axis=-3).reshape(B * m, K)


def _mean(x: np.ndarray) -> float:
    return float(x.mean()) if x.size else float("nan")


def finish_advantages(run: Run) -> pd.DataFrame:
    """One row per logged update of ``run``: ``a_fin`` and ``a_cut``, the mean advantage of the
    finished and of the cut completions in groups with no right candidate (``n_fin``, ``n_cut``:
    how many), the same in groups with one (``a_fin_right``, ``a_cut_right``), and ``cut``, the
    update's share of cut completions (its slates' ``cut`` flags; ``truncated`` in the metrics
    is the same share, computed by the engine)."""
    m = int(run.config["completions_per_agent"])
    scaling = run.config.get("scale_rewards", "group")
    eps = float(run.config.get("advantage_eps", ADVANTAGE_EPS))
    rows = []
    for sl in run.slates:
        if "cut" not in sl:
            raise ValueError(f"{run.path}: its slates have no candidate 'cut' flag (logged before the "
                             "engine recorded it); replay the run at a later commit to read them")
        A = slate_advantages(sl["score"], m, scaling, eps)
        R = np.asarray(sl["R"], dtype=float)
        cut = np.asarray(sl["cut"], dtype=bool)
        B, K = R.shape[0] // m, R.shape[1]
        right = np.repeat(R.reshape(B, m * K).max(axis=1) > 0, m)[:, None] & np.ones(K, bool)
        dead = ~right
        rows.append({
            "update": int(sl["update"]),
            "a_fin": _mean(A[dead & ~cut]), "a_cut": _mean(A[dead & cut]),
            "n_fin": int((dead & ~cut).sum()), "n_cut": int((dead & cut).sum()),
            "a_fin_right": _mean(A[right & ~cut]), "a_cut_right": _mean(A[right & cut]),
            "dead_share": float(dead.mean()), "cut": float(cut.mean()),
        })
    return pd.DataFrame(rows).set_index("update").sort_index()


def pooled_fin(frames) -> float:
    """``a_fin`` pooled over updates: the mean advantage of every finished completion in a group
    with no right candidate, each update's mean weighted by its count ``n_fin``. ``frames`` is one
    frame of :func:`finish_advantages` or a dict of them (pooled over runs as well); NaN where no
    such completion exists. H2a's measure over a run's first updates: ``pooled_fin(f.loc[:12])``."""
    frames = frames.values() if isinstance(frames, dict) else [frames]
    num = sum(float((f["a_fin"].fillna(0) * f["n_fin"]).sum()) for f in frames)
    den = sum(int(f["n_fin"].sum()) for f in frames)
    return num / den if den else float("nan")


def follows(frames: dict, n_perm: int = 10_000, seed: int = 0, through: int | None = None) -> dict:
    """Does the cut share follow the finished answers' mean advantage? For each run (a frame of
    :func:`finish_advantages`, updates 1 to ``through`` or all), the Spearman correlation between
    ``a_fin(t)`` and ``c(t+1) - c(t)``; H2 predicts their mean ``rho`` below 0. ``p`` is the
    one-sided permutation p-value of that mean (``a_fin`` shuffled over the updates within each
    run, ``n_perm`` times): the share of shuffles with a mean at most the observed one, counting
    the observed. Updates with no finished completion in a hopeless group are left out.
    Returns ``rho`` (mean), ``per_run`` (each run's), ``pairs`` (per run) and ``p``."""
    rng = np.random.default_rng(seed)
    xs, ys, per_run, pairs = [], [], {}, {}
    for name, f in frames.items():
        f = f.sort_index()
        if through is not None:
            f = f.loc[:through]
        x = f["a_fin"].to_numpy()[:-1]
        y = np.diff(f["cut"].to_numpy())
        keep = ~np.isnan(x)
        x, y = x[keep], y[keep]
        if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
            raise ValueError(f"run {name!r}: fewer than three updates with a spread in both a_fin and the "
                             "cut share's change; no correlation to read")
        xs.append(x)
        ys.append(y)
        per_run[name] = float(spearmanr(x, y).statistic)
        pairs[name] = int(x.size)
    observed = float(np.mean(list(per_run.values())))
    # Spearman's rho is Pearson's on the (average) ranks: shuffling x shuffles its ranks
    shuffled = np.zeros(n_perm)
    for x, y in zip(xs, ys):
        rx, ry = (rankdata(v) - (v.size + 1) / 2 for v in (x, y))
        rx, ry = rx / np.linalg.norm(rx), ry / np.linalg.norm(ry)
        shuffled += rng.permuted(np.tile(rx, (n_perm, 1)), axis=1) @ ry
    shuffled /= len(xs)
    below = 1 + int((shuffled <= observed + 1e-12).sum())  # the observed arrangement counts
    return {"rho": observed, "per_run": per_run, "pairs": pairs, "p": below / (n_perm + 1)}


def escape_figure(frames: dict, through: int | None = None, axes=None):
    """H2 drawn, one colour per run (a frame of :func:`finish_advantages`, keyed by its label;
    runs of one arm, the label's first word, share a hue and a marker and differ in shade):
    left, the cut share ``c(t)`` by update; right, ``a_fin(t)`` against ``c(t+1) - c(t)`` (H2
    predicts the points of a run falling from left to right). Updates 1 to ``through`` or all.
    Returns the figure."""
    import matplotlib.pyplot as plt

    if axes is None:
        fig, axes = plt.subplots(1, 2, figsize=(7.2, 3.2), constrained_layout=True)
    left, right = axes
    # one hue per arm (the label's first word), one shade per run: no two runs share a colour
    hues = ["Reds", "Blues", "Greens", "Purples", "Oranges", "Greys"]
    arms = list(dict.fromkeys(str(name).split()[0] for name in frames))
    count = {a: sum(str(n).split()[0] == a for n in frames) for a in arms}
    seen = dict.fromkeys(arms, 0)
    markers = {a: m for a, m in zip(arms, "osD^v<>")}
    for name, f in frames.items():
        arm = str(name).split()[0]
        shade = 0.45 + 0.5 * seen[arm] / max(count[arm] - 1, 1)
        seen[arm] += 1
        c = plt.get_cmap(hues[arms.index(arm) % len(hues)])(shade)
        f = f.sort_index() if through is None else f.sort_index().loc[:through]
        left.plot(f.index, f["cut"], marker=markers[arm], ms=3, lw=1, color=c, label=str(name), zorder=3)
        right.scatter(f["a_fin"].to_numpy()[:-1], np.diff(f["cut"].to_numpy()), s=14, color=c,
                      marker=markers[arm], zorder=3)
    left.set(xlabel="update t", ylabel="share of completions cut, c(t)", ylim=(0, 1))
    right.axhline(0, color="0.75", lw=0.6, zorder=0)  # under the points, which sit on it centred
    right.axvline(0, color="0.75", lw=0.6, zorder=0)
    right.set(xlabel="ā_fin(t), hopeless groups", ylabel="c(t+1) − c(t)")
    left.legend(fontsize=7, frameon=False)
    return left.figure
