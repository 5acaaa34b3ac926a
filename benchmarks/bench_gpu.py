"""The GRPO engine's speed and memory on the available device, with projections (issue 10).

Runs on a GPU when one is visible, else on the CPU. In one process, on one model
(SmolLM2-135M-Instruct by default; ``--model`` takes any spec of
:func:`mcpg.grpo.models.load_base`; ``--tiny-random`` is the seconds-long CI mode):

(a) ops per decoding step (``torch.profiler``; a proxy for kernel launches on a GPU): the
    engine's mixed-adapter step (batched multi-LoRA, :mod:`mcpg.grpo.multilora`), the same
    step through peft's per-adapter split, and a plain ``generate`` step of the base model
    (the same model with its adapters disabled), on the same rows. Counted as the aten ops
    of a generate of ``1 + d`` tokens minus those of 1 token, divided by ``d``, so the
    prefill is left out. Every aten op is counted, nested ones included.
(b) rollout: the engine's ``generate`` (K agents mixed, shared prefill, per-row temperature)
    against one plain ``generate`` of the base model over the same rows, every row forced to
    exactly ``--tokens`` new tokens; ms per decoding step and generated tokens per second.
(c) differentiable scoring + backward of one micro-batch (``--micro`` rows of those
    completions), the update's inner step.
(d) one whole update of the trainer (:class:`mcpg.grpo.train.Engine`: rollout, rewards,
    routing, credit, clipped loss and optimizer step, router step) on a small batch.
(e) the shared-prefix pass against the unshared one on the grid's configuration
    (``data/configs/ch08-grid-stop.json`` with ``mask_truncated_completions``; the tiny
    random model in CI mode): the actor's forward + backward and the rollout, each arm
    interleaved with the others, as ``benchmarks/bench_prefix.py`` runs them (its
    :func:`compare`), on this device.
(f) our update against TRL's GRPOTrainer on the grid's K = 1 control setting
    (``data/configs/ch08-grid-stop-control.json`` with ``mask_truncated_completions``; the
    tiny random model at its small sizes in CI mode): ``Engine.update`` with the prompt shared
    and not, and one optimizer step of ``GRPOTrainer``, each arm in its own subprocess, the
    arms alternating, as ``benchmarks/bench_trl.py`` runs them (its :func:`compare`), on this
    device; skipped, and said so, when ``trl`` is not installed.

Peak memory per part: ``torch.cuda.max_memory_allocated`` on a GPU, the peak resident set
(``VmHWM``, reset between parts through ``/proc/self/clear_refs``) on a CPU; in (f) per arm,
each in its own process.

Projection. From (b) and (c) we take the per-token costs on this device, ``g`` = rollout
seconds per generated token (rows x tokens) and ``s`` = scoring + backward seconds per
scored token (rows x (prompt + completion) positions), and scale them by the ratio of
parameter counts ``P_config / P_measured`` (compute grows about linearly with parameters,
per token, at a fixed batch); one update of a config of ``n`` rows, ``L_new`` new tokens and
``L_prompt`` prompt tokens (the measured mean) is then
``(n L_new g + n (L_prompt + L_new) s) P_config / P_measured``, and a run is ``updates``
updates plus a greedy evaluation of ``eval_problems x (K + 1)`` rows of
``eval_max_new_tokens`` tokens at ``g``. This says what the config would take *on the
device measured*; it ignores that a GPU's decoding of small batches is bound by kernel
launches and memory bandwidth rather than arithmetic, so it is a rough guide, and a CPU
result does not project GPU time. For a GPU we add a second, labelled model-based estimate
(``gpu_estimate``): a decoding step costs ``max(ops x launch_s, weight bytes / bandwidth)``
(ops per step from (a), scaled by the config model's layer count), a training token costs
``6 P / (peak FLOP/s x utilisation)`` with the assumptions written into the JSON.

    python benchmarks/bench_gpu.py [--tiny-random | --model SPEC] [--rows 12] [--agents 3]
        [--tokens 32] [--micro 8] [--repeats 2] [--out benchmarks/results/NAME.json]

Wall times are minima over ``--repeats`` (other processes on a shared machine only add); the
rollout's ratio engine / plain is the median of the paired ratios of its interleaved repeats.
"""

