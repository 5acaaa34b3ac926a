"""The README's statements about recorded results, checked against the files they describe, and
its example of training your own agents, run as written.

Run-by-run numbers live in the chapters (asserted when they execute) and on the recording log;
the README states only chapter 8's verdict in words, and this test keeps those words true."""

from pathlib import Path

import numpy as np
import pytest

from mcpg import stats
from mcpg.grpo import verdict
from mcpg.grpo.hypotheses import read_h1
from mcpg.grpo.runs import read_comparison

ROOT = Path(__file__).resolve().parents[1]
PAPER_GAP = 0.04  # the paper's Table 1: removal 0.41 - winner-take-all 0.37, deployed accuracy


def _readme() -> str:
    return " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())


def _grid_runs():
    """The finished runs of chapter 8's grid of record, as the chapter reads them."""
    return [r for r in read_comparison(ROOT / "data" / "results" / "ch08" / "grid-mask")
            if r.eval is not None]


def test_readme_states_chapter_8s_verdict():
    """"removal's deployed accuracy ends behind winner-take-all's on average, under the paper's
    protocol and centred alike. Under the paper's protocol the interval over ten seeds lies below
    0 [...]. That rests on removal runs that cut [...]: without the pairs in which a
    run fails a cut measure the interval contains 0, and still lies below +0.04 (leaving them out
    favours removal [...]). Centred, over ten seeds as well, the interval lies below 0
    (removal − winner-take-all −0.091 [−0.161, −0.020]), which refutes chapter 8's hypothesis
    [...]; without the pairs in which a run fails a cut measure, the centred interval contains 0
    too"."""
    readme = _readme()
    assert "removal's deployed accuracy ends behind winner-take-all's on average" in readme
    assert "Under the paper's protocol the interval over ten seeds lies below 0" in readme
    assert ("without the pairs in which a run fails a cut measure the interval contains 0, and "
            "still lies below +0.04") in readme
    assert "Centred, over ten seeds as well, the interval lies below 0" in readme
    assert "without the pairs in which a run fails a cut measure, the centred interval contains 0 too" \
        in readme
    runs = _grid_runs()
    if not runs:
        pytest.skip("no grid of record in this checkout")
    d = {sc: verdict.seed_verdict(runs, scaling=sc, target=PAPER_GAP).loc["deployed"]
         for sc in ("group", "none")}
    assert all(v["n"] >= 3 and v["mean"] < 0 for v in d.values())
    assert d["group"]["n"] == 10  # "over ten seeds"
    assert d["group"]["high"] < 0 and not d["group"]["contains_target"]
    assert d["none"]["n"] == 10  # "over ten seeds as well"
    assert d["none"]["high"] < 0  # "lies below 0"
    # "which refutes chapter 8's hypothesis": H1, read by its rule
    assert read_h1(runs)["reading"] == "refuted"
    # "(removal − winner-take-all −0.212 [−0.360, −0.065])", the README's typography, and the
    # centred "(removal − winner-take-all −0.091 [−0.161, −0.020])"
    for g in d.values():
        stated = f"{g['mean']:+.3f} [{g['low']:+.3f}, {g['high']:+.3f}]".replace("-", "−")
        assert f"(removal − winner-take-all {stated})" in readme
    kept_n = verdict.health_sensitivity(runs, scaling="none").loc["and cut held-out <= bar"]
    assert kept_n["pairs"] >= 2 and kept_n["low"] < 0 < kept_n["high"]  # "contains 0 too"
    assert "in this setting" in readme  # the scope of the verdict
    kept = verdict.health_sensitivity(runs, scaling="group").loc["and cut held-out <= bar"]
    assert kept["pairs"] >= 2 and kept["low"] < 0 < kept["high"] < PAPER_GAP
    # "leaving them out favours removal, whose runs cut more often"
    assert "leaving them out favours removal, whose runs cut more often" in readme
    cuts = verdict.cut_failures(runs)
    assert cuts["removal"].mean() > cuts["wta"].mean()


