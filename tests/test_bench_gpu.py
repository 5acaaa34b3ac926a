"""benchmarks/bench_gpu.py in its CI mode (tiny random model): it runs every part and writes
a JSON whose numbers hang together."""

import importlib.util
import json
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_bench_gpu_tiny_random(tmp_path, monkeypatch):
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
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
    # the paper's model is bigger than colab's: a larger projected update, on this device
    cfgs = res["projection"]["configs"]
    assert cfgs["paper"]["this_device"]["update_s"] > cfgs["colab"]["this_device"]["update_s"]

