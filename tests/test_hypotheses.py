"""Chapter 8's hypotheses read by their stated rules (mcpg.grpo.hypotheses), on built grids
whose answer is known: each rule gives each of its readings on the grid made for it, and
nothing is read while a run it needs is missing."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from mcpg.grpo import hypotheses as hyp
from mcpg.grpo.rundir import Run

AGENTS = ["money", "time", "geometry"]


def _run(arm, seed, deployed=0.5, agents=(0.4, 0.4, 0.4), cut=0.0, slates=()):
    signal, _, scaling = arm.partition("-")
    e = {"accuracy": deployed, "uniform_accuracy": float(np.mean(agents)), "best_of_k": 0.8,
         "entropy": 0.5, "brier": 0.2, "specialization": 0.1, "regret": 0.1, "base_accuracy": 0.2,
         "agent_accuracy": list(agents), "initial_agent_accuracy": [0.3] * 3,
         "deployed_fraction": [1 / 3] * 3, "router_auc": 0.9, "truncated": cut}
    metrics = pd.DataFrame({"update": range(1, 7), "truncated": [cut] * 6})
    return Run(path=Path(f"/tmp/g/{arm}/seed{seed}"), signal=signal, agents=AGENTS, metrics=metrics,
               config={"seed": seed, "scale_rewards": scaling, "completions_per_agent": 4},
               eval=e, slates=list(slates))


def _grid(diff=None, seeds=range(10), cut=None, dropped=None, oracle=None, scalings=("group", "none"),
          oracle_seeds=hyp.ORACLE_SEEDS):
    """wta-{scaling} at 0.5 deployed; removal at 0.5 + diff[scaling][seed]; oracle likewise."""
    rng = np.random.default_rng(0)
    runs = []
    for sc in scalings:
        for s in seeds:
            runs.append(_run(f"wta-{sc}", s, 0.5 + 0.01 * rng.normal()))
            d = (diff or {}).get(sc, lambda s: 0.0)(s)
            agents = (0.05, 0.4, 0.4) if (dropped or {}).get((sc, s)) else (0.4, 0.4, 0.4)
            runs.append(_run(f"removal-{sc}", s, runs[-1].eval["accuracy"] + d, agents,
                             cut=(cut or {}).get((sc, s), 0.0)))
            if s in oracle_seeds and oracle is not None:
                runs.append(_run(f"oracle-{sc}", s, runs[-2].eval["accuracy"] + oracle(sc, s)))
    return runs


@pytest.mark.parametrize("shift, reading", [(-0.2, "refuted"), (0.2, "supported"), (0.0, "undecided")])
def test_h1_reads_the_side_of_the_interval(shift, reading):
    noise = np.random.default_rng(1).normal(0, 0.05, 10)
    r = hyp.read_h1(_grid({"none": lambda s: shift + noise[s]}))
    assert r["reading"] == reading and r["n"] == 10
    assert (r["high"] < 0) == (reading == "refuted") and (r["low"] > 0) == (reading == "supported")
    if reading == "undecided":  # the interval contains 0; whether it excludes +0.07 is said
        assert ("excludes" in r["why"]) == (r["high"] < hyp.H1_PREDICTION)


def test_nothing_is_read_while_a_run_is_missing():
    runs = [r for r in _grid() if not (r.arm == "removal-none" and r.config["seed"] == 7)]
    assert hyp.read_h1(runs)["reading"] == "not read"
    assert "removal-none seed 7" in hyp.read_h1(runs)["why"]
    assert hyp.read_h4(runs)["reading"] == "not read"
    table = hyp.read_hypotheses(runs, replays=[])
    assert table.loc["H2a", "reading"] == "not read" and table.loc["H2b", "reading"] == "not read"
    assert table.loc["H2 contrast", "reading"] == "not read"


def test_h2_contrast_and_h4_count_the_runs():
    fails = {("group", s): 0.5 for s in (3, 4, 6, 7, 9)}
    fewer = hyp.read_h2(_grid(cut={**fails, ("none", 3): 0.5}), [])[-1]
    assert fewer["reading"] == "consistent" and (fewer["centred"], fewer["standardised"]) == (1, 5)
    same = hyp.read_h2(_grid(cut={**fails, **{("none", s): 0.5 for s in range(5)}}), [])[-1]
    assert same["reading"] == "refuted"
    drops = {("group", s): True for s in (1, 2, 5)}
    assert hyp.read_h4(_grid(dropped=drops))["reading"] == "consistent"
    assert hyp.read_h4(_grid(dropped={**drops, ("none", 0): True, ("none", 1): True,
                                      ("none", 2): True}))["reading"] == "refuted"


def test_h3_names_the_loser_by_its_rule():
    noise = np.random.default_rng(2).normal(0, 0.01, 10)
    behind = hyp.read_h3(_grid(oracle=lambda sc, s: -0.3 + noise[s]))
    assert [r["reading"] for r in behind] == ["the contribution loses"] * 2
    # removal far behind winner-take-all, the oracle level with it: the estimate loses
    est = hyp.read_h3(_grid({sc: (lambda s: -0.3 + noise[s]) for sc in ("group", "none")},
                            oracle=lambda sc, s: noise[s]))
    assert [r["reading"] for r in est] == ["the estimate loses"] * 2
    level = hyp.read_h3(_grid(oracle=lambda sc, s: [0.1, -0.1, 0.0][s]))
    assert [r["reading"] for r in level] == ["undecided"] * 2


def _replay(seed, a_sign, rng, updates=12, m=4, K=3, B=2, spread=0.0, arm="removal-group"):
    """A standardised removal replay whose hopeless group gives its finished completions a mean
    advantage of sign ``a_sign`` (the cut ones score higher when it is negative); ``spread``
    separates two of the other problem's completions (a rollout whose spread is large beside
    the hopeless group's); ``arm`` sets the scaling."""
    slates = []
    for t in range(1, updates + 1):
        R = np.zeros((B * m, K))
        R[m:, :][0, 0] = 1.0  # problem 1 has a right candidate; problem 0 none
        cut = np.zeros((B * m, K), int)
        cut[:2, :] = 1  # two of problem 0's four completions are cut, for every agent
        cut[m:, :] = rng.random((m, K)) < 0.3  # and some of problem 1's: the cut share varies
        score = rng.normal(0, 0.1, (B * m, K))
        score[:2, :] -= a_sign * (0.5 + 0.1 * rng.random())
        score[m:m + 2, :] += spread
        slates.append({"update": t, "R": R.tolist(), "score": score.tolist(), "cut": cut.tolist()})
    return Run(path=Path(f"/tmp/r/{arm}/seed{seed}"), signal="removal", agents=AGENTS,
               metrics=pd.DataFrame(), slates=slates,
               config={"seed": seed, "scale_rewards": arm.split("-")[1], "completions_per_agent": m})