from __future__ import annotations

import argparse
import contextlib
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
RESULTS = Path(__file__).resolve().parent / "results"

# Parameter counts and layer counts of the named configs' models (their model cards / configs).
CONFIG_MODELS = {
    "colab": {"model": "Qwen/Qwen2.5-0.5B-Instruct", "params": 494e6, "layers": 24, "bytes_per_param": 2},
    "paper": {"model": "meta-llama/Llama-3.2-3B-Instruct", "params": 3.21e9, "layers": 28,
              "bytes_per_param": 2},
}
# Assumptions of the model-based GPU estimate (H100-class), stated in the output.
GPU_ASSUMPTIONS = {"launch_s_per_op": 5e-6, "hbm_bytes_per_s": 3.0e12, "bf16_flops": 9.9e14,
                   "utilisation": 0.3}


# -- memory ------------------------------------------------------------------------------------
def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux)


def _peak_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(f, device, repeats: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        _sync(device)
        t = time.perf_counter()
        out = f()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best, out


# -- the set-up ---------------------------------------------------------------------------------
def _engine(model: str, agents: int, device: str, dtype: str):
    from mcpg.grpo.configs import DEFAULT_AGENTS, resolve_config
    from mcpg.grpo.train import Engine

    specs = [dict(a) for a in DEFAULT_AGENTS]
    while len(specs) < agents:
        specs.append({**DEFAULT_AGENTS[len(specs) % 3], "name": f"agent{len(specs)}"})
    base = "tiny-random" if model == "tiny-random" else "cpu-smoke"
    cfg = resolve_config(base, model=model, device=device, dtype=dtype, agents=specs[:agents], progress=False,
                         train_problems=8, eval_problems=2)
    eng = Engine(cfg, "wta")
    with torch.no_grad():  # trained-looking adapters (B != 0), so every adapter computes something
        g = torch.Generator().manual_seed(0)
        for n, p in eng.pool.model.named_parameters():
            if "lora_B" in n:
                p.copy_((torch.randn(p.shape, generator=g) * 0.01).to(p))
    return eng, cfg


def _rows(eng, n_rows: int):
    """``n_rows`` rows: the first training questions, every agent in turn (K agents mixed)."""
    qs = [eng.train_set[i]["question"] for i in range(len(eng.train_set))]
    prompts, adapters, temps = [], [], []
    per_q = max(1, n_rows // (eng.K * 2))  # a few completions per (question, agent): shared prefill applies
    i = 0
    while len(prompts) < n_rows:
        q = qs[(i // eng.K) % len(qs)]
        a = eng.agents[i % eng.K]
        for _ in range(per_q):
            if len(prompts) < n_rows:
                prompts.append(eng.pool.prompt(q, a))
                adapters.append(a.name)
                temps.append(a.temperature)
        i += 1
    return prompts, adapters, temps


@contextlib.contextmanager
def _peft_path(pool):
    """The pool with peft's per-adapter split instead of the batched multi-LoRA layer."""
    saved = pool.multilora
    pool.multilora = None
    try:
        yield
    finally:
        pool.multilora = saved


def _plain_generate(pool, prompts, tokens, device):
    """One plain ``generate`` of the base model (adapters disabled) over the rows, sampling
    at temperature 1, forced to ``tokens`` new tokens."""
    tok = pool.tokenizer
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    with pool.model.disable_adapter(), torch.no_grad():
        return pool.model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                   max_new_tokens=tokens, min_new_tokens=tokens,
                                   pad_token_id=tok.pad_token_id)


def _engine_generate(pool, prompts, adapters, temps, tokens):
    return pool.generate(prompts, adapters, temps, max_new_tokens=tokens, min_new_tokens=tokens)


def _count_ops(f) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        f()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


def ops_per_step(pool, prompts, adapters, temps, device, extra: int = 4) -> dict:
    """Aten ops of one decoding step: (ops of 1 + extra tokens - ops of 1 token) / extra."""
    def step_ops(fn):
        return (_count_ops(lambda: fn(1 + extra)) - _count_ops(lambda: fn(1))) / extra

    def engine(n):
        return _engine_generate(pool, prompts, adapters, temps, n)

    def plain(n):
        return _plain_generate(pool, prompts, n, device)

    out = {"engine_multilora": step_ops(engine), "plain_generate": step_ops(plain)}
    with _peft_path(pool):
        out["engine_peft_split"] = step_ops(engine)
    out["ratio_multilora"] = out["engine_multilora"] / out["plain_generate"]
    out["ratio_peft_split"] = out["engine_peft_split"] / out["plain_generate"]
    return out


def bench_rollout(pool, prompts, adapters, temps, tokens, device, repeats) -> dict:
    """(b): the two arms alternate ``repeats`` times (a busy spell of a shared machine hits
    both); per arm the minimum and median wall time, and the median of the paired per-repeat
    ratios engine / plain (the figure the CPU target of issue 10 speaks of)."""
    n = len(prompts)
    _engine_generate(pool, prompts[:2], adapters[:2], temps[:2], 2)  # warm-up
    _plain_generate(pool, prompts[:2], 2, device)
    res = {}
    arms = {"engine": lambda: _engine_generate(pool, prompts, adapters, temps, tokens),
            "plain_generate": lambda: _plain_generate(pool, prompts, tokens, device)}
    walls = {name: [] for name in arms}
    peaks = {name: 0 for name in arms}
    for _ in range(repeats):
        for name, f in arms.items():
            _reset_peak(device)
            walls[name].append(_timed(f, device, 1)[0])
            peaks[name] = max(peaks[name], _peak_bytes(device) or 0)
    for name in arms:
        wall = min(walls[name])
        res[name] = {"wall_s": wall, "median_wall_s": statistics.median(walls[name]), "walls_s": walls[name],
                     "ms_per_step": 1e3 * wall / tokens, "tokens_per_s": n * tokens / wall,
                     "peak_bytes": peaks[name]}
    paired = [e / p for e, p in zip(walls["engine"], walls["plain_generate"])]
    res["ratios"] = paired
    res["ratio"] = statistics.median(paired)
    return res


def bench_scoring(pool, roll, micro, device, repeats) -> dict:
    sub = roll.rows(range(min(micro, len(roll))))

    def step():
        pool.model.zero_grad(set_to_none=True)
        lp = pool.token_logprobs(sub)
        (lp * sub.completion_mask.to(lp.device)).sum().backward()

    step()  # warm-up
    _reset_peak(device)
    before = _peak_bytes(device)
    wall, _ = _timed(step, device, repeats)
    peak = _peak_bytes(device)
    positions = sub.prompt_ids.shape[1] + sub.completion_ids.shape[1]
    pool.model.zero_grad(set_to_none=True)
    return {"rows": len(sub), "positions": positions, "wall_s": wall,
            "scored_tokens_per_s": len(sub) * positions / wall, "peak_bytes": peak,
            "peak_above_start_bytes": None if before is None or peak is None else peak - before}


def bench_update(eng, tokens, device, repeats) -> dict:
    gen = eng.pool.generate

    def forced(*a, **k):  # every completion of the rollout exactly `tokens` long, as in (b)
        k["min_new_tokens"] = tokens
        return gen(*a, **k)

    eng.pool.generate = forced
    try:
        _reset_peak(device)
        wall, row = _timed(eng.update, device, repeats)
    finally:
        eng.pool.generate = gen
    rows = eng.cfg["prompts_per_update"] * eng.K * eng.cfg["completions_per_agent"]
    return {"rows": rows, "wall_s": wall, "peak_bytes": _peak_bytes(device), "seconds": row.get("seconds")}


def project(per_gen_token_s, per_scored_token_s, params, prompt_len, ops_step, layers, K=3) -> dict:
    """Wall time of the colab and paper configs (see the module docstring)."""
    from mcpg.grpo.configs import resolve_config

    out = {}
    for name, m in CONFIG_MODELS.items():
        cfg = resolve_config(name)
        n = cfg["prompts_per_update"] * len(cfg["agents"]) * cfg["completions_per_agent"]
        L = cfg.max_completion_length
        scale = m["params"] / params
        update = (n * L * per_gen_token_s + n * (prompt_len + L) * per_scored_token_s) * scale
        n_eval = cfg["eval_problems"] * (len(cfg["agents"]) + 1)
        evaluation = n_eval * cfg["eval_max_new_tokens"] * per_gen_token_s * scale
        # model-based GPU estimate (assumptions in GPU_ASSUMPTIONS)
        a = GPU_ASSUMPTIONS
        bs = cfg["generation_batch_size"] or n
        step = max(ops_step * m["layers"] / layers * a["launch_s_per_op"],
                   m["params"] * m["bytes_per_param"] / a["hbm_bytes_per_s"])
        gen_s = -(-n // bs) * L * step
        train_s = 3 * 2 * m["params"] * n * (prompt_len + L) / (a["bf16_flops"] * a["utilisation"])
        eval_s = -(-n_eval // bs) * cfg["eval_max_new_tokens"] * step
        out[name] = {
            "model": m["model"], "rows_per_update": n, "updates": cfg["updates"],
            "this_device": {"update_s": update, "eval_s": evaluation,
                            "run_h": (cfg["updates"] * update + evaluation) / 3600},
            "gpu_estimate": {"decode_step_s": step, "rollout_s": gen_s, "train_s": train_s,
                             "update_s": gen_s + train_s,
                             "run_h": (cfg["updates"] * (gen_s + train_s) + eval_s) / 3600},
        }
    return {"configs": out, "gpu_assumptions": GPU_ASSUMPTIONS,
            "how": "this_device: measured per-token costs x (P_config / P_measured); gpu_estimate: "
                   "decoding step = max(ops/step x layers ratio x launch time, weight bytes / bandwidth), "
                   "training = 6 P per token at the assumed FLOP/s and utilisation. "
                   "Projections, not measurements."}


def bench_prefix(model: str, device: torch.device, dtype: str, repeats: int) -> dict:
    """Part (e): ``bench_prefix.compare`` on its own engine of the grid's configuration, with
    ``model`` (the tiny random model: its own small configuration)."""
    import importlib.util

    from mcpg.grpo.configs import resolve_config
    from mcpg.grpo.train import Engine

    spec = importlib.util.spec_from_file_location("bench_prefix", Path(__file__).with_name("bench_prefix.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tiny = model == "tiny-random"
    config = "tiny-random" if tiny else str(mod.GRID)
    over = {"mask_truncated_completions": True, "progress": False, "eval_problems": 2,
            "model": model, "device": device.type, "dtype": dtype}
    if tiny:
        over.update(train_micro_batch=4, completions_per_agent=4)
    eng = Engine(resolve_config(config, **over), "wta")
    try:
        return {"config": config, "overrides": over, **mod.compare(eng, repeats)}
    finally:
        del eng
        if device.type == "cuda":
            torch.cuda.empty_cache()


def bench_trl(model: str, device: torch.device, dtype: str, repeats: int) -> dict:
    """Part (f): ``bench_trl.compare`` on the grid's K = 1 control setting with ``model`` (the
    tiny random model: ``bench_trl.TINY``'s sizes), on this device."""
    import importlib.util

    try:
        import trl  # noqa: F401
    except ImportError:
        return {"skipped": "trl is not installed"}
    spec = importlib.util.spec_from_file_location("bench_trl", Path(__file__).with_name("bench_trl.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    over = {**(mod.TINY if model == "tiny-random" else {}), "model": model, "device": device.type,
            "dtype": dtype,
            "threads": torch.get_num_threads() if device.type == "cpu" else 0}
    cfg = mod.setting(str(mod.CONTROL), **over)
    return {"config": str(mod.CONTROL.relative_to(mod.ROOT)), "overrides": over, "setting": mod._summary(cfg),
            **mod.compare(cfg, repeats)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tiny-random", action="store_true", help="CI mode: the tiny random model, small sizes")
    ap.add_argument("--rows", type=int, default=12)
    ap.add_argument("--agents", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--micro", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 | float16 (default: float32 on a CPU, "
                                                  "bfloat16 on a GPU)")
    ap.add_argument("--parts", default="abcdef", help="which parts to run, e.g. 'ab'")
    ap.add_argument("--out", default=None, help="JSON path (default: results/<device>-<model>.json)")
    args = ap.parse_args(argv)
    if args.tiny_random:
        args.model = "tiny-random"
        args.tokens = min(args.tokens, 8)
        args.repeats = 1
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = args.dtype or ("bfloat16" if device.type == "cuda" else "float32")
    eng, cfg = _engine(args.model, args.agents, device.type, dtype)
    pool = eng.pool
    params = sum(p.numel() for n, p in pool.model.named_parameters() if ".lora_" not in n)
    layers = pool.model.get_base_model().config.num_hidden_layers
    prompts, adapters, temps = _rows(eng, args.rows)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    result = {
        "device": name, "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
        "python": sys.version.split()[0], "torch": torch.__version__, "model": args.model,
        "model_source": eng.model_source, "dtype": dtype, "params": params, "layers": layers,
        "agents": args.agents,
        "rows": args.rows, "tokens": args.tokens, "micro": args.micro, "repeats": args.repeats,
        "note": "wall times are minima over repeats (on a shared machine other processes only add time); "
                "rollout.ratio is the median of the per-repeat ratios engine / plain (arms interleaved)",
    }
    torch.manual_seed(0)
    if "a" in args.parts:
        result["ops_per_step"] = ops_per_step(pool, prompts, adapters, temps, device)
    roll = None
    if "b" in args.parts:
        result["rollout"] = bench_rollout(pool, prompts, adapters, temps, args.tokens, device, args.repeats)
    if "c" in args.parts:
        roll = _engine_generate(pool, prompts, adapters, temps, args.tokens)
        result["scoring_backward"] = bench_scoring(pool, roll, args.micro, device, args.repeats)
    if "d" in args.parts:
        result["update"] = bench_update(eng, args.tokens, device, args.repeats)
        result["update"]["prompts_per_update"] = cfg["prompts_per_update"]
        result["update"]["completions_per_agent"] = cfg["completions_per_agent"]
    if "e" in args.parts:
        result["prefix"] = bench_prefix(args.model, device, dtype, max(args.repeats, 2))
    if "f" in args.parts:
        result["trl"] = bench_trl(args.model, device, dtype, args.repeats)
    if "b" in args.parts and "c" in args.parts:
        g = result["rollout"]["engine"]["wall_s"] / (args.rows * args.tokens)
        s = result["scoring_backward"]["wall_s"] / (result["scoring_backward"]["rows"]
                                                   * result["scoring_backward"]["positions"])
        prompt_len = float(roll.prompt_mask.sum(1).float().mean())
        ops = result.get("ops_per_step", {}).get("engine_multilora", 0.0)
        result["per_token"] = {"rollout_s_per_generated_token": g, "scoring_backward_s_per_token": s,
                               "mean_prompt_tokens": prompt_len}
        result["projection"] = project(g, s, params, prompt_len, ops, layers)
    stem = f"{name.replace(' ', '-').lower()}-{args.model.replace('/', '-')}"
    out = Path(args.out) if args.out else RESULTS / f"{stem}.json"
    from mcpg.grpo._runtime import write_json
    write_json(out, result)
    print(json.dumps(result, indent=2))
    print(f"written to {out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
