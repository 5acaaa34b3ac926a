"""scripts/gpu_session.py end to end on the CPU with the tiny random model, and its carry
helpers (the GGUF split into two halves and joined again)."""

import json
import os
from pathlib import Path

import pytest

from repo_scripts import load_script  # tests/repo_scripts.py

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _environment_restored(monkeypatch):
    """The session sets MCPG_GSM8K_DIR and PYTHONPATH for its child processes, as it must on
    the device; here monkeypatch puts them back afterwards, so later tests see the real data."""
    for key in ("MCPG_GSM8K_DIR", "PYTHONPATH", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM"):
        if key in os.environ:  # recorded, and restored at teardown whatever the session sets
            monkeypatch.setenv(key, os.environ[key])
        else:
            monkeypatch.delenv(key, raising=False)


def _module():
    return load_script("scripts/gpu_session.py")


def test_halves_join_to_the_file(tmp_path):
    gs = _module()
    src = tmp_path / "model.gguf"
    src.write_bytes(bytes(range(256)) * 41 + b"odd")  # an odd size: the halves differ by one byte
    info = gs.split_file(src, tmp_path / "carry")
    p1, p2 = tmp_path / "carry" / "part1", tmp_path / "carry" / "part2"
    assert p1.stat().st_size + p2.stat().st_size == src.stat().st_size == info["bytes"]
    assert abs(p1.stat().st_size - p2.stat().st_size) <= 1
    out = gs.join_parts(p1, p2, tmp_path / "pkg" / "model.gguf", info["sha256"])
    assert out.read_bytes() == src.read_bytes()
    p2.write_bytes(b"x" + p2.read_bytes()[1:])  # a damaged half is refused
    with pytest.raises(ValueError, match="SHA-256"):
        gs.join_parts(p1, p2, tmp_path / "pkg2" / "model.gguf", info["sha256"])
    assert not (tmp_path / "pkg2" / "model.gguf").exists()


def test_gpu_session_tiny_random_end_to_end(tmp_path, capsys):
    gs = _module()
    out, runs = tmp_path / "out", tmp_path / "runs"
    limit = 300.0
    rec = gs.main(
        [
            "run",
            "--tiny-random",
            "--out",
            str(out),
            "--limit",
            str(limit),
            "--margin",
            "5",
            "--data-dir",
            str(FIXTURE),
            "--processes",
            "1,2",
            "--updates",
            "2",
            "--runs",
            str(runs),
            "--raise-errors",
        ]
    )
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("gpu-session: ")
    assert json.loads((out / "session.json").read_text()) == json.loads(json.dumps(rec))
    phases = rec["phases"]
    assert "error" not in phases and rec["elapsed_s"] < limit
    # the benchmark, in order, each written as it appeared
    bench = json.loads((out / "bench" / "rollout.json").read_text())
    assert bench["rollout"]["ratio"] == pytest.approx(phases["rollout"]["ratio"])
    upd = json.loads((out / "bench" / "update_paper_shape.json").read_text())
    assert upd["rows"] == upd["prompts_per_update"] * upd["K"] * upd["m"] and upd["seconds"]["total"] > 0
    procs = json.loads((out / "bench" / "processes.json").read_text())["counts"]
    for n in ("1", "2"):
        assert len(procs[n]["walls_s"]) == int(n)
        assert procs[n]["aggregate_tokens_per_s"] == pytest.approx(int(n) * 6 * 4 / max(procs[n]["walls_s"]))
    assert phases["rollout"]["at_s"] <= phases["update_paper_shape"]["at_s"] <= phases["processes"]["at_s"]
    # the two GRPO runs: capped at 2 updates, checkpointed, evaluated, resumable with train()
    from mcpg.grpo.train import train

    for signal in ("removal", "wta"):
        rows = [json.loads(x) for x in (out / "gsm8k" / signal / "metrics.jsonl").read_text().splitlines()]
        assert [r["update"] for r in rows] == [1, 2] and all(r["signal"] == signal for r in rows)
        assert phases[f"grpo_{signal}"]["updates"] == 2
        ev = json.loads((out / "gsm8k" / signal / "eval.json").read_text())
        assert ev["updates"] == 2 and ev["n"] == 4
        state = json.loads((runs / signal / "checkpoint" / "state.json").read_text())
        assert state["step"] == 2 and state["signal"] == signal
    resumed = train(None, "wta", runs / "wta", updates=3, resume=True)  # its own config.json
    assert resumed["updates"] == 3
    assert json.loads((runs / "wta" / "metrics.jsonl").read_text().splitlines()[-1])["update"] == 3
    assert json.loads(line[len("gpu-session: ") :].rsplit(" in ", 1)[0])["wta"]["updates"] == 2


def test_gpu_session_stops_before_a_short_limit(tmp_path, capsys):
    gs = _module()
    rec = gs.main(
        [
            "run",
            "--tiny-random",
            "--out",
            str(tmp_path),
            "--limit",
            "3",
            "--margin",
            "1",
            "--data-dir",
            str(FIXTURE),
            "--runs",
            str(tmp_path / "runs"),
        ]
    )
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("gpu-session: {}")
    skipped = [k for k, v in rec["phases"].items() if "skipped" in v]
    assert skipped == ["rollout", "update_paper_shape", "processes", "grpo_removal", "grpo_wta"]
    assert rec["elapsed_s"] < 3
