"""The engine under allocation "leverage" (chapter 9): budget 0 and 1 bit for bit, the logged
leverage, and checkpoint/resume of the budget's state. Tiny random model on the CPU."""

import json
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mcpg.grpo.train import leverage_proxy, train
from reference_runs import weight_files  # tests/reference_runs.py

warnings.filterwarnings("ignore", category=FutureWarning)
FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"
EXACT_KEYS = ("exact_evaluations", "feedback_cost", "exact_share", "exact_share_expected")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _fixture_data(monkeypatch):
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))


@pytest.fixture
def some_rewards(monkeypatch):
    """Reward each completion by a hash of its text (a random model is never right)."""
    import mcpg.grpo.train as train_module

    monkeypatch.setattr(train_module, "reward", lambda text, gold, truncated=False:
                        float(zlib.crc32(text.encode()) % 2))


def _rows(run: Path, name: str) -> list[dict]:
    rows = [json.loads(line) for line in (run / name).read_text().splitlines()]
    for r in rows:
        r.pop("seconds", None)  # wall-clock time is the one thing allowed to differ
    return rows


def _without(rows, keys):
    return [{k: v for k, v in r.items() if k not in keys} for r in rows]


def _weights(run: Path) -> dict:
    files = weight_files(run)  # each agent's adapter (peft's format) and the router
    out = {f"adapters/{name}": load_file(str(f)) for name, f in files.items() if name != "router.safetensors"}
    out["router"] = load_file(str(files["router.safetensors"]))
    return out


def test_leverage_budget_zero_is_removal_and_one_is_oracle(tmp_path, some_rewards):
    kw = dict(updates=3)
    runs = {name: tmp_path / name for name in ("removal", "oracle", "b0", "b1", "b05")}
    train("tiny-random", "removal", runs["removal"], **kw)
    train("tiny-random", "oracle", runs["oracle"], **kw)
    for name, b in (("b0", 0.0), ("b1", 1.0), ("b05", 0.5)):
        train("tiny-random", "removal", runs[name], exact_budget=b, allocation="leverage", **kw)
    m = {k: _rows(v, "metrics.jsonl") for k, v in runs.items()}
    assert m["b0"] == m["removal"]  # bit for bit, every metric
    assert _without(m["b1"], {"signal", *EXACT_KEYS}) == _without(m["oracle"], {"signal", *EXACT_KEYS})
    assert all(r["exact_share"] == 1.0 for r in m["b1"])
    assert _without(m["b05"], EXACT_KEYS) != _without(m["removal"], EXACT_KEYS)  # the check can fail
    for a, b in (("b0", "removal"), ("b1", "oracle")):
        wa, wb = _weights(runs[a]), _weights(runs[b])
        for name in wa:
            assert all(torch.equal(wa[name][k], wb[name][k]) for k in wa[name]), (a, name)
    slates = _rows(runs["b05"], "slates.jsonl")
    for s in slates:  # the allocation's inputs and outputs are logged per slate
        assert len(s["exact_z"]) == len(s["exact_p"]) == len(s["exact_a"]) == 4
        a, p = np.array(s["exact_a"]), np.array(s["exact_p"])
        assert a.shape == (4, 3) and (a >= 0).all() and a.sum() > 0
        assert ((p == 0) | (p > 0.5)).all()  # only {0} ∪ (½, 1]


def test_leverage_budget_resumes_as_uninterrupted(tmp_path, some_rewards):
    kw = dict(updates=3, exact_budget=0.5, allocation="leverage")
    full, cut = tmp_path / "full", tmp_path / "cut"
    train("tiny-random", "removal", full, **kw)
    assert train("tiny-random", "removal", cut, stop_after=2, **kw) is None
    saved = json.loads((cut / "checkpoint" / "budget_rank0.json").read_text())
    assert saved["budget"]["rule"] == "leverage" and saved["budget"]["floor"] == 0.0
    train(None, "removal", cut, resume=True)  # the run's own config
    assert _rows(cut, "metrics.jsonl") == _rows(full, "metrics.jsonl")
    assert _rows(cut, "slates.jsonl") == _rows(full, "slates.jsonl")


def test_leverage_proxy():
    # √Σ(1 - π_t)² over the counted tokens; 0 for a row the loss leaves out
    lp = torch.log(torch.tensor([[0.5, 0.9, 0.2], [0.1, 0.1, 0.1]]))
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(leverage_proxy(lp, mask), [np.sqrt(0.25 + 0.01), 0.0])
