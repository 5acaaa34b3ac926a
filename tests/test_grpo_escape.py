"""Chapter 8's H2 measurement (mcpg.grpo.escape): the advantages of finished and cut completions in
groups with no right candidate, recomputed from logged slates, and the permutation test of
whether the cut share follows them."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import spearmanr

from mcpg.grpo import escape
from mcpg.grpo.objective import group_advantages
from mcpg.grpo.rundir import Run


def _run(slates, scaling="group", m=4):
    return Run(path=Path("/tmp/x/removal-group/seed0"), config={"completions_per_agent": m,
               "scale_rewards": scaling}, signal="removal", agents=["a", "b", "c"],
               metrics=pd.DataFrame(), slates=slates)


def _slate(rng, update, B=3, m=4, K=3, right=(True, False, False)):
    R = np.zeros((B, m, K))
    for b, r in enumerate(right):
        if r:
            R[b, rng.integers(m), rng.integers(K)] = 1.0
    return {"update": update, "R": R.reshape(B * m, K).tolist(),
            "score": rng.normal(size=(B * m, K)).tolist(),
            "cut": (rng.random((B * m, K)) < 0.4).astype(int).tolist()}


def test_slate_advantages_are_each_agents_group_step():
    rng = np.random.default_rng(0)
    score = rng.normal(size=(3 * 4, 3))
    for scaling in ("group", "none"):
        A = escape.slate_advantages(score, 4, scaling)
        for b in range(3):
            for k in range(3):
                g = score[4 * b:4 * b + 4, k]
                want = group_advantages(g[:, None], scaling)[:, 0]
                assert np.allclose(A[4 * b:4 * b + 4, k], want)
    # batch (TRL's scale_rewards="batch"): centred in the group, divided by the agent's standard
    # deviation over the update's 12 completions, as the engine's step does
    A = escape.slate_advantages(score, 4, "batch")
    for k in range(3):
        g = score[:, k].reshape(3, 4)
        want = (g - g.mean(axis=1, keepdims=True)) / (score[:, k].std(ddof=1) + 1e-4)
        assert np.allclose(A[:, k], want.ravel())
    with pytest.raises(ValueError):
        escape.slate_advantages(score[:10], 4, "group")


def test_finish_advantages_by_hand():
    # one problem, no right candidate: agent 0's cut completions have the higher credit, so its
    # finished ones get a negative mean advantage; the second problem has a right candidate
    m, K = 4, 3
    score = np.zeros((2 * m, K))
    score[:m, 0] = [0.1, 0.2, 0.9, 1.0]  # completions 2 and 3 are cut
    cut = np.zeros((2 * m, K), int)
    cut[2:4, 0] = 1
    R = np.zeros((2 * m, K))
    R[m + 1, 2] = 1.0
    f = escape.finish_advantages(_run([{"update": 1, "R": R.tolist(), "score": score.tolist(),
                                        "cut": cut.tolist()}]))
    A = group_advantages(score[:m, :1], "group")[:, 0]
    # hopeless groups: problem 0's three agents; agents 1 and 2 have equal credits (advantage 0)
    fin = np.concatenate([A[:2], np.zeros(2 * m)])
    assert f.loc[1, "a_fin"] == pytest.approx(fin.mean()) and f.loc[1, "a_fin"] < 0
    assert f.loc[1, "a_cut"] == pytest.approx(A[2:].mean()) and f.loc[1, "a_cut"] > 0
    assert (f.loc[1, "n_fin"], f.loc[1, "n_cut"]) == (10, 2)
    assert f.loc[1, "dead_share"] == 0.5 and f.loc[1, "cut"] == pytest.approx(2 / 24)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000))
def test_centred_advantages_balance_finished_and_cut(seed):
    # centred, every group's advantages sum to 0, so in the hopeless groups the finished and the
    # cut completions' advantages cancel: n_fin a_fin + n_cut a_cut = 0
    rng = np.random.default_rng(seed)
    f = escape.finish_advantages(_run([_slate(rng, u) for u in (1, 2)], "none"))
    for _, r in f.iterrows():
        total = (r["n_fin"] * np.nan_to_num(r["a_fin"]) + r["n_cut"] * np.nan_to_num(r["a_cut"]))
        assert abs(total) < 1e-9


def test_winner_take_all_gives_hopeless_groups_nothing():
    rng = np.random.default_rng(1)
    sl = _slate(rng, 1, right=(False, False, False))
    sl["score"] = np.zeros((12, 3)).tolist()  # 1{I=i} G with G = 0
    f = escape.finish_advantages(_run([sl]))
    assert f.loc[1, "a_fin"] == 0 and f.loc[1, "a_cut"] == 0


def test_slates_without_cut_flags_are_refused():
    with pytest.raises(ValueError, match="cut"):
        escape.finish_advantages(_run([{"update": 1, "R": [[0.0]] * 4, "score": [[0.0]] * 4}]))


def _frame(a_fin, cut):
    return pd.DataFrame({"a_fin": a_fin, "cut": cut}, index=pd.Index(range(1, len(cut) + 1), name="update"))


def test_follows_reads_a_cut_share_that_rises_after_negative_means():
    # the cut share rises by exactly -a_fin: a perfect negative rank correlation in each run
    rng = np.random.default_rng(2)
    frames = {}
    for k in range(4):
        a = rng.normal(size=12)
        frames[k] = _frame(a, np.concatenate([[0.2], 0.2 + np.cumsum(-a[:-1]) / 10]))
    out = escape.follows(frames, n_perm=2000)
    assert out["rho"] == pytest.approx(-1.0) and out["p"] < 0.01
    assert out["pairs"] == {k: 11 for k in range(4)}
    # the same per-run rho as scipy's
    f = frames[0]
    want = spearmanr(f["a_fin"].to_numpy()[:-1], np.diff(f["cut"].to_numpy())).statistic
    assert out["per_run"][0] == pytest.approx(want)


def test_follows_is_calibrated_on_unrelated_series():
    # with no relation, the permutation p-value is uniform: over 120 independent sets of runs,
    # about 5 % fall below 0.05 and the mean is 1/2 (tolerances of three standard errors)
    rng = np.random.default_rng(3)
    ps = []
    for _ in range(120):
        frames = {k: _frame(rng.normal(size=12), rng.random(12)) for k in range(4)}
        ps.append(escape.follows(frames, n_perm=200, seed=int(rng.integers(1 << 30)))["p"])
    share = np.mean(np.asarray(ps) < 0.05)
    assert share < 0.05 + 3 * np.sqrt(0.05 * 0.95 / 120)  # 0.110
    assert np.mean(ps) == pytest.approx(0.5, abs=3 * np.sqrt(1 / 12 / 120))  # 0.079


def test_follows_refuses_a_run_with_nothing_to_correlate():
    with pytest.raises(ValueError, match="spread"):
        escape.follows({"flat": _frame(np.zeros(12), np.linspace(0, 1, 12))})


def test_escape_figure_draws_each_run_on_both_panels():
    import matplotlib

    matplotlib.use("Agg")
    rng = np.random.default_rng(5)
    frames = {f"seed {k}": _frame(rng.normal(size=12), rng.random(12)) for k in range(3)}
    fig = escape.escape_figure(frames, through=10)
    left, right = fig.axes
    assert len(left.lines) == 3 and all(len(line.get_xdata()) == 10 for line in left.lines)
    points = [c.get_offsets() for c in right.collections]
    assert len(points) == 3 and all(len(p) == 9 for p in points)  # t = 1..9 against c(t+1) - c(t)
    f = frames["seed 0"].loc[:10]
    assert np.allclose(points[0][:, 1], np.diff(f["cut"].to_numpy()))


@pytest.mark.usefixtures("one_torch_thread", "gsm8k_fixture")
@pytest.mark.parametrize("scaling", ["batch", "none", "group"])
def test_recomputed_advantages_are_the_ones_the_engine_trained_on(tmp_path, scaling):
    """A tiny-random run under each scaling: the advantages slate_advantages recomputes from the
    logged scores have, per agent and update, the spread the engine logged
    (``agent/advantage_std``, over the agent's completions), so H2's and H5's readings use the
    run's own step, batch scaling included."""
    from mcpg.grpo.rundir import read_run
    from mcpg.grpo.train import train

    train("tiny-random", "removal", tmp_path / "run", scale_rewards=scaling, updates=2)
    run = read_run(tmp_path / "run")
    m = int(run.config["completions_per_agent"])
    logged = run.metrics.set_index("update")["agent/advantage_std"]
    assert len(run.slates) == 2
    for row in run.slates:
        A = escape.slate_advantages(row["score"], m, scaling)
        np.testing.assert_allclose(A.std(axis=0), logged.loc[row["update"]], rtol=1e-5, atol=1e-7)


def test_pooled_fin_weights_each_update_by_its_finished_completions():
    a = pd.DataFrame({"a_fin": [-0.5, 0.25, np.nan], "n_fin": [2, 6, 0]}, index=[1, 2, 3])
    b = pd.DataFrame({"a_fin": [1.0], "n_fin": [2]}, index=[1])
    # (-0.5 * 2 + 0.25 * 6) / 8; an update without finished completions counts for nothing
    assert escape.pooled_fin(a) == pytest.approx(0.0625)
    assert escape.pooled_fin({"a": a}) == escape.pooled_fin(a)
    # over runs: every finished completion of both, not the mean of the two runs' means
    assert escape.pooled_fin({"a": a, "b": b}) == pytest.approx((-1.0 + 1.5 + 2.0) / 10)
    assert np.isnan(escape.pooled_fin(a.loc[3:]))
