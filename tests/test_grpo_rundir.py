"""The run directory's schema (mcpg.grpo.rundir): every key the engine logs is declared, once."""

import json
from pathlib import Path

import pytest

from mcpg.grpo import rundir
from mcpg.grpo.runs import health

FIXTURE = Path(__file__).parent / "fixtures"


def test_each_key_is_declared_once():
    for keys in (rundir.METRICS_KEYS, rundir.SLATE_KEYS + rundir.SLATE_BUDGET_KEYS, rundir.EVAL_FILE_KEYS):
        assert len(keys) == len(set(keys))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A budgeted removal run on the tiny model (every key a run can log) with an evaluation
    inside the metrics rows."""
    import os

    import torch

    from mcpg.grpo.train import train

    old_env, n = os.environ.get("MCPG_GSM8K_DIR"), torch.get_num_threads()
    os.environ["MCPG_GSM8K_DIR"] = str(FIXTURE / "gsm8k")
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("rundir") / "run"
        train("tiny-random", "removal", out, updates=2, exact_budget=0.5, eval_every=1, eval_initial=True)
    finally:
        torch.set_num_threads(n)
        if old_env is None:
            os.environ.pop("MCPG_GSM8K_DIR")
        else:
            os.environ["MCPG_GSM8K_DIR"] = old_env
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def test_every_logged_metric_is_declared(run):
    rows = _rows(run / rundir.METRICS)
    assert "eval" in rows[0]
    for r in rows:
        assert set(r) - {"eval"} == set(rundir.METRICS_KEYS) | set(rundir.AGENT_DIAGNOSTICS)
        assert all(len(r[k]) == 3 for k in rundir.PER_AGENT_METRICS + tuple(rundir.AGENT_DIAGNOSTICS))
        assert not any(isinstance(r[k], (list, dict)) for k in rundir.SCALAR_METRICS)
    assert set(rows[0]["eval"]) == set(rundir.EVAL_FILE_KEYS)
    for s in _rows(run / rundir.SLATES):
        assert set(s) == {"update", *rundir.SLATE_KEYS, *rundir.SLATE_BUDGET_KEYS}
    assert set(json.loads((run / rundir.INITIAL_EVAL).read_text())) == set(rundir.EVAL_FILE_KEYS)
    final = set(json.loads((run / rundir.EVAL).read_text()))
    assert final - set(rundir.EVAL_FILE_KEYS) == {"signal", "updates", "initial_accuracy", "initial_correct",
                                                   "initial_agent_accuracy", "initial_deployed_fraction"}
    assert (run / rundir.PROVENANCE).exists() and (run / rundir.ROUTER).exists()


def test_health_keeps_every_declared_metric(run):
    from mcpg.grpo.runs import read_run

    h = health(read_run(run))
    assert set(h["metric"]) == set(rundir.PER_AGENT_METRICS) | set(rundir.SCALAR_METRICS)


def test_each_diagnostic_is_namespaced_and_has_its_meaning():
    assert all(k.startswith("agent/") and len(v) > 20 for k, v in rundir.AGENT_DIAGNOSTICS.items())
    assert not set(rundir.AGENT_DIAGNOSTICS) & set(rundir.METRICS_KEYS)


def test_every_metric_has_its_meaning_in_the_engines_table():
    """mcpg.grpo.train's table of logged metrics names every key of METRICS_KEYS and nothing else
    but ``eval`` and the ``agent/`` diagnostics (whose meanings AGENT_DIAGNOSTICS holds)."""
    import re

    import mcpg.grpo.train as train

    table = train.__doc__.split("Logged metrics")[1].split("Evaluation (")[0]
    documented = set(re.findall(r"^``([\w/.]+)``", table, re.M))
    assert documented == set(rundir.METRICS_KEYS) | {"eval", "agent/..."}


def test_the_recorded_reference_runs_hold_the_declared_keys():
    """The runs recorded before the refactor (tests/fixtures/reference) log the same keys (and
    none of the per-agent diagnostics, which came later)."""
    for case in sorted(d for d in (FIXTURE / "reference").iterdir() if d.is_dir()):
        for r in _rows(case / rundir.METRICS):
            assert set(r) - {"eval"} == set(rundir.METRICS_KEYS), case.name


def test_writer_truncates_to_the_checkpoint(tmp_path):
    w = rundir.RunWriter(tmp_path)
    for u in (1, 2, 3):
        w.update({"update": u, "x": u}, {"R": [[u]]})
    w.truncate(2)
    assert [r["update"] for r in _rows(tmp_path / rundir.METRICS)] == [1, 2]
    assert [r["R"] for r in _rows(tmp_path / rundir.SLATES)] == [[[1]], [[2]]]


def test_slates_reshape_rows_and_back():
    """Row b*K*m + k*m + g (problem b, agent k, completion g) is slate (b, g), candidate k."""
    import numpy as np
    import torch

    from mcpg.grpo.slates import Slates

    B, m, K = 2, 3, 4
    s = Slates(B, m, K)
    rows = np.arange(B * K * m)
    x = s.from_rows(rows)
    for b in range(B):
        for k in range(K):
            for g in range(m):
                assert x[b, g, k] == b * K * m + k * m + g
    assert (s.to_rows(x) == rows).all()
    assert s.logged(x).shape == (B * m, K) and (s.logged(x)[m + 1] == x[1, 1]).all()
    feats = torch.arange(B * K * m * 5).reshape(-1, 5)
    t = s.from_rows(feats)
    assert t.shape == (B, m, K, 5) and torch.equal(t[1, 2, 3], feats[1 * K * m + 3 * m + 2])
    assert torch.equal(s.to_rows(t), feats)


def test_metrics_row_reads_the_gathered_log():
    """Two slates of K = 2 by hand: every declared key, each from its own entries of the log."""
    log = {"R": [[1.0, 0.0], [0.0, 0.0]], "G": [1.0, 0.0], "I": [0, 1], "entropy": [0.5, 0.7],
           "brier": [0.1, 0.3], "spec": [1], "len": [3.0, 5.0, 7.0, 9.0], "trunc": [0.0, 1.0, 0.0, 0.0],
           "score": [[1.0, 0.0], [0.0, 0.5]], "zero_std": [[0, 1]], "zero_std_reward": [[0, 1]],
           "exact_z": [1, 0], "exact_p": [0.5, 0.25]}
    row = rundir.metrics_row(log, 2, update=3, signal="removal", losses=[0.1, 0.2], router_loss=0.6,
                             clip_fraction=0.0, router_slates=6, seconds={"total": 1.0})
    assert list(row) == [k for k in row if k in rundir.METRICS_KEYS] and set(row) == set(rundir.METRICS_KEYS)
    diag = rundir.metrics_row(log, 2, update=3, signal="removal", losses=[0.1, 0.2], router_loss=0.6,
                              clip_fraction=0.0, router_slates=6, seconds={"total": 1.0},
                              diagnostics={"agent/grad_norm": [1.5, 2.0]})
    assert diag == {**row, "agent/grad_norm": [1.5, 2.0]}
    with pytest.raises(ValueError, match="AGENT_DIAGNOSTICS"):
        rundir.metrics_row(log, 2, update=3, signal="removal", losses=[0.1, 0.2], router_loss=0.6,
                           clip_fraction=0.0, router_slates=6, seconds={}, diagnostics={"grad_norm": [1, 2]})
    assert row["reward"] == 0.5 and row["oracle"] == 0.5 and row["agent_accuracy"] == [0.5, 0.0]
    assert row["selected_fraction"] == [0.5, 0.5] and row["credit_mean"] == [0.5, 0.25]
    assert (row["exact_evaluations"], row["feedback_cost"], row["exact_share"]) == (1, 1, 0.5)
    assert row["exact_share_expected"] == 0.375 and row["truncated"] == 0.25 and row["completion_tokens"] == 6
    assert row["zero_std_fraction"] == [0.0, 1.0] and row["specialization"] == 1.0