def test_readme_advises_as_far_as_both_scalings_support():
    """"prefer winner-take-all credit to removal estimated by Eq. (19), with standardised or
    centred advantages: over ten seeds each, removal ends behind under both, beyond the variation
    between seeds. Without the runs that cut their answers at the token budget, the seeds cannot
    tell the two apart under either scaling": each scaling's interval over ten paired seeds lies
    below 0, and each contains 0 without the pairs in which a run fails a cut measure."""
    readme = _readme()
    assert ("prefer winner-take-all credit to removal estimated by Eq. (19), with standardised or "
            "centred advantages: over ten seeds each, removal ends behind under both") in readme
    assert "the seeds cannot tell the two apart under either scaling" in readme
    runs = _grid_runs()
    if not runs:
        pytest.skip("no grid of record in this checkout")
    for sc in ("group", "none"):
        d = verdict.seed_verdict(runs, scaling=sc).loc["deployed"]
        assert d["n"] == 10 and d["high"] < 0, sc
        kept = verdict.health_sensitivity(runs, scaling=sc).loc["and cut held-out <= bar"]
        assert kept["low"] < 0 < kept["high"], sc


def test_readme_states_the_oracle_reading():
    """"The exact removal contribution, trained on directly, cannot be told apart from
    winner-take-all over three seeds under either scaling (deployed 0.604 against 0.573 under
    the paper's protocol, oracle − winner-take-all +0.031 [−0.293, +0.355]; 0.495 against 0.609
    centred, −0.115 [−0.339, +0.110]), so three seeds cannot say whether the estimate or the
    contribution is what loses": under each scaling the oracle's t-intervals over three seeds
    contain 0, in deployed accuracy and the agents' mean; H3 reads "undecided" by its rule; the
    stated means and intervals are the computed ones."""
    from mcpg.grpo.hypotheses import read_h3

    readme = _readme()
    assert ("cannot be told apart from winner-take-all over three seeds under either scaling") \
        in readme
    assert "so three seeds cannot say whether the estimate or the contribution is what loses" \
        in readme
    runs = _grid_runs()
    if not any(r.arm.startswith("oracle-") for r in runs):
        pytest.skip("no oracle recorded")
    stated = {}
    for sc in ("group", "none"):
        v = verdict.seed_verdict(runs, "oracle", "wta", sc, ("deployed", "agents' mean"))
        assert (v["n"] == 3).all(), sc  # "over three seeds"
        assert ((v["low"] < 0) & (v["high"] > 0)).all(), sc  # "cannot be told apart"
        o = v.loc["deployed"]
        means = verdict.paired_seeds(runs, "oracle", "wta", sc, columns=("deployed",))[
            "deployed"].mean()
        stated[sc] = (f"{means['oracle']:.3f} against {means['wta']:.3f}",
                      f"{o['mean']:+.3f} [{o['low']:+.3f}, {o['high']:+.3f}]".replace("-", "−"))
    assert (f"(deployed {stated['group'][0]} under the paper's protocol, oracle − "
            f"winner-take-all {stated['group'][1]}; {stated['none'][0]} centred, "
            f"{stated['none'][1]})") in readme
    assert {h["reading"] for h in read_h3(runs)} == {"undecided"}  # "cannot say"


def test_readme_states_what_h2_read():
    """"standardised removal pushes down, pooled over four replays, the finished answers of
    questions no agent gets right, but the share of cut answers does not follow that push update
    by update": H2a consistent (its box names only what refutes it; pooled ā_fin below 0) and H2b
    refuted by the box's rules, on the replays in the repository."""
    from mcpg.grpo.hypotheses import read_h2

    readme = _readme()
    assert ("standardised removal pushes down, pooled over four replays, the finished answers of "
            "questions no agent gets right, but the share of cut answers does not follow that push "
            "update by update") in readme
    replays = read_comparison(ROOT / "data" / "results" / "ch08" / "replay")
    if not replays:
        pytest.skip("no replays in this checkout")
    h2a, h2b = read_h2([], replays, n_perm=2_000)[:2]
    assert (h2a["reading"], h2b["reading"]) == ("consistent", "refuted")
    assert h2a["pooled"] < 0 and h2b["rho"] >= 0
    assert len([k for k in h2a if k.startswith("seed ") and not k.endswith("below")]) == 4


