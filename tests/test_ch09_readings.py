"""Chapter 9's readings of its budgeted LLM runs: where the evaluation probabilities lay."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mcpg.grpo.rundir import Run
from mcpg.grpo.slate_diagnostics import evaluation_probabilities


def _run(rows):
    return Run(path=Path("budgeted"), config={"exact_budget": 0.3}, signal="removal",
               agents=["a", "b", "c"], metrics=pd.DataFrame(), slates=rows)


def test_evaluation_probabilities_counts_each_kind_of_slate():
    run = _run([{"update": 1, "exact_p": [0.0, 1.0, 0.6, 0.0]},
                {"update": 2, "exact_p": [0.0, 0.0, 0.0, 0.0]}])
    t = evaluation_probabilities(run)
    assert list(t.index) == [1, 2]
    assert t.loc[1, ["slates", "at 0", "at 1", "between"]].tolist() == [4, 2, 1, 1]
    assert t.loc[1, "least positive"] == 0.6
    assert t.loc[1, "expected evaluations"] == pytest.approx(1.6)
    assert np.isnan(t.loc[2, "least positive"]) and t.loc[2, "at 0"] == 4
    # every slate is counted once
    assert (t[["at 0", "at 1", "between"]].sum(axis=1) == t["slates"]).all()


def test_evaluation_probabilities_of_a_uniform_allocation_lie_between():
    t = evaluation_probabilities(_run([{"update": 1, "exact_p": [0.1] * 8}]))
    assert t.loc[1, "between"] == 8 and t.loc[1, "at 0"] == 0 and t.loc[1, "at 1"] == 0


def test_evaluation_probabilities_refuses_a_run_without_a_budget():
    with pytest.raises(ValueError, match="exact_p"):
        evaluation_probabilities(_run([{"update": 1, "p": [[0.5, 0.5]]}]))
    with pytest.raises(ValueError, match="no slates"):
        evaluation_probabilities(_run([]))


RECORDED = Path(__file__).resolve().parents[1] / "data" / "results" / "ch09" / "llm" / "grid-mask"


@pytest.mark.skipif(not RECORDED.is_dir(), reason="chapter 9's LLM arms are not recorded here")
def test_the_recorded_top_n_rule_is_deterministic_at_a_tenth():
    """Chapter 9 says so: at b = 0.1 every slate of the top-n rule has p = 0 or 1, the same
    count at 1 on every rollout; at b = 0.3 every positive p is above one half."""
    from mcpg.grpo.rundir import read_run

    for budget in ("0.1", "0.3"):
        for seed in sorted((RECORDED / f"leverage-b{budget}-group").glob("seed*")):
            t = evaluation_probabilities(read_run(seed))
            assert (t["least positive"] > 0.5).all()
            if budget == "0.1":
                assert (t["between"] == 0).all() and t["at 1"].nunique() == 1


RESULTS = Path(__file__).resolve().parents[1] / "data" / "results"
BUDGET_GRID = RESULTS / "ch09" / "budget.json"


def _holm(pvals: dict) -> dict:
    """Holm's adjusted p-values, written out here apart from the chapter's own."""
    order = sorted(pvals, key=pvals.get)
    m, out, run = len(order), {}, 0.0
    for i, k in enumerate(order):
        run = max(run, min(1.0, (m - i) * pvals[k]))
        out[k] = run
    return out


def test_holm_lies_between_the_raw_p_values_and_bonferroni():
    raw = {"a": 0.001, "b": 0.02, "c": 0.03, "d": 0.5}
    adj = _holm(raw)
    assert adj == pytest.approx({"a": 0.004, "b": 0.06, "c": 0.06, "d": 0.5})
    assert all(raw[k] <= adj[k] <= min(1.0, 4 * raw[k]) for k in raw)


def _sim_accuracy(grid, scale, method, budget, alloc):
    cells = {(r["scale_rewards"], r["method"], r["exact_budget"], r["allocation"]): r
             for r in grid["results"]}
    return np.asarray(cells[(scale, method, budget, alloc)]["final"]["accuracy"])


@pytest.mark.skipif(not BUDGET_GRID.is_file(), reason="chapter 9's simulated grid is not recorded here")
def test_the_simulated_lead_of_top_n_over_uniform_survives_holm_at_2_percent_only():
    """Chapter 9: with centred advantages top-n's lead over uniform at the same budget lies apart
    from 0 at 2 % and 25 %, and Holm's correction over the 30 intervals against uniform keeps
    the first only; standardised, its deficits at 25 and 50 % are kept."""
    import json

    from scipy.stats import ttest_1samp

    grid = json.loads(BUDGET_GRID.read_text())
    p = {}
    for scale in ("none", "group"):
        for alloc in grid["allocations"]:
            if alloc == "uniform":
                continue
            for b in grid["budgets"]:
                d = (_sim_accuracy(grid, scale, "removal", b, alloc)
                     - _sim_accuracy(grid, scale, "removal", b, "uniform"))
                p[(scale, alloc, b)] = float(ttest_1samp(d, 0.0).pvalue)
    assert len(p) == 30
    adj = _holm(p)
    assert p[("none", "leverage", 0.02)] < 0.05 and p[("none", "leverage", 0.25)] < 0.05
    assert adj[("none", "leverage", 0.02)] < 0.05  # kept (Bonferroni keeps it too)
    assert 30 * p[("none", "leverage", 0.02)] < 0.05
    assert adj[("none", "leverage", 0.25)] > 0.05  # not kept
    assert adj[("group", "leverage", 0.25)] < 0.05 and adj[("group", "leverage", 0.5)] < 0.05


@pytest.mark.skipif(not BUDGET_GRID.is_file(), reason="chapter 9's simulated grid is not recorded here")
def test_sqrt_lies_near_theorem_3s_bound_with_centred_advantages_only():
    """Chapter 9: up to a 25 % budget the square-root rule's median risk is at most 2.0 times
    Theorem 3's bound with centred advantages and more than a hundred times at 25 % with
    standardised ones; the uniform rule's is above 4 centred."""
    import json

    grid = json.loads(BUDGET_GRID.read_text())
    cells = {(r["scale_rewards"], r["method"], r["exact_budget"], r["allocation"]): r
             for r in grid["results"]}

    def ratio(scale, alloc, b):
        ex = cells[(scale, "removal", b, alloc)]["exact"]
        return float(np.median(np.asarray(ex["risk"]) / np.asarray(ex["risk_bound"])))

    small = [b for b in grid["budgets"] if b <= 0.25]
    assert max(ratio("none", "sqrt", b) for b in small) < 2.05
    assert min(ratio("none", "uniform", b) for b in small) > 4
    assert ratio("group", "sqrt", 0.25) > 100


@pytest.mark.skipif(not RECORDED.is_dir(), reason="chapter 9's LLM arms are not recorded here")
def test_the_budgeted_runs_name_two_transformers_versions_and_each_pair_shares_one():
    """Chapter 9's configuration box: transformers 5.25.0 on 6 of the 12 budgeted runs, 5.24.0
    on the others and on every baseline of chapter 8 it reads; top-n and uniform at one
    budget and seed ran on one version."""
    import json

    def version(run):
        return json.loads((run / "PROVENANCE.json").read_text())["machine"]["transformers"]

    runs = sorted(RECORDED.glob("*-b*-group/seed*"))
    assert len(runs) == 12
    versions = {(r.parent.name, r.name): version(r) for r in runs}
    assert sorted(versions.values()).count("5.25.0") == 6
    assert set(versions.values()) == {"5.24.0", "5.25.0"}
    for (arm, seed), v in versions.items():
        twin = arm.replace("leverage", "uniform")
        assert versions[(twin, seed)] == v
    base = RESULTS / "ch08" / "grid-mask"
    assert {version(r) for a in ("removal-group", "oracle-group")
            for r in (base / a).glob("seed*")} == {"5.24.0"}
