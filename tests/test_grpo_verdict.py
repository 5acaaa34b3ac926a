"""Tests of mcpg.grpo.verdict: Table 1 over seeds, paired seeds, power, health sensitivity."""

import json
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from mcpg.grpo import verdict
from mcpg.grpo.runs import read_comparison, t_interval

ROOT = Path(__file__).resolve().parents[1]
AGENTS = [{"name": n, "role": "r", "temperature": 1.0, "specialty": n} for n in ("money", "time", "geometry")]


def _eval(rng, n=16, k=3):
    right = rng.binomial(1, 0.4, size=(n, k))
    correct = right[np.arange(n), rng.integers(0, k, n)]
    base = rng.binomial(1, 0.2, n)
    return {"accuracy": float(correct.mean()), "uniform_accuracy": float(right.mean()),
            "best_of_k": float(right.max(1).mean()), "entropy": float(rng.random()),
            "brier": float(rng.random()), "specialization": float(rng.random()),
            "regret": float(right.max(1).mean() - correct.mean()), "base_accuracy": float(base.mean()),
            "correct": correct.tolist(), "base_correct": base.tolist(), "agent_correct": right.tolist(),
            "agent_accuracy": right.mean(0).tolist(), "initial_agent_accuracy": [0.2] * k,
            "deployed_fraction": [1 / k] * k, "router_auc": 0.9, "truncated": 0.0, "n": n}


def _grid(tmp_path, rng, arms, cut=None):
    """A grid folder ``<arm>/seed<k>`` with random evaluations; ``cut[(arm, seed)]`` sets a run's
    truncated share in training (0.1 otherwise)."""
    cut = cut or {}
    for arm, seeds in arms.items():
        signal, _, scaling = arm.partition("-")
        agents = AGENTS[:1] if arm == "control" else AGENTS
        for s in seeds:
            d = tmp_path / arm / f"seed{s}"
            d.mkdir(parents=True)
            cfg = {"agents": agents, "prompts_per_update": 2, "completions_per_agent": 4, "seed": s,
                   "task": "arithmetic", "data_dir": None, "data_seed": 0, "eval_problems": 16,
                   "scale_rewards": scaling or "group"}
            (d / "config.json").write_text(json.dumps({"config": cfg,
                                                       "signal": "wta" if arm == "control" else signal}))
            rows = [{"update": u, "reward": 0.5, "oracle": 0.5, "truncated": cut.get((arm, s), 0.1),
                     "agent_accuracy": [0.2] * len(agents), "credit_mean": [0.1] * len(agents)}
                    for u in range(1, 7)]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            e = _eval(rng, k=len(agents))
            if arm == "control":
                e.update(entropy=None, specialization=None)
            (d / "eval.json").write_text(json.dumps(e))
    return [r for r in read_comparison(tmp_path) if r.eval is not None]


def test_table1_is_the_mean_over_seeds_with_its_t_interval(tmp_path):
    rng = np.random.default_rng(0)
    runs = _grid(tmp_path, rng, {"control": [0, 1], "wta-group": [0, 1, 2], "removal-group": [0, 1, 2],
                                 "oracle-group": [0], "wta-none": [0, 1]})
    t = verdict.table1(runs, "group")
    assert list(t.index) == list(verdict.TABLE1_ROWS)
    assert t["seeds", "n"].tolist() == [3, 2, 3, 3, 1]
    for row, arm in (("wta", "wta-group"), ("removal", "removal-group")):
        for col, key in (("deployed", "accuracy"), ("agents' mean", "uniform_accuracy"),
                         ("regret", "regret")):
            v = [r.eval[key] for r in runs if r.arm == arm]
            ci = t_interval(v)
            assert t.loc[row, (col, "mean")] == pytest.approx(np.mean(v))
            assert t.loc[row, (col, "low")] == pytest.approx(ci["low"])
            assert t.loc[row, (col, "high")] == pytest.approx(ci["high"])
    # the frozen model answers alone: deployed only; one oracle seed: no interval
    assert np.isnan(t.loc["frozen", ("entropy", "mean")]) and np.isnan(t.loc["oracle", ("deployed", "low")])
    assert np.isnan(t.loc["control", ("entropy", "mean")])  # K = 1: no routing
    text = verdict.format_table1(t)
    assert text.loc["control", "entropy"] == "–" and "[" not in text.loc["oracle", "deployed"]
    assert text.loc["frozen", "seeds"] == "–" and text.loc["wta", "seeds"] == 3  # one measurement
    assert text.loc["wta", "deployed"].startswith(f"{t.loc['wta', ('deployed', 'mean')]:.3f} [")
    # the centred table has no oracle row and two seeds of wta
    c = verdict.table1(runs, "none")
    assert "oracle" not in c.index and "removal" not in c.index and c.loc["wta", ("seeds", "n")] == 2


