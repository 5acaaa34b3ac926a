"""Your agents, your data (issue 74): what a practitioner meets when training agents of their own
on data of their own with ``mcpg.grpo``, each case with the behaviour it had before it was fixed
named in its test's docstring."""

from __future__ import annotations

import json
import logging

import pytest
from datasets import Dataset

from mcpg.grpo.configs import resolve_config
from mcpg.grpo.train import train

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS = {"prompt": ["Name a colour of the sky.", "Name a yellow fruit.", "The opposite of hot?",
                   "A pet that purrs?"],
        "answer": ["blue", "banana", "cold", "cat"]}
FAST = dict(updates=1, progress=False, eval_initial=False)


def words() -> Dataset:
    return Dataset.from_dict(ROWS)


def graded(completions, answer, **kwargs):
    """1 for the word, 0.5 for its first letter, else 0."""
    return [1.0 if a in c else 0.5 if a[0] in c else 0.0 for c, a in zip(completions, answer)]


def test_your_data_gets_neutral_agents_no_instruction_and_one_line_saying_so(tmp_path, caplog):
    """Before: with train_dataset and no instruction or agents, every agent was told to solve a
    math word problem and was a money, time or geometry specialist, in silence."""
    with caplog.at_level(logging.INFO, logger="mcpg.grpo"):
        train("tiny-random", "removal", tmp_path / "run", reward_funcs=graded, train_dataset=words(),
              eval_dataset=words(), **FAST)
    cfg = json.loads((tmp_path / "run" / "config.json").read_text())["config"]
    assert cfg["instruction"] == ""
    assert [a["specialty"] for a in cfg["agents"]] == [None] * 3
    assert not any(w in a["role"] for a in cfg["agents"] for w in ("money", "time", "math", "lengths"))
    notes = [r.getMessage() for r in caplog.records if r.name.startswith("mcpg")]
    assert len(notes) == 1 and "\n" not in notes[0]
    assert "instruction" in notes[0] and all(a["name"] in notes[0] for a in cfg["agents"])
    # given, they are used as they are, without a note
    caplog.clear()
    mine = [{"name": "poet", "role": "You answer in verse.", "specialty": "poetry"},
            {"name": "terse", "role": "You answer in one word.", "temperature": 0.7}]
    with caplog.at_level(logging.INFO, logger="mcpg.grpo"):
        result = train("tiny-random", "removal", tmp_path / "mine", reward_funcs=graded,
                       train_dataset=words(), eval_dataset=words(), agents=mine,
                       instruction="Answer briefly.",
                       **FAST)
    assert not [r for r in caplog.records if r.name.startswith("mcpg")]
    cfg = json.loads((tmp_path / "mine" / "config.json").read_text())["config"]
    assert [a["name"] for a in cfg["agents"]] == ["poet", "terse"] and cfg["instruction"] == "Answer briefly."
    assert result["specialization"] is None  # a label of your own matches no GSM8K keyword class


def test_a_specialty_is_any_label():
    """Before: specialty accepted only money, time and geometry."""
    cfg = resolve_config("tiny-random", agents=[{"name": "poet", "role": "r", "specialty": "poetry"}])
    assert cfg.agents[0]["specialty"] == "poetry"
    with pytest.raises(ValueError, match="'specialty' must be a non-empty label"):
        resolve_config("tiny-random", agents=[{"name": "poet", "role": "r", "specialty": 3}])