def test_h2a_reads_the_sign_of_the_finished_answers_advantage():
    rng = np.random.default_rng(3)
    neg = [_replay(s, -1, rng) for s in hyp.REPLAYED]
    h2a = hyp.read_h2(_grid(), neg, n_perm=200)[0]
    assert h2a["reading"] == "consistent" and h2a["pooled"] < 0 and h2a["high"] >= h2a["low"]
    # the table of every reading carries its numbers, so a page need not read H2 again
    table = hyp.read_hypotheses(_grid(), neg, n_perm=200)
    assert list(table.columns[:3]) == ["measurement", "reading", "why"]
    assert table.loc["H2a", "pooled"] == h2a["pooled"] and table.loc["H2a", "seed 3"] == h2a["seed 3"]
    assert np.isnan(table.loc["H2b", "pooled"]) and -1 <= table.loc["H2b", "rho"] <= 1
    # seed 3 alone positive refutes it even with the pooled mean below 0
    mixed = [_replay(s, +1 if s == 3 else -1, rng) for s in hyp.REPLAYED]
    h2a = hyp.read_h2(_grid(), mixed, n_perm=200)[0]
    assert h2a["reading"] == "refuted" and "seed 3" in h2a["why"] and h2a["pooled"] < 0
    short = [_replay(s, -1, rng, updates=11 if s == 9 else 12) for s in hyp.REPLAYED]
    assert hyp.read_h2(_grid(), short, n_perm=200)[0]["reading"] == "not read"


