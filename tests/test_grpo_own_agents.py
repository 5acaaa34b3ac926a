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


def test_rewards_that_read_the_schedule_or_the_last_token_train(tmp_path):
    """Before: the check before training called each reward with an empty completion, empty
    completion_ids and max_steps 0: TRL's reward schedule died of ZeroDivisionError, a reward
    reading completion_ids[i][-1] of IndexError."""
    seen = []

    def schedule(completions, trainer_state, **kwargs):  # a weight that grows over the run
        seen.append((trainer_state.global_step, trainer_state.max_steps))
        return [0.5 * trainer_state.global_step / trainer_state.max_steps for _ in completions]

    def ends_even(completions, completion_ids, **kwargs):
        return [float(ids[-1] % 2 == 0) for ids in completion_ids]

    train("tiny-random", "wta", tmp_path / "run", reward_funcs=[schedule, ends_even],
          reward_weights=[1.0, 0.5], train_dataset=words(), eval_dataset=words(), **{**FAST, "updates": 2})
    assert seen == [(0, 2), (1, 2), (2, 2)]  # two updates, then the final evaluation


def test_a_reward_that_cannot_take_its_keywords_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    from mcpg.grpo import models

    monkeypatch.setattr(models, "load_base", lambda *a, **k: pytest.fail("the model was loaded"))

    def wants_gold(completions, gold):  # a column the dataset lacks, and no **kwargs
        return [0.0 for _ in completions]

    with pytest.raises(ValueError, match="wants_gold .* 'gold'.*columns \\['answer'\\].*\\*\\*kwargs"):
        train("tiny-random", "wta", tmp_path / "run", reward_funcs=wants_gold, train_dataset=words(),
              eval_dataset=words(), **FAST)
    assert not (tmp_path / "run").exists()


