"""Your reward and your data (issue 60, section 4): reward functions with TRL's signature and a
``datasets.Dataset`` with a ``prompt`` column, from Python and from the command line; what the
evaluation counts correct; what a run records and what resuming refuses."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
from datasets import Dataset, DatasetDict

from mcpg.grpo import __main__ as cli
from mcpg.grpo import custom
from mcpg.grpo.custom import RewardScorer
from mcpg.grpo.train import evaluate_run, train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["How much do 3 pens cost at $2 each?", "How many hours are in 2 days?",
           "What is the area of a 3 by 4 rectangle?", "Name a colour of the sky."]
ROWS = {"prompt": PROMPTS, "answer": ["6", "48", "12", "blue"], "level": [1, 2, 2, 0]}


def rows_dataset() -> Dataset:
    return Dataset.from_dict(ROWS)


def module(tmp_path, monkeypatch, name: str, source: str) -> str:
    """A module ``name`` in ``tmp_path`` (importable: the folder is put on sys.path)."""
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_scorer_sums_weighted_rewards_and_none_means_no_reward_from_that_function():
    problems = [{"question": "q", "columns": {"x": 1}}] * 3

    def a(prompts, completions, **kw):
        return [1.0, None, 0.0]

    def b(prompts, completions, **kw):
        return [True, 1, None]

    s = RewardScorer([a, b], [0.25, 0.75])
    assert s(problems, ["", "", ""], [[], [], []], 0, 1).tolist() == [1.0, 0.75, 0.0]
    assert s.correct(problems, ["", "", ""], [[], [], []], 0, 1).tolist() == [1.0, 0.0, 0.0]
    assert RewardScorer([a]).names == [f"{__name__}:{a.__qualname__}"]
    assert a.__qualname__.endswith("<locals>.a")
    with pytest.raises(ValueError, match="no reward function scored completion 2"):
        RewardScorer([lambda **kw: [0.0, 1.0, None]])(problems, ["", "", ""], [[], [], []], 0, 1)
    with pytest.raises(ValueError, match="reward of completion 0 is 1.5, outside \\[0, 1\\]"):
        RewardScorer([lambda **kw: [1.5, 0, 0]])(problems, ["", "", ""], [[], [], []], 0, 1)
    with pytest.raises(ValueError, match="2 weights for 1 reward functions"):
        RewardScorer([a], [0.5, 0.5])
    # the full reward, up to rounding: 0.1 + 0.2 + 0.7 is correct
    parts = [lambda **kw: [0.1] * 3, lambda **kw: [0.2] * 3, lambda **kw: [0.7] * 3]
    assert RewardScorer(parts).correct(problems, ["", "", ""], [[], [], []], 0, 1).tolist() == [1.0] * 3


def test_datasets_read_from_memory_a_saved_folder_and_json_lines(tmp_path):
    ds = rows_dataset()
    rows, source = custom.load_rows(ds, "train_dataset")
    assert rows[0] == {"prompt": PROMPTS[0], "answer": "6", "level": 1} and "fingerprint" in source
    ds.save_to_disk(str(tmp_path / "saved"))
    saved = tmp_path / "saved"
    assert custom.load_rows(saved, "train_dataset") == (rows, str(saved.resolve()))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert custom.load_rows(str(tmp_path / "rows.jsonl"), "eval_dataset")[0] == rows
    problems = custom.dataset_problems(rows, "train_dataset")
    assert problems[1] == {"question": PROMPTS[1], "columns": {"answer": "48", "level": 2}}
    # refused, each on one line naming the argument
    DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dict"))
    bad = [(lambda: custom.load_rows(tmp_path / "dict", "train_dataset"), "holds the splits \\['train'\\]"),
           (lambda: custom.load_rows(Dataset.from_dict({"question": ["q"]}), "eval_dataset"),
            "eval_dataset has no 'prompt' column"),
           (lambda: custom.load_rows(ds.to_iterable_dataset(), "train_dataset"), "IterableDataset"),
           (lambda: custom.load_rows([{"prompt": "q"}], "train_dataset"),
            "must be a datasets.Dataset or a path"),
           (lambda: custom.dataset_problems([{"prompt": [{"role": "user", "content": "q"}]}], "t"),
            "conversation .* plain text"),
           (lambda: custom.dataset_problems([{"prompt": "q", "completions": 1}], "train_dataset"),
            "'completions'.* shadow"),
           (lambda: custom.dataset_problems([], "eval_dataset"), "holds no rows")]
    for call, words in bad:
        with pytest.raises(ValueError, match=words):
            call()


def test_reward_functions_are_called_as_trl_calls_them(tmp_path, gsm8k_fixture):
    """Keywords prompts, completions, completion_ids, trainer_state and every other column, one
    value per completion; training logs the reward's mean, the evaluation counts the full reward."""
    seen = []

    def half(prompts, completions, completion_ids, trainer_state, answer, level, **kwargs):
        step = (trainer_state.global_step, trainer_state.max_steps)
        seen.append(dict(prompts=prompts, completions=completions, ids=completion_ids, answer=answer,
                         level=level, step=step, extra=kwargs))
        return [0.5] * len(completions)

    ds = rows_dataset()
    out = tmp_path / "half"
    result = train("tiny-random", "removal", out, updates=1, reward_funcs=half, train_dataset=ds,
                   eval_dataset=ds, progress=False, instruction="Answer briefly.")
    calls = seen  # the first on real completions: nothing calls a reward on made-up ones
    assert calls[0]["step"] == (0, 1) and all(ids for ids in calls[0]["ids"])
    training = calls[1]  # after the untrained pool's evaluation
    n = 2 * 3 * 2  # prompts_per_update x K x m of tiny-random
    assert all(len(training[k]) == n for k in ("prompts", "completions", "ids", "answer", "level"))
    assert training["extra"] == {} and training["step"] == (0, 1)
    for p, a, lv in zip(training["prompts"], training["answer"], training["level"]):
        i = PROMPTS.index(p)  # the dataset's prompt as it is, its own columns beside it
        assert (a, lv) == (ROWS["answer"][i], ROWS["level"][i])
    assert all(isinstance(t, int) for ids in training["ids"] for t in ids)
    assert [len(c["prompts"]) for c in (calls[0], calls[-1])] == [4 * (3 + 1), 4 * 3]  # with the base once
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["reward"] == 0.5 and metrics["agent_accuracy"] == [0.5] * 3
    # a reward of 0.5 is never the full reward: nothing is correct in the evaluation
    assert result["accuracy"] == result["oracle"] == result["base_accuracy"] == 0.0
    assert result["strict_accuracy"] is None and result["flexible_accuracy"] is None  # no gold number
    assert result["n"] == 4 and result["n_specialty"] == 0  # your data's agents have no specialty
    saved = json.loads((out / "config.json").read_text())
    name = f"{__name__}:test_reward_functions_are_called_as_trl_calls_them.<locals>.half"
    assert saved["reward_funcs"] == [name] and "fingerprint" in saved["eval_dataset"]
    data = json.loads((out / "PROVENANCE.json").read_text())["data"]
    assert data["task"] == "dataset" and data["reward_funcs"] == [name] and data["eval_n"] == 4
    assert data["eval_sha256"] == custom.problems_sha256(custom.dataset_problems(list(ds), "d"))


