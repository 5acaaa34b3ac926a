"""Bad input to ``python -m mcpg.grpo``, as a table: each row ends in ONE ``error:`` line that
names the key or file and says how to fix it, before the model loads where that can be told
without it, and leaves the output folder byte for byte as it was (or absent, for a new one).

Then the run folder's own rules: a folder belongs to one run (resume with or without its own
config; a changed config or too few updates refused), Ctrl-C says how ``--resume`` continues,
and an evaluation reads the run's own problems only (issue 60, sections 1 and 2)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from mcpg.grpo import __main__ as cli
from mcpg.grpo import models
from mcpg.grpo.train import train

FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"
TRAIN = ["train", "--config", "tiny-random", "--signal", "wta", "--no-progress"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _fixture_data(monkeypatch):
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """Two tiny runs on the fixture's problems: ``finished`` (2 updates) and ``unfinished``
    (stopped after 1 of 2, as a crash leaves it)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("MCPG_GSM8K_DIR", str(FIXTURE))
    base = tmp_path_factory.mktemp("recorded")
    train("tiny-random", "wta", base / "finished", updates=2, progress=False)
    assert train("tiny-random", "wta", base / "unfinished", updates=2, stop_after=1, progress=False) is None
    mp.undo()
    return base


def snapshot(folder: Path) -> dict | None:
    """Every file under ``folder`` with its bytes (None when the folder does not exist)."""
    if not folder.exists():
        return None
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def data_folder(tmp: Path, test_lines: list[str] | None = None) -> Path:
    """A GSM8K folder: the fixture's train.jsonl, and test.jsonl made of ``test_lines``."""
    folder = tmp / "gsm8k"
    folder.mkdir()
    shutil.copy(FIXTURE / "train.jsonl", folder / "train.jsonl")
    (folder / "test.jsonl").write_text("".join(line + "\n" for line in test_lines or []))
    return folder


def config_file(tmp: Path, **keys) -> str:
    path = tmp / "config.json"
    path.write_text(json.dumps({"base": "tiny-random", **keys}))
    return str(path)


def copy_run(recorded: Path, name: str, tmp: Path) -> Path:
    shutil.copytree(recorded / name, tmp / name)
    return tmp / name


FIXTURE_TEST = (FIXTURE / "test.jsonl").read_text().splitlines()


# Each case: (tmp, recorded, monkeypatch) -> (argv, the folder to watch, whether the error comes
# before the model loads), and the words its one line must hold.
def _empty_test_split(tmp, rec, mp):
    mp.setenv("MCPG_GSM8K_DIR", str(data_folder(tmp, [])))
    return [*TRAIN, "--output", str(tmp / "out")], tmp / "out", True


def _broken_json_line_41(tmp, rec, mp):
    lines = [FIXTURE_TEST[i % len(FIXTURE_TEST)] for i in range(45)]
    lines[40] = '{"question": "How many\u0001 apples?", "answer": "#### 3"}'.replace("\u0001", "\t")
    mp.setenv("MCPG_GSM8K_DIR", str(data_folder(tmp, lines)))
    return [*TRAIN, "--output", str(tmp / "out")], tmp / "out", True


def _tensorboard_missing(tmp, rec, mp):
    real = importlib.util.find_spec
    mp.setattr(importlib.util, "find_spec",
               lambda name, *a: None if name == "tensorboard" else real(name, *a))
    conf = config_file(tmp, report_to=["tensorboard"])
    return ["train", "--config", conf, "--signal", "wta", "--output", str(tmp / "out")], tmp / "out", True


def _config_case(**keys):
    def case(tmp, rec, mp):
        conf = config_file(tmp, **keys)
        return ["train", "--config", conf, "--signal", "wta", "--output", str(tmp / "out")], tmp / "out", True
    return case


def _model_missing(tmp, rec, mp):
    return _config_case(model=str(tmp / "no-such-model"))(tmp, rec, mp)


def _model_folder_empty(tmp, rec, mp):
    (tmp / "empty-model").mkdir()
    return _config_case(model=str(tmp / "empty-model"))(tmp, rec, mp)