def test_a_reward_s_own_error_names_it_and_keeps_its_traceback(tmp_path, monkeypatch, capsys):
    """Before: a ValueError inside a reward became ``error: could not convert string to float``,
    with no function name and no traceback."""
    from mcpg.grpo import __main__ as cli

    (tmp_path / "parse_rewards_74.py").write_text(
        "def parse(completions, **kwargs):\n    return [float('reward ' + c) for c in completions]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="could not convert") as info:
        train("tiny-random", "wta", tmp_path / "run", reward_funcs="parse_rewards_74:parse",
              train_dataset=words(), eval_dataset=words(), **FAST)
    assert any("reward function parse_rewards_74:parse" in n for n in info.value.__notes__)
    assert str(info.traceback[-1].path).endswith("parse_rewards_74.py")  # the user's line that failed
    Dataset.from_dict(ROWS).save_to_disk(str(tmp_path / "rows"))
    argv = ["train", "--config", "tiny-random", "--signal", "wta", "--output", str(tmp_path / "cli"),
            "--reward_funcs", "parse_rewards_74:parse", "--train_dataset", str(tmp_path / "rows"),
            "--eval_dataset", str(tmp_path / "rows"), "--no-progress"]
    with pytest.raises(ValueError, match="could not convert") as info:  # not one line: the traceback
        cli.main(argv)
    assert str(info.traceback[-1].path).endswith("parse_rewards_74.py")


@pytest.mark.parametrize("trl_key, ours, words", [
    ("num_generations", "completions_per_agent", "per prompt"),
    ("temperature", "agents", "per agent"),
    ("per_device_train_batch_size", "prompts_per_update", "completions"),
    ("max_steps", "updates", "num_iterations"),
])
def test_trl_s_names_get_our_equivalent_and_the_difference(trl_key, ours, words, capsys):
    """Before: num_generations got "did you mean num_iterations?" (which changes the optimiser
    steps per rollout), temperature router_features, per_device_train_batch_size
    generation_batch_size."""
    from mcpg.grpo import __main__ as cli

    with pytest.raises(ValueError) as info:
        resolve_config("tiny-random", **{trl_key: 4})
    said = str(info.value)
    assert f"TRL's {trl_key!r}" in said and f"'{ours}'" in said and words in said
    assert "did you mean" not in said
    argv = ["train", "--config", "tiny-random", "--signal", "wta", "--output", "unused", f"--{trl_key}", "4"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and f"--{trl_key}" in err and ours in err


def test_a_reward_edited_under_its_name_does_not_resume(tmp_path, monkeypatch):
    """Before: only the name was recorded, so a run resumed with an edited reward mixed the old
    function's initial accuracy with the new one's final (0.0 -> 1.0) in silence."""
    import sys

    def write(value: float) -> None:
        (tmp_path / "edited_74.py").write_text(
            f"def score(completions, **kwargs):\n    return [{value} for _ in completions]\n")

    write(0.0)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    train("tiny-random", "wta", out, reward_funcs="edited_74:score", train_dataset=words(),
          eval_dataset=words(), **{**FAST, "updates": 2}, stop_after=1)
    saved = json.loads((out / "config.json").read_text())
    (recorded,) = saved["reward_sources"]
    assert set(recorded) == {"source_sha256", "module_sha256"}
    assert all(len(v) == 64 for v in recorded.values())
    write(1.0)
    monkeypatch.delitem(sys.modules, "edited_74")
    with pytest.raises(ValueError, match="edited_74:score: its source differs from the one the run was "
                                         "trained with .* new output"):
        train(None, None, out, resume=True, train_dataset=words(), eval_dataset=words())
    # a run recorded before the hashes existed resumes as before
    (out / "config.json").write_text(json.dumps({k: v for k, v in saved.items() if k != "reward_sources"}))
    assert train(None, None, out, resume=True, train_dataset=words(), eval_dataset=words())["updates"] == 2


def test_a_graded_reward_reports_its_mean_beside_accuracy(tmp_path, capsys):
    """Before: a reward of 0.5 trained, but eval.json reported accuracy 0.000 and no mean reward."""
    from mcpg.grpo import __main__ as cli
    from mcpg.grpo import rundir

    def half(completions, **kwargs):
        return [0.5] * len(completions)

    result = train("tiny-random", "wta", tmp_path / "run", reward_funcs=half, train_dataset=words(),
                   eval_dataset=words(), updates=1, progress=False)
    assert result["accuracy"] == 0.0  # correct means the full reward
    assert result["reward"] == result["base_reward"] == result["initial_reward"] == 0.5
    assert result["agent_reward"] == [0.5] * 3
    initial = json.loads((tmp_path / "run" / "initial_eval.json").read_text())
    assert set(initial) == set(rundir.EVAL_FILE_KEYS) | set(rundir.REWARD_EVAL_KEYS)
    lines = cli.summary(result, cli.build_parser().parse_args(["evaluate", "--run", str(tmp_path / "run")]))
    assert "mean reward 0.500 (untrained pool 0.500)" in lines
    assert "agents' accuracy 0.000, 0.000, 0.000, mean reward 0.500, 0.500, 0.500" in lines


def test_an_adapter_folder_names_its_base_model_role_and_provenance(tmp_path):
    """Before: adapter_config.json had base_model_name_or_path null, the model card was peft's
    empty template, and the agent's role lived only in the run's config.json."""
    from peft import AutoPeftModelForCausalLM, PeftConfig

    from mcpg.grpo.models import load_base

    model, tok, _ = load_base("tiny-random")  # stands in for a model folder of your own
    model.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    mine = [{"name": "poet", "role": "You answer in verse."},
            {"name": "terse", "role": "You answer in one word."}]
    out = tmp_path / "run"
    train("tiny-random", "wta", out, reward_funcs=graded, train_dataset=words(), eval_dataset=words(),
          agents=mine, instruction="Answer briefly.", model=str(tmp_path / "base"), **FAST)
    folder = out / "adapters" / "poet"
    base = PeftConfig.from_pretrained(str(folder)).base_model_name_or_path
    assert base == str((tmp_path / "base").resolve())
    card = (folder / "README.md").read_text()
    commit = json.loads((out / "PROVENANCE.json").read_text())["commit"]
    for words_ in ("base_model:", "You answer in verse. Answer briefly.", "wta", str(commit),
                   "AutoPeftModelForCausalLM.from_pretrained", f"{graded.__module__}:graded"):
        assert words_ in card, words_
    loaded = AutoPeftModelForCausalLM.from_pretrained(str(folder))  # PEFT alone: the base from the folder
    assert loaded.active_adapter == "default"


def test_an_agent_with_no_trained_tokens_logs_null(tmp_path, gsm8k_fixture):
    """Before: an agent whose completions were all cut at the token budget, with
    mask_truncated_completions, logged 0.0 for the means over its trained tokens."""
    from mcpg.grpo import rundir

    out = tmp_path / "run"
    train("tiny-random", "wta", out, mask_truncated_completions=True, max_completion_length=2, **FAST)
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert row["truncated"] == 1.0  # every completion cut: no agent has a trained token
    for key in rundir.TOKEN_MEANS:
        assert row[key] == [None] * 3, key
    assert row["agent/grad_norm"] == [0.0] * 3  # a norm of no gradient is 0, not unknown


def test_an_empty_saved_dataset_is_one_line(tmp_path):
    """Before: an empty Dataset saved to disk gave datasets' IndexError traceback."""
    from mcpg.grpo import custom

    Dataset.from_dict({"prompt": []}).save_to_disk(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="train_dataset .*empty.* holds no rows"):
        custom.load_rows(tmp_path / "empty", "train_dataset")


def test_suggested_commands_are_shell_quoted(tmp_path):
    """Before: a suggested command held the folder as it is, so a path with a space failed when
    pasted."""
    import shlex

    from mcpg.grpo import __main__ as cli
    from mcpg.grpo.train import evaluate_run

    out = tmp_path / "my runs" / "a b"
    train("tiny-random", "wta", out, train_dataset=words(), eval_dataset=words(), reward_funcs=graded,
          **{**FAST, "updates": 2}, stop_after=1)
    args = cli.build_parser().parse_args(["train", "--output", str(out), "--resume"])
    line = cli.interrupted(args)
    command = line.split("continue the run with ", 1)[1]
    assert shlex.split(command)[shlex.split(command).index("--output") + 1] == str(out)
    with pytest.raises(ValueError) as info:
        evaluate_run(out)
    command = str(info.value).split("finish it with ", 1)[1].split(", then", 1)[0]
    assert shlex.split(command)[shlex.split(command).index("--output") + 1] == str(out)


def test_an_unwritable_output_is_refused_before_the_model_loads(tmp_path, monkeypatch):
    """Before: write permission was found missing only when the run first wrote, after the model
    loaded."""
    import os

    from mcpg.grpo import models

    monkeypatch.setattr(models, "load_base", lambda *a, **k: pytest.fail("the model was loaded"))
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p) == str(locked) else real(p, mode))
    with pytest.raises(ValueError, match="cannot write .*locked"):
        train("tiny-random", "wta", locked / "run", train_dataset=words(), eval_dataset=words(),
              reward_funcs=graded, **FAST)