def test_paired_seeds_pair_only_seeds_both_arms_finished(tmp_path):
    rng = np.random.default_rng(1)
    runs = _grid(tmp_path, rng, {"wta-group": [0, 1, 2, 3], "removal-group": [1, 2, 3, 5]})
    p = verdict.paired_seeds(runs)
    assert list(p.index) == [1, 2, 3]
    by = {(r.arm, r.config["seed"]): r.eval for r in runs}
    for s in p.index:
        d = by["removal-group", s]["accuracy"] - by["wta-group", s]["accuracy"]
        assert p.loc[s, ("deployed", "difference")] == pytest.approx(d)
    v = verdict.seed_verdict(runs, target=0.04)
    ref = stats.ttest_1samp(p["deployed", "difference"], 0).confidence_interval(0.95)
    assert v.loc["deployed", "low"] == pytest.approx(ref.low)
    assert v.loc["deployed", "high"] == pytest.approx(ref.high)
    assert v.loc["deployed", "below 0"] + v.loc["deployed", "above 0"] <= 3
    with pytest.raises(ValueError, match="both"):
        verdict.paired_seeds(runs, scaling="none")


def test_power_half_widths_and_the_target():
    d = np.array([0.1, -0.2, 0.05, 0.0])
    pw = verdict.power(d, target=0.04)
    sd = d.std(ddof=1)
    assert pw["half_width"] == pytest.approx(stats.t.ppf(0.975, 3) * sd / 2)
    assert pw["half_width_10"] == pytest.approx(stats.t.ppf(0.975, 9) * sd / np.sqrt(10))
    assert pw["contains_target"] and not pw["excludes_zero"]
    far = verdict.power(d + 1.0, target=0.04)
    assert far["excludes_zero"] and not far["contains_target"]
    with pytest.raises(ValueError):
        verdict.power([0.1])


def test_power_interval_covers_at_its_level():
    # three seeds of normal differences: the t-interval covers the true mean 95% of the time
    rng = np.random.default_rng(2)
    hits = [(pw := verdict.power(rng.normal(0.04, 0.2, 3)))["low"] <= 0.04 <= pw["high"] for _ in range(3000)]
    assert abs(np.mean(hits) - 0.95) < 0.014  # 3.5 binomial standard errors