def _new_run_over_a_dead_one(tmp, rec, mp):
    # a run (of another task) that died before its first update: its config.json and initial
    # evaluation; a new run must not take them over
    out = tmp / "out"
    out.mkdir()
    for f in ("config.json", "initial_eval.json", "PROVENANCE.json"):
        shutil.copy(rec / "finished" / f, out / f)
    saved = json.loads((out / "config.json").read_text())
    saved["config"]["task"] = "arithmetic"
    (out / "config.json").write_text(json.dumps(saved))
    return [*TRAIN, "--output", str(out)], out, True


def _new_run_into_a_folder_of_other_files(tmp, rec, mp):
    (tmp / "out").mkdir()
    (tmp / "out" / "notes.txt").write_text("mine\n")
    return [*TRAIN, "--output", str(tmp / "out")], tmp / "out", True


def _resume_with_another_config(tmp, rec, mp):
    run = copy_run(rec, "unfinished", tmp)
    conf = config_file(tmp, learning_rate=0.5)
    return ["train", "--config", conf, "--signal", "wta", "--output", str(run), "--resume"], run, True


def _resume_below_the_updates_done(tmp, rec, mp):
    run = copy_run(rec, "finished", tmp)
    return ["train", "--signal", "wta", "--output", str(run), "--resume", "--updates", "1"], run, True


def _resume_on_other_problems(tmp, rec, mp):
    run = copy_run(rec, "unfinished", tmp)
    mp.setenv("MCPG_GSM8K_DIR", str(data_folder(tmp, FIXTURE_TEST[:-1])))
    return ["train", "--signal", "wta", "--output", str(run), "--resume"], run, True


def _evaluate_an_unfinished_run(tmp, rec, mp):
    run = copy_run(rec, "unfinished", tmp)
    return ["evaluate", "--run", str(run)], run, True


def _evaluate_on_other_problems(tmp, rec, mp):
    run = copy_run(rec, "finished", tmp)
    changed = [FIXTURE_TEST[0].replace('"question": "', '"question": "Suppose that ', 1), *FIXTURE_TEST[1:]]
    assert changed != FIXTURE_TEST
    mp.setenv("MCPG_GSM8K_DIR", str(data_folder(tmp, changed)))
    return ["evaluate", "--run", str(run)], run, True


def _evaluate_an_older_run_on_fewer_problems(tmp, rec, mp):
    # a run recorded before PROVENANCE.json held its problems: their number is still checked
    run = copy_run(rec, "finished", tmp)
    prov = json.loads((run / "PROVENANCE.json").read_text())
    del prov["data"]
    (run / "PROVENANCE.json").write_text(json.dumps(prov))
    mp.setenv("MCPG_GSM8K_DIR", str(data_folder(tmp, FIXTURE_TEST[:3])))
    return ["evaluate", "--run", str(run)], run, True


def _key_option(*keys):
    def case(tmp, rec, mp):
        return [*TRAIN, "--output", str(tmp / "out"), *keys], tmp / "out", True
    return case


def _resume_with_another_key(tmp, rec, mp):
    run = copy_run(rec, "unfinished", tmp)
    return ["train", "--output", str(run), "--resume", "--learning_rate", "0.5"], run, True


ROWS = [{"prompt": "What is 2 + 3?", "answer": "5"}, {"prompt": "What is 7 - 4?", "answer": "3"}]


def _custom(reward: str | None = None, rows: list[dict] | None = None, spec: str | None = None,
            before_model: bool = True):
    """A run with a reward function of one's own (``reward``: its body's return expression, in a
    module put on sys.path) and a JSON Lines dataset of ``rows``; ``before_model``: refused before
    the model loads (what a reward returns is checked at its first call, on real completions)."""
    def case(tmp, rec, mp):
        data = tmp / "rows.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in (ROWS if rows is None else rows)))
        argv = [*TRAIN, "--output", str(tmp / "out"), "--train_dataset", str(data),
                "--eval_dataset", str(data)]
        if reward is not None:
            name = f"reward_{abs(hash(reward)) % 10**8}"
            source = f"def mine(prompts, completions, **kwargs):\n    return {reward}\n"
            (tmp / f"{name}.py").write_text(source)
            mp.syspath_prepend(str(tmp))
            argv += ["--reward_funcs", f"{name}:mine"]
        elif spec is not None:
            argv += ["--reward_funcs", spec]
        return argv, tmp / "out", before_model
    return case


