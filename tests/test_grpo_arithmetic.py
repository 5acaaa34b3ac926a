"""The synthetic word-problem task of chapter 8 (mcpg.grpo.arithmetic)."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpg.grpo.arithmetic import OPERATIONS, SPECIALTIES, generate_problems, make_problem, write_task
from mcpg.grpo.gsm8k import gold_answer, load_gsm8k, question_specialty, reward


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), spec=st.sampled_from(SPECIALTIES), op=st.sampled_from(OPERATIONS),
       max_value=st.integers(2, 500))
def test_problem_is_gsm8k_format_and_arithmetic_is_right(seed, spec, op, max_value):
    p = make_problem(np.random.default_rng(seed), spec, op, max_value)
    assert p["answer"].rstrip().splitlines()[-1].startswith("#### ")
    assert gold_answer(p["answer"]) == p["gold"]
    # redo the arithmetic from the <<x op y = z>> annotations, chained
    steps = [line.split("<<")[1].split(">>")[0] for line in p["answer"].splitlines()[:-1]]
    assert len(steps) == (2 if op == "add_sub" else 1)
    prev = None
    for s in steps:
        lhs, rhs = s.split("=")
        for sym in "+-":
            if sym in lhs:
                x, y = (int(t) for t in lhs.split(sym))
                z = x + y if sym == "+" else x - y
        assert z == int(rhs)
        if prev is not None:
            assert x == prev
        prev = z
    assert p["gold"] == prev and p["gold"] >= 0
    # the keyword specialty of the question is the intended one
    assert question_specialty(p["question"]) == spec
    # the model is rewarded for the gold number and not for another
    assert reward(f"... #### {int(p['gold'])}", p["gold"]) == 1.0
    assert reward(f"... #### {int(p['gold']) + 1}", p["gold"]) == 0.0


def test_generate_is_deterministic_and_balanced():
    a = generate_problems(90, seed=3)
    b = generate_problems(90, seed=3)
    assert a == b
    assert a != generate_problems(90, seed=4)
    counts = {s: sum(p["specialty"] == s for p in a) for s in SPECIALTIES}
    assert counts == {s: 30 for s in SPECIALTIES}
    assert {p["operation"] for p in a} == {"add", "sub"}


def test_write_task_is_read_by_the_engine_loader(tmp_path):
    folder = write_task(tmp_path / "task", n_train=40, n_test=12, seed=1)
    train = load_gsm8k("train", data_dir=folder)
    test = load_gsm8k("test", data_dir=folder)
    assert len(train) == 40 and len(test) == 12
    assert not {p["question"] for p in train} & {p["question"] for p in test}
    row = json.loads((folder / "train.jsonl").read_text().splitlines()[0])
    assert set(row) == {"question", "answer"}


@pytest.mark.parametrize("kwargs, name", [
    (dict(specialty="cooking"), "specialty"),
    (dict(operation="mul"), "operation"),
    (dict(max_value=1), "max_value"),
    (dict(max_value=2.5), "max_value"),
])
def test_bad_problem_arguments(kwargs, name):
    args = dict(specialty="money", operation="add", max_value=10) | kwargs
    with pytest.raises(ValueError, match=name):
        make_problem(np.random.default_rng(0), **args)


def test_bad_arguments_name_themselves(tmp_path):
    with pytest.raises(ValueError, match="rng"):
        make_problem(0, "money")
    with pytest.raises(ValueError, match="n"):
        generate_problems(0)
    with pytest.raises(ValueError, match="operations"):
        generate_problems(5, operations=("add", "div"))
    with pytest.raises(ValueError, match="n_test"):
        write_task(tmp_path, n_train=5, n_test=0)
    with pytest.raises(ValueError, match="held-out"):  # too few distinct problems for both splits
        write_task(tmp_path, n_train=1000, n_test=1000, max_value=2)
