"""Config keys in TRL's names, the signal as a key, and every key on the command line (issue 60,
section 3): an old name still works with a FutureWarning, a recorded run's config.json reads
silently with its numbers unchanged, and ``python -m mcpg.grpo train --KEY VALUE`` sets any key."""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest

from mcpg.grpo import __main__ as cli
from mcpg.grpo.configs import (
    ALIASES,
    GRPOConfig,
    canonical_keys,
    check_config,
    field_docs,
    resolve_config,
    saved_config,
)

ROOT = Path(__file__).resolve().parents[1]
RECORDED = sorted([*(ROOT / "data" / "results").rglob("config.json"),
                   *(ROOT / "tests" / "fixtures").rglob("config.json")])


def test_old_names_set_trls_keys_with_a_future_warning(tmp_path):
    assert ALIASES == {"max_new_tokens": "max_completion_length", "clip_eps": "epsilon",
                       "clip_eps_high": "epsilon_high"}
    for old, new in ALIASES.items():
        with pytest.warns(FutureWarning, match=f"'{old}' is now '{new}'"):
            cfg = resolve_config("tiny-random", **{old: 7})
        assert getattr(cfg, new) == 7 and old not in cfg.to_dict()
        with pytest.warns(FutureWarning, match=f"'{new}'"):
            assert cfg[old] == 7  # cfg["old"] still reads
        assert old not in cfg and new in cfg
        with pytest.warns(FutureWarning):
            assert cfg.replace(**{old: 9})[new] == 9
        spec = {k: v for k, v in resolve_config("tiny-random").to_dict().items() if k != new}
        with pytest.warns(FutureWarning):
            assert check_config({**spec, old: 9})[new] == 9
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"base": "tiny-random", "max_new_tokens": 5, "clip_eps": 0.3}))
    with pytest.warns(FutureWarning) as seen:
        cfg = resolve_config(str(path))
    assert (cfg.max_completion_length, cfg.epsilon) == (5, 0.3)
    assert {str(w.message).split("'")[1] for w in seen} == {"max_new_tokens", "clip_eps"}
    assert all(w.filename == __file__ for w in seen)  # attributed to the caller, not the library
    # the named configs use the new names: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in ("tiny-random", "cpu-smoke", "control", "colab", "paper"):
            resolve_config(name)


