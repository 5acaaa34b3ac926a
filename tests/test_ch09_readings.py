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
