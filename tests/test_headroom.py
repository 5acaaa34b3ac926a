"""mcpg.grpo.headroom (Wilson interval, unbiased pass@k, groups with no right answer, greedy
answers read at a smaller budget) and scripts/gsm8k_measure.py on the tiny random model."""

import itertools
import json
from math import comb
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpg.grpo.headroom import cut_completion, no_right_share, pass_at_k, wilson_interval
from repo_scripts import load_script  # tests/repo_scripts.py

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"


def test_wilson_matches_scipy_and_known_values():
    from scipy.stats import binomtest

    for k, n in [(0, 10), (3, 128), (8, 128), (64, 128), (1319, 1319), (1, 1)]:
        ci = binomtest(k, n).proportion_ci(0.95, method="wilson")
        assert wilson_interval(k, n) == pytest.approx((ci.low, ci.high), abs=1e-12)
    lo, hi = wilson_interval(0, 10)
    assert lo == pytest.approx(0.0, abs=1e-15) and hi == pytest.approx(0.27753, abs=1e-5)
    for bad in [(-1, 5), (6, 5), (1, 0), (1.5, 3)]:
        with pytest.raises(ValueError):
            wilson_interval(*bad)


@settings(max_examples=60)
@given(n=st.integers(1, 9), data=st.data())
def test_pass_at_k_is_the_mean_over_k_subsets(n, data):
    c = data.draw(st.integers(0, n))
    k = data.draw(st.integers(1, n))
    right = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    exact = np.mean([any(right[i] for i in s) for s in subsets])
    assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)


def test_pass_at_k_unbiased_by_monte_carlo():
    """E[pass@k estimate from n samples] = 1 - (1 - q)^k for samples right with chance q."""
    rng = np.random.default_rng(0)
    q, n, k, reps = 0.15, 8, 4, 200_000
    c = rng.binomial(n, q, size=reps)
    est = np.array([pass_at_k(n, int(x), k) for x in range(n + 1)])[c]
    se = est.std() / np.sqrt(reps)
    assert abs(est.mean() - (1 - (1 - q) ** k)) < 4 * se


def test_no_right_share_is_one_minus_pass_at_m():
    rows = [[0] * 8, [1] + [0] * 7, [1] * 8, [0, 1] * 4]
    assert no_right_share(rows, 8) == pytest.approx(0.25)
    assert no_right_share(rows, 4) == pytest.approx(np.mean([1 - pass_at_k(8, sum(r), 4) for r in rows]))
    assert no_right_share([[0, 0, 1, 1]], 2) == pytest.approx(comb(2, 2) / comb(4, 2))
    with pytest.raises(ValueError):
        no_right_share([], 8)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_cut_completion():
    ids = [5, 6, 7, 2]  # 2 = EOS: ended by itself after 4 tokens
    assert cut_completion(ids, 4, False, 8, eos_token_id=2) == (ids, False)
    assert cut_completion(ids, 4, False, 4, eos_token_id=2) == (ids, False)
    assert cut_completion(ids, 4, False, 3) == ([5, 6, 7], True)  # EOS would be token 4
    assert cut_completion([5, 6, 7, 8], 4, True, 2) == ([5, 6], True)
    with pytest.raises(ValueError):
        cut_completion(ids, 4, False, 0)
    with pytest.raises(ValueError, match="EOS"):
        cut_completion([5, 6], 2, False, 4, eos_token_id=2)


def _measure():
    return load_script("scripts/gsm8k_measure.py")


