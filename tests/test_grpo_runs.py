"""Tests of mcpg.grpo.runs: reading run directories, t-intervals, paired gains, Eq. 19 on logged slates."""

import json

import numpy as np
import pytest
from scipy import stats

from mcpg import allocation, routing
from mcpg.grpo.objective import credit, credit_leverage
from mcpg.grpo.runs import (
    NoPairedSeeds,
    advantage_alignment,
    advantage_bias,
    advantage_by_outcome,
    advantage_distance,
    allocation_risks,
    compare_runs,
    compare_signals,
    eval_gains,
    eval_table,
    expected_advantage,
    feedback_table,
    group_signal,
    health,
    health_table,
    learning_curve,
    paired_difference,
    per_problem,
    probe_answers,
    read_comparison,
    read_run,
    recording_summary,
    signals_over_seeds,
    slate_credit,
    slate_groups,
    t_interval,
    verdict_table,
)

AGENTS = [{"name": n, "role": "r", "temperature": 1.0, "specialty": n} for n in ("money", "time", "geometry")]


def _config(**kw):
    cfg = {"agents": AGENTS, "prompts_per_update": 2, "completions_per_agent": 4, "seed": 0,
           "task": "arithmetic", "data_dir": None, "data_seed": 0, "eval_problems": 6}
    return {**cfg, **kw}


def _write_run(folder, signal="removal", rows=None, eval_=None, slates=None, **cfg):
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"config": _config(**cfg), "signal": signal}))
    rows = rows or [{"update": u, "signal": signal, "reward": r, "oracle": 0.5, "truncated": 0.25,
                     "agent_accuracy": [0.1, 0.2, 0.0], "credit_mean": [0.0, 0.1, 0.0]}
                    for u, r in enumerate([0.0, 1.0, 0.0, 1.0], start=1)]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if eval_ is not None:
        (folder / "eval.json").write_text(json.dumps(eval_))
    if slates is not None:
        (folder / "slates.jsonl").write_text("".join(json.dumps(s) + "\n" for s in slates))
    return folder


def _slates(rng, n_updates=3, n=8, K=3, signal="removal"):
    out = []
    for u in range(1, n_updates + 1):
        s = rng.normal(size=(n, K)) * 2
        p, P = routing.router_propensities(s, 1.0, 0.1), routing.leave_one_out_propensities(s, 1.0, 0.1)
        mu = 1 / (1 + np.exp(-s))
        R = rng.binomial(1, 0.4, size=(n, K)).astype(float)
        sel = routing.sample_selection(p, rng)
        G = R[np.arange(n), sel]
        score = credit(signal, sel, G, p, P, mu, rewards_all=R)
        out.append({"update": u, "R": R.tolist(), "I": sel.tolist(), "G": G.tolist(), "p": p.tolist(),
                    "P": P.tolist(), "mu_hat": mu.tolist(), "score": score.tolist()})
    return out


def test_t_interval_formula():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    ci = t_interval(x)
    half = stats.t.ppf(0.975, 3) * np.std(x, ddof=1) / 2
    assert ci["mean"] == 2.5 and ci["n"] == 4
    assert ci["half_width"] == pytest.approx(half) and ci["half_width"] == pytest.approx(2.0543, abs=1e-4)
    assert ci["low"] == pytest.approx(2.5 - half) and ci["high"] == pytest.approx(2.5 + half)
    assert t_interval([3.0, 3.0, 3.0])["half_width"] == 0
    assert np.isnan(t_interval([1.0])["half_width"])
    with pytest.raises(ValueError):
        t_interval([])


def test_t_interval_covers_at_its_level():
    # normal samples of size 5: the t-interval's coverage is exactly 0.95 (a z-interval's is not)
    rng = np.random.default_rng(0)
    hits = [(ci := t_interval(rng.normal(1.0, 2.0, size=5)))["low"] <= 1.0 <= ci["high"] for _ in range(4000)]
    assert abs(np.mean(hits) - 0.95) < 0.012  # 3.5 binomial standard errors


def test_paired_difference():
    from mcpg import stats
    from mcpg.grpo.heldout import paired_row

    assert paired_difference is stats.paired_difference  # one paired difference, re-exported
    a, b = [1, 1, 0, 1, 0, 1], [0, 1, 0, 0, 0, 1]
    d = paired_row(a, b)
    assert d["mean"] == pytest.approx(np.mean(a) - np.mean(b)) and d["mean_a"] == pytest.approx(4 / 6)
    assert d == {**d, **t_interval(np.subtract(a, b))}
    with pytest.raises(ValueError):
        paired_row([1, 0], [1, 0, 1])


def test_read_run_learning_curve_and_health(tmp_path):
    run = read_run(_write_run(tmp_path / "r"))
    assert run.agents == ["money", "time", "geometry"] and run.slates_per_update == 8 and run.eval is None
    lc = learning_curve(run, window=2)
    assert lc["rolling"].tolist() == [0.0, 0.5, 0.5, 0.5] and (lc["slates"] == 8).all()
    h = health(run)
    # keys the rows do not hold are skipped; per-agent lists get the agents' names
    assert set(h["metric"]) == {"reward", "oracle", "truncated", "agent_accuracy", "credit_mean"}
    acc = h[(h["metric"] == "agent_accuracy") & (h["update"] == 1)].set_index("agent")["value"]
    assert acc.to_dict() == {"money": 0.1, "time": 0.2, "geometry": 0.0}
    with pytest.raises(FileNotFoundError):
        read_run(tmp_path)


def test_eval_gains_table_and_compare(tmp_path):
    ev = {"accuracy": 0.5, "entropy": 0.9, "brier": 0.2, "specialization": None, "oracle": 0.8, "regret": 0.3,
          "base_accuracy": 1 / 3, "n": 6, "deployed_fraction": [0.5, 0.5, 0.0],
          "correct": [1, 1, 1, 0, 0, 0], "base_correct": [1, 0, 0, 1, 0, 0],
          "initial_correct": [0, 1, 0, 0, 0, 0], "initial_accuracy": 1 / 6}
    a = read_run(_write_run(tmp_path / "a", eval_=ev))
    g = eval_gains(a)
    assert list(g.index) == ["trained - frozen base", "trained - untrained pool",
                             "untrained pool - frozen base"]
    assert g.loc["trained - frozen base", "mean"] == pytest.approx(0.5 - 1 / 3)
    assert g.loc["trained - untrained pool", "mean"] == pytest.approx(0.5 - 1 / 6)
    t = eval_table(a)
    assert t.loc["frozen (single agent)", "accuracy"] == pytest.approx(1 / 3) and t.loc["removal", "n"] == 6
    b = read_run(_write_run(tmp_path / "b", signal="wta", eval_={**ev, "correct": [0, 1, 1, 0, 0, 0]}))
    assert compare_runs(a, b)["mean"] == pytest.approx(1 / 6)
    c = read_run(_write_run(tmp_path / "c", signal="wta", eval_=ev, data_seed=1))
    with pytest.raises(ValueError, match="data_seed"):
        compare_runs(a, c)


