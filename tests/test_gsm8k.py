"""mcpg.grpo.gsm8k: loader on the fixture (and the real files when MCPG_GSM8K_DIR is set), answer checking."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcpg import stats
from mcpg.grpo.gsm8k import (
    ANSWER_LINE,
    SPECIALTY_KEYWORDS,
    committed_answer,
    extract_answer,
    gold_answer,
    gsm8k_source,
    is_correct,
    load_gsm8k,
    problems_sha256,
    question_specialty,
    reward,
)

FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The answer is 42.", 42.0),
        ("So she pays $1,234.50 in total.", 1234.5),
        ("The total is 1,000,000 apples", 1_000_000.0),
        ("It drops to -7 degrees", -7.0),
        ("Each costs $0.75", 0.75),
        ("We get \\boxed{18} so the answer is 18", 18.0),
        ("5 + 3 = 8, then \\boxed{12}. Later I wrote 99", 12.0),
        ("first 3 then 4\n#### 5\nthen 100", 5.0),
        ("Step 1: 16 - 3 - 4 = 9. Step 2: 9 * 2 = 18", 18.0),
        ("The answer is 42. Check: 6 * 7 = 42, and 3 more", 42.0),
        ("Final answer: 3,600", 3600.0),
        ("5-3=2", 2.0),
        ("The answer is -$5.", -5.0),
        ("I do not know.", None),
        ("", None),
        (None, None),
        ("\\boxed{x}", None),
        ("Answer: .5", 0.5),
        ("the value is 1,2", 2.0),  # "1,2" is not a thousands group: two numbers
    ],
)
def test_extract_answer(text, expected):
    got = extract_answer(text)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def test_extract_answer_rejects_non_string():
    with pytest.raises(ValueError, match="model_output"):
        extract_answer(42)


def test_gold_answer():
    assert gold_answer("He makes 9 * 2 = <<9*2=18>>18\n#### 18") == 18.0
    assert gold_answer("... #### 3,600") == 3600.0
    assert gold_answer("#### -5") == -5.0
    assert gold_answer("a #### 1 b #### 2.5") == 2.5
    with pytest.raises(ValueError, match="answer_text"):
        gold_answer("no marker 18")
    with pytest.raises(ValueError, match="answer_text"):
        gold_answer("#### none")


def test_is_correct_and_reward():
    assert is_correct("so the answer is $18.", 18)
    assert is_correct("#### 18.0", 18)
    assert is_correct("3,600 dollars", 3600)
    assert not is_correct("The answer is 17", 18)
    assert not is_correct("no number here", 0)  # no number scores 0, even against gold 0
    assert not is_correct(None, 1)
    assert is_correct(2.5, 2.5)
    assert reward("answer: 7", 7) == 1.0 and reward("answer: 8", 7) == 0.0 and reward("", 7) == 0.0


def test_strict_reads_the_marker_only():
    # lm-eval-harness's two GSM8K filters: strict-match (#### only) and flexible-extract
    assert extract_answer("so it is 12. #### 7", mode="strict") == 7.0
    assert extract_answer("The answer is 12.", mode="strict") is None
    assert extract_answer("The answer is 12.", mode="flexible") == 12.0
    assert is_correct("The answer is 12.", 12) and not is_correct("The answer is 12.", 12, mode="strict")
    with pytest.raises(ValueError, match="mode"):
        extract_answer("#### 1", mode="lenient")


@pytest.mark.parametrize(
    "text, truncated, committed",
    [
        ("17 - 16 = 1. #### 1", False, 1.0),
        ("17 - 16 = 1. #### 1", True, 1.0),  # the marker commits even when the text runs on
        ("we need 17 - 16, which is 10 meters. Since 10 x 1", True, None),  # cut mid-sentence
        ("we need 17 - 16, which is 10 meters. Since 10 x 1", False, 1.0),  # ended: last number
        ("The answer is 5", True, None),
        ("The answer is 5", False, 5.0),
        ("", False, None),
    ],
)
def test_committed_answer(text, truncated, committed):
    assert committed_answer(text, truncated) == committed


def test_reward_pays_a_cut_answer_only_through_its_marker():
    # the example: right by accident while being cut off
    cut = "...we need to calculate 17 - 16, which is 10 meters. Since 10 meters is 10 x 1"
    assert reward(cut, 1.0) == 1.0  # ended by itself: its last number is its answer
    assert reward(cut, 1.0, truncated=True) == 0.0  # cut: it committed to nothing
    assert reward(cut + " #### 1", 1.0, truncated=True) == 1.0
    assert reward("#### 2", 1.0, truncated=True) == 0.0
    with pytest.raises(ValueError, match="output"):
        reward(3, 3.0)


def test_load_fixture():
    train = load_gsm8k("train", data_dir=FIXTURE)
    test = load_gsm8k("test", data_dir=FIXTURE)
    assert len(train) == 8 and len(test) == 4
    assert train[0]["gold"] == 6.0 and train[4]["gold"] == 3600.0 and train[5]["gold"] == -5.0
    assert test[3]["gold"] == 2.5
    assert set(train[0]) == {"question", "answer", "gold"}
    # the gold answer of every fixture problem is checked correct from its own solution
    assert all(is_correct(r["answer"], r["gold"]) for r in train + test)


def test_load_env_variable_and_subset(monkeypatch):
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))
    a = load_gsm8k("train", n=5, seed=3)
    b = load_gsm8k("train", n=5, seed=3)
    c = load_gsm8k("train", n=5, seed=4)
    assert a == b and len(a) == 5 and len({r["question"] for r in a}) == 5
    assert [r["question"] for r in a] != [r["question"] for r in c]
    with pytest.raises(ValueError, match="n="):
        load_gsm8k("train", n=100)
    with pytest.raises(ValueError, match="split"):
        load_gsm8k("validation")
    with pytest.raises(ValueError, match="n must"):
        load_gsm8k("train", n=0)
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE / "missing"))
    with pytest.raises(ValueError, match="train.jsonl"):
        load_gsm8k("train")


def test_load_rejects_bad_rows(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "q"}) + "\n")
    with pytest.raises(ValueError, match="answer"):
        load_gsm8k("train", data_dir=tmp_path)


def test_a_bad_line_is_named_by_file_and_line(tmp_path):
    good = (FIXTURE / "test.jsonl").read_text().splitlines()
    lines = [good[i % len(good)] for i in range(45)]
    for i, bad, words in [
        (40, '{"question": "a\tb", "answer": "#### 1"}', ["line 41, column", "not valid JSON"]),
        (2, '["question", "answer"]', ["line 3:", "'question' and 'answer'"]),
        (9, json.dumps({"question": "q", "answer": "no marker"}), ["line 10:", "####"]),
    ]:
        rows = list(lines)
        rows[i] = bad
        (tmp_path / "test.jsonl").write_text("\n".join(rows) + "\n")
        with pytest.raises(ValueError) as err:
            load_gsm8k("test", data_dir=tmp_path)
        assert str(err.value).startswith(f"{tmp_path / 'test.jsonl'}, ")
        assert all(w in str(err.value) for w in words), str(err.value)
    (tmp_path / "test.jsonl").write_text("\n\n")
    with pytest.raises(ValueError, match="holds no problems"):
        load_gsm8k("test", data_dir=tmp_path)


def test_problems_sha256_names_the_problems_in_their_order(monkeypatch):
    rows = load_gsm8k("test", data_dir=FIXTURE)
    digest = problems_sha256(rows)
    assert len(digest) == 64 and digest == problems_sha256([dict(r) for r in rows])
    assert problems_sha256(rows[::-1]) != digest  # the order counts (pairing per problem)
    changed = [dict(rows[0], question=rows[0]["question"] + " "), *rows[1:]]
    assert problems_sha256(changed) != digest
    assert problems_sha256([dict(r, gold=0.0) for r in rows]) == digest  # read off question and answer
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))
    assert gsm8k_source() == str(FIXTURE.resolve()) == gsm8k_source(str(FIXTURE))
    monkeypatch.delenv("MCPG_GSM8K_DIR")
    assert gsm8k_source() == "hub:openai/gsm8k/main"


@pytest.mark.skipif(not os.environ.get("MCPG_GSM8K_DIR"), reason="MCPG_GSM8K_DIR not set (real GSM8K files)")
def test_load_real_files():
    train = load_gsm8k("train")
    test = load_gsm8k("test")
    assert len(train) == 7473 and len(test) == 1319
    assert test[0]["gold"] == 18.0  # Janet's ducks
    assert all(is_correct(r["answer"].rsplit("####", 1)[1], r["gold"]) for r in test)
    sub = load_gsm8k("train", n=512, seed=0)
    assert len(sub) == 512


def test_question_specialty():
    assert question_specialty("Mia buys 3 pencils that cost $2 each.") == "money"
    assert question_specialty("A train travels for 4 hours and 30 minutes.") == "time"
    assert question_specialty("A rectangle has area 10 and width 2.") == "geometry"
    assert question_specialty("How many marbles are in the bag?") is None


def test_specialty_keywords_follow_the_specialty_order():
    """Agent k is the specialist of stats.SPECIALTIES[k]; the keyword table must list them in that order."""
    assert tuple(SPECIALTY_KEYWORDS) == stats.SPECIALTIES


def test_import_is_light():
    code = ("import sys, mcpg.grpo.gsm8k, mcpg.grpo; "
            "print('transformers' in sys.modules, 'peft' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.parametrize(
    "text, line",
    [
        ("4 + 3 = 7 dollars.\n#### 7\n#### 7\n####", "#### 7\n"),
        ("#### $1,234.50 dollars\nand more", "#### $1,234.50 dollars\n"),
        ("####\n-3\n", "####\n-3\n"),
        ("#### 7", None),  # the line is not finished: the number may go on
        ("#### \nseven\n", None),  # no number
        ("The answer is 7.\n", None),  # no marker
    ],
)
def test_answer_line_is_the_first_finished_marker_line(text, line):
    m = ANSWER_LINE.search(text)
    assert (m.group(0) if m else None) == line
    if line is not None:  # what a completion stopped there commits to is the line's number
        stopped = text[: m.end()]
        assert committed_answer(stopped) == extract_answer(line, mode="strict")
