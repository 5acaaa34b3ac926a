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
