"""Recorded GRPO runs as tidy tables: learning curves, health, held-out gains, Eq. 19 on real slates.

A run directory written by :func:`mcpg.grpo.train.train` (its files and every logged key are
listed in :mod:`mcpg.grpo.train`) is read by :func:`read_run` into a :class:`Run`. The
functions below turn runs into the frames chapter 8 draws and tests:

- :func:`read_comparison`: every run of a comparison recorded as ``<signal>/seed<k>/``;
- :func:`learning_curve`: the sampled deployed reward per update, with a trailing rolling mean;
- :func:`health`: zero-spread groups, truncation, completion length, routing shares, ... in long
  form (one row per update, agent and metric);
- :func:`eval_table`: Table 1's six diagnostics of several runs, with the frozen model's row;
- :func:`paired_difference`, :func:`eval_gains`, :func:`compare_runs`: paired per-problem
  differences of held-out correctness (final pool vs frozen base model, final vs untrained
  pool, one run vs another on the same problems) with t-intervals (:func:`t_interval`);
- :func:`signals_over_seeds`: two signals (or two arms) seed by seed (paired per-problem
  differences) and over seeds (a t-interval of the per-seed differences: the seeds, not the
  problems, are the sample); :class:`NoPairedSeeds` when no seed has both;
- :func:`slate_credit`: on the logged slates, where every candidate's reward is known, the
  removal estimate of Eq. (19) from the deployed reward only, its exact expectation over the
  router's draw, and the exact removal contribution (the ``oracle`` signal); Corollary 3 says
  the last two are equal for any fixed outcome model (proof: the paper's Appendix B.11).
  The credits come from :func:`mcpg.grpo.objective.credit`, not a re-implementation;
- :func:`group_signal`: per GRPO group (one prompt's m slates, one agent), whether any candidate
  was right and how large the advantages the run trained on were: under group scaling a
  group whose credits differ only by estimator noise moves as far as one with signal;
- :func:`expected_advantage`: per completion, the advantage its credit gets on average over
  the router's draws given the completions, standardised and centred: the bias that group
  standardisation adds to an unbiased credit; :func:`advantage_bias` sums it up over the
  groups with no right candidate;
- :func:`health_table`: per finished run, the bars (:data:`HEALTH_BARS`) a run must clear before
  its credit signal is compared with another's, and the held-out measures read apart from the
  router;
- :func:`compare_signals`: :func:`signals_over_seeds` under each advantage scaling and on each
  measure, as one table; :func:`verdict_table` sums it up per scaling and measure (the interval
  over seeds, and on how many seeds the paired interval lies below 0, straddles it or lies above);
- :func:`probe_answers`: a probe's regenerated held-out answers (``samples.jsonl`` of
  ``scripts/ch08_cut_answers.py``) with the run's graded ``right`` and ``mu_hat`` beside each;
- :func:`feedback_table`: per finished run, what its credit signal paid in reward queries
  beyond the deployed one (paper §7: exact evaluations on a budget), beside its held-out measures;
- :func:`recording_summary`: per run, the counts behind chapter 8's diagnosis of a recording
  (truncation, agent-updates without a correct candidate, credit-free agent-updates,
  rollouts with no correct candidate at all, routing collapse at evaluation).

Only numpy, pandas, :mod:`mcpg.stats` and :mod:`mcpg.grpo.objective` are imported (no transformers).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from .. import allocation
from ..stats import EVAL_KEYS, mean_ci
from .objective import advantage_alignment as objective_alignment
from .objective import advantage_by_outcome as objective_by_outcome
from .objective import credit, credit_leverage, expected_advantages, group_advantages
from .rundir import PER_AGENT_METRICS, SCALAR_METRICS, Run, read_comparison, read_json, read_jsonl, read_run

__all__ = ["Run", "read_run", "read_comparison", "t_interval", "paired_difference", "learning_curve",
           "health", "eval_table", "eval_gains", "compare_runs", "signals_over_seeds", "slate_credit",
           "group_signal", "expected_advantage", "advantage_bias", "advantage_alignment",
           "advantage_by_outcome", "recording_summary", "slate_groups", "health_table",
           "compare_signals", "verdict_table", "probe_answers", "feedback_table", "allocation_risks",
           "advantage_distance",
           "NoPairedSeeds", "HEALTH_BARS", "per_problem", "MEASURES",
           "PER_AGENT_METRICS", "SCALAR_METRICS", "EVAL_KEYS"]



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


def paired_difference(a, b, level: float = 0.95) -> dict:
    """Paired difference ``a - b`` of per-problem outcomes on the same problems, with its t-interval.

    Returns ``mean_a``, ``mean_b`` and :func:`t_interval` of the differences (``mean`` is
    ``mean_a - mean_b``).
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"a and b must be 1-d and paired (same length), got shapes {a.shape} and {b.shape}")
    return {"mean_a": float(a.mean()), "mean_b": float(b.mean()), **t_interval(a - b, level)}


