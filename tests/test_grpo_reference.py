"""Nothing numerical changes: the engine reproduces runs recorded before its refactor, bit for bit.

tests/fixtures/reference/ holds runs recorded at commit a1a7339 (before issue 47's refactor of
the engine) by tests/reference_runs.py: chapter 8's masked-grid configuration (removal and
oracle credit), chapter 9's budgeted removal with two optimizer steps per rollout and
micro-batches, and winner-take-all with the sequence-normalised loss, each on the tiny random
model for two updates on one torch thread. This test trains them again with this checkout's
code and compares every metric, slate, evaluation, the config and the SHA-256 of every final
weight tensor; only ``seconds`` (wall time) is left out.

The grid's own model, SmolLM2-135M, for one update: ``MCPG_SMOLLM2_REFERENCE=DIR`` compares
with a run recorded (``python tests/reference_runs.py DIR --smollm2``) at the old commit
(minutes; not in the fixture, whose model weights are not in the repository).

Bit for bit holds on the CPU the fixture was recorded on (``machine.json``): another CPU's
kernels round differently (measured on an Intel Xeon against the fixture's AMD EPYC: every
token, reward, count and key identical, floats within 1e-5 relative). There the test asks every
value that is not a float to be identical and every float to agree within ``CROSS_CPU_RTOL``,
and leaves out the weight digests, which cannot be compared to a tolerance.
"""

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import reference_runs as ref  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "reference"
CROSS_CPU_RTOL = 1e-4
"""Relative tolerance of a float on a CPU other than the fixture's (measured worst: 1e-5)."""


def _same_cpu() -> bool:
    from mcpg.grpo.provenance import machine_info

    return machine_info()["cpu"] == json.loads((FIXTURE / "machine.json").read_text())["cpu"]


def _close(a, b, rtol: float) -> bool:
    """Equal, floats within ``rtol`` relative (of at least 1), recursively."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= rtol * max(1.0, abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rtol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rtol) for x, y in zip(a, b))
    return a == b


@pytest.fixture
def hashed_rewards(monkeypatch):
    """Every engine module that scores completions with gsm8k.reward scores by a hash instead."""
    import mcpg.grpo.train  # noqa: F401 (loads the engine's modules)
    from mcpg.grpo import gsm8k

    real = gsm8k.reward
    for name, mod in list(sys.modules.items()):
        if name.startswith("mcpg.") and getattr(mod, "reward", None) is real:
            monkeypatch.setattr(mod, "reward", ref.hashed_reward)


def _differences(got: dict, want: dict, rtol: float = 0.0) -> list[str]:
    """What differs between two read cases; ``rtol`` > 0 compares floats to a tolerance and
    leaves out the weight digests."""
    out = []
    for f in want:
        if rtol and f == "weights.json":
            if set(got[f]) != set(want[f]):
                out.append(f"{f}: the tensors differ")
            continue
        if not _close(got[f], want[f], rtol):
            if isinstance(want[f], list) and isinstance(got[f], list):
                rows = [i for i, (a, b) in enumerate(zip(got[f], want[f])) if not _close(a, b, rtol)]
                keys = sorted({k for i in rows for k in set(got[f][i]) | set(want[f][i])
                               if not _close(got[f][i].get(k), want[f][i].get(k), rtol)})
                out.append(f"{f}: rows {rows} differ in {keys} (lengths {len(got[f])}, {len(want[f])})")
            elif isinstance(want[f], dict) and isinstance(got[f], dict):
                keys = sorted(k for k in set(got[f]) | set(want[f])
                              if not _close(got[f].get(k), want[f].get(k), rtol))
                out.append(f"{f}: keys {keys} differ")
            else:
                out.append(f"{f}: {type(got[f]).__name__} against {type(want[f]).__name__}")
    return out


@pytest.mark.usefixtures("one_torch_thread", "hashed_rewards")
@pytest.mark.parametrize("case", sorted(ref.CASES))
def test_engine_reproduces_the_recorded_run_bit_for_bit(tmp_path, monkeypatch, case):
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(Path(__file__).parent / "fixtures" / "gsm8k"))
    want = ref.read_case(FIXTURE / case)
    assert want["metrics.jsonl"] and want["weights.json"]  # the fixture is there
    got = ref.read_case(ref.run_case(case, tmp_path))
    assert _differences(got, want, 0.0 if _same_cpu() else CROSS_CPU_RTOL) == []


def test_the_comparison_sees_a_changed_value():
    """One changed digit in one slate, or in one weight digest, is reported."""
    want = ref.read_case(FIXTURE / "grid-mask-removal")
    got = ref.read_case(FIXTURE / "grid-mask-removal")
    got["slates.jsonl"][1]["p"][3][0] += 1e-12
    got["weights.json"]["router.safetensors:net.0.weight"] = "0"
    diff = _differences(got, want)
    assert diff == ["slates.jsonl: rows [1] differ in ['p'] (lengths 2, 2)",
                    "weights.json: keys ['router.safetensors:net.0.weight'] differ"]


def test_the_cross_cpu_comparison_sees_a_moved_float_and_a_changed_count():
    """Across CPUs: a float moved beyond the tolerance, or an integer count changed by one, is
    reported; a float moved within the tolerance is not."""
    want = ref.read_case(FIXTURE / "grid-mask-removal")
    got = ref.read_case(FIXTURE / "grid-mask-removal")
    got["slates.jsonl"][1]["p"][3][0] += 1e-7
    assert _differences(got, want, CROSS_CPU_RTOL) == []
    got["slates.jsonl"][1]["p"][3][0] += 1e-2
    assert _differences(got, want, CROSS_CPU_RTOL) == [
        "slates.jsonl: rows [1] differ in ['p'] (lengths 2, 2)"]
    got = ref.read_case(FIXTURE / "grid-mask-removal")
    row = got["metrics.jsonl"][0]
    key = next(k for k, v in row.items() if isinstance(v, int) and not isinstance(v, bool))
    row[key] += 1
    assert _differences(got, want, CROSS_CPU_RTOL) == [
        f"metrics.jsonl: rows [0] differ in ['{key}'] (lengths 2, 2)"]


@pytest.mark.skipif(not os.environ.get("MCPG_SMOLLM2_REFERENCE"), reason="SmolLM2 reference run not given")
@pytest.mark.usefixtures("one_torch_thread")
def test_smollm2_one_update_bit_for_bit(tmp_path):
    recorded = Path(os.environ["MCPG_SMOLLM2_REFERENCE"])
    for case in ref.SMOL_CASES:
        want = ref.read_case(recorded / case)
        got = ref.read_case(ref.run_case(case, tmp_path))
        assert _differences(got, want) == []