def test_readme_states_the_size_of_the_fetched_results(tmp_path):
    """"shallow and sparse: about 65 MB on disk, 16 MB transferred": a fetch of data/results
    from this clone at its HEAD, as Colab does (mcpg.results.fetch_results), measured on disk
    and by the pack git received; each within a quarter of the stated size."""
    import re
    import shutil
    import subprocess

    from mcpg.results import fetch_results

    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git clone")
    m = re.search(r"about (\d+) MB on disk, (\d+) MB transferred", _readme())
    assert m, "the README states the fetch's size"
    disk, sent = (float(x) * 1e6 for x in m.groups())
    head = subprocess.check_output(["git", "-C", str(ROOT), "rev-parse", "HEAD"], text=True).strip()
    dest = fetch_results(ROOT.as_uri(), head, tmp_path / "fetched")
    on_disk = sum(f.stat().st_blocks * 512 for f in dest.parents[1].rglob("*") if f.is_file())
    pack = sum(f.stat().st_size for f in (dest.parents[1] / ".git" / "objects").rglob("*.pack"))
    assert 0.75 * disk <= on_disk <= 1.25 * disk, f"{on_disk / 1e6:.0f} MB on disk"
    assert 0.75 * sent <= pack <= 1.25 * sent, f"{pack / 1e6:.0f} MB transferred"


def test_readme_says_no_gpu_result_is_measured():
    """The README claims no GPU number, and none is recorded."""
    assert "No GPU result is measured" in _readme()
    assert not (ROOT / "data" / "results" / "paper").exists()


def test_readme_states_the_twin_and_its_ablations():
    """The twin's sentences: removal behind under both scalings and the oracle level (30 seeds),
    no ablation puts centred removal ahead, and the rightness ablation moves it furthest."""
    import json

    readme = _readme()
    assert "puts removal behind winner-take-all under both scalings" in readme
    assert "No single variable moved back to chapter 7's default puts centred removal ahead" in readme
    twin = ROOT / "data" / "results" / "ch07" / "twin"
    pred = json.loads((twin / "predictions.json").read_text())
    abl = json.loads((twin / "ablations.json").read_text())

    def diffs(arms, sc, sig):
        a = {(x["scale_rewards"], x["signal"]): np.asarray(x["accuracy"]) for x in arms}
        return a[sc, sig] - a[sc, "wta"]

    assert len(pred["seeds"]) == 30
    for sc in ("group", "none"):
        rem, ora = diffs(pred["arms"], sc, "removal"), diffs(pred["arms"], sc, "oracle")
        assert stats.paired_difference(rem, 0 * rem).high < 0
        o = stats.paired_difference(ora, 0 * ora)
        assert o.low < 0 < o.high  # "level with it"
    level = 1 - 0.05 / len(abl["ablations"])
    twin_d = diffs(pred["arms"], "none", "removal")
    moves = {}
    for a in abl["ablations"]:
        d = diffs(a["arms"], "none", "removal")
        assert not stats.paired_difference(d, 0 * d, level).low > 0  # "no single variable ... ahead"
        moves[a["name"]] = float((d - twin_d).mean())
    assert max(moves, key=moves.get) == "rightness"  # "moves it furthest"
    r = next(a for a in abl["ablations"] if a["name"] == "rightness")
    d = diffs(r["arms"], "none", "removal")
    iv = stats.paired_difference(d, 0 * d, level)
    assert iv.low < 0 < iv.high  # "to level"