def learning_curve(runs: Run | list[Run], window: int = 5) -> pd.DataFrame:
    """Sampled deployed reward per update and its trailing rolling mean over ``window`` updates.

    Columns: ``run`` (the run's label), ``signal``, ``seed``, ``update``, ``reward`` (mean G of the
    rollout), ``rolling`` (mean of the last ``window`` updates' rewards, fewer at the start),
    ``oracle`` (share of slates with some correct candidate) and ``slates`` (slates per rollout).
    """
    if window < 1:
        raise ValueError(f"window must be a positive integer, got {window}")
    frames = []
    for run in [runs] if isinstance(runs, Run) else runs:
        m = run.metrics.sort_values("update")
        frames.append(pd.DataFrame({
            "run": run.label, "signal": run.signal, "seed": run.config.get("seed", 0),
            "update": m["update"].to_numpy(), "reward": m["reward"].to_numpy(dtype=float),
            "rolling": m["reward"].astype(float).rolling(window, min_periods=1).mean().to_numpy(),
            "oracle": m["oracle"].to_numpy(dtype=float), "slates": run.slates_per_update}))
    return pd.concat(frames, ignore_index=True)


def health(runs: Run | list[Run]) -> pd.DataFrame:
    """Health metrics in long form: one row per run, update, agent and metric.

    Per-agent metrics (:data:`PER_AGENT_METRICS`) get the agent's name; per-update metrics
    (:data:`SCALAR_METRICS`) get agent ``"all"``. Keys a run's rows do not hold (an older
    recording) are skipped. Columns: ``run``, ``signal``, ``update``, ``agent``, ``metric``, ``value``.
    """
    rows = []
    for run in [runs] if isinstance(runs, Run) else runs:
        for r in run.metrics.to_dict("records"):
            for key in PER_AGENT_METRICS:
                if isinstance(r.get(key), list):
                    rows += [(run.label, run.signal, r["update"], a, key, float(v))
                             for a, v in zip(run.agents, r[key])]
            for key in SCALAR_METRICS:
                v = r.get(key)
                if v is not None and not (isinstance(v, float) and np.isnan(v)):
                    rows.append((run.label, run.signal, r["update"], "all", key, float(v)))
    return pd.DataFrame(rows, columns=["run", "signal", "update", "agent", "metric", "value"])


