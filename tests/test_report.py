"""The ``report_to`` config key: metrics.jsonl's scalars in TensorBoard event files."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

from mcpg.grpo import _report
from mcpg.grpo._report import MetricsReport, check_available, flatten_scalars
from mcpg.grpo.configs import resolve_config

FIXTURES = Path(__file__).parent / "fixtures" / "gsm8k"


def test_flatten_scalars_names_agents_and_nests():
    row = {"update": 3, "reward": 0.5, "loss": [0.1, -0.2], "specialization": None, "signal": "wta",
           "flag": True, "seconds": {"rollout": 2.0, "total": 3.5},
           "eval": {"accuracy": 0.25, "agent_accuracy": [0.0, 1.0], "correct": [1, 0, 1],
                    "agent_correct": [[1, 0], [0, 1]]}}
    got = flatten_scalars(row, ["a", "b"])
    assert got == {"reward": 0.5, "loss/a": 0.1, "loss/b": -0.2, "seconds/rollout": 2.0,
                   "seconds/total": 3.5, "eval/accuracy": 0.25, "eval/agent_accuracy/a": 0.0,
                   "eval/agent_accuracy/b": 1.0}


def test_report_to_is_checked():
    assert resolve_config("tiny-random")["report_to"] == []  # off by default
    assert resolve_config("tiny-random", report_to=["tensorboard"])["report_to"] == ["tensorboard"]
    for bad in ("tensorboard", ["wandb"], [None]):
        with pytest.raises(ValueError, match="report_to"):
            resolve_config("tiny-random", report_to=bad)


def test_missing_tensorboard_is_a_clear_error(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ValueError, match=r"report_to.*mcpg\[tensorboard\]"):
        check_available(["tensorboard"])
    check_available([])  # nothing asked: nothing needed
    assert MetricsReport([], "/nonexistent", ["a"]).writer is None


def _events(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_events_hold_the_metrics_scalars(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from mcpg.grpo.train import train

    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURES))
    run = tmp_path / "run"
    train("tiny-random", "removal", run, updates=2, eval_every=1, report_to=["tensorboard"])
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    agents = [a["name"] for a in resolve_config("tiny-random")["agents"]]
    want: dict[str, list[tuple[int, float]]] = {}
    for row in rows:
        for tag, v in flatten_scalars(row, agents).items():
            want.setdefault(tag, []).append((row["update"], v))
    got = _events(run / "tensorboard")
    assert set(got) == set(want)
    assert "eval/accuracy" in got and "loss/money" in got and "seconds/total" in got
    for tag, series in want.items():
        assert [s for s, _ in got[tag]] == [s for s, _ in series], tag
        for (_, a), (_, b) in zip(got[tag], series):  # event files hold float32
            assert math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-6), (tag, a, b)
    # off by default: no event files
    train("tiny-random", "removal", tmp_path / "plain", updates=1)
    assert not (tmp_path / "plain" / "tensorboard").exists()
    assert _report.REPORTERS == ("tensorboard",)