def test_a_full_reward_is_correct_and_the_task_s_columns_without_a_dataset(tmp_path, gsm8k_fixture):
    got = {}

    def one(prompts, completions, answer, gold, **kwargs):  # GSM8K's problems: answer, gold
        got.update(answer=answer[0], gold=gold[0])
        return [1] * len(completions)

    result = train("tiny-random", "wta", tmp_path / "one", updates=1, reward_funcs=[one, one],
                   reward_weights=[0.5, 0.5], progress=False)
    assert result["accuracy"] == result["oracle"] == result["base_accuracy"] == 1.0
    assert result["correct"] == [1] * result["n"] and result["router_auc"] is None  # one class
    assert "####" in got["answer"] and isinstance(got["gold"], float)
    assert result["strict_accuracy"] is not None  # GSM8K's gold number is there
    with pytest.raises(ValueError, match="'reward_weights' weighs reward_funcs"):
        train("tiny-random", "wta", tmp_path / "none", reward_weights=[1.0])
    with pytest.raises(ValueError, match="a dataset of your own needs reward_funcs"):
        train("tiny-random", "wta", tmp_path / "none", train_dataset=rows_dataset(),
              eval_dataset=rows_dataset())
    with pytest.raises(ValueError, match="together"):
        train("tiny-random", "wta", tmp_path / "none", reward_funcs=[one], train_dataset=rows_dataset())
    assert not (tmp_path / "none").exists()


def test_resume_and_evaluate_keep_the_run_s_reward_and_data(tmp_path, monkeypatch, gsm8k_fixture, capsys):
    """From the command line: a reward function by module:function, datasets by path. Resumed
    without them, the run imports its recorded functions and reads its recorded paths; another
    function is refused, the directory untouched."""
    mod = module(tmp_path, monkeypatch, "my_rewards", """
        def says_answer(prompts, completions, answer, **kwargs):
            return [float(a in c) for c, a in zip(completions, answer)]

        def other(prompts, completions, **kwargs):
            return [0.0] * len(completions)
    """)
    ds = rows_dataset()
    ds.save_to_disk(str(tmp_path / "train"))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ds))
    out = tmp_path / "run"
    argv = ["train", "--config", "tiny-random", "--signal", "removal", "--output", str(out), "--no-progress",
            "--reward_funcs", f"{mod}:says_answer", "--train_dataset", str(tmp_path / "train"),
            "--eval_dataset", str(tmp_path / "eval.jsonl"), "--updates", "1"]
    code, err = cli.main(argv), capsys.readouterr().err
    assert code == 0, err
    saved = json.loads((out / "config.json").read_text())
    assert saved["reward_funcs"] == [f"{mod}:says_answer"]
    assert saved["train_dataset"] == str(tmp_path / "train")
    assert saved["eval_dataset"] == str(tmp_path / "eval.jsonl")
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert cli.main(["train", "--output", str(out), "--resume", "--updates", "2",
                     "--reward_funcs", f"{mod}:other"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: reward_funcs") and "differ from the run's" in err and "\n" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert cli.main(["train", "--output", str(out), "--resume", "--updates", "2", "--no-progress"]) == 0
    assert json.loads((out / "eval.json").read_text())["updates"] == 2
    assert cli.main(["evaluate", "--run", str(out), "--no-progress"]) == 0
    # another held-out dataset: refused by its SHA-256
    (tmp_path / "other.jsonl").write_text(json.dumps({"prompt": "What is 1 + 1?", "answer": "2"}) + "\n")
    with pytest.raises(ValueError, match="held-out problems .* differ .* give the datasets the run read"):
        evaluate_run(out, eval_dataset=tmp_path / "other.jsonl")
    # a run trained on the default reward refuses reward functions on resume
    plain = tmp_path / "plain"
    train("tiny-random", "wta", plain, updates=2, stop_after=1, progress=False)
    with pytest.raises(ValueError, match="differ from the run's \\(the default reward"):
        train(None, None, plain, resume=True, reward_funcs=f"{mod}:says_answer")
    assert np.isfinite(json.loads((out / "eval.json").read_text())["accuracy"])