def test_a_key_under_both_names_is_refused_and_did_you_mean_knows_the_old_names():
    with pytest.raises(ValueError, match="'max_new_tokens' and 'max_completion_length' are one key"):
        resolve_config({"base": "tiny-random", "max_new_tokens": 4, "max_completion_length": 4})
    with pytest.raises(ValueError, match="'clip_eps' and 'epsilon' are one key"):
        resolve_config("tiny-random", clip_eps=0.1, epsilon=0.1)
    with pytest.raises(ValueError, match="one key"):
        resolve_config("tiny-random").replace(clip_eps_high=0.3, epsilon_high=0.3)
    for typo, meant in (("max_new_token", "max_completion_length"), ("clip_ep", "epsilon"),
                        ("max_completion_lenght", "max_completion_length"), ("epsilon_hi", "epsilon_high")):
        with pytest.raises(ValueError, match=f"'{typo}' \\(did you mean '{meant}'\\?\\)"):
            resolve_config("tiny-random", **{typo: 1})


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_every_recorded_config_reads_silently_with_its_numbers(path):
    """Every config.json under data/results and tests/fixtures: read as the engine reads it back
    (saved_config), without a warning; every value it recorded is the value read (under the key's
    new name), and the signal recorded beside the config is the config's."""
    saved = json.loads(path.read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = saved_config(saved)
        entry = saved_config(saved["config"], signal=saved["signal"])
    assert cfg == entry and cfg.signal == saved["signal"]
    recorded = canonical_keys(saved["config"], warn=False)
    assert {k: cfg[k] for k in recorded} == recorded


def test_a_recorded_run_reads_with_the_new_names():
    from mcpg.grpo.rundir import read_run

    run = read_run(ROOT / "data" / "results" / "ch08" / "control")
    raw = json.loads((run.path / "config.json").read_text())["config"]
    assert "max_new_tokens" in raw and "max_completion_length" not in raw
    assert run.config["max_completion_length"] == raw["max_new_tokens"] and "max_new_tokens" not in run.config


def test_the_signal_is_a_config_key(tmp_path, gsm8k_fixture):
    from mcpg.grpo.train import train

    assert resolve_config("tiny-random").signal is None
    assert resolve_config("tiny-random", signal="wta").signal == "wta"
    with pytest.raises(ValueError, match="signal must be one of .*'best'"):
        resolve_config("tiny-random", signal="best")
    # the exact budget's rule is the config's: removal only, and undecided while the signal is
    assert resolve_config("tiny-random", exact_budget=0.5).with_signal("removal").signal == "removal"
    for sig in ("wta", "oracle"):
        with pytest.raises(ValueError, match="'exact_budget' corrects the removal signal only"):
            resolve_config("tiny-random", exact_budget=0.5, signal=sig)
        with pytest.raises(ValueError, match="'exact_budget' corrects the removal signal only"):
            resolve_config("tiny-random", exact_budget=0.5).with_signal(sig)
    # the argument and the config's key must agree; either alone chooses it
    cfg = resolve_config("tiny-random", signal="wta")
    assert cfg.with_signal(None) is cfg and cfg.with_signal("wta") is cfg
    with pytest.raises(ValueError, match="signal 'removal' differs from config key 'signal' \\('wta'\\)"):
        cfg.with_signal("removal")
    with pytest.raises(ValueError, match="no signal"):
        resolve_config("tiny-random").with_signal(None)
    # train: the config's signal when the argument is None; a disagreeing one refused untouched
    with pytest.raises(ValueError, match="differs from config key 'signal'"):
        train({"base": "tiny-random", "signal": "wta"}, "removal", tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    out = tmp_path / "run"
    assert train({"base": "tiny-random", "signal": "wta"}, None, out, stop_after=0, progress=False) is None
    saved = json.loads((out / "config.json").read_text())
    assert saved["signal"] == saved["config"]["signal"] == "wta"
    assert saved_config(saved).signal == "wta"
    # a recording made before the key: the signal recorded beside its config
    old = {"config": {k: v for k, v in saved["config"].items() if k != "signal"}, "signal": "oracle"}
    assert saved_config(old).signal == "oracle" and saved_config(old["config"]).signal is None


def test_help_lists_every_key_with_the_first_line_of_its_docstring(capsys):
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for f in dataclasses.fields(GRPOConfig):
        assert f"--{f.name} " in text, f.name
        if f.name not in cli.OWN_OPTIONS:
            line = " ".join(cli._help_line(field_docs()[f.name]).split()).replace("%%", "%")
            assert len(line) > 10 and line in text, (f.name, line)
    for old in ALIASES:  # hidden: the old names work but are not offered
        assert f"--{old} " not in text
    assert "--reward_funcs" in text and "--train_dataset" in text and "--eval_dataset" in text


def _as_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def test_the_command_line_sets_any_key():
    """Every key's option reads its own value back (each default written as text), and a
    table of typed values: numbers, null, flags, JSON, a plain module name."""
    parser = cli.build_parser()
    cfg = resolve_config("tiny-random", reward_weights=[0.5, 0.5], report_to=["tensorboard"])
    for key, value in cfg.to_dict().items():
        if key in cli.OWN_OPTIONS:
            continue
        args = parser.parse_args(["train", "--output", "o", f"--{key}", _as_text(value)])
        assert cli.key_overrides(args) == {key: value}, key
    table = [
        (["--learning_rate", "1e-4", "--max_completion_length", "16"],
         {"learning_rate": 1e-4, "max_completion_length": 16}),
        (["--max_grad_norm", "none", "--epsilon_high", "null", "--train_problems", "NULL"],
         {"max_grad_norm": None, "epsilon_high": None, "train_problems": None}),
        (["--stop_at_answer", "--no-shared_prefix", "--eval_initial", "false"],
         {"stop_at_answer": True, "shared_prefix": False, "eval_initial": False}),
        (["--lora_target_modules", "q_proj"], {"lora_target_modules": "q_proj"}),
        (["--lora_target_modules", '["q_proj", "v_proj"]'], {"lora_target_modules": ["q_proj", "v_proj"]}),
        (["--agents", '[{"name": "solver", "role": "You solve."}]'],
         {"agents": [{"name": "solver", "role": "You solve."}]}),
        (["--instruction", "null", "--data_dir", "/data"], {"instruction": None, "data_dir": "/data"}),
        (["--name", "none"], {"name": "none"}),  # text is text: only null is None, for keys that allow it
    ]
    for argv, want in table:
        assert cli.key_overrides(parser.parse_args(["train", "--output", "o", *argv])) == want, argv
    # an old name sets the new key, with a FutureWarning; both names at once is an error
    args = parser.parse_args(["train", "--output", "o", "--max_new_tokens", "12", "--clip_eps", "0.3"])
    with pytest.warns(FutureWarning) as seen:
        assert cli.key_overrides(args) == {"max_completion_length": 12, "epsilon": 0.3}
    assert sorted(str(w.message).split(" (")[0] for w in seen) == [
        "--clip_eps is now --epsilon", "--max_new_tokens is now --max_completion_length"]
    args = parser.parse_args(["train", "--output", "o", "--max_new_tokens", "12",
                              "--max_completion_length", "4"])
    with pytest.raises(cli.UsageError, match="--max_new_tokens and --max_completion_length are one"):
        cli.key_overrides(args)


@pytest.mark.usefixtures("one_torch_thread")
def test_a_run_from_the_command_line_records_the_keys_it_was_given(tmp_path, gsm8k_fixture, capsys):
    out = tmp_path / "run"
    argv = ["train", "--config", "tiny-random", "--signal", "removal", "--output", str(out), "--no-progress",
            "--updates", "1", "--learning_rate", "1e-4", "--max_completion_length", "16", "--no-eval_initial"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    saved = json.loads((out / "config.json").read_text())
    assert saved["config"]["learning_rate"] == 1e-4 and saved["config"]["max_completion_length"] == 16
    assert saved["config"]["eval_initial"] is False and saved["config"]["signal"] == "removal"
    assert not (out / "initial_eval.json").exists()
    # resumed: a key equal to the run's is accepted, a different one refused (and nothing changes)
    before = (out / "config.json").read_bytes()
    assert cli.main(["train", "--output", str(out), "--resume", "--learning_rate", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "learning_rate (0.0001 in the run, 0.5 given)" in err and "\n" not in err.strip()
    assert (out / "config.json").read_bytes() == before
    assert cli.main(["train", "--output", str(out), "--resume", "--learning_rate", "1e-4", "--updates", "2",
                     "--no-progress"]) == 0
    assert json.loads((out / "eval.json").read_text())["updates"] == 2
