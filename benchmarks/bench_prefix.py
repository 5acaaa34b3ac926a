"""The shared-prefix pass against the unshared one on the grid's configuration (issue 46).

One process, one engine (``data/configs/ch08-grid-stop.json`` with
``mask_truncated_completions``, SmolLM2-135M; ``--config`` and ``--set key=value`` change
it), one rollout of the configuration's size (``prompts_per_update`` problems x K agents x m
completions, with their own lengths and cuts). Then, the arms interleaved ``--repeats`` times:

- **actor**: the actor's forward and backward passes over the engine's own micro-batches of
  that same rollout (consecutive rows, ``train_micro_batch`` each, every row scored; a
  token-level loss with random advantages, no optimizer step, so every arm sees the same
  weights):

  - ``unshared``: every row runs its own prompt (config key ``shared_prefix`` false);
  - ``shared``: each (agent, prompt) prompt runs once per micro-batch, its KV cache expanded
    to the rows (``shared_prefix`` true, the default, and what every recording ran).

- **rollout**: ``AgentPool.generate`` of the same prompts, the same seed, with the prefill
  shared (one per (agent, prompt), its cache copied to the m rows) and without.

Reported: each arm's wall times and median, the median of the per-repeat ratios against
``unshared``, the update's ratio (rollout + actor) shared / unshared from the medians, the
positions the shared arm pushes through the decoder against the real (unpadded) tokens, and
each arm's peak memory (``torch.cuda.max_memory_allocated`` on a GPU; on a CPU the peak
resident set, reset before each arm through ``/proc/self/clear_refs``, so the model's own
memory is in it). Only ratios of arms run side by side in one process mean anything on a
shared machine; never compare absolute times across runs.

    python benchmarks/bench_prefix.py [--config PATH] [--set key=value ...] [--repeats 3]
        [--threads 1] [--out benchmarks/results/NAME.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore", category=FutureWarning)
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
GRID = ROOT / "data" / "configs" / "ch08-grid-stop.json"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _memory_helpers():
    """bench_gpu.py's peak-memory reset and reading (CUDA's allocator, or VmHWM on Linux)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gpu", Path(__file__).with_name("bench_gpu.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod._reset_peak, mod._peak_bytes


_reset_peak, _peak_bytes = _memory_helpers()


def _parse_sets(sets: list[str]) -> dict:
    out = {}
    for s in sets:
        key, _, value = s.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _consecutive(n: int, size: int) -> list[list[int]]:
    size = size or n
    return [list(range(i, min(i + size, n))) for i in range(0, n, size)]