def test_health_sensitivity_names_what_it_leaves_out(tmp_path):
    rng = np.random.default_rng(3)
    runs = _grid(tmp_path, rng, {"wta-group": [0, 1, 2], "removal-group": [0, 1, 2]},
                 cut={("removal-group", 1): 0.4})
    s = verdict.health_sensitivity(runs)
    assert s.loc["every pair", "pairs"] == 3 and s.loc["every pair", "left out"] == "none"
    assert s.loc["cut in training <= bar", "pairs"] == 2
    assert s.loc["cut in training <= bar", "left out"] == "seed 1"
    assert s.loc["cut in training <= bar", "left-out seeds"] == (1,)
    assert s.loc["every pair", "left-out seeds"] == ()
    p = verdict.paired_seeds(runs)
    assert s.loc["cut in training <= bar", "mean"] == pytest.approx(
        p.loc[[0, 2], ("deployed", "difference")].mean())
    # cut_failures names the run that fails, and only it
    fails = verdict.cut_failures(runs)
    assert fails["removal"].to_dict() == {0: False, 1: True, 2: False}
    assert not fails["wta"].any()
    # several seeds are named as prose names them
    two = _grid(tmp_path / "two", rng, {"wta-group": [0, 1, 2], "removal-group": [0, 1, 2]},
                cut={("removal-group", 0): 0.4, ("wta-group", 2): 0.5})
    s2 = verdict.health_sensitivity(two)
    assert s2.loc["cut in training <= bar", "left out"] == "seeds 0 and 2"
    assert s2.loc["cut in training <= bar", "left-out seeds"] == (0, 2)
    assert s2.loc["cut in training <= bar", "pairs"] == 1


def test_control_gains_and_dropouts(tmp_path):
    rng = np.random.default_rng(4)
    runs = _grid(tmp_path, rng, {"control": [0, 1], "wta-group": [0]})
    g = verdict.control_gains(runs)
    assert list(g.index) == [0, 1]
    for r in (r for r in runs if r.arm == "control"):
        gain = np.mean(np.subtract(r.eval["correct"], r.eval["base_correct"]))
        assert g.loc[r.config["seed"], "gain"] == pytest.approx(gain)
        row = g.loc[r.config["seed"]]
        assert row["clears the bar"] == (gain >= 0.1 and row["low"] > 0)
    d = verdict.dropouts(runs, below=0.5)
    assert list(d.index) == [("wta-group", 0)]  # the control has no routing
    acc = next(r for r in runs if r.arm == "wta-group").eval["agent_accuracy"]
    assert d.iloc[0]["dropped"] == sum(a < 0.5 for a in acc)