@pytest.mark.parametrize("rho, p, reading", [(-0.4, 0.01, "supported"), (-0.1, 0.3, "undecided"),
                                             (0.0, 0.5, "refuted"), (0.3, 0.9, "refuted")])
def test_h2b_reads_the_mean_correlation_and_its_permutation_p(monkeypatch, rho, p, reading):
    rng = np.random.default_rng(4)
    replays = [_replay(s, -1, rng) for s in hyp.REPLAYED]
    real = hyp.read_h2(_grid(), replays, n_perm=200)[1]  # the measurement runs on these slates
    assert real["hypothesis"] == "H2b" and real["reading"] != "not read" and -1 <= real["rho"] <= 1
    monkeypatch.setattr(hyp, "follows", lambda frames, **kw: {"rho": rho, "p": p})
    assert hyp.read_h2(_grid(), replays, n_perm=200)[1]["reading"] == reading


BOTH = ("group", "batch")


def test_h5_waits_for_its_runs():
    runs = [r for r in _grid(scalings=BOTH) if not (r.arm == "wta-batch" and r.config["seed"] == 9)]
    rows = hyp.read_h5(runs, [])
    assert [r["hypothesis"] for r in rows] == ["H5a", "H5b", "H5c", "H5 check"]
    assert all(r["reading"] == "not read" for r in rows)
    assert "wta-batch seed 9" in rows[0]["why"]
    assert "removal-group replay seed 0" in rows[-1]["why"]  # the check needs the replays too
    # withdrawn in the third box: the table of every hypothesis reads none of its rows
    table = hyp.read_hypotheses(runs, [])
    assert not {"H5a", "H5b", "H5c", "H5 check"} & set(table.index)
    assert table.loc["H5", "reading"] == "withdrawn"


@pytest.mark.parametrize("shift, reading", [(0.2, "supported"), (-0.2, "refuted"), (0.0, "undecided")])
def test_h5a_reads_the_difference_of_the_deficits(shift, reading):
    noise = np.random.default_rng(5).normal(0, 0.05, 10)
    # standardised removal 0.2 behind wta; batch removal behind by 0.2 - shift
    runs = _grid({"group": lambda s: -0.2 + noise[s], "batch": lambda s: -0.2 + shift + noise[::-1][s]},
                 scalings=BOTH)
    h5a = hyp.read_h5(runs, [])[0]
    assert h5a["reading"] == reading
    assert (h5a["low"] > 0) == (reading == "supported") and (h5a["high"] < 0) == (reading == "refuted")
    assert h5a["mean"] == pytest.approx(shift + (noise[::-1] - noise).mean(), abs=0.02)


def test_h5b_and_h5c_count_batch_against_standardised():
    fails = {("group", s): 0.5 for s in (2, 3, 4, 6, 7)}
    drops = {("group", s): True for s in range(6)}
    fewer = hyp.read_h5(_grid(cut={**fails, ("batch", 1): 0.5}, dropped=drops, scalings=BOTH), [])
    assert [r["reading"] for r in fewer[1:3]] == ["consistent", "consistent"]
    assert (fewer[1]["batch"], fewer[1]["standardised"]) == (1, 5)
    assert (fewer[2]["batch"], fewer[2]["standardised"]) == (0, 6)
    more = {("batch", s): 0.5 for s in range(5)}
    drop_more = {**drops, **{("batch", s): True for s in range(6)}}
    same = hyp.read_h5(_grid(cut={**fails, **more}, dropped=drop_more, scalings=BOTH), [])
    assert [r["reading"] for r in same[1:3]] == ["refuted", "refuted"]