CASES = {
    # section 2 of issue 60
    "empty test split": (_empty_test_split, ["test.jsonl", "holds no problems"]),
    "broken JSON on line 41": (_broken_json_line_41, ["test.jsonl, line 41", "not valid JSON"]),
    "report_to tensorboard, not installed": (_tensorboard_missing, ["'report_to'", "pip install"]),
    "model path missing": (_model_missing, ["config key 'model'", "no-such-model", "does not exist"]),
    "model folder empty": (_model_folder_empty, ["config key 'model'", "empty-model", "not a model folder"]),
    "max_grad_norm big": (_config_case(max_grad_norm="big"), ["'max_grad_norm'", "'big'"]),
    "agent temperature hot": (
        _config_case(agents=[{"name": "solver", "role": "r", "temperature": "hot"}]),
        ["'agents'", "'temperature'", "'hot'"]),
    "learning_rate true": (_config_case(learning_rate=True), ["'learning_rate'", "positive number", "True"]),
    "specialty a number": (
        _config_case(agents=[{"name": "solver", "role": "r", "specialty": 3}]),
        ["'specialty'", "non-empty label", "3"]),
    "unknown key": (_config_case(lerning_rate=0.1), ["'lerning_rate'", "did you mean 'learning_rate'"]),
    # section 1: a run folder belongs to one run
    "new run over a dead run": (_new_run_over_a_dead_one, ["already holds a run", "--resume", "new output"]),
    "new run into other files": (_new_run_into_a_folder_of_other_files, ["not empty", "notes.txt"]),
    "resume with another config": (_resume_with_another_config, ["learning_rate", "0.5", "differs"]),
    "resume below the updates done": (_resume_below_the_updates_done, ["below the 2 updates", "--updates"]),
    "resume on other problems": (_resume_on_other_problems, ["held-out problems", "SHA-256", "differ"]),
    "evaluate an unfinished run": (_evaluate_an_unfinished_run, ["has not finished", "--resume"]),
    "evaluate on other problems": (_evaluate_on_other_problems,
                                   ["evaluate", "SHA-256", "differ", "MCPG_GSM8K_DIR"]),
    "evaluate an older run on fewer problems": (_evaluate_an_older_run_on_fewer_problems,
                                                ["gives 3 held-out problems", "evaluated on 4"]),
    # section 3: every key on the command line
    "key option not a number": (_key_option("--learning_rate", "abc"),
                                ["--learning_rate 'abc'", "'learning_rate' is a number"]),
    "key option out of range": (_key_option("--max_completion_length", "0"),
                                ["'max_completion_length'", "positive integer", "0"]),
    "key option under both names": (_key_option("--max_new_tokens", "4", "--max_completion_length", "5"),
                                    ["--max_new_tokens and --max_completion_length", "one config key"]),
    "resume with another key": (_resume_with_another_key, ["learning_rate", "0.5", "differs", "resume"]),
    # section 4: your reward and your data
    "dataset without a prompt column": (_custom("[1.0] * len(completions)", rows=[{"question": "q"}]),
                                        ["train_dataset", "rows.jsonl, line 1", "no 'prompt'"]),
    "reward of the wrong length": (_custom("[1.0] * (len(completions) + 1)", before_model=False),
                                   ["reward function", ":mine returned 9 rewards for 8 completions"]),
    "reward not a number": (_custom("['right'] * len(completions)", before_model=False),
                            [":mine returned 'right' for completion 0", "finite number"]),
    "reward function that does not import": (_custom(spec="no_such_module_60:reward"),
                                             ["'no_such_module_60:reward'", "does not import"]),
    "reward function named without a module": (_custom(spec="reward"), ["'reward'", "module:function"]),
    "dataset without a reward": (_custom(), ["needs reward_funcs", "--reward_funcs"]),
    "conversational prompt": (_custom("[1.0] * len(completions)",
                                      rows=[{"prompt": [{"role": "user", "content": "q"}]}]),
                              ["conversation", "plain text"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_leaves_the_folder_as_it_was(name, tmp_path, recorded, monkeypatch, capsys):
    make, words = CASES[name]
    argv, folder, before_model = make(tmp_path, recorded, monkeypatch)
    loads = []
    real = models.load_base
    monkeypatch.setattr(models, "load_base", lambda *a, **k: loads.append(a) or real(*a, **k))
    before = snapshot(folder)
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    assert captured.out == ""
    for w in words:
        assert w in err, (w, err)
    assert len(err) < 400, err  # one line a person reads, not a list of every key
    assert snapshot(folder) == before, "the output folder changed"
    if before_model:
        assert loads == [], "the model was loaded before the error"


def test_what_the_old_checks_refused_wrongly_is_accepted(tmp_path):
    # an agent named like a part of 'lora_' ('a', peft warns by substring) saves and loads unchanged
    # (tests/test_grpo_own_agents.py), and so does a name merely containing such letters
    from mcpg.grpo.configs import resolve_config

    agents = [{"name": "a", "role": "r", "temperature": 1, "specialty": None},
              {"name": "lora_agent", "role": "r", "temperature": 0.5, "specialty": "time"}]
    assert [a["name"] for a in resolve_config("tiny-random", agents=agents)["agents"]] == ["a", "lora_agent"]
    for ok in ({"max_grad_norm": None}, {"max_grad_norm": 0}, {"learning_rate": 1}, {"epsilon_high": 0.28}):
        assert resolve_config("tiny-random", **ok)  # numbers, null where allowed


def test_resume_with_the_runs_own_config_continues(tmp_path, recorded, capsys):
    # the recorder passes its config with --resume: the same config is checked and accepted
    run = copy_run(recorded, "unfinished", tmp_path)
    argv = ["train", "--config", "tiny-random", "--signal", "wta", "--output", str(run), "--resume",
            "--no-progress"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert json.loads((run / "eval.json").read_text())["updates"] == 2
    assert 2 <= len(out.strip().splitlines()) <= 5 and "eval.json" in out and "accuracy" in out
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["update"] for r in rows] == [1, 2]


def test_ctrl_c_says_how_resume_continues(tmp_path, monkeypatch, capsys):
    from mcpg.grpo.train import Engine

    real, calls = Engine.update, []

    def update(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(Engine, "update", update)
    run = tmp_path / "run"
    assert cli.main([*TRAIN, "--output", str(run), "--updates", "3"]) == 130
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert "checkpoint at update 1" in err and f"--output {run} --resume" in err and "--signal wta" in err
    monkeypatch.setattr(Engine, "update", real)
    assert cli.main(["train", "--signal", "wta", "--output", str(run), "--resume", "--no-progress"]) == 0
    assert json.loads((run / "eval.json").read_text())["updates"] == 3
    # interrupted before anything was written
    monkeypatch.setattr(Engine, "__init__", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli.main([*TRAIN, "--output", str(tmp_path / "new")]) == 130
    assert "nothing was written" in capsys.readouterr().err and not (tmp_path / "new").exists()


def test_evaluate_records_its_call_and_keeps_the_training_record(tmp_path, recorded, capsys):
    from mcpg.grpo.provenance import recorded_provenance

    run = copy_run(recorded, "finished", tmp_path)
    before = json.loads((run / "PROVENANCE.json").read_text())
    assert cli.main(["evaluate", "--run", str(run), "--no-progress"]) == 0
    after = json.loads((run / "PROVENANCE.json").read_text())
    top = [{k: v for k, v in p.items() if k != "calls"} for p in (after, before)]
    assert top[0] == top[1]
    assert after["calls"][:-1] == before["calls"]
    call = after["calls"][-1]
    assert call["call"] == "evaluate" and call["wrote"] == "eval.json"
    assert call["data"]["eval_sha256"] == before["data"]["eval_sha256"]
    # a recorder reads the training call, not the evaluation
    fields = {"commit": None, "started": None}
    assert recorded_provenance(run, fields, {})["started"] == before["calls"][-1]["started"]