def test_figures_draw_one_line_per_seed(tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    rng = np.random.default_rng(5)
    runs = _grid(tmp_path, rng, {"wta-group": [0, 1, 2], "removal-group": [0, 1, 2]})
    fig = verdict.paired_seed_figure({"group": verdict.paired_seeds(runs, columns=("deployed",))})
    lines = [ln for ln in fig.axes[0].lines if len(ln.get_xdata()) == 2 and list(ln.get_xdata()) == [0, 1]]
    assert len(lines) == 3
    fig = verdict.arm_figure(runs, "t")
    assert len(fig.axes) == 3


def test_cut_answer_kinds_reads_the_recorded_probe():
    folder = ROOT / "data" / "results" / "ch08" / "grid" / "probe" / "cut-answers"
    if not folder.is_dir():
        pytest.skip("no probe recorded")
    kinds = verdict.cut_answer_kinds(folder)
    for path in folder.glob("*/summary.json"):
        s = json.loads(path.read_text())
        for k, name in enumerate(s["agent_names"]):
            assert kinds.loc[(path.parent.name, name), "cut"] == pytest.approx(s["per_agent"][k]["cut"])
    with pytest.raises(FileNotFoundError):
        verdict.cut_answer_kinds(ROOT / "data")


def test_recorded_grid_mask_is_the_stop_grid_with_cut_answers_masked():
    """Chapter 8's grid of record (``data/results/ch08/grid-mask``): each finished run is at one
    clean commit of its own, its config is the stop grid's run of the same arm and seed with
    ``mask_truncated_completions`` switched on and nothing else changed, and it starts from the
    same untrained evaluation (the key acts only on updates). Seeds the stop grid never recorded
    are checked against the grid's own seed 0 of the same arm (the seed apart)."""
    root = ROOT / "data" / "results" / "ch08"
    runs = [r for r in read_comparison(root / "grid-mask") if r.eval is not None]
    if not runs:
        pytest.skip("no grid-mask run recorded")
    stop = {(r.arm, r.config["seed"]): r for r in read_comparison(root / "grid-stop")}
    # one commit, dfdbc84; the centred additions (seeds 3-9, the oracle's 1-2) at their own, 95ffaa9,
    # whose untrained evaluation is byte for byte the one dfdbc84 recorded for the seed's other arms
    later = [r for r in runs if not r.provenance["commit"].startswith("dfdbc84")]
    assert len({r.provenance["commit"] for r in runs if r not in later}) == 1
    assert {r.provenance["commit"][:7] for r in later} <= {"95ffaa9"}
    for r in later:
        k = r.config["seed"]
        assert r.config["scale_rewards"] == "none" and (k >= 3 or (r.signal == "oracle" and k in (1, 2)))
        same = next(x for x in runs if x.arm == "wta-group" and x.config["seed"] == k)
        assert (r.path / "initial_eval.json").read_bytes() == (same.path / "initial_eval.json").read_bytes()
    # a key today's engine resolves that dfdbc84's lacked (the shared prompt's KV cache, on: the
    # reference test holds bit for bit with it)
    newer = {"shared_prefix": True}
    assert runs[0].provenance["commit"] not in {r.provenance["commit"] for r in stop.values()}
    key = "mask_truncated_completions"
    first = {r.arm: r for r in runs if r.config["seed"] == 0}
    for r in runs:
        assert not r.provenance["dirty"] and r.config[key] is True
        twin = stop.get((r.arm, r.config["seed"]))
        if twin is None:  # a seed the stop grid never recorded: the grid's own seed 0, seed apart
            ref = first[r.arm]
            skip = {"seed"} | {k for k, v in newer.items() if k not in ref.config and r.config.get(k) == v}
            assert ({k: v for k, v in r.config.items() if k not in skip}
                    == {k: v for k, v in ref.config.items() if k != "seed"}), (r.arm, r.config["seed"])
            continue
        assert key not in twin.config
        assert {k: v for k, v in r.config.items() if k != key} == twin.config, (r.arm, r.config["seed"])
        untrained = [json.loads((x.path / "initial_eval.json").read_text()) for x in (r, twin)]
        assert untrained[0] == untrained[1]


def test_seeds_needed_is_the_first_n_whose_half_width_fits():
    # the chapter's power sentence: at a per-seed spread of 0.2, resolving +-0.04 takes about 100
    # seeds; n is the first whose t half-width fits and n - 1 does not
    for sd, hw in ((0.2, 0.04), (0.207, 0.04), (0.1, 0.1), (1.0, 0.3)):
        n = verdict.seeds_needed(sd, hw)
        assert stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n) <= hw
        if n > 2:
            assert stats.t.ppf(0.975, n - 2) * sd / np.sqrt(n - 1) > hw
    assert 95 <= verdict.seeds_needed(0.2, 0.04) <= 102
    with pytest.raises(ValueError):
        verdict.seeds_needed(0.0, 0.04)


def test_seeds_for_power_matches_a_simulated_t_test():
    from scipy import stats as st

    from mcpg.grpo.verdict import seeds_for_power, seeds_needed

    n = seeds_for_power(0.2, 0.1)
    # the normal approximation ((1.96 + 0.84) sd / effect)^2 = 31.4, plus about two for the t
    assert 32 <= n <= 36
    rng = np.random.default_rng(0)
    for k, lo, hi in ((n, 0.78, 0.84), (n - 8, 0.6, 0.75)):
        d = rng.normal(0.1, 0.2, size=(20_000, k))
        hit = st.ttest_1samp(d, 0.0, axis=1).pvalue < 0.05
        assert lo <= hit.mean() <= hi, (k, hit.mean())
    # a half-width of the effect's size is far fewer seeds: it detects the effect half the time
    assert seeds_needed(0.2, 0.1) < n
