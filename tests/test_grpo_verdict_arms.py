"""Tests of mcpg.grpo.verdict's readings of named arms: arms_over_seeds, config_departures."""

import json

import numpy as np
import pytest

from mcpg.grpo import verdict
from mcpg.grpo.heldout import per_problem, t_interval
from mcpg.grpo.runs import read_comparison

AGENTS = [{"name": n, "role": "r", "temperature": 1.0, "specialty": n} for n in ("money", "time", "geometry")]


def _grid(tmp_path, rng, arms, extra=None):
    """A grid ``<arm>/seed<k>`` of removal runs with random per-problem evaluations on 16
    problems; ``extra[arm]`` adds config keys to that arm's runs."""
    extra = extra or {}
    for arm, seeds in arms.items():
        for s in seeds:
            d = tmp_path / arm / f"seed{s}"
            d.mkdir(parents=True)
            cfg = {"agents": AGENTS, "prompts_per_update": 2, "completions_per_agent": 4, "seed": s,
                   "task": "arithmetic", "data_dir": None, "data_seed": 0, "eval_problems": 16,
                   "scale_rewards": "group", "exact_budget": 0.0, **extra.get(arm, {})}
            (d / "config.json").write_text(json.dumps({"config": cfg, "signal": "removal"}))
            row = {"update": 1, "reward": 0.5, "oracle": 0.5, "truncated": 0.1}
            (d / "metrics.jsonl").write_text(json.dumps(row) + "\n")
            right = rng.binomial(1, 0.4, size=(16, 3))
            correct = right[np.arange(16), rng.integers(0, 3, 16)]
            (d / "eval.json").write_text(json.dumps({
                "accuracy": float(correct.mean()), "uniform_accuracy": float(right.mean()),
                "best_of_k": float(right.max(1).mean()), "correct": correct.tolist(),
                "agent_correct": right.tolist(), "base_correct": [0] * 16, "n": 16}))
    return [r for r in read_comparison(tmp_path) if r.eval is not None]


def test_arms_over_seeds_is_the_t_interval_of_the_per_seed_paired_differences(tmp_path):
    rng = np.random.default_rng(0)
    runs = _grid(tmp_path, rng, {"uniform-b0.1-group": [0, 1, 2], "removal-group": [0, 1, 2, 3],
                                 "oracle-group": [0], "leverage-b0.1-group": [1, 2]})
    by = {(r.arm, r.config["seed"]): r for r in runs}
    pairs = [("uniform-b0.1-group", "removal-group"), ("uniform-b0.1-group", "oracle-group"),
             ("leverage-b0.1-group", "uniform-b0.1-group"), ("leverage-b0.1-group", None),
             ("leverage-b0.1-group", "oracle-group")]  # no seed in common: left out
    t = verdict.arms_over_seeds(runs, pairs)
    assert sorted({k[:2] for k in t.index}) == sorted(pairs[:3])
    for (arm, ref), seeds in {pairs[0]: [0, 1, 2], pairs[1]: [0], pairs[2]: [1, 2]}.items():
        for measure in ("uniform", "deployed"):
            d = [(per_problem(by[arm, s], measure) - per_problem(by[ref, s], measure)).mean()
                 for s in seeds]
            row = t.loc[(arm, ref, measure)]
            assert row["difference"] == pytest.approx(np.mean(d))
            assert row["n"] == len(seeds) and row["seeds"] == ", ".join(map(str, seeds))
            if len(seeds) > 1:
                ci = t_interval(d)
                assert (row["low"], row["high"]) == (pytest.approx(ci["low"]), pytest.approx(ci["high"]))
            else:
                assert np.isnan(row["low"]) and np.isnan(row["high"])
    # the direction: swapping an arm and its reference flips the sign, keeps the width
    swapped = verdict.arms_over_seeds(runs, [pairs[0][::-1]], measures=("uniform",))
    a, b = t.loc[(*pairs[0], "uniform")], swapped.iloc[0]
    assert b["difference"] == pytest.approx(-a["difference"]) and b["difference"] != 0
    assert b["high"] - b["low"] == pytest.approx(a["high"] - a["low"])


def test_arms_over_seeds_is_empty_when_nothing_is_paired(tmp_path):
    runs = _grid(tmp_path, np.random.default_rng(1), {"removal-group": [0]})
    t = verdict.arms_over_seeds(runs, [("uniform-b0.1-group", "removal-group")])
    assert t.empty and list(t.columns) == ["difference", "low", "high", "n", "seeds"]
    assert t.index.names == ["arm", "reference", "measure"]


def test_config_departures_names_each_changed_or_added_key(tmp_path):
    runs = _grid(tmp_path, np.random.default_rng(2), {"removal-group": [0], "uniform-b0.1-group": [1]},
                 extra={"uniform-b0.1-group": {"exact_budget": 0.1, "allocation": "uniform"}})
    plain, budgeted = sorted(runs, key=lambda r: r.arm)
    assert plain.arm == "removal-group"
    assert verdict.config_departures(budgeted, budgeted) == {}
    # the seed differs but is ignored; the budget differs; allocation is new
    assert verdict.config_departures(budgeted, plain) == {"exact_budget": (0.1, 0.0),
                                                          "allocation": ("uniform", None)}
    assert "seed" in verdict.config_departures(budgeted, plain, ignore=())
