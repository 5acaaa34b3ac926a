"""benchmarks/bench_gpu.py in its CI mode (tiny random model): it runs every part and writes
a JSON whose numbers hang together."""

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

from repo_scripts import load_script  # tests/repo_scripts.py

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_bench_gpu_tiny_random(tmp_path, monkeypatch):
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))
    bench = load_script("benchmarks/bench_gpu.py")
    out = tmp_path / "r.json"
    res = bench.main(["--tiny-random", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    ops = res["ops_per_step"]
    # the batched multi-LoRA step is near a plain step; peft's split is far above both
    assert ops["plain_generate"] > 0 and ops["ratio_multilora"] <= 1.5 < ops["ratio_peft_split"]
    r = res["rollout"]
    assert len(r["ratios"]) == res["repeats"] and r["ratio"] == statistics.median(r["ratios"])
    for arm in ("engine", "plain_generate"):
        assert r[arm]["wall_s"] > 0 and r[arm]["peak_bytes"] > 0
        assert r[arm]["tokens_per_s"] == pytest.approx(res["rows"] * res["tokens"] / r[arm]["wall_s"])
    assert res["scoring_backward"]["rows"] == res["micro"] and res["update"]["wall_s"] > 0
    for name in ("colab", "paper"):
        p = res["projection"]["configs"][name]
        assert p["this_device"]["run_h"] > 0 and p["gpu_estimate"]["run_h"] > 0
    # (e) the shared-prefix comparison: every arm timed at every repeat, ratios from those times
    pre = res["prefix"]
    assert all(len(v) == len(pre["seconds"]["actor/unshared"]) >= 2 for v in pre["seconds"].values())
    assert pre["ratio_to_unshared"]["update"] == pytest.approx(
        (pre["median_s"]["rollout/shared"] + pre["median_s"]["actor/shared"])
        / (pre["median_s"]["rollout/unshared"] + pre["median_s"]["actor/unshared"]))
    # m = 4 completions per (agent, prompt), micro-batches of 4 rows: each micro-batch is one group,
    # so the shared arm runs one prompt per micro-batch, a quarter of the unshared arm's
    assert pre["prompt_runs_shared"] == pre["micro_batches"] == pre["rows"] // 4
    pos = pre["positions_shared"]
    assert pos["prompt_real"] <= pos["prompt_run"] == pos["prompt_run_unshared"] // 4
    assert pos["completion_real"] <= pos["completion_run"]
    # (f) against TRL's GRPOTrainer: every arm timed, on the same problems and prompts
    trl = res["trl"]
    if "skipped" in trl:
        assert importlib.util.find_spec("trl") is None
    else:
        assert set(trl["arms"]) == {"ours/shared", "ours/unshared", "trl"}
        assert trl["same_work"] == {"questions": True, "prompt_tokens": True, "rows": True}
        for a in trl["arms"].values():
            assert a["peak_bytes"] > 0 and len(a["seconds"]["step"]) == res["repeats"]
        assert trl["ratio_to_trl"]["ours/shared"]["step"] > 0
    # the paper's model is bigger than colab's: a larger projected update, on this device
    cfgs = res["projection"]["configs"]
    assert cfgs["paper"]["this_device"]["update_s"] > cfgs["colab"]["this_device"]["update_s"]


def test_bench_memory_tiny_random(monkeypatch):
    """benchmarks/bench_memory.py on the tiny random model: every phase of a run gets a peak,
    and none exceeds the process's VmHWM (what /usr/bin/time -v reports)."""
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))
    bench = load_script("benchmarks/bench_memory.py")
    res = bench.main(["--config", "tiny-random", "--set", "max_completion_length=8",
                      "--set", "eval_max_new_tokens=4", "--set", "train_micro_batch=4"])
    peaks = res["phases_peak_rss_bytes"]
    for phase in ("load", "evaluate/generate", "update/generate", "update/score", "update/backward"):
        assert peaks.get(phase, 0) > 0, phase
    # VmHWM is the kernel's high-water mark of the RSS, updated lazily (per-thread counters are
    # folded in from time to time), so a sample may pass it by a few pages
    assert max(peaks.values()) <= 1.01 * res["vm_hwm_bytes"]
    import torch

    assert torch.Tensor.backward.__name__ == "backward" and not hasattr(torch.Tensor.backward, "__wrapped__")


def test_bench_prefix_main_tiny_random(tmp_path, monkeypatch):
    """benchmarks/bench_prefix.py end to end on the tiny random model: the JSON it writes is the
    result it returns, with the commit and the machine, and every arm timed at every repeat."""
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))
    bench = load_script("benchmarks/bench_prefix.py")
    out = tmp_path / "sub" / "prefix.json"  # a folder that does not exist yet
    res = bench.main(["--config", "tiny-random", "--set", "max_completion_length=8", "--set",
                      "train_micro_batch=4", "--repeats", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert res["commit"] and res["repeats"] == 2 and res["wall_s"] > 0
    assert all(len(v) == 2 for v in res["seconds"].values())
    assert res["prompt_runs_shared"] <= res["rows"]