def _rows(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.usefixtures("one_torch_thread")
def test_gsm8k_measure_tiny_random(tmp_path):
    gm = _measure()
    common = ["--model", "tiny-random", "--data-dir", str(FIXTURE), "--arith-problems", "4",
              "--sample-problems", "4", "--samples", "4", "--batch", "8", "--max-new-tokens", "16",
              "--arith-max-new-tokens", "8", "--budgets", "4,8"]
    one = tmp_path / "one"
    summary = gm.main([*common, "--output", str(one)])
    # resumable: stopped after one batch, then run again, it writes the same rows
    cut = tmp_path / "cut"
    gm.main([*common, "--output", str(cut), "--max-batches", "1"])
    assert len(_rows(cut / "arith_greedy.jsonl")) == 4 and not (cut / "greedy.jsonl").exists()
    legacy = json.loads((cut / "PROVENANCE.json").read_text())
    (cut / "PROVENANCE.json").rename(cut / "provenance.json")  # as recordings before issue 60 named it
    gm.main([*common, "--output", str(cut)])
    assert not (cut / "provenance.json").exists()  # read, continued, and written under the one name
    assert json.loads((cut / "PROVENANCE.json").read_text())["sessions"][0] == legacy["sessions"][0]
    seq = tmp_path / "seq"  # the phases one after another: the same rows
    gm.main([*common, "--output", str(seq), "--schedule", "sequential"])
    for phase in gm.PHASES:
        a, b = _rows(one / f"{phase}.jsonl"), _rows(cut / f"{phase}.jsonl")
        assert a == b == _rows(seq / f"{phase}.jsonl"), phase
    # the summary is recomputed from the rows
    g = _rows(one / "greedy.jsonl")
    assert len(g) == 4 and summary["gsm8k"]["greedy"]["n"] == 4
    for mode in gm.MODES:
        acc = summary["gsm8k"]["greedy"]["accuracy"][mode]
        assert acc["correct"] == sum(r[mode] for r in g)
        assert acc["wilson95"] == list(wilson_interval(acc["correct"], 4))
    assert summary["gsm8k"]["greedy"]["truncation"] == np.mean([r["truncated"] for r in g])
    s = _rows(one / "samples.jsonl")
    assert all(len(r["samples"]) == 4 and len(r["committed"]) == 4 for r in s)
    p1 = summary["gsm8k"]["samples"]["pass_at_k"]["committed"]["1"]["estimate"]
    assert p1 == pytest.approx(np.mean([np.mean(r["committed"]) for r in s]))
    assert summary["gsm8k"]["samples"]["no_right_share_m8"] == {}  # n = 4 < 8: not defined
    prov = summary["provenance"]
    assert prov["complete"] == {p: True for p in gm.PHASES} and prov["model"] == "tiny-random"
    # written by the library's one writer, under its one name, with the imported code's origin
    from mcpg.grpo.provenance import code_origin, read_provenance

    assert (one / "PROVENANCE.json").is_file() and not (one / "provenance.json").exists()
    assert read_provenance(one)["commit"] == code_origin()["commit"] == prov["code"]["commit"]
    assert prov["generation_time"]["greedy"]["batches"] == 1
    # a budget added after the recording is read off the recorded token ids: the same rows as
    # a recording made with it from the start
    late = tmp_path / "late"
    gm.main([*common[:-1], "4", "--output", str(late)])
    assert all(set(r["budgets"]) == {"4"} for r in _rows(late / "greedy.jsonl"))
    gm.main([*common, "--output", str(late)])
    for phase in ("greedy", "arith_greedy"):
        assert _rows(late / f"{phase}.jsonl") == _rows(one / f"{phase}.jsonl"), phase
    assert json.loads((late / "summary.json").read_text())["gsm8k"]["greedy"]["budgets"] == \
        summary["gsm8k"]["greedy"]["budgets"]
    # a budget read off the 16-token answers equals greedy decoding at that budget
    short = tmp_path / "short"
    gm.main([*common[:-6], "--max-new-tokens", "8", "--arith-max-new-tokens", "8", "--budgets", "4",
             "--output", str(short), "--phases", "greedy"])
    for long_row, short_row in zip(g, _rows(short / "greedy.jsonl")):
        assert short_row["ids"] == long_row["ids"][:8]
        assert short_row["truncated"] == long_row["budgets"]["8"]["truncated"]
        assert {m: short_row[m] for m in gm.MODES} == {m: long_row["budgets"]["8"][m] for m in gm.MODES}


def test_recording_log_quotes_the_recorded_gsm8k_numbers():
    """The recording log's list of GSM8K numbers is the report of the recorded summary.json, so
    that a new recording cannot land without the book saying what it measured."""
    gm = _measure()
    summary = ROOT / "data" / "results" / "gsm8k" / "summary.json"
    if not summary.exists():
        pytest.skip("no GSM8K recording in this checkout")
    text = (ROOT / "book" / "recording_log.md").read_text()
    want = gm.replace_report(text, gm.report(json.loads(summary.read_text())))
    assert text == want, ("book/recording_log.md's GSM8K numbers differ from data/results/gsm8k/"
                          "summary.json: run python scripts/gsm8k_measure.py --output data/results/gsm8k "
                          "--report --readme book/recording_log.md")
    # the report says what it read: every phase's problem count
    s = json.loads(summary.read_text())
    if s["gsm8k"]["greedy"]:
        assert f"on {s['gsm8k']['greedy']['n']} test problems" in text
    with pytest.raises(ValueError, match="block"):
        gm.replace_report("no markers here", "x")
