"""Chapter 7's readings of chapter 8's grid (mcpg.grpo.simulated.readings): the words follow the
intervals and name the seeds, whatever the grid holds."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from mcpg import stats
from mcpg.grpo.runs import read_comparison
from mcpg.grpo.simulated import readings

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "book" / "07_routed_grpo_simulation.md"
AGENTS = [{"name": n, "role": "r", "temperature": 1.0, "specialty": n} for n in ("money", "time", "geometry")]
FORBIDDEN = re.compile(r"\b(reach|reaches|reached|level with|tie|ties)\b")


def _grid(tmp_path, accuracy):
    """A grid folder ``<arm>/seed<k>``: ``accuracy[arm][seed]`` is the run's deployed accuracy
    (the agents' mean is half of it); everything else is the same for every run."""
    for arm, by_seed in accuracy.items():
        signal, _, scaling = arm.partition("-")
        for s, acc in by_seed.items():
            d = tmp_path / arm / f"seed{s}"
            d.mkdir(parents=True)
            cfg = {"agents": AGENTS, "prompts_per_update": 2, "completions_per_agent": 4, "seed": s,
                   "task": "arithmetic", "data_dir": None, "data_seed": 0, "eval_problems": 16,
                   "scale_rewards": scaling}
            (d / "config.json").write_text(json.dumps({"config": cfg, "signal": signal}))
            rows = [{"update": u, "reward": 0.5, "oracle": 0.5, "truncated": 0.1,
                     "agent_accuracy": [0.2] * 3, "credit_mean": [0.1] * 3} for u in range(1, 7)]
            (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            e = {"accuracy": acc, "uniform_accuracy": acc / 2, "best_of_k": min(1.0, acc + 0.1),
                 "entropy": 0.5, "brier": 0.2, "specialization": 0.3, "regret": 0.1,
                 "base_accuracy": 0.1, "agent_accuracy": [0.2] * 3, "n": 16}
            (d / "eval.json").write_text(json.dumps(e))
    return [r for r in read_comparison(tmp_path) if r.eval is not None]


# an arm far behind on average whose interval over three seeds is wide enough to cover 0
FAR_BEHIND = {"wta-group": {0: 0.60, 1: 0.62, 2: 0.58},
              "removal-group": {0: 0.10, 1: 0.70, 2: 0.05}}


def test_a_far_behind_arm_with_a_wide_interval_cannot_be_told_apart(tmp_path):
    runs = _grid(tmp_path, FAR_BEHIND)
    x = readings.paired_arms(runs, "removal", "wta")
    assert x["n"] == 3 and x["low"] < 0 < x["high"]
    assert x["mean_a"] == pytest.approx(np.mean([0.10, 0.70, 0.05]))
    assert x["mean"] == pytest.approx(x["mean_a"] - x["mean_b"]) and x["mean"] < -0.2
    text = readings.arms_sentence(x)
    assert "cannot be told apart by these seeds" in text and "behind on average" in text
    assert f"removal ({x['mean_a']:.3f})" in text and f"winner-take-all ({x['mean_b']:.3f})" in text
    assert not FORBIDDEN.search(text)
    # the per-seed statement names the seeds it holds on: behind on two of three
    assert stats.seeds_where(x["diff"] < 0) == "on seeds 0 and 2 (2 of 3)"


def test_an_interval_below_zero_reads_behind_and_above_zero_ahead(tmp_path):
    runs = _grid(tmp_path, {"wta-group": {0: 0.60, 1: 0.62, 2: 0.58, 3: 0.61},
                            "removal-group": {0: 0.40, 1: 0.43, 2: 0.39, 3: 0.40}})
    behind = readings.paired_arms(runs, "removal", "wta")
    assert behind["high"] < 0
    assert readings.arms_sentence(behind).startswith(
        f"removal ({behind['mean_a']:.3f}) is behind winner-take-all")
    ahead = readings.paired_arms(runs, "wta", "removal")
    assert readings.arms_sentence(ahead, "winner-take-all", "removal").startswith(
        f"winner-take-all ({ahead['mean_a']:.3f}) is ahead of removal")


def test_one_seed_gives_no_interval_and_says_so(tmp_path):
    runs = _grid(tmp_path, {"wta-none": {0: 0.5}, "oracle-none": {0: 0.4}})
    x = readings.paired_arms(runs, "oracle", "wta", scaling="none")
    assert x["n"] == 1 and np.isnan(x["low"]) and np.isnan(x["high"])
    text = readings.arms_sentence(x)
    assert text == ("the oracle (0.400) against winner-take-all (0.500) on one seed, "
                    "which gives no interval over seeds")
    assert readings.interval_against(x, [0.1, -0.2]) == "has no interval yet (one seed)"


def test_a_subset_of_seeds_reads_those_seeds_only(tmp_path):
    runs = _grid(tmp_path, FAR_BEHIND)
    x = readings.paired_arms(runs, "removal", "wta", seeds=[1, 2])
    assert list(x["diff"].index) == [1, 2]
    assert x["mean_a"] == pytest.approx(np.mean([0.70, 0.05]))
    with pytest.raises(ValueError):
        readings.paired_arms(runs, "removal", "wta", seeds=[7])


def test_an_interval_against_the_simulation_s_values():
    x = {"low": -0.3, "high": 0.3, "n": 3}
    assert readings.interval_against(x, [-0.04, -0.02]) == "contains every one of them"
    assert readings.interval_against(x, [0.31, 0.5]) == "lies below every one of them"
    assert readings.interval_against(x, [-0.5, -0.4]) == "lies above every one of them"
    assert readings.interval_against(x, [-0.5, 0.0, 0.1]) == "contains 2 of the 3"
    with pytest.raises(ValueError):
        readings.interval_against(x, [])


def test_side_counts_use_the_verbs_of_compare_reading():
    assert (readings.side_counts(["behind", "level", "behind"])
            == "is behind winner-take-all in 2 of the 3 cells and cannot be told apart from it in 1")
    assert (readings.side_counts(["level", "level"])
            == "cannot be told apart from winner-take-all in all 2 cells")
    assert readings.side_counts(["ahead"], "the oracle") == "is ahead of the oracle in 1 of 1 cells"
    for sides in (["behind", "level", "ahead"], ["level"] * 4):
        assert not FORBIDDEN.search(readings.side_counts(sides))
    with pytest.raises(ValueError):
        readings.side_counts(["tie"])
    with pytest.raises(ValueError):
        readings.side_counts([])


def test_seed_names_and_span():
    assert readings.seed_names([0]) == "seed 0"
    assert readings.seed_names([0, 1, 2]) == "seeds 0, 1 and 2"
    assert readings.span([0.356, 0.816]) == "0.36 to 0.82"
    assert readings.span([0.5, 0.501]) == "0.50"
    assert readings.span([-0.02, 0.008], 3, signed=True) == "-0.020 to +0.008"


def test_the_chapter_reads_chapter_8_from_its_grid_of_record_only():
    """Chapter 7 quotes chapter 8 from the grid of record, through these builders: it names no
    other recording of chapter 8 as a results folder, and writes no reading of an interval
    by hand in a reaching or tying word."""
    text = CHAPTER.read_text()
    folders = set(re.findall(r'"ch08"\s*/\s*"([\w-]+)"', text)) | set(re.findall(r"ch08/([\w-]+)", text))
    assert folders == {"grid-mask"}, folders
    assert "readings.paired_arms" in text and "readings.arms_sentence" in text
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    assert not re.search(r"\b(level with|a tie|ties)\b", prose)


# the third box's test of one ablation, on constructed per-seed differences whose intervals are
# known: 30 seeds, sd about 0.01 (half-width about 0.006 at Bonferroni over 7, t_29 = 3.06)
NOISE = np.random.default_rng(0).normal(size=30)
NOISE = (NOISE - NOISE.mean()) / NOISE.std(ddof=1) * 0.01


def test_an_ablation_that_flips_the_sign_decides_it():
    r = readings.sign_test(-0.09 + NOISE, +0.05 + NOISE[::-1], n_ablations=7)
    assert r["twin"]["side"] == "behind" and r["ablated"]["side"] == "ahead"
    assert r["difference"]["low"] > 0 and r["verdict"] == "decides the sign"
    assert r["level"] == pytest.approx(1 - 0.05 / 7) and r["n"] == 30 and not r["identical"]
    # its interval is a t-interval at that level, by hand
    hw = stats.t_quantile(1 - 0.05 / 7, 29) * 0.01 / np.sqrt(30)
    assert r["twin"]["low"] == pytest.approx(-0.09 - hw) and r["twin"]["high"] == pytest.approx(-0.09 + hw)


def test_an_ablation_that_shifts_without_crossing_moves_it():
    # from -0.09 to -0.03: still behind, yet the difference +0.06 excludes 0
    r = readings.sign_test(-0.09 + NOISE, -0.03 + NOISE[::-1], n_ablations=7)
    assert r["ablated"]["side"] == "behind" and r["difference"]["side"] == "ahead"
    assert r["verdict"] == "moves the sign"
    # to 0 (covering it): the twin's side against level is not opposite sides; it moves
    r = readings.sign_test(-0.09 + NOISE, 0.0 + NOISE[::-1], n_ablations=7)
    assert r["ablated"]["side"] == "level" and r["verdict"] == "moves the sign"


def test_an_ablation_whose_difference_covers_0_is_refuted_and_bonferroni_widens():
    # a shift of +0.004: at 95 % alone its difference can exclude 0, over 7 ablations it cannot
    twin, abl = -0.09 + NOISE, -0.086 + NOISE
    abl = abl + 0.009 * np.tile([1, -1], 15)  # the difference: 0.004 ± 0.009 by seed
    one = readings.sign_test(twin, abl, n_ablations=1)
    seven = readings.sign_test(twin, abl, n_ablations=7)
    assert one["difference"]["low"] > 0 and one["verdict"] == "moves the sign"
    assert seven["difference"]["low"] < 0 and seven["verdict"] == "refuted as the decider"


def test_an_ablation_that_changes_nothing_is_refuted_and_says_so():
    r = readings.sign_test(-0.09 + NOISE, -0.09 + NOISE, n_ablations=7)
    assert r["identical"] and r["difference"]["low"] == r["difference"]["high"] == 0
    assert r["verdict"] == "refuted as the decider"


def test_the_sign_test_refuses_unpaired_or_too_few_seeds():
    with pytest.raises(ValueError):
        readings.sign_test(np.zeros(30), np.zeros(29), n_ablations=7)
    with pytest.raises(ValueError):
        readings.sign_test(np.zeros(1), np.zeros(1), n_ablations=7)
    with pytest.raises(ValueError):
        readings.sign_test(np.zeros(3), np.zeros(3), n_ablations=0)


def test_recorded_arms_reads_a_twin_recording():
    rec = {"arms": [{"scale_rewards": "none", "signal": "wta", "accuracy": [0.5, 0.6]},
                    {"scale_rewards": "none", "signal": "removal", "accuracy": [0.4, 0.7]}]}
    arms = readings.recorded_arms(rec)
    assert set(arms) == {("none", "wta"), ("none", "removal")}
    assert np.allclose(arms["none", "removal"] - arms["none", "wta"], [-0.1, 0.1])
    with pytest.raises(KeyError):
        readings.recorded_arms(rec, "sampled_accuracy")