def eval_table(runs: Run | list[Run], frozen: bool = True) -> pd.DataFrame:
    """Table 1's diagnostics of each finished run, the untrained pool's accuracy, and the frozen model.

    One row per run (its label) with :data:`EVAL_KEYS`, ``initial_accuracy`` (NaN when not
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
    the run did not record are left out. Columns as :func:`paired_difference`.
    """
    e = run.eval
    if e is None or "correct" not in e:
        raise ValueError(f"{run.path}: eval.json has no per-problem 'correct' list (an older recording)")
    pairs = {"trained - frozen base": ("correct", "base_correct"),
             "trained - untrained pool": ("correct", "initial_correct"),
             "untrained pool - frozen base": ("initial_correct", "base_correct")}
    rows = {name: paired_difference(e[a], e[b], level) for name, (a, b) in pairs.items() if a in e and b in e}
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
    return paired_difference(per_problem(a, measure), per_problem(b, measure), level)


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

    ``by="arm"`` names ``a`` and ``b`` by :attr:`Run.arm` instead (``removal-b0.1-group``
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


def slate_credit(run: Run) -> pd.DataFrame:
    """Eq. (19) against the exact removal contribution on a run's logged slates.

    For every logged slate (update u, slate g; the slates of one prompt are ``m`` consecutive
    ones) and agent i: the candidate's reward ``R``, the propensity ``p``, the outcome model
    ``mu_hat``, whether it was deployed, and three credits from
    :func:`mcpg.grpo.objective.credit`:

    - ``removal``: Eq. (19) from the deployed reward G = R^(I) only (what ``removal`` trains on);
    - ``removal_expected``: its exact expectation over the router's draw I ~ p given the
      slate, ``sum_j p_j Delta_hat_i(I=j, G=R^(j))``;
    - ``oracle``: the exact removal contribution ``sum_j p_j R^(j) - sum_{j != i} p^{-i}_j R^(j)``.

    Corollary 3: ``removal_expected == oracle`` for any fixed ``mu_hat``. ``logged`` is the
    credit the run trained on (its signal's), which must equal that signal's recomputed credit.

    A run with ``exact_budget`` also logs each slate's evaluation probability and draw (paper
    §7): ``exact_p`` and ``exact_z`` (NaN for a run without them). Its ``logged`` credit is then
    Eq. (21), ``removal + exact_z / exact_p * (oracle - removal)``.

    ``cut`` (the candidate was cut at the token budget) and ``tokens`` (its length) are read
    where the engine logged them (runs recorded before it did: NaN).
    """
    if not run.slates:
        raise ValueError(f"{run.path} holds no slates.jsonl")
    m = int(run.config["completions_per_agent"])
    frames = []
    for row in run.slates:
        R, p = np.asarray(row["R"], float), np.asarray(row["p"], float)
        P, mu = np.asarray(row["P"], float), np.asarray(row["mu_hat"], float)
        sel, G = np.asarray(row["I"], int), np.asarray(row["G"], float)
        n, K = R.shape
        removal = credit("removal", sel, G, p, P, mu)
        oracle = credit("oracle", sel, G, p, P, mu, rewards_all=R)
        expected = sum(p[:, [j]] * credit("removal", np.full(n, j), R[:, j], p, P, mu) for j in range(K))
        frames.append(pd.DataFrame({
            "update": row["update"], "slate": np.repeat(np.arange(n), K),
            "prompt": np.repeat(np.arange(n) // m, K),
            "agent": np.tile(run.agents, n), "R": R.ravel(), "p": p.ravel(), "mu_hat": mu.ravel(),
            "deployed": (sel[:, None] == np.arange(K)).ravel(), "G": np.repeat(G, K),
            "removal": removal.ravel(), "removal_expected": expected.ravel(), "oracle": oracle.ravel(),
            "logged": np.asarray(row["score"], float).ravel(),
            **{key: np.repeat(np.asarray(row[key], float), K) if key in row else np.nan
               for key in ("exact_p", "exact_z")},
            **{key: np.asarray(row[key], float).ravel() if key in row else np.nan
               for key in ("cut", "tokens")}}))
    return pd.concat(frames, ignore_index=True)


def allocation_risks(run: Run, flat: float = 1e-3) -> pd.DataFrame:
    """Theorem 2's gradient risk of the exact evaluations a budgeted run drew, rollout by rollout.

    For each logged rollout of a run with ``exact_budget`` (its slates carry ``exact_p`` and
    ``exact_z``), from :func:`slate_credit`: η² is the squared error of Eq. (19) against the
    exact removal contribution, σ² = 0 (an exact evaluation is the contribution itself) and
    a the leverage of :func:`~mcpg.grpo.objective.credit_leverage` on Eq. (19)'s scores over
    each agent's group of m slates, with the run's ``scale_rewards`` (what the engine's
    allocation weighs). One evaluation serves a slate's K agents
    (:func:`mcpg.allocation.slate_entries`) and costs K − 1 reward queries. Columns, one row per
    update:

    - ``evaluated``: slates evaluated exactly (Z = 1);
    - ``Eq. (19) alone``: Σ a² η², the error of the uncorrected estimate;
    - ``risk allocated``: :func:`mcpg.allocation.allocation_risk` of the logged p, the expected
      error of Eq. (21)'s credit over the draws Z (Theorem 2);
    - ``realised``: Σ a² (Δ̃ − Y)² of the credit the run trained on (one draw of Z);
    - ``risk uniform``: the uniform allocation of the same expected cost Σ p (K − 1);
    - ``Theorem 3 bound``: the least risk of any allocation of that cost
      (:func:`mcpg.allocation.risk_lower_bound`);
    - ``Eq. (19), flat groups``: the part of ``Eq. (19) alone`` on groups whose Eq. (19)
      scores have a standard deviation below ``flat``, where the standardised leverage is
      near its largest, 1/eps.
    """
    sc = slate_credit(run)
    if sc["exact_p"].isna().any():
        raise ValueError(f"{run.path}: its slates log no exact_p (a run without exact_budget)")
    K, m = len(run.agents), int(run.config["completions_per_agent"])
    eps = run.advantage_eps
    rows = []
    for update, g in sc.groupby("update", sort=True):
        removal = g["removal"].to_numpy().reshape(-1, m, K)
        a = credit_leverage(removal, run.scale_rewards, eps, axis=-2).reshape(-1, K)
        eta2 = ((g["removal"] - g["oracle"]).to_numpy() ** 2).reshape(-1, K)
        is_flat = np.broadcast_to(removal.std(axis=1, ddof=1, keepdims=True) < flat, removal.shape)
        one, s2, e2 = allocation.slate_entries(a, np.zeros_like(eta2), eta2)
        p = g["exact_p"].to_numpy()[::K]
        cost = np.full(p.size, K - 1.0)
        spent = float(p @ cost)
        uniform = allocation.uniform_allocation(cost, spent)
        rows.append({
            "update": update, "evaluated": int(g["exact_z"].to_numpy()[::K].sum()),
            "Eq. (19) alone": float(e2.sum()),
            "risk allocated": allocation.allocation_risk(p, one, s2, e2),
            "realised": float((a**2 * ((g["logged"] - g["oracle"]).to_numpy() ** 2).reshape(-1, K)).sum()),
            "risk uniform": allocation.allocation_risk(uniform, one, s2, e2),
            "Theorem 3 bound": allocation.risk_lower_bound(one, s2, e2, cost, spent),
            "Eq. (19), flat groups": float((a**2 * eta2)[is_flat.reshape(-1, K)].sum()),
        })
    return pd.DataFrame(rows).set_index("update")


def advantage_distance(run: Run) -> dict:
    """How far the GRPO advantages a run trained on lay from the exact signal's, on its own completions.

    From :func:`slate_credit`, three credits of every logged completion become advantages
    (:func:`~mcpg.grpo.objective.group_advantages` with the run's ``scale_rewards`` and
    ``advantage_eps``, standardised when a recording predates the key, as the engine's default
    is; an agent's m slates of one prompt are a group): the credit the run
    trained on (``logged``; Eq. (21) for a budgeted run), Eq. (19) (``removal``) and the exact
    removal contribution (``oracle``). Unlike :func:`allocation_risks`' first-order leverage,
    this is exact, and bounded where a group's scores barely differ.

    Returns ``trained`` and ``eq19``: the mean squared distance of those advantages from the
    oracle's; ``trained_corr`` and ``eq19_corr``: their correlation with the oracle's; the same
    four with suffix ``_signal`` over the groups with a right candidate (elsewhere the oracle's
    advantages are 0); and ``signal_groups``, those groups' share.
    """
    sc = slate_credit(run)
    K, m = len(run.agents), int(run.config["completions_per_agent"])
    eps = run.advantage_eps

    def adv(col: str) -> np.ndarray:
        x = sc[col].to_numpy(dtype=float, copy=True).reshape(len(run.slates), -1, m, K)
        return np.asarray(group_advantages(x, run.scale_rewards, eps)).ravel()

    exact, trained, eq19 = adv("oracle"), adv("logged"), adv("removal")
    signal = (sc.groupby(["update", "prompt"])["R"].transform("max") > 0).to_numpy()

    def corr(x, y):
        return float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else float("nan")

    out = {"signal_groups": float(signal.mean())}
    for name, a in (("trained", trained), ("eq19", eq19)):
        for suffix, sel in (("", slice(None)), ("_signal", signal)):
            out[name + suffix] = float(((a - exact)[sel] ** 2).mean())
            out[f"{name}_corr{suffix}"] = corr(a[sel], exact[sel])
    return out


def group_signal(run: Run) -> pd.DataFrame:
    """Per GRPO group of a run's logged slates: is there a reward to learn from, and how far did it move?

    A group is one agent's ``m`` completions of one prompt (``m`` consecutive logged slates).
    One row per (update, prompt, agent) with:

    - ``any_correct``: some candidate on the group's slates is right (any agent's ``R = 1``);
      without one, every credit in the group is the outcome model's term alone;
    - ``own_correct``: some of this agent's own candidates is right;
    - ``score_std``: the unbiased spread of the agent's ``m`` logged credits;
    - ``mean_abs_advantage``: the mean ``|A|`` the run trained on, the logged credits through
      :func:`mcpg.grpo.objective.group_advantages` with the run's ``scale_rewards`` and
      ``advantage_eps``. With ``"group"`` scaling it is of order one for any group whose spread
      is well above ``advantage_eps``, however small that spread is: Eq. (19)'s noise in a
      group with no right candidate is standardised to steps as large as a real signal's.
    """
    if not run.slates:
        raise ValueError(f"{run.path} holds no slates.jsonl")
    m = int(run.config["completions_per_agent"])
    scale = run.scale_rewards
    eps = run.advantage_eps
    frames = []
    for row in run.slates:
        R, S = np.asarray(row["R"], float), np.asarray(row["score"], float)
        n, K = R.shape
        if n % m:
            raise ValueError(f"update {row['update']}: {n} slates are not whole groups of m = {m}")
        R, S = R.reshape(n // m, m, K), S.reshape(n // m, m, K)
        A = group_advantages(S, scale_rewards=scale, eps=eps, axis=-2)
        frames.append(pd.DataFrame({
            "update": row["update"], "prompt": np.repeat(np.arange(n // m), K),
            "agent": np.tile(run.agents, n // m),
            "any_correct": np.repeat(R.max(axis=(1, 2)) > 0, K), "own_correct": (R.max(axis=1) > 0).ravel(),
            "score_std": S.std(axis=1, ddof=1).ravel(),
            "mean_abs_advantage": np.abs(A).mean(axis=1).ravel()}))
    return pd.concat(frames, ignore_index=True)


def _grouped_slates(run: Run):
    """Each logged update's row with its slates as GRPO groups: ``p``, ``P``, ``mu_hat`` and
    ``R`` shaped ``(prompts, m, K)`` (``P``: ``(prompts, m, K, K)``)."""
    if not run.slates:
        raise ValueError(f"{run.path} holds no slates.jsonl")
    m = int(run.config["completions_per_agent"])
    for row in run.slates:
        arrays = [np.asarray(row[k], float) for k in ("p", "P", "mu_hat", "R")]
        n = arrays[0].shape[0]
        if n % m:
            raise ValueError(f"update {row['update']}: {n} slates are not whole groups of m = {m}")
        yield row, [x.reshape((n // m, m) + x.shape[1:]) for x in arrays]


def expected_advantage(run: Run) -> pd.DataFrame:
    """The advantage each completion's credit gets *on average over the router's draws*, given
    the completions: ``E[A | completions]`` under both advantage scalings, on the logged slates.

    Within one GRPO group (agent i, one prompt's m slates) the router draws I_g ~ p_g on each
    slate independently; :func:`mcpg.grpo.objective.expected_advantages` sums the run's signal's
    advantages over all K^m joint draws, exactly.

    Centred advantages are linear in the credits, so their expectation is the centred
    *expected* credit; for ``removal`` that is the centred exact removal contribution
    (Corollary 3), 0 in a group with no right candidate. Standardising divides by the group's
    realised spread, which depends on the draws, so the expectation of a ratio is no longer
    the ratio of expectations: in a group with no right candidate it is not 0 but follows
    whatever the outcome model's term does with the draws. One row per (update, slate, agent):
    ``prompt``, ``R``, ``p``, ``mu_hat``, ``any_correct`` (some candidate of the group's slates
    is right), ``expected_credit``, ``expected_group`` (standardised, the run's
    ``advantage_eps``) and ``expected_none`` (centred).
    """
    eps = run.advantage_eps
    frames = []
    for row, groups in _grouped_slates(run):
        p, P, mu, R = (x.reshape((-1,) + x.shape[2:]) for x in groups)
        n, K = R.shape
        m = groups[0].shape[1]
        ea = {sc: expected_advantages(run.signal, *groups, scale_rewards=sc, eps=eps).reshape(n, K)
              for sc in ("group", "none")}
        expected_credit = sum(p[:, [j]] * credit(run.signal, np.full(n, j), R[:, j], p, P, mu, rewards_all=R)
                              for j in range(K))
        any_correct = np.repeat(R.reshape(n // m, m * K).max(1) > 0, m)
        frames.append(pd.DataFrame({
            "update": row["update"], "slate": np.repeat(np.arange(n), K),
            "prompt": np.repeat(np.arange(n) // m, K),
            "agent": np.tile(run.agents, n), "R": R.ravel(), "p": p.ravel(), "mu_hat": mu.ravel(),
            "any_correct": np.repeat(any_correct, K), "expected_credit": expected_credit.ravel(),
            "expected_group": ea["group"].ravel(), "expected_none": ea["none"].ravel()}))
    return pd.concat(frames, ignore_index=True)


def slate_groups(run: Run) -> list[np.ndarray]:
    """All of a run's logged slates as GRPO groups, updates one after another: ``[p, P, mu_hat,
    R]``, each ``(groups, m, K)`` (``P``: ``(groups, m, K, K)``), the arrays that
    :func:`mcpg.grpo.objective.advantage_moments` and the simulated pool's
    ``group_diagnostics`` read."""
    return [np.concatenate(x) for x in zip(*(g for _, g in _grouped_slates(run)))]


def advantage_alignment(run: Run, signals=("wta", "removal", "oracle"),
                        scalings=("group", "none")) -> pd.DataFrame:
    """How much of each signal's GRPO advantage is about the completion it is given, on one
    run's logged slates: :func:`mcpg.grpo.objective.advantage_alignment` over all its groups.

    The slates are the run's own, so every signal is read on the same completions, routed by
    the same router: what winner-take-all, Eq. (19) and the exact removal contribution would
    have handed these completions. One row per (signal, scaling): ``corr`` (of the advantage
    with the completion's own reward, over completions and the router's draws), ``rms`` and
    ``expected_share`` (the part of ``E[A^2]`` left after averaging over the draws).
    """
    eps = run.advantage_eps
    groups = slate_groups(run)
    return pd.DataFrame([{"signal": s, "scaling": sc,
                          **objective_alignment(s, *groups, scale_rewards=sc, eps=eps)}
                         for s in signals for sc in scalings]).set_index(["signal", "scaling"])


def advantage_by_outcome(run: Run, signals=("wta", "removal", "oracle"),
                         scalings=("group", "none")) -> pd.DataFrame:
    """Which completions each signal's advantage pushes towards, on one run's logged slates:
    :func:`mcpg.grpo.objective.advantage_by_outcome` over all its groups.

    One row per (signal, scaling), one column per kind of completion
    (``mcpg.grpo.objective.OUTCOMES``): the mean of ``E[A | completions]`` over that kind,
    in units of the advantage's rms. A right answer that another agent's candidate on the same
    slate also gets right is where winner-take-all's and the exact removal contribution's
    advantages part. The kinds' shares of the completions are in ``frame.attrs["share"]``.
    """
    eps = run.advantage_eps
    groups = slate_groups(run)
    rows = {}
    for s in signals:
        for sc in scalings:
            out = objective_by_outcome(s, *groups, scale_rewards=sc, eps=eps)
            rows[(s, sc)] = {k: v["mean_advantage"] for k, v in out.items()}
    frame = pd.DataFrame(rows).T.rename_axis(["signal", "scaling"])
    frame.attrs["share"] = {k: v["share"] for k, v in out.items()}  # R alone fixes them
    return frame


def advantage_bias(expected: pd.DataFrame) -> pd.Series:
    """The bias of an advantage scaling, summed up from :func:`expected_advantage`'s frame.

    Over the rows of groups with no right candidate, where the exact removal contribution is 0
    and an unbiased credit has nothing to push: ``groups without a right candidate`` (their
    share), the mean size of ``E[A | completions]`` standardised and centred, and the correlation
    of the standardised one with the completion's propensity ``p`` and with ``mu_hat`` (NaN
    when either does not vary). Centred, the mean size is 0 for ``removal`` (Corollary 3).
    """
    dead = expected[~expected["any_correct"].astype(bool)]

    def corr(x: str) -> float:
        a, b = dead["expected_group"].to_numpy(), dead[x].to_numpy()
        return float(np.corrcoef(a, b)[0, 1]) if len(dead) > 1 and a.std() > 0 and b.std() > 0 else np.nan

    return pd.Series({
        "groups without a right candidate": 1 - float(expected["any_correct"].mean()),
        "mean |E[A]|, standardised": float(dead["expected_group"].abs().mean()),
        "mean |E[A]|, centred": float(dead["expected_none"].abs().mean()),
        "corr with p": corr("p"), "corr with mu_hat": corr("mu_hat"),
    })


def recording_summary(run: Run) -> dict:
    """Counts behind a diagnosis of one recording, from its metrics rows and eval.json.

    ``truncated_mean``/``_min``/``_max``: share of completions cut at ``max_new_tokens``;
    ``agent_updates``: updates x agents; ``no_correct``: agent-updates none of whose sampled
    completions is right (every group of that agent has zero reward spread);
    ``no_credit``: agent-updates whose credit scores are all 0 (for ``wta``, whose scores are
    >= 0, ``credit_mean == 0`` means exactly that: every group standardises to advantage 0);
    ``groups``/``groups_without_signal_min``: the agent's groups in total and a lower bound on
    those without signal (all groups of credit-free agent-updates; ``wta`` only, else None);
    ``rollouts_no_correct``: updates with no correct candidate in the whole rollout (``oracle == 0``);
    ``max_deployed_fraction``: at evaluation, the largest share of problems one agent got.
    """
    m = run.metrics
    acc = np.array(m["agent_accuracy"].tolist(), dtype=float)
    cm = np.array(m["credit_mean"].tolist(), dtype=float)
    groups_per = int(run.config["prompts_per_update"])
    no_credit = int((cm == 0).sum()) if run.signal == "wta" else None
    return {
        "updates": len(m), "truncated_mean": float(m["truncated"].mean()),
        "truncated_min": float(m["truncated"].min()), "truncated_max": float(m["truncated"].max()),
        "agent_updates": int(acc.size), "no_correct": int((acc == 0).sum()),
        "no_credit": no_credit, "groups": int(acc.size * groups_per),
        "groups_without_signal_min": None if no_credit is None else no_credit * groups_per,
        "rollouts_no_correct": int((m["oracle"] == 0).sum()),
        "max_deployed_fraction": None if run.eval is None else float(max(run.eval["deployed_fraction"])),
    }


HEALTH_BARS = {"truncated": 0.25, "router_auc": 0.70}
"""The bars a run clears before its credit signal is compared with another's.

``truncated`` is the largest share of completions cut at the token budget over a run's last five
updates (above it, a comparison compares answer formats); ``router_auc`` the smallest held-out
ROC AUC of the outcome model (below it, the router cannot route). :func:`health_table` adds a
third bar, deployed accuracy at least the agents' mean (a router no worse than a uniform draw)."""


def health_table(runs: Run | list[Run], last: int = 5) -> pd.DataFrame:
    """One row per finished run, indexed by ``(arm, seed)``: is it healthy enough to compare?

    Columns: ``cut`` (share of completions cut, mean over the last ``last`` updates), ``cut,
    held-out`` (the share of the held-out greedy answers cut at the evaluation's budget, eval.json's
    ``truncated``; not a bar: a run can pass ``cut`` in training and still cut many answers where it
    is measured), ``zero-spread`` (share of GRPO groups whose rewards are all equal, over the same
    updates and the agents), ``router_auc`` and ``router_auc_within`` (eval.json), ``deployed``
    (held-out accuracy), ``agents' mean`` (``uniform_accuracy``: a uniform router), ``best_of_k``,
    ``largest share`` (the largest share of held-out problems one agent was sent: routing collapse
    when near 1), and ``healthy``: ``cut`` <= ``HEALTH_BARS["truncated"]``, ``router_auc`` >=
    ``HEALTH_BARS["router_auc"]`` and ``deployed`` >= ``agents' mean``.
    """
    if last < 1:
        raise ValueError(f"last must be a positive integer, got {last}")

    def row(r: Run) -> dict:
        tail = r.metrics.sort_values("update").tail(last)
        zero = (np.array(tail["zero_std_reward_fraction"].tolist(), dtype=float).mean()
                if "zero_std_reward_fraction" in tail else float("nan"))
        e = r.eval
        auc = e.get("router_auc")
        out = {"cut": float(tail["truncated"].mean()),
               "cut, held-out": float(e.get("truncated", np.nan)), "zero-spread": float(zero),
               "router_auc": np.nan if auc is None else float(auc),
               "router_auc_within": (np.nan if e.get("router_auc_within") is None
                                     else float(e["router_auc_within"])),
               **_held_out(e), "largest share": float(max(e["deployed_fraction"]))}
        out["healthy"] = bool(out["cut"] <= HEALTH_BARS["truncated"]
                              and out["router_auc"] >= HEALTH_BARS["router_auc"]
                              and out["deployed"] >= out["agents' mean"] - 1e-12)
        return out

    return _by_arm_and_seed(runs, row)


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


def probe_answers(probe: str | os.PathLike, run: Run | None = None) -> pd.DataFrame:
    """A probe's regenerated held-out answers, one row per (problem, agent), with the run's grades.

    ``probe`` is a folder written by ``scripts/ch08_cut_answers.py`` (``samples.jsonl``: problem,
    agent, text, cut and the cut's kind; ``summary.json``); ``run`` the run whose final agents it
    regenerated. With a run, adds ``right`` (``agent_correct`` of its eval.json) and ``mu_hat``
    (the outcome model's estimate that the answer is right, eval.json's ``mu_hat``). Refuses a
    probe whose summary does not say that the regenerated answers reproduce the run's grades (so
    they are the answers the run was graded on), and rows that do not fit the run's problems and
    agents.
    """
    probe = Path(probe)
    summary = read_json(probe / "summary.json")
    if summary is None:
        raise FileNotFoundError(f"{probe} holds no summary.json: not a probe folder")
    if not summary.get("reproduces_agent_correct"):
        raise ValueError(f"{probe}: the regenerated answers do not reproduce the run's grades")
    answers = pd.DataFrame(read_jsonl(probe / "samples.jsonl"))
    if answers.empty:
        raise ValueError(f"{probe}: samples.jsonl holds no answers")
    if run is None:
        return answers
    if run.eval is None or "mu_hat" not in run.eval:
        raise ValueError(f"{run.path}: eval.json has no mu_hat (unfinished or an older recording)")
    right = np.asarray(run.eval["agent_correct"])
    if answers["problem"].max() >= right.shape[0] or answers["agent"].max() >= right.shape[1]:
        raise ValueError(f"{probe}: its answers do not fit {run.path}'s {right.shape} held-out grades")
    at = answers["problem"].to_numpy(), answers["agent"].to_numpy()
    answers["right"] = right[at].astype(int)
    answers["mu_hat"] = np.asarray(run.eval["mu_hat"], dtype=float)[at]
    return answers


def feedback_table(runs: Run | list[Run]) -> pd.DataFrame:
    """What each finished run paid for feedback, indexed by ``(arm, seed)`` (paper §7).

    A reward query beyond the deployed one is the unit of cost: an exact evaluation of a slate
    queries its K - 1 undeployed candidates. ``removal`` with ``exact_budget`` b evaluates a
    share of about b of its slates (Eq. 21's Z = 1, logged per update as ``exact_evaluations``);
    the ``oracle`` evaluates every slate; ``wta`` and ``removal`` without a budget none.

    Columns: ``budget`` (the config's ``exact_budget``; 1 for the oracle), ``exact share``
    (slates evaluated exactly / slates, over the run), ``feedback cost`` (reward queries beyond
    the deployed ones, over the run), ``cost per update``, and the held-out ``deployed``,
    ``agents' mean`` and ``best_of_k`` (as in :func:`health_table`).
    """
    def row(r: Run) -> dict:
        m = r.metrics
        slates = len(m) * r.slates_per_update
        if r.signal == "oracle":
            exact, budget = slates, 1.0
        else:
            exact = int(m["exact_evaluations"].sum()) if "exact_evaluations" in m else 0
            budget = float(r.config.get("exact_budget", 0.0)) if r.signal == "removal" else 0.0
        cost = exact * (len(r.agents) - 1)
        return {"budget": budget, "exact share": exact / slates, "feedback cost": cost,
                "cost per update": cost / len(m), **_held_out(r.eval)}

    return _by_arm_and_seed(runs, row)