def compare(eng, repeats: int) -> dict:
    """The interleaved arms on one engine (see the module docstring); returns the results."""
    cfg, pool, m = eng.cfg, eng.pool, eng.cfg["completions_per_agent"]
    device = pool.device
    questions = [p["question"] for p in eng.train_set[: cfg["prompts_per_update"]]]
    prompts, adapters, temps, _ = eng.prompt_rows(questions, m)

    def rollout(shared: bool):
        pool.share_prefill = shared
        torch.manual_seed(1)
        return pool.generate(prompts, adapters, temps, cfg.max_completion_length,
                             batch_size=cfg["generation_batch_size"] or None,
                             stop_at_answer=cfg["stop_at_answer"])

    roll = rollout(True)
    trained = roll.completion_mask.clone()
    if cfg["mask_truncated_completions"]:
        trained = trained * (~roll.truncated.bool())[:, None].to(trained.dtype)
    adv = torch.randn(len(roll), generator=torch.Generator().manual_seed(0))
    chunks = _consecutive(len(roll), cfg["train_micro_batch"])  # the engine's micro-batches

    def actor(shared: bool):
        pool.share_prefill = shared
        pool.model.zero_grad(set_to_none=False)
        denom = trained.sum().clamp(min=1)
        for c in chunks:
            lp = pool.token_logprobs(roll.rows(c))
            w = (trained[c] * adv[c][:, None]).to(lp)
            (-(lp * w).sum() / denom).backward()

    arms = {
        "actor/unshared": lambda: actor(False),
        "actor/shared": lambda: actor(True),
        "rollout/unshared": lambda: rollout(False),
        "rollout/shared": lambda: rollout(True),
    }
    arms["actor/shared"]()  # warm-up
    times = {k: [] for k in arms}
    peaks = {k: 0 for k in arms}
    for _ in range(repeats):
        for k, f in arms.items():
            _reset_peak(device)
            _sync(device)
            t = time.perf_counter()
            f()
            _sync(device)
            times[k].append(time.perf_counter() - t)
            peaks[k] = max(peaks[k], _peak_bytes(device) or 0)
            print(f"  {k}: {times[k][-1]:.2f} s", file=sys.stderr, flush=True)
    pool.share_prefill = cfg["shared_prefix"]
    pool.model.zero_grad(set_to_none=True)
    med = {k: statistics.median(v) for k, v in times.items()}

    def paired(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(times[a], times[b]))

    # positions the shared arm pushes through the decoder (each micro-batch's distinct prompts at
    # the rollout's prompt width, its rows at the completion width) against the real tokens there,
    # and the unshared arm's (every row's prompt)
    P, T = roll.prompt_ids.shape[1], roll.completion_ids.shape[1]
    key = [(tuple(roll.prompt_ids[r].tolist()), roll.adapters[r]) for r in range(len(roll))]
    first = [sorted({key[r]: r for r in reversed(c)}.values()) for c in chunks]  # a row per prompt run
    positions = {
        "prompt_run": P * sum(len(f) for f in first),
        "prompt_real": int(sum(roll.prompt_mask[f].sum() for f in first)),
        "prompt_run_unshared": P * len(roll),
        "completion_run": T * len(roll),
        "completion_real": int(roll.completion_mask.sum()),
    }
    return {
        "rows": len(roll),
        "prompt_tokens_mean": float(roll.prompt_mask.sum(1).float().mean()),
        "prompt_width": int(roll.prompt_ids.shape[1]),
        "completion_tokens_mean": float(roll.completion_mask.sum(1).float().mean()),
        "completion_width": int(roll.completion_ids.shape[1]),
        "truncated": float(roll.truncated.float().mean()),
        "micro_batches": len(chunks),
        "prompt_runs_shared": sum(len(f) for f in first),
        "positions_shared": positions,
        "seconds": times,
        "median_s": med,
        "peak_bytes": peaks,
        "ratio_to_unshared": {
            "actor/shared": paired("actor/shared", "actor/unshared"),
            "rollout/shared": paired("rollout/shared", "rollout/unshared"),
            "update": (med["rollout/shared"] + med["actor/shared"])
            / (med["rollout/unshared"] + med["actor/unshared"]),
        },
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(GRID))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config key (JSON value), after mask_truncated_completions=true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from mcpg.grpo.configs import resolve_config
    from mcpg.grpo.train import Engine

    overrides = {"mask_truncated_completions": True, "progress": False, "eval_problems": 2,
                 **_parse_sets(args.set)}
    if args.threads:
        overrides.setdefault("threads", args.threads)
    from mcpg.grpo._runtime import write_json
    from mcpg.grpo.provenance import commit_state, machine_info, now

    cfg = resolve_config(args.config, **overrides)
    started, t0, machine = now(), time.perf_counter(), machine_info()
    eng = Engine(cfg, "wta")
    result = {
        "command": " ".join(["python benchmarks/bench_prefix.py", *(sys.argv[1:] if argv is None else argv)]),
        **commit_state(ROOT), "date": started, "machine": machine,
        "config": args.config, "overrides": overrides, "model_source": eng.model_source,
        "device": torch.cuda.get_device_name() if eng.pool.device.type == "cuda" else "cpu",
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "platform": platform.platform(), "repeats": args.repeats,
        **compare(eng, args.repeats),
    }
    result["wall_s"] = time.perf_counter() - t0
    if args.out:
        write_json(Path(args.out), result)
        print(f"written to {args.out}", file=sys.stderr)
    keys = ("median_s", "ratio_to_unshared", "positions_shared", "peak_bytes")
    print(json.dumps({k: result[k] for k in keys}, indent=2))
    return result


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