def test_a_folder_whose_run_stopped_before_update_1_says_how_to_start_over(tmp_path):
    """Before: a folder whose run failed before update 1 could be neither rerun nor resumed (with
    the fix that failed it), and no message said how to start over."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.json").write_text("{}")  # what a run killed before its first update leaves
    (out / "PROVENANCE.json").write_text("{}")
    with pytest.raises(ValueError, match=f"stopped before its first update.*rm -r {out}"):
        train("tiny-random", "wta", out, train_dataset=words(), eval_dataset=words(), reward_funcs=graded,
              **FAST)


def test_a_one_letter_agent_name_trains_and_loads_with_peft(tmp_path):
    """Before: an agent named ``a`` was refused as "part of 'lora_'" (peft warns by substring);
    its adapter saves and loads unchanged."""
    import torch
    from peft import PeftModel, get_peft_model_state_dict
    from safetensors.torch import load_file

    from mcpg.grpo.models import load_base

    agents = [{"name": "a", "role": "You answer."}, {"name": "r", "role": "You reply."}]
    out = tmp_path / "run"
    train("tiny-random", "wta", out, train_dataset=words(), eval_dataset=words(), reward_funcs=graded,
          agents=agents, **FAST)
    saved = load_file(str(out / "adapters" / "a" / "adapter_model.safetensors"))
    model = PeftModel.from_pretrained(load_base("tiny-random")[0], str(out / "adapters" / "a"),
                                      adapter_name="a")
    loaded = get_peft_model_state_dict(model, adapter_name="a")
    # the same tensors: lora_A starts random, so one reinitialised on loading would differ
    assert saved.keys() == loaded.keys() and all(torch.equal(saved[k], loaded[k]) for k in saved)


def test_an_unreachable_hub_id_fails_at_once(monkeypatch):
    """Before: a hub id with no network retried for 51 s before its error."""
    import time

    from mcpg.grpo import models

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setattr(models, "hub_reachable", lambda timeout=3.0: False)
    start = time.perf_counter()
    with pytest.raises(ValueError, match="no-such-model.* not in the local cache.* cannot be reached"):
        models.load_base("no-such-org/no-such-model")
    assert time.perf_counter() - start < 10


def test_lr_scheduler_type_is_trl_s_and_constant_by_default(tmp_path, gsm8k_fixture):
    """Before: the learning rate was constant where TRL's default decays linearly, with no key
    to choose; recorded configs, which lack the key, mean constant."""
    from mcpg.grpo.configs import saved_config
    from mcpg.grpo.train import Engine

    assert resolve_config("tiny-random").lr_scheduler_type == "constant"
    assert saved_config({"config": {}, "signal": "wta"}).lr_scheduler_type == "constant"
    with pytest.raises(ValueError, match="'lr_scheduler_type' must be one of"):
        resolve_config("tiny-random", lr_scheduler_type="warmup_forever")
    cfg = resolve_config("tiny-random", lr_scheduler_type="linear", updates=4, num_iterations=2)
    engine = Engine(cfg, "wta")
    lrs = []
    for _ in range(2):
        engine.update()
        lrs.append(engine.optimizer.param_groups[0]["lr"])
    assert lrs == pytest.approx([cfg.learning_rate * 6 / 8, cfg.learning_rate * 4 / 8])
    # resumed, the schedule goes on where it was
    out = tmp_path / "run"
    train(cfg, "wta", out, stop_after=1, progress=False, eval_initial=False)
    again = Engine(cfg, "wta")
    again.load_checkpoint(out / "checkpoint")
    assert again.optimizer.param_groups[0]["lr"] == pytest.approx(cfg.learning_rate * 6 / 8)