@pytest.mark.parametrize("spread, reading", [(5.0, "holds"), (0.0, "fails")])
def test_h5_check_compares_the_hopeless_groups_advantage(spread, reading):
    """Batch scaling shrinks a hopeless group's advantages only where the rollout's spread is
    larger than the group's own: with two far-apart answers elsewhere it does, without them the
    rollout's spread is the smaller and the check fails."""
    rng = np.random.default_rng(6)
    replays = [_replay(s, -1, rng) for s in hyp.REPLAYED]
    batch = [_replay(s, -1, rng, spread=spread, arm="removal-batch") for s in range(10)]
    runs = _grid(scalings=BOTH)
    by = {r.config["seed"]: r for r in batch}
    runs = [Run(**{**vars(r), "slates": by[r.config["seed"]].slates}) if r.arm == "removal-batch" else r
            for r in runs]
    check = hyp.read_h5(runs, replays)[-1]
    assert check["reading"] == reading and check["standardised"] < 0
    assert (abs(check["batch"]) < abs(check["standardised"])) == (reading == "holds")


def test_h3_at_ten_seeds_reads_the_same_rule_on_seeds_0_to_9():
    noise = np.random.default_rng(3).normal(0, 0.02, 10)
    three = _grid(oracle=lambda sc, s: -0.3 + noise[s])
    rows = hyp.read_h3(three, hyp.SEEDS)
    assert [r["hypothesis"] for r in rows] == ["H3 (10 seeds) standardised", "H3 (10 seeds) centred"]
    assert all(r["reading"] == "not read" for r in rows) and "oracle-group seed 3" in rows[0]["why"]
    ten = _grid(oracle=lambda sc, s: -0.3 + noise[s], oracle_seeds=range(10))
    assert [r["reading"] for r in hyp.read_h3(ten, hyp.SEEDS)] == ["the contribution loses"] * 2
    table = hyp.read_hypotheses(ten, [], n_perm=100)
    assert table.loc["H3 (10 seeds) centred", "reading"] == "the contribution loses"
    assert table.loc["H3 centred", "reading"] == "the contribution loses"  # seeds 0-2 still read


def _predictions(removal, oracle):
    n = 30
    arms = []
    for sc in ("group", "none"):
        arms += [{"scale_rewards": sc, "signal": "wta", "accuracy": [0.5] * n},
                 {"scale_rewards": sc, "signal": "removal", "accuracy": [0.5 + removal] * n},
                 {"scale_rewards": sc, "signal": "oracle", "accuracy": [0.5 + oracle] * n}]
    return {"arms": arms}


def test_the_twin_agrees_where_chapter_8s_interval_holds_its_mean():
    noise = np.random.default_rng(4).normal(0, 0.02, 10)
    grid = _grid({sc: (lambda s: -0.1 + noise[s]) for sc in ("group", "none")},
                 oracle=lambda sc, s: 0.0 + noise[s], oracle_seeds=range(10))
    rows = {r["hypothesis"]: r for r in hyp.read_twin(grid, _predictions(-0.1, 0.0))}
    assert rows["twin removal − wta centred"]["reading"] == "agrees"
    assert rows["twin oracle − wta standardised"]["reading"] == "agrees"
    assert rows["twin on H3"]["reading"] == "consistent"
    far = {r["hypothesis"]: r for r in hyp.read_twin(grid, _predictions(+0.2, 0.0))}
    assert far["twin removal − wta centred"]["reading"] == "contradicts"
    behind = _grid(oracle=lambda sc, s: -0.3 + noise[s], oracle_seeds=range(10))
    assert hyp.read_twin(behind, _predictions(0.0, 0.0))[-1]["reading"] == "refuted"
    # the oracle's seeds 3-9 missing: its rows and the H3 row are not read
    three = _grid(oracle=lambda sc, s: 0.0)
    part = {r["hypothesis"]: r for r in hyp.read_twin(three, _predictions(0.0, 0.0))}
    assert part["twin oracle − wta centred"]["reading"] == "not read"
    assert part["twin removal − wta centred"]["reading"] in ("agrees", "contradicts")
    assert part["twin on H3"]["reading"] == "not read"