def test_read_comparison(tmp_path):
    for sig in ("wta", "removal"):
        for seed in (1, 0):
            _write_run(tmp_path / sig / f"seed{seed}", signal=sig, seed=seed)
    (tmp_path / "oracle" / "seed0").mkdir(parents=True)  # a run not started yet: skipped
    runs = read_comparison(tmp_path)
    assert [r.label for r in runs] == ["removal seed0", "removal seed1", "wta seed0", "wta seed1"]
    assert len(learning_curve(runs)) == 16


def test_two_arms_of_one_signal_and_seed_keep_apart(tmp_path):
    for arm in ("removal-group", "removal-b0.1-group"):
        _write_run(tmp_path / arm / "seed0", eval_={"correct": [1, 0], "base_correct": [0, 0],
                                                  "base_accuracy": 0.0, "n": 2})
    runs = read_comparison(tmp_path)
    assert {r.signal for r in runs} == {"removal"}
    assert sorted(r.label for r in runs) == ["removal-b0.1-group seed0", "removal-group seed0"]
    h = health(runs)
    assert h.groupby("run").size().tolist() == [len(h) // 2] * 2  # each run's rows under its own name
    assert len(eval_table(runs, frozen=False)) == 2


def test_signals_over_seeds(tmp_path):
    rng = np.random.default_rng(3)
    base = rng.binomial(1, 0.2, 40).tolist()
    runs, diffs = [], []
    for seed in range(3):
        got = {sig: rng.binomial(1, q, 40).tolist() for sig, q in (("removal", 0.4), ("wta", 0.3))}
        diffs.append(np.mean(got["removal"]) - np.mean(got["wta"]))
        for sig, c in got.items():
            ev = {"accuracy": float(np.mean(c)), "n": 40, "correct": c, "base_correct": base}
            runs.append(read_run(_write_run(tmp_path / sig / f"seed{seed}", signal=sig, eval_=ev, seed=seed)))
    t = signals_over_seeds(runs)
    assert list(t.index) == ["seed 0", "seed 1", "seed 2", "over seeds"]
    np.testing.assert_allclose(t["difference"][:3], diffs)
    over = t_interval(diffs)
    assert t.loc["over seeds", "difference"] == pytest.approx(np.mean(diffs))
    lo_hi = (t.loc["over seeds", "low"], t.loc["over seeds", "high"])
    assert lo_hi == pytest.approx((over["low"], over["high"]))
    assert t.loc["over seeds", "n"] == 3 and t.loc["seed 1", "n"] == 40
    assert t.loc["seed 2", "gain_wta"] == pytest.approx(t.loc["seed 2", "wta"] - np.mean(base))
    # one seed: no interval over seeds; a signal without a partner seed is refused
    one = signals_over_seeds(runs[:2])
    assert np.isnan(one.loc["over seeds", "low"]) and one.loc["over seeds", "n"] == 1
    with pytest.raises(NoPairedSeeds, match="no seed"):
        signals_over_seeds(runs, a="oracle")
    with pytest.raises(ValueError, match="by must be"):
        signals_over_seeds(runs, by="scaling")


def test_arms_over_seeds(tmp_path):
    # one signal, two configurations: arms are named by their folder, not their signal
    rng = np.random.default_rng(7)
    runs = [_grid_run(tmp_path, "removal", k, sc, rng) for k in range(2) for sc in ("group", "b0.1-group")]
    # by signal, both arms are "removal": which run of seed 0 is meant is refused, not guessed
    with pytest.raises(ValueError, match="two finished runs of signal 'removal', seed 0"):
        signals_over_seeds(runs)
    with pytest.raises(NoPairedSeeds):
        signals_over_seeds(runs[::2])  # one arm, one signal: nothing to pair it with
    t = signals_over_seeds(runs, a="removal-b0.1-group", b="removal-group", by="arm")
    assert list(t.index) == ["seed 0", "seed 1", "over seeds"]
    for k in range(2):
        a, b = runs[2 * k + 1], runs[2 * k]
        want = np.mean(a.eval["correct"]) - np.mean(b.eval["correct"])
        assert t.loc[f"seed {k}", "difference"] == pytest.approx(want)


def test_slate_credit_corollary3(tmp_path):
    rng = np.random.default_rng(1)
    run = read_run(_write_run(tmp_path / "r", slates=_slates(rng)))
    s = slate_credit(run)
    assert len(s) == 3 * 8 * 3 and s["prompt"].max() == 1  # 2 prompts x m = 4 slates per update
    assert s[["exact_p", "exact_z"]].isna().all().all()  # a run without a budget logs neither
    # the logged credit is the run's signal's; the exact expectation over I ~ p of Eq. 19 is the oracle
    np.testing.assert_allclose(s["logged"], s["removal"], atol=1e-12)
    np.testing.assert_allclose(s["removal_expected"], s["oracle"], atol=1e-12)
    assert (s["removal"] - s["oracle"]).abs().max() > 0.1  # one draw is noisy
    # independent check of the expectation: average Eq. 19 over many draws of I for one slate
    row = run.slates[0]
    p, P, mu, R = (np.asarray(row[k], float)[0] for k in ("p", "P", "mu_hat", "R"))
    draws = routing.sample_selection(np.broadcast_to(p, (200_000, 3)), rng)
    est = credit("removal", draws, R[draws], np.broadcast_to(p, (200_000, 3)),
                 np.broadcast_to(P, (200_000, 3, 3)), np.broadcast_to(mu, (200_000, 3))).mean(0)
    exact = s[(s["update"] == 1) & (s["slate"] == 0)]["oracle"].to_numpy()
    np.testing.assert_allclose(est, exact, atol=0.03)


def test_group_signal(tmp_path):
    rng = np.random.default_rng(2)
    slates = _slates(rng, n_updates=2)
    slates[0]["R"] = np.zeros((8, 3)).tolist()  # update 1: no candidate right anywhere
    run = read_run(_write_run(tmp_path / "r", slates=slates))
    gs = group_signal(run)
    assert len(gs) == 2 * 2 * 3 and list(gs["agent"][:3]) == run.agents  # 2 updates x 2 prompts x K
    assert not gs[gs["update"] == 1]["any_correct"].any()
    # recomputed by hand: agent 1 of prompt 1 (slates 4-7) of update 2, group-standardised (TRL's eps)
    S = np.asarray(slates[1]["score"])[4:8, 1]
    row = gs[(gs["update"] == 2) & (gs["prompt"] == 1)].iloc[1]
    assert row["score_std"] == pytest.approx(S.std(ddof=1))
    assert row["mean_abs_advantage"] == pytest.approx(np.abs((S - S.mean()) / (S.std(ddof=1) + 1e-4)).mean())
    own = np.asarray(slates[1]["R"])[4:8, 1].max() > 0
    assert row["own_correct"] == own
    # centred advantages (scale_rewards "none") shrink with the credits; group scaling divides the
    # shrink out again, up to eps: |A| = c mean|S - mean S| / (c std S + eps) for credits c S
    small = [{**s, "score": (np.asarray(s["score"]) * 0.1).tolist()} for s in slates]
    gs_none = group_signal(read_run(_write_run(tmp_path / "n", slates=small, scale_rewards="none")))
    gs_none_full = group_signal(read_run(_write_run(tmp_path / "nf", slates=slates, scale_rewards="none")))
    np.testing.assert_allclose(gs_none["mean_abs_advantage"], 0.1 * gs_none_full["mean_abs_advantage"])
    gs_small = group_signal(read_run(_write_run(tmp_path / "s", slates=small)))
    np.testing.assert_allclose(gs_small["mean_abs_advantage"],
                               gs_none["mean_abs_advantage"] / (0.1 * gs["score_std"] + 1e-4))
    S = S * 0.1
    assert gs_none.loc[row.name, "mean_abs_advantage"] == pytest.approx(np.abs(S - S.mean()).mean())
    with pytest.raises(ValueError, match="whole groups"):
        group_signal(read_run(_write_run(tmp_path / "bad", slates=slates, completions_per_agent=3)))


def test_recording_summary(tmp_path):
    rows = [{"update": 1, "signal": "wta", "reward": 0.0, "oracle": 0.0, "truncated": 0.9,
             "agent_accuracy": [0.0, 0.0, 0.0], "credit_mean": [0.0, 0.0, 0.0]},
            {"update": 2, "signal": "wta", "reward": 0.5, "oracle": 0.5, "truncated": 0.7,
             "agent_accuracy": [0.25, 0.0, 0.0], "credit_mean": [0.25, 0.0, 0.0]}]
    s = recording_summary(read_run(_write_run(tmp_path / "w", signal="wta", rows=rows)))
    assert s["no_correct"] == 5 and s["no_credit"] == 5 and s["agent_updates"] == 6
    assert s["groups"] == 12 and s["groups_without_signal_min"] == 10 and s["rollouts_no_correct"] == 1
    assert s["truncated_mean"] == pytest.approx(0.8) and s["max_deployed_fraction"] is None
    r = recording_summary(read_run(_write_run(tmp_path / "r", signal="removal", rows=rows)))
    assert r["no_credit"] is None and r["groups_without_signal_min"] is None


def test_engine_run_directory(tmp_path):
    """A tiny-random run: every file reads, and the logged credit is Eq. 19 with Corollary 3 holding."""
    pytest.importorskip("peft")
    from mcpg.grpo.train import train

    cfg = {"base": "tiny-random", "updates": 2, "eval_problems": 4, "train_problems": 16,
           "task": "arithmetic"}
    train(cfg, "removal", tmp_path / "run")
    run = read_run(tmp_path / "run")
    assert run.initial_eval is not None and len(run.slates) == 2 and len(learning_curve(run)) == 2
    s = slate_credit(run)
    assert len(s) == 2 * run.slates_per_update * 3
    np.testing.assert_allclose(s["logged"], s["removal"], atol=1e-9)
    np.testing.assert_allclose(s["removal_expected"], s["oracle"], atol=1e-9)
    # each candidate's cut and length: per update, their means are the metrics' shares
    per_update = s.groupby("update")[["cut", "tokens"]].mean()
    np.testing.assert_allclose(per_update["cut"], run.metrics["truncated"], atol=1e-12)
    np.testing.assert_allclose(per_update["tokens"], run.metrics["completion_tokens"], atol=1e-9)
    assert set(s["cut"]) <= {0.0, 1.0}
    assert (s.loc[s["cut"] == 1, "tokens"] == run.config["max_completion_length"]).all()
    assert (s.loc[s["cut"] == 0, "tokens"] <= run.config["max_completion_length"]).all()
    assert {"zero_std_fraction", "truncated", "completion_tokens"} <= set(health(run)["metric"])
    assert eval_gains(run).shape[0] == 3


def test_expected_advantage(tmp_path):
    """E[A | completions] over the router's draws, exact (K^m = 81 joint draws) and by Monte Carlo."""
    rng = np.random.default_rng(5)
    slates = _slates(rng, n_updates=2)
    R = np.asarray(slates[0]["R"])
    R[:4] = 0.0  # prompt 0 of update 1: no candidate right on any of its 4 slates
    sel = np.asarray(slates[0]["I"])
    G = R[np.arange(8), sel]
    args = (np.asarray(slates[0][k], float) for k in ("p", "P", "mu_hat"))
    slates[0].update(R=R.tolist(), G=G.tolist(), score=credit("removal", sel, G, *args).tolist())
    run = read_run(_write_run(tmp_path / "r", slates=slates))
    ea = expected_advantage(run)
    assert len(ea) == 2 * 8 * 3
    # Corollary 3: the expected Eq. 19 credit is the exact removal contribution (slate_credit's oracle)
    sc = slate_credit(run)
    np.testing.assert_allclose(ea["expected_credit"], sc["oracle"], atol=1e-12)
    # centred advantages are linear: their expectation is the centred expected credit, per group
    grp = ea.groupby(["update", "prompt", "agent"])["expected_credit"].transform("mean")
    np.testing.assert_allclose(ea["expected_none"], ea["expected_credit"] - grp, atol=1e-12)
    dead = ea[(ea["update"] == 1) & (ea["prompt"] == 0)]
    assert not dead["any_correct"].any()
    np.testing.assert_allclose(dead["expected_none"], 0.0, atol=1e-12)  # no right answer: no push
    assert dead["expected_group"].abs().max() > 0.05  # standardised: a push from the outcome model
    # summed up over the groups with no right candidate (here the one group of each agent)
    bias = advantage_bias(ea)
    assert bias["groups without a right candidate"] == pytest.approx(1 - ea["any_correct"].mean())
    assert bias["groups without a right candidate"] == pytest.approx(1 / 4)  # 1 of 4 prompts
    assert bias["mean |E[A]|, centred"] < 1e-12
    assert bias["mean |E[A]|, standardised"] == pytest.approx(dead["expected_group"].abs().mean())
    assert bias["corr with p"] == pytest.approx(np.corrcoef(dead["expected_group"], dead["p"])[0, 1])
    # an independent path: simulate whole rollouts of router draws and average the advantages
    p, P, mu = (np.asarray(slates[0][k], float)[:4] for k in ("p", "P", "mu_hat"))
    n_sim, agent = 20_000, 1
    draws = routing.sample_selection(np.broadcast_to(p, (n_sim, 4, 3)), rng)  # (n_sim, 4 slates)
    c = credit("removal", draws, np.zeros((n_sim, 4)), np.broadcast_to(p, (n_sim, 4, 3)),
               np.broadcast_to(P, (n_sim, 4, 3, 3)), np.broadcast_to(mu, (n_sim, 4, 3)))[..., agent]
    A = (c - c.mean(1, keepdims=True)) / (c.std(1, ddof=1, keepdims=True) + 1e-4)
    se = A.std(0) / np.sqrt(n_sim)
    want = dead[dead["agent"] == run.agents[agent]]["expected_group"].to_numpy()
    assert np.all(np.abs(A.mean(0) - want) < 5 * se + 1e-9)
    # a perturbed signal must break Corollary 3's line: wta's expected credit is not the oracle
    wta = expected_advantage(read_run(_write_run(tmp_path / "w", signal="wta", slates=slates)))
    assert np.abs(wta["expected_credit"] - sc["oracle"]).max() > 0.05


def test_advantage_alignment_of_a_run(tmp_path):
    """The run-level table pools all updates' groups into one call of the objective's function."""
    from mcpg.grpo.slate_diagnostics import group_alignment as on_groups
    slates = _slates(np.random.default_rng(6), n_updates=3)
    run = read_run(_write_run(tmp_path / "r", slates=slates))
    table = advantage_alignment(run)
    assert list(table.index) == [(s, sc) for s in ("wta", "removal", "oracle") for sc in ("group", "none")]
    stack = {k: np.concatenate([np.asarray(s[k], float).reshape((2, 4) + np.shape(s[k])[1:]) for s in slates])
             for k in ("p", "P", "mu_hat", "R")}
    for got, k in zip(slate_groups(run), ("p", "P", "mu_hat", "R")):
        np.testing.assert_array_equal(got, stack[k])
    want = on_groups("removal", stack["p"], stack["P"], stack["mu_hat"], stack["R"], "none")
    assert table.loc[("removal", "none")].to_dict() == pytest.approx(want)
    # pooled, not averaged per update: one update alone gives another answer
    first = on_groups("removal", *(stack[k][:2] for k in ("p", "P", "mu_hat", "R")), "none")
    assert first["corr"] != pytest.approx(want["corr"])
    assert table.loc[("oracle", "group"), "expected_share"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="whole groups"):
        advantage_alignment(read_run(_write_run(tmp_path / "odd", slates=slates, completions_per_agent=3)))


def test_advantage_by_outcome_of_a_run(tmp_path):
    """The run-level table pools all updates' groups into one call of the objective's function."""
    from mcpg.grpo.slate_diagnostics import OUTCOMES
    from mcpg.grpo.slate_diagnostics import group_by_outcome as on_groups
    slates = _slates(np.random.default_rng(7), n_updates=3)
    run = read_run(_write_run(tmp_path / "r", slates=slates))
    table = advantage_by_outcome(run, scalings=("none",))
    assert list(table.columns) == list(OUTCOMES)
    assert list(table.index) == [(s, "none") for s in ("wta", "removal", "oracle")]
    want = on_groups("oracle", *slate_groups(run), scale_rewards="none")
    assert table.loc[("oracle", "none")].to_dict() == pytest.approx(
        {k: v["mean_advantage"] for k, v in want.items()}, nan_ok=True)
    assert table.attrs["share"] == pytest.approx({k: v["share"] for k, v in want.items()})


def test_agent_level_measures_read_the_actors_apart_from_the_router(tmp_path):
    rng = np.random.default_rng(4)
    n, base = 30, rng.binomial(1, 0.2, 30).tolist()
    runs, want = [], {}
    for seed in range(2):
        for sig in ("removal", "wta"):
            agents = rng.binomial(1, 0.5 if sig == "removal" else 0.3, (n, 3))
            dep = rng.integers(0, 3, n)  # a router that routes at random
            ev = {"accuracy": 0.0, "n": n, "correct": agents[np.arange(n), dep].tolist(),
                  "base_correct": base, "agent_correct": agents.tolist()}
            runs.append(read_run(_write_run(tmp_path / sig / f"seed{seed}", signal=sig, eval_=ev, seed=seed)))
            want[sig, seed] = agents
    r = runs[0]
    np.testing.assert_allclose(per_problem(r, "uniform"), want["removal", 0].mean(1))
    np.testing.assert_allclose(per_problem(r, "best_of_k"), want["removal", 0].max(1))
    np.testing.assert_allclose(per_problem(r, "deployed"), r.eval["correct"])
    for measure, f in (("uniform", lambda x: x.mean(1)), ("best_of_k", lambda x: x.max(1))):
        t = signals_over_seeds(runs, measure=measure)
        for seed in range(2):
            d = f(want["removal", seed]) - f(want["wta", seed])
            assert t.loc[f"seed {seed}", "difference"] == pytest.approx(d.mean())
            assert t.loc[f"seed {seed}", "gain_wta"] == pytest.approx((f(want["wta", seed]) - base).mean())
    # the deployed comparison is a different number: the random router mixes the agents
    assert signals_over_seeds(runs).loc["seed 0", "difference"] != pytest.approx(
        signals_over_seeds(runs, measure="uniform").loc["seed 0", "difference"])
    with pytest.raises(ValueError, match="measure"):
        per_problem(r, "median")


def _grid_run(folder, signal, seed, scaling, rng, n=24, cut=(0.1,) * 6, auc=0.8, router="best",
              held_out_cut=0.05):
    agents = rng.binomial(1, 0.4, (n, 3))
    dep = agents.argmax(1) if router == "best" else agents.argmin(1)
    rows = [{"update": u, "signal": signal, "reward": 0.5, "oracle": 0.5, "truncated": c,
             "agent_accuracy": [0.1, 0.2, 0.0], "credit_mean": [0.0, 0.1, 0.0],
             "zero_std_reward_fraction": [u / 10, 0.0, 0.5]} for u, c in enumerate(cut, start=1)]
    ev = {"accuracy": float(agents[np.arange(n), dep].mean()), "n": n,
          "correct": agents[np.arange(n), dep].tolist(), "base_correct": [0] * n,
          "agent_correct": agents.tolist(), "uniform_accuracy": float(agents.mean()), "base_accuracy": 0.0,
          "best_of_k": float(agents.max(1).mean()), "router_auc": auc, "router_auc_within": auc - 0.1,
          "deployed_fraction": (np.bincount(dep, minlength=3) / n).tolist(), "truncated": held_out_cut}
    return read_run(_write_run(folder / f"{signal}-{scaling}" / f"seed{seed}", signal=signal, rows=rows,
                               eval_=ev, seed=seed, scale_rewards=scaling))


def test_health_table_bars(tmp_path):
    rng = np.random.default_rng(5)
    good = _grid_run(tmp_path, "wta", 0, "group", rng)
    cut = _grid_run(tmp_path, "wta", 1, "group", rng, cut=(0.9, 0.9, 0.3, 0.2, 0.3, 0.2))
    blind = _grid_run(tmp_path, "removal", 0, "group", rng, auc=0.69)
    worse = _grid_run(tmp_path, "removal", 1, "group", rng, router="worst")
    long = _grid_run(tmp_path, "removal", 2, "group", rng, held_out_cut=0.6)
    t = health_table([worse, blind, cut, good, long])
    assert list(t.index) == [("removal-group", 0), ("removal-group", 1), ("removal-group", 2),
                             ("wta-group", 0), ("wta-group", 1)]
    # the last five updates only: (0.9, 0.3, 0.2, 0.3, 0.2) -> 0.38 > 0.25
    assert t.loc[("wta-group", 1), "cut"] == pytest.approx(0.38)
    # zero-spread: agents' shares over updates 2..6 -> mean of (u/10, 0, 0.5)
    assert t.loc[("wta-group", 0), "zero-spread"] == pytest.approx((0.4 + 0 + 0.5) / 3)
    assert t.loc[("wta-group", 0), "agents' mean"] == pytest.approx(good.eval["uniform_accuracy"])
    assert t["healthy"].tolist() == [False, False, True, True, False]
    # the held-out cut share is read from eval.json and reported, not a bar
    assert t.loc[("removal-group", 2), "cut, held-out"] == pytest.approx(0.6)
    assert t.loc[("wta-group", 0), "cut, held-out"] == pytest.approx(0.05)
    # the router that picks the worst agent is below the uniform draw; the best is at or above it
    assert t.loc[("removal-group", 1), "deployed"] < t.loc[("removal-group", 1), "agents' mean"]
    assert t.loc[("wta-group", 0), "deployed"] >= t.loc[("wta-group", 0), "agents' mean"]
    assert t.loc[("wta-group", 0), "largest share"] == pytest.approx(max(good.eval["deployed_fraction"]))
    with pytest.raises(ValueError, match="last"):
        health_table(good, last=0)


def test_compare_signals_by_scaling_and_measure(tmp_path):
    rng = np.random.default_rng(6)
    runs = [_grid_run(tmp_path, sig, seed, sc, rng)
            for sc in ("group", "none") for seed in range(2) for sig in ("wta", "removal")]
    runs.append(_grid_run(tmp_path, "oracle", 0, "none", rng))
    t = compare_signals(runs)
    assert sorted(set(t.index.get_level_values("scaling"))) == ["group", "none"]
    for sc in ("group", "none"):
        sub = [r for r in runs if r.config["scale_rewards"] == sc]
        for measure in ("deployed", "uniform", "best_of_k"):
            want = signals_over_seeds(sub, measure=measure)
            got = t.xs((sc, measure))
            np.testing.assert_allclose(got["difference"], want["difference"])
            assert list(got.index) == ["seed 0", "seed 1", "over seeds"]
    # the oracle has a partner under "none" only: "group" is left out, not an error
    o = compare_signals(runs, a="oracle")
    assert set(o.index.get_level_values("scaling")) == {"none"}
    with pytest.raises(NoPairedSeeds, match="any scaling"):
        compare_signals(runs, a="oracle", b="control")


def test_verdict_table_counts_the_seeds_by_side(tmp_path):
    rng = np.random.default_rng(7)
    runs = [_grid_run(tmp_path, sig, seed, sc, rng)
            for sc in ("group", "none") for seed in range(3) for sig in ("wta", "removal")]
    full = compare_signals(runs)
    v = verdict_table(runs)
    measures = ("deployed", "uniform", "best_of_k")
    assert list(v.index) == [(sc, m) for sc in ("group", "none") for m in measures]
    for (sc, m), row in v.iterrows():
        seeds = full.xs((sc, m)).drop("over seeds")
        over = full.xs((sc, m, "over seeds"))
        assert row["seeds"] == 3 == row["below 0"] + row["level"] + row["above 0"]
        assert row["below 0"] == (seeds["high"] < 0).sum() and row["above 0"] == (seeds["low"] > 0).sum()
        # the mean of the per-seed differences and their t-interval with 2 degrees of freedom
        d = seeds["difference"].to_numpy()
        half = stats.t.ppf(0.975, 2) * d.std(ddof=1) / np.sqrt(3)
        assert row["difference"] == pytest.approx(d.mean()) == pytest.approx(over["difference"])
        assert (row["low"], row["high"]) == pytest.approx((d.mean() - half, d.mean() + half))
    # a pool whose removal agents are all wrong: every seed's interval lies below 0
    for r in runs:
        if r.signal == "removal":
            r.eval["agent_correct"] = (np.zeros_like(r.eval["agent_correct"])).tolist()
    u = verdict_table(runs, measures=("uniform",))
    assert (u["below 0"] == 3).all() and (u["high"] < 0).all()
    with pytest.raises(NoPairedSeeds):
        verdict_table(runs, a="oracle")


def test_probe_answers_join_the_runs_grades(tmp_path):
    rng = np.random.default_rng(8)
    run = _grid_run(tmp_path, "removal", 0, "none", rng, n=4)
    run.eval["mu_hat"] = rng.uniform(size=(4, 3)).tolist()
    probe = tmp_path / "probe"
    probe.mkdir()
    rows = [{"problem": i, "agent": k, "cut": bool(i == k), "text": f"#### {i}"}
            for i in range(4) for k in range(3)]
    (probe / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (probe / "summary.json").write_text(json.dumps({"reproduces_agent_correct": True}))
    a = probe_answers(probe, run)
    assert len(a) == 12 and "right" not in probe_answers(probe).columns
    for _, x in a.iterrows():
        assert x["right"] == run.eval["agent_correct"][x["problem"]][x["agent"]]
        assert x["mu_hat"] == run.eval["mu_hat"][x["problem"]][x["agent"]]
    small = _grid_run(tmp_path / "small", "removal", 0, "none", rng, n=3)
    small.eval["mu_hat"] = [[0.5] * 3] * 3
    with pytest.raises(ValueError, match="do not fit"):
        probe_answers(probe, small)
    (probe / "summary.json").write_text(json.dumps({"reproduces_agent_correct": False}))
    with pytest.raises(ValueError, match="reproduce"):
        probe_answers(probe, run)
    with pytest.raises(FileNotFoundError, match="summary.json"):
        probe_answers(tmp_path, run)


def test_feedback_table_counts_reward_queries(tmp_path):
    # K = 3 agents and 2 x 4 = 8 slates per update, 3 updates: an exact evaluation costs 2 queries
    ev = {"accuracy": 0.5, "uniform_accuracy": 0.4, "best_of_k": 0.7}
    def rows(exact):
        return [{"update": u, "signal": "removal", "reward": 0.5, "oracle": 0.5, "truncated": 0.1,
                 "agent_accuracy": [0.1, 0.2, 0.0], "credit_mean": [0.0, 0.1, 0.0],
                 **({} if exact is None else {"exact_evaluations": exact[u - 1]})} for u in (1, 2, 3)]
    budget = read_run(_write_run(tmp_path / "removal-b0.25" / "seed1", rows=rows([2, 3, 1]), eval_=ev,
                                 seed=1, exact_budget=0.25))
    plain = read_run(_write_run(tmp_path / "removal" / "seed1", rows=rows(None), eval_=ev, seed=1))
    oracle = read_run(_write_run(tmp_path / "oracle" / "seed1", signal="oracle", rows=rows([0, 0, 0]),
                                 eval_=ev, seed=1))
    unfinished = read_run(_write_run(tmp_path / "wta" / "seed1", signal="wta", rows=rows([0, 0, 0])))
    t = feedback_table([budget, plain, oracle, unfinished])
    assert list(t.index) == [("oracle", 1), ("removal", 1), ("removal-b0.25", 1)]
    b = t.loc[("removal-b0.25", 1)]
    assert (b["budget"], b["exact share"], b["feedback cost"]) == (0.25, 6 / 24, 12)
    assert b["cost per update"] == pytest.approx(4.0)
    assert t.loc[("oracle", 1), "feedback cost"] == 24 * 2 and t.loc[("oracle", 1), "exact share"] == 1.0
    assert t.loc[("removal", 1), "feedback cost"] == 0 and t.loc[("removal", 1), "budget"] == 0.0
    assert t.loc[("removal", 1), "agents' mean"] == 0.4
    with pytest.raises(ValueError, match="eval.json"):
        feedback_table(unfinished)



def test_cost_figure_joins_each_allocation_from_budget_0_to_the_oracle(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib.collections import PathCollection

    from mcpg.grpo.verdict import cost_figure

    rng = np.random.default_rng(3)
    arms = {"removal": {}, "oracle": {}, "leverage-b0.1": {"exact_budget": 0.1, "allocation": "leverage"},
            "uniform-b0.1": {"exact_budget": 0.1, "allocation": "uniform"},
            "leverage-b0.3": {"exact_budget": 0.3, "allocation": "leverage"}}
    runs = []
    for arm, cfg in arms.items():
        for seed in ((0,) if arm == "leverage-b0.3" else (0, 1, 2)):
            exact = [0] * 3 if arm == "removal" else list(rng.integers(0, 8, 3))
            cut = 0.5 if (arm, seed) == ("uniform-b0.1", 2) else 0.1  # one run fails the cut bar
            rows = [{"update": u, "signal": "removal", "reward": 0.5, "oracle": 0.5, "truncated": cut,
                     "agent_accuracy": [0.1, 0.2, 0.0], "credit_mean": [0.0, 0.1, 0.0],
                     "exact_evaluations": int(exact[u - 1])} for u in (1, 2, 3)]
            ev = {"accuracy": 0.4 + 0.5 * float(rng.random()), "uniform_accuracy": 0.4, "best_of_k": 0.9,
                  "router_auc": 0.9, "truncated": 0.0, "deployed_fraction": [1 / 3] * 3}
            signal = "oracle" if arm == "oracle" else "removal"
            runs.append(read_run(_write_run(tmp_path / arm / f"seed{seed}", signal=signal, rows=rows,
                                            eval_=ev, seed=seed, **cfg)))
    t = feedback_table(runs)
    ax = cost_figure(runs, colors={"leverage": "C3"}).axes[0]
    lines = {ln.get_label(): ln for ln in ax.lines if not ln.get_label().startswith("_")}
    assert sorted(lines) == ["leverage", "uniform"]
    assert lines["leverage"].get_color() == "C3"

    def mean(arm, shift=1.0):
        g = t.xs(arm, level="arm")
        return g["feedback cost"].mean() * shift, g["deployed"].mean()

    # each line: budget 0, the allocation's arms by budget, the oracle (which costs K - 1 per slate)
    lev = [mean("removal"), mean("leverage-b0.1", 0.975), mean("leverage-b0.3", 0.975), mean("oracle")]
    np.testing.assert_allclose(np.c_[lines["leverage"].get_data()], lev)
    uni = [mean("removal"), mean("uniform-b0.1", 1.025), mean("oracle")]
    np.testing.assert_allclose(np.c_[lines["uniform"].get_data()], uni)
    assert mean("oracle")[0] == 3 * 8 * 2 and mean("removal")[0] == 0
    dots = [c for c in ax.collections if isinstance(c, PathCollection)
            and c.get_label() != "fails a health bar"]  # the legend's key aside
    filled = [c for c in dots if c.get_alpha() == 0.35]
    hollow = [c for c in dots if c.get_alpha() is None and not c.get_facecolor().size]
    assert sum(len(c.get_offsets()) for c in filled) == len(runs) - 1  # a dot per run...
    (failing,) = [c for c in hollow if len(c.get_offsets())]  # ...hollow where it fails a bar
    x, y = failing.get_offsets()[0]
    r = t.loc[("uniform-b0.1", 2)]
    assert (x, y) == pytest.approx((r["feedback cost"] * 1.025, r["deployed"]))
    assert ax.get_xscale() == "symlog"

def test_recorded_budget_arms_join_the_grid():
    """Chapter 9's recorded LLM arms: each run is chapter 8's grid configuration with the budget
    keys only, at the grid's commit, and spends its budget: the allocation's expected share of
    exact evaluations is the budget in every update (Eq. 22 meets its expected-cost constraint)
    and the realised share lies within the binomial 99.9 % interval around it."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "data" / "results"
    arms = [r for r in read_comparison(root / "ch09" / "llm") if r.eval is not None]
    if not arms:
        pytest.skip("no chapter 9 LLM arm recorded")
    grid = {(r.arm, r.config["seed"]): r for r in read_comparison(root / "ch08" / "grid")
            if r.eval is not None}
    plain = grid["removal-group", 0]
    for r in arms:
        assert r.signal == "removal" and r.provenance["commit"] == plain.provenance["commit"]
        assert not r.provenance["dirty"]
        budget = r.config["exact_budget"]
        assert 0 < budget < 1 and r.config["allocation"] == "sqrt"
        same = {k: v for k, v in r.config.items() if k not in ("exact_budget", "seed")}
        assert same == {k: v for k, v in plain.config.items() if k not in ("exact_budget", "seed")}
        assert np.allclose(r.metrics["exact_share_expected"], budget, atol=1e-9)
        n = len(r.metrics) * r.slates_per_update
        share = r.metrics["exact_evaluations"].sum() / n
        assert abs(share - budget) < 3.29 * np.sqrt(budget * (1 - budget) / n)
        ps = np.concatenate([s["exact_p"] for s in r.slates])
        assert ps.size == n and ps.min() > 0 and ps.max() <= 1
        # the credit each run trained on is Eq. (21) of Eq. (19) and the exact contribution,
        # both recomputed from the logged slate, with the logged p and Z
        sc = slate_credit(r)
        np.testing.assert_allclose(sc["logged"], allocation.corrected_contribution(
            sc["removal"], sc["oracle"], sc["exact_z"], sc["exact_p"]), atol=1e-9)
        assert set(sc["exact_z"]) == {0.0, 1.0}


def _check_budget_arm(r, plain, newer=None):
    """One budgeted removal run against its plain removal twin (same seed): the configuration
    is the twin's with the budget keys only (and keys the engine gained since, at ``newer``'s
    values); it spends its budget (uniform: every p is b; leverage: p in {0} U (1/2, 1],
    spending within one slate of b, never above); the realised evaluations lie within 99.9 %
    of their expectation; and its credit is Eq. (21) recomputed from its logged slates."""
    from mcpg.grpo.verdict import config_departures
    rule, budget = r.config["allocation"], r.config["exact_budget"]
    assert r.signal == "removal" and rule in ("leverage", "uniform") and 0 < budget < 1
    departs = config_departures(r, plain, ignore=("exact_budget", "allocation", "seed"))
    assert all((newer or {}).get(k) == v for k, v in departs.items()), departs
    ps = np.concatenate([s["exact_p"] for s in r.slates])
    zs = np.concatenate([s["exact_z"] for s in r.slates])
    n = len(r.metrics) * r.slates_per_update
    assert ps.size == n == zs.size
    if rule == "uniform":
        assert np.allclose(ps, budget, atol=1e-9)
    else:
        assert ((ps == 0) | ((ps > 0.5) & (ps <= 1))).all()
        spent = ps.reshape(len(r.metrics), -1).mean(1)
        assert (spent <= budget + 1e-9).all()
        assert (spent >= budget - 1.0 / r.slates_per_update - 1e-9).all()
    assert abs(zs.sum() - ps.sum()) <= 3.29 * np.sqrt((ps * (1 - ps)).sum()) + 1e-9
    sc = slate_credit(r)
    np.testing.assert_allclose(sc["logged"], allocation.corrected_contribution(
        sc["removal"], sc["oracle"], sc["exact_z"], sc["exact_p"]), atol=1e-9)


def test_budget_arm_check_on_fresh_runs(tmp_path):
    """The check that chapter 9's recorded arms must pass, on runs the engine makes now
    (tiny random model): it passes on a budgeted run of each rule, and it fails when a run's
    logged probabilities are not what its rule spends."""
    from mcpg.grpo.train import train
    train("tiny-random", "removal", tmp_path / "plain", updates=2)
    plain = read_run(tmp_path / "plain")
    for rule in ("leverage", "uniform"):
        train("tiny-random", "removal", tmp_path / rule, updates=2, exact_budget=0.3, allocation=rule)
        r = read_run(tmp_path / rule)
        _check_budget_arm(r, plain)
        for s in r.slates:  # an allocation that spent a quarter more
            s["exact_p"] = list(np.minimum(1.0, np.asarray(s["exact_p"], dtype=float) * 1.25 + 0.01))
        with pytest.raises(AssertionError):
            _check_budget_arm(r, plain)


def test_recorded_budget_arms_on_the_grid_of_record():
    """Chapter 9's LLM arms on the grid of record (``ch09/llm/grid-mask/<allocation>-b<b>-group``):
    all at one clean commit, each named by its keys and passing :func:`_check_budget_arm`
    against the masked grid's removal run of its seed. Skips while none is recorded."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "data" / "results"
    arms = [r for r in read_comparison(root / "ch09" / "llm" / "grid-mask") if r.eval is not None]
    if not arms:
        pytest.skip("no chapter 9 LLM arm on the grid of record recorded")
    base = {r.config["seed"]: r for r in read_comparison(root / "ch08" / "grid-mask")
            if r.arm == "removal-group" and r.eval is not None}
    assert len({r.provenance["commit"] for r in arms}) == 1
    for r in arms:
        assert not r.provenance["dirty"]
        assert r.arm == f"{r.config['allocation']}-b{r.config['exact_budget']}-group"
        # shared_prefix: gained by the engine after the grid's commit, true as its runs were
        _check_budget_arm(r, base[r.config["seed"]], newer={"shared_prefix": (True, None)})


def _recorded_twins(child: str, parent: str, key: str, aside=()):
    """A recorded grid that is another with one config key switched on: each finished run of
    ``data/results/ch08/<child>`` is at one clean commit, not the parent's, has ``key`` True,
    and its config is the parent's run of the same arm and seed without the key (the keys in
    ``aside`` apart). Returns the (run, twin) pairs; skips while none is recorded."""
    from pathlib import Path
    root = Path(__file__).resolve().parents[1] / "data" / "results" / "ch08"
    runs = [r for r in read_comparison(root / child) if r.eval is not None]
    if not runs:
        pytest.skip(f"no {child} run recorded")
    parents = {(r.arm, r.config["seed"]): r for r in read_comparison(root / parent)}
    assert len({r.provenance["commit"] for r in runs}) == 1
    assert runs[0].provenance["commit"] not in {r.provenance["commit"] for r in parents.values()}
    pairs = []
    for r in runs:
        assert not r.provenance["dirty"] and r.config[key] is True
        twin = parents[r.arm, r.config["seed"]]
        assert key not in twin.config
        assert ({k: v for k, v in r.config.items() if k not in (key, *aside)}
                == {k: v for k, v in twin.config.items() if k not in aside}), (r.arm, r.config["seed"])
        pairs.append((r, twin))
    return pairs


def test_recorded_grid_stop_is_the_grid_with_the_stop():
    """Chapter 8's second grid (``data/results/ch08/grid-stop``): every finished run is at one
    commit, clean, and its config is the grid's run of the same arm and seed with
    ``stop_at_answer`` switched on and nothing else changed that bears on training (the name,
    and ``report_to``, a logging key added after the grid's commit, aside), at a commit other
    than the grid's: its runs are compared with each other only."""
    _recorded_twins("grid-stop", "grid", "stop_at_answer", aside=("name", "report_to"))


def _budgeted_slates(rng, p_of, n_updates=3):
    """Removal slates with exact evaluations drawn at probabilities p_of(n): the logged credit
    is Eq. (21) of Eq. (19) and the exact contribution, as the engine logs it."""
    out = _slates(rng, n_updates=n_updates)
    for row in out:
        n = len(row["I"])
        p = p_of(n)
        z = (rng.random(n) < p).astype(float)
        args = [np.asarray(row[k]) for k in ("I", "G", "p", "P", "mu_hat")]
        eq19 = credit("removal", *args)
        exact = credit("oracle", *args, rewards_all=np.asarray(row["R"]))
        row["score"] = allocation.corrected_contribution(eq19, exact, z[:, None], p[:, None]).tolist()
        row["exact_p"], row["exact_z"] = p.tolist(), z.tolist()
    return out


def test_allocation_risks_and_advantage_distance(tmp_path):
    rng = np.random.default_rng(5)
    cfg = {"completions_per_agent": 4, "scale_rewards": "group", "exact_budget": 0.3}
    uniform = read_run(_write_run(tmp_path / "u", slates=_budgeted_slates(rng, lambda n: np.full(n, 0.3)),
                                  **cfg))
    risks = allocation_risks(uniform)
    assert list(risks.index) == [1, 2, 3] and (risks["Eq. (19) alone"] > 0).all()
    # the logged allocation is the uniform one of its own expected cost; Theorem 3 bounds both
    np.testing.assert_allclose(risks["risk allocated"], risks["risk uniform"], rtol=1e-12)
    np.testing.assert_allclose(risks["risk allocated"], (1 / 0.3 - 1) * risks["Eq. (19) alone"], rtol=1e-12)
    assert (risks["Theorem 3 bound"] <= risks["risk allocated"] * (1 + 1e-12)).all()
    # the flat groups' part of Eq. (19)'s error: none below a spread of 0, all of it below inf
    assert (allocation_risks(uniform, flat=0.0)["Eq. (19), flat groups"] == 0).all()
    np.testing.assert_allclose(allocation_risks(uniform, flat=np.inf)["Eq. (19), flat groups"],
                               risks["Eq. (19) alone"], rtol=1e-12)
    assert (risks["Eq. (19), flat groups"] <= risks["Eq. (19) alone"]).all()
    # the budget's share on flat groups: a uniform p spends it as the flat entries lie
    np.testing.assert_allclose(risks["expected evaluations"], 0.3 * 8, rtol=1e-12)
    sc = slate_credit(uniform)
    g = sc["removal"].to_numpy().reshape(3, -1, 4, 3)  # update, prompt, m, K
    flat_entries = (g.std(axis=2, ddof=1) < 1e-3).mean(axis=(1, 2))
    np.testing.assert_allclose(risks["expected on flat groups"] / risks["expected evaluations"],
                               flat_entries, rtol=1e-12)
    assert (allocation_risks(uniform, flat=0.0)["expected on flat groups"] == 0).all()
    wide = allocation_risks(uniform, flat=np.inf)
    np.testing.assert_allclose(wide["expected on flat groups"], wide["expected evaluations"], rtol=1e-12)
    # p = 1 only on the slates with no flat entry: none of the budget on flat groups; p = 1
    # only on those with one: all of it on slates that hold one, at least 1/K of each
    cut = float(np.median(g.std(axis=2, ddof=1)))  # half of the groups flat
    f_s = np.repeat((g.std(axis=2, ddof=1) < cut).mean(axis=2), 4, axis=1)  # update, slate
    assert 0 < f_s.mean() < 1

    def spent_on_flat(evaluated):
        for row, k in zip(uniform.slates, evaluated):
            row["exact_p"] = k.astype(float).tolist()
        r = allocation_risks(uniform, flat=cut).sum()
        return r["expected on flat groups"] / r["expected evaluations"]

    assert spent_on_flat(f_s == 0) == 0
    share = spent_on_flat(f_s > 0)
    assert share >= 1 / 3 and share == pytest.approx(f_s[f_s > 0].mean(), rel=1e-12)
    # p = 0 (the pre-draw rule's) keeps Eq. (19)'s error on its slate, not an infinite risk
    mixed = [np.where(k, 0.75, 0.0) for k in f_s > 0]
    for row, p in zip(uniform.slates, mixed):
        row["exact_p"] = p.tolist()
    r = allocation_risks(uniform)
    assert np.isfinite(r["risk allocated"]).all() and (r["risk allocated"] > 0).all()
    e2 = (sc["removal"] - sc["oracle"]).to_numpy().reshape(3, -1, 3) ** 2  # update, slate, K
    a2 = np.concatenate([credit_leverage(g[u], "group", uniform.advantage_eps, axis=-2).reshape(-1, 3)
                         for u in range(3)]).reshape(3, -1, 3) ** 2
    w2 = (a2 * e2).sum(axis=2)
    p = np.asarray(mixed)
    expected = np.where(p > 0, w2 * (1 / np.where(p > 0, p, 1) - 1), w2).sum(axis=1)
    np.testing.assert_allclose(r["risk allocated"], expected, rtol=1e-12)
    # every slate evaluated: Eq. (21) is the exact contribution, so nothing is left
    full = read_run(_write_run(tmp_path / "f", slates=_budgeted_slates(rng, lambda n: np.ones(n)), **cfg))
    r = allocation_risks(full)
    assert (r["evaluated"] == 8).all() and np.allclose(r[["risk allocated", "realised"]], 0, atol=1e-12)
    d = advantage_distance(full)
    assert d["trained"] == pytest.approx(0, abs=1e-12) and d["trained_corr"] == pytest.approx(1)
    assert d["eq19"] > 0.01 and 0 < d["signal_groups"] <= 1
    # a run without a budget trained on Eq. (19): the two distances are one
    plain = read_run(_write_run(tmp_path / "p", slates=_slates(rng), completions_per_agent=4))
    d = advantage_distance(plain)
    assert d["trained"] == d["eq19"] and d["trained_corr_signal"] == d["eq19_corr_signal"]
    with pytest.raises(ValueError, match="exact_p"):
        allocation_risks(plain)
