"""Our update against TRL's GRPOTrainer on the grid's K = 1 control setting (issue 46).

The setting is the grid's control arm as chapter 8 records it (``scripts/ch08_record.py
grid-mask``): ``data/configs/ch08-grid-stop-control.json`` with
``mask_truncated_completions``, signal ``wta`` (one agent: plain GRPO). That is SmolLM2-135M,
the arithmetic task's GSM8K-format problems, ``prompts_per_update`` problems x m completions
per step, ``max_completion_length``, the agent's temperature, LoRA rank/alpha/targets, learning rate,
``loss_type``, ``scale_rewards``, ``train_micro_batch``, gradient checkpointing, the answer line
as a stop (``stop_at_answer``) and no gradient from a cut completion. ``--config`` and
``--set key=value`` change it. Three arms:

- ``ours/shared`` and ``ours/unshared``: :meth:`mcpg.grpo.train.Engine.update` (rollout,
  reward, credit, actor step, router step) with config key ``shared_prefix`` true and false;
- ``trl``: one optimizer step of TRL's ``GRPOTrainer`` on the same base model with the same
  LoRA (peft), the same chat prompts, the same reward (:func:`mcpg.grpo.gsm8k.reward`) and
  keys: ``num_generations`` = m, ``per_device_train_batch_size`` = the micro-batch,
  ``gradient_accumulation_steps`` = rows / micro-batch (one generation per optimizer step, no
  old log-probabilities, as ours with one iteration), ``beta`` 0 (no reference model),
  ``top_k`` 0, a constant learning rate, ``adamw_torch``, and the dataset in the order of the
  engine's own draws (``shuffle_dataset`` false), so that both sides train on the same
  problems at every step. TRL has no answer-line stop: its ``generate`` gets the engine's
  stopping criterion (``mcpg.grpo.agents._AnswerLine``) and a stopped completion gets an EOS
  after its answer line, else TRL would read it as cut (it does not end in EOS) and mask it.
  So TRL trains one token more than ours on each stopped completion (its EOS); the token
  counts below show it.

Each arm runs in its own subprocess (its peak memory is its own): load, build, one warm-up
step, then ``--steps`` timed steps; the arms alternate ``--repeats`` rounds (shared,
unshared, trl, shared, ...), so a busy spell of the machine hits every arm. Every subprocess
starts from the same seed, so each round repeats the same work. Per step:

- ``step``: the step's wall time (ours: ``Engine.update``; TRL: from its ``on_step_begin`` to
  its ``on_step_end`` callback: generation, reward, advantages, the micro-batches' forward and
  backward passes, gradient clipping, the optimizer step);
- ``rollout``: ours the update's own ``seconds.rollout`` (drawing the problems and
  ``AgentPool.generate``); TRL the time in ``_generate_and_score_completions`` (tokenising,
  ``generate``, reward, advantages); ``generate`` is the model's ``generate`` alone on both
  sides;
- ``actor``: ``step - rollout`` (ours: reward, credit, the actor's micro-batches and step, the
  router's step; TRL: its micro-batches' forward, loss and backward, clipping and step);
- the work: real prompt tokens, completion tokens generated (up to and with EOS, or up to the
  answer line), completion tokens trained (those of uncut completions), decoding steps (the
  batch's completion width), cut and stopped completions, and the problems.

Peak memory per arm (``peak_bytes``): ``torch.cuda.max_memory_allocated`` on a GPU; on a CPU
the peak resident set (``VmHWM``), reset when the arm is built (``/proc/self/clear_refs``), so
it holds the model, the optimizer and the steps' activations but not the loading's transient
peak; ``rss_after_setup_bytes`` is the resident set at that reset. Only ratios of arms run
side by side mean anything on a shared machine; never compare absolute times across runs.

    python benchmarks/bench_trl.py [--config PATH] [--set key=value ...] [--repeats 3]
        [--steps 1] [--threads 1] [--out benchmarks/results/NAME.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

import torch

warnings.filterwarnings("ignore", category=FutureWarning)
ROOT = Path(__file__).resolve().parents[1]
CONTROL = ROOT / "data" / "configs" / "ch08-grid-stop-control.json"
ARMS = ("ours/shared", "ours/unshared", "trl")
PHASES = ("step", "rollout", "actor", "generate")
TINY = {"model": "tiny-random", "prompts_per_update": 2, "max_completion_length": 8, "train_micro_batch": 4,
        "lora_r": 4, "lora_alpha": 8}
"""The CI mode's overrides: the tiny random model, 2 problems x 4 completions, 8 tokens."""


def _sibling(name: str):
    """The benchmark script ``name``.py beside this one, as a module."""
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_gpu = _sibling("bench_gpu")
_reset_peak, _peak_bytes, _sync = _gpu._reset_peak, _gpu._peak_bytes, _gpu._sync
_parse_sets = _sibling("bench_prefix")._parse_sets


def setting(config: str = str(CONTROL), **overrides):
    """The resolved config: ``config`` with ``mask_truncated_completions`` (the grid's control
    arm), then ``overrides``; one agent, rows a multiple of the micro-batch (TRL's accumulation)."""
    from mcpg.grpo.configs import resolve_config

    over = {"mask_truncated_completions": True, "progress": False, "eval_problems": 2, "eval_initial": False,
            **overrides}
    cfg = resolve_config(config, **over)
    rows = cfg["prompts_per_update"] * cfg["completions_per_agent"]
    if len(cfg["agents"]) != 1:
        raise ValueError(f"the K = 1 setting has one agent, config {config!r} has {len(cfg['agents'])}")
    if rows % (cfg["train_micro_batch"] or rows):
        raise ValueError(f"{rows} rows per step are not a whole number of micro-batches of "
                         f"{cfg['train_micro_batch']} (TRL's gradient accumulation)")
    return cfg


def _device(cfg) -> torch.device:
    dev = cfg["device"]
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if dev == "auto" else dev)


def draws(cfg, n: int) -> list[list[dict]]:
    """The problems of the engine's first ``n`` updates: ``Engine._draw_problems`` with the
    engine's data generator, without building the engine (no model)."""
    import numpy as np

    from mcpg.grpo.train import Engine, _load_split

    stand_in = types.SimpleNamespace(cfg=cfg, train_set=_load_split(cfg, "train"),
                                     data_rng=np.random.default_rng([cfg["seed"], 1]),
                                     dist=types.SimpleNamespace(rank=0, world=1))
    return [Engine._draw_problems(stand_in) for _ in range(n)]


def _work(prompt_tokens, completion_tokens, trained_tokens, rows, width, truncated, stopped) -> dict:
    return {"rows": int(rows), "prompt_tokens": int(prompt_tokens),
            "completion_tokens": int(completion_tokens),
            "trained_tokens": int(trained_tokens), "decode_steps": int(width), "truncated": int(truncated),
            "stopped": int(stopped)}


# -- the arms (each in its own subprocess) -----------------------------------------------------
def run_ours(cfg, shared: bool, steps: int) -> dict:
    """``Engine.update`` with ``shared_prefix`` = ``shared``: one warm-up step, then ``steps``."""
    from mcpg.grpo.train import Engine

    t = time.perf_counter()
    eng = Engine(cfg.replace(shared_prefix=shared), "wta")
    setup_s = time.perf_counter() - t
    device, eos = eng.pool.device, eng.pool.tokenizer.eos_token_id
    rolls, drawn, gen_s = [], [], []
    rollout, draw, generate = eng._rollout, eng._draw_problems, eng.pool.generate

    def timed_generate(*a, **k):
        t0 = time.perf_counter()
        out = generate(*a, **k)
        _sync(device)
        gen_s.append(time.perf_counter() - t0)
        return out

    eng._rollout = lambda *a, **k: rolls.append(rollout(*a, **k)) or rolls[-1]
    eng._draw_problems = lambda: drawn.append(draw()) or drawn[-1]
    eng.pool.generate = timed_generate
    _reset_peak(device)
    base = _peak_bytes(device)
    out = []
    for i in range(1 + steps):
        _sync(device)
        t0 = time.perf_counter()
        row = eng.update()
        _sync(device)
        wall = time.perf_counter() - t0
        roll = rolls[-1]
        cut = roll.truncated.bool()
        gen = roll.completion_mask
        ended = ((roll.completion_ids == eos) & gen.bool()).any(1)
        trained = gen * (~cut)[:, None].to(gen.dtype) if cfg["mask_truncated_completions"] else gen
        out.append({"warmup": i == 0, "step_s": wall, "rollout_s": row["seconds"]["rollout"],
                    "actor_s": wall - row["seconds"]["rollout"], "generate_s": gen_s[-1],
                    "questions": [p["question"] for p in drawn[-1]],
                    **_work(roll.prompt_mask.sum(), gen.sum(), trained.sum(), len(roll),
                            roll.completion_ids.shape[1], cut.sum(), (~cut & ~ended).sum())})
    return {"model_source": eng.model_source, "setup_s": setup_s, "steps": out,
            "rss_after_setup_bytes": base, "peak_bytes": _peak_bytes(device)}


def _trl_generate(model, tokenizer, record: list, stop_at_answer: bool, eos_ids=None) -> None:
    """Time ``model.generate`` (what TRL calls) and record its work by TRL's convention (a
    completion runs up to and with its first EOS, any of ``eos_ids``, the trainer's
    ``eos_token_ids``, default the tokenizer's; one without EOS is cut). With
    ``stop_at_answer`` it gets the engine's answer-line stop, and a stopped row gets EOS after
    its answer line (TRL's sign of an ended completion)."""
    from transformers import StoppingCriteriaList

    from mcpg.grpo.agents import _AnswerLine

    generate, eos, pad = model.generate, tokenizer.eos_token_id, tokenizer.pad_token_id
    eos_ids = torch.as_tensor(list(eos_ids) if eos_ids is not None else [eos])

    def wrapped(*args, **kwargs):
        rows, n = kwargs["input_ids"].shape
        stop = _AnswerLine(tokenizer, n, rows) if stop_at_answer else None
        if stop is not None:
            kwargs["stopping_criteria"] = StoppingCriteriaList([stop])
        t0 = time.perf_counter()
        out = generate(*args, **kwargs)
        _sync(out.device)
        elapsed, width = time.perf_counter() - t0, out.shape[1] - n
        stopped = torch.zeros(rows, dtype=torch.bool) if stop is None else stop.length > 0
        if bool(stopped.any()):
            if int(stop.length.max()) >= width:  # a row stopped at the last step: room for its EOS
                out = torch.cat([out, torch.full_like(out[:, :1], pad)], 1)
            for r in stopped.nonzero().flatten().tolist():
                out[r, n + int(stop.length[r])] = eos
        is_eos = torch.isin(out[:, n:].cpu(), eos_ids)
        first = torch.where(is_eos.any(1), is_eos.int().argmax(1), torch.full((rows,), is_eos.shape[1]))
        record.append({"generate_s": elapsed, "stopped": int(stopped.sum()),
                       "cut": int((~is_eos.any(1)).sum()),
                       "tokens": int((first + 1).clamp(max=is_eos.shape[1]).sum()), "rows": rows,
                       "width": width})
        return out

    model.generate = wrapped


def run_trl(cfg, steps: int, workdir: str) -> dict:
    """TRL's GRPOTrainer on the same setting: one warm-up optimizer step, then ``steps``."""
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mcpg.grpo.agents import INSTRUCTION
    from mcpg.grpo.gsm8k import reward
    from mcpg.grpo.models import load_base

    device = _device(cfg)
    m, rows = cfg["completions_per_agent"], cfg["prompts_per_update"] * cfg["completions_per_agent"]
    micro = cfg["train_micro_batch"] or rows
    agent = cfg["agents"][0]
    t = time.perf_counter()
    torch.manual_seed(cfg["seed"])
    model, tok, source = load_base(cfg["model"], dtype=cfg["dtype"], device=str(device), seed=cfg["seed"])
    system = agent["role"] + " " + (INSTRUCTION if cfg["instruction"] is None else cfg["instruction"])
    problems = [p for step in draws(cfg, 1 + steps) for p in step]  # the engine's draws, in order
    data = [{"prompt": [{"role": "system", "content": system}, {"role": "user", "content": p["question"]}],
             "question": p["question"], "gold": float(p["gold"])} for p in problems]
    questions, eos_ids = [], []  # eos_ids: the trainer's, once it is built

    def arithmetic_reward(prompts, completions, completion_ids, gold, question, **kwargs):
        questions.append(question)
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [reward(x, g, truncated=not ids or ids[-1] not in eos_ids)
                for x, g, ids in zip(texts, gold, completion_ids)]

    args = GRPOConfig(
        output_dir=workdir, report_to="none", save_strategy="no", disable_tqdm=True, logging_steps=1,
        use_cpu=device.type == "cpu", bf16=cfg["dtype"] == "bfloat16", fp16=cfg["dtype"] == "float16",
        seed=cfg["seed"], max_steps=1 + steps, shuffle_dataset=False,
        per_device_train_batch_size=micro, gradient_accumulation_steps=rows // micro, num_generations=m,
        max_completion_length=cfg.max_completion_length, temperature=agent.get("temperature", 1.0),
        top_p=1.0, top_k=0, learning_rate=cfg["learning_rate"], weight_decay=cfg["weight_decay"],
        lr_scheduler_type="constant", optim="adamw_torch", max_grad_norm=cfg["max_grad_norm"] or 0.0,
        loss_type=cfg["loss_type"], scale_rewards=cfg["scale_rewards"], epsilon=cfg.epsilon,
        epsilon_high=cfg.epsilon_high, num_iterations=cfg["num_iterations"], beta=0.0,
        mask_truncated_completions=cfg["mask_truncated_completions"],
        gradient_checkpointing=cfg["gradient_checkpointing"],
    )
    lora = LoraConfig(r=cfg["lora_r"], lora_alpha=cfg["lora_alpha"], lora_dropout=0.0,
                      target_modules=cfg["lora_target_modules"], task_type="CAUSAL_LM", bias="none")
    walls = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            _sync(device)
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            _sync(device)
            walls.append(time.perf_counter() - self.t0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=model, reward_funcs=arithmetic_reward, args=args,
                              train_dataset=Dataset.from_list(data), processing_class=tok, peft_config=lora,
                              callbacks=[Clock()])
    setup_s = time.perf_counter() - t
    gens, scored = [], []
    eos_ids.extend(trainer.eos_token_ids)
    _trl_generate(trainer.model, tok, gens, cfg["stop_at_answer"], eos_ids)
    score = trainer._generate_and_score_completions

    def timed_score(inputs):
        t0 = time.perf_counter()
        batch = score(inputs)
        _sync(device)
        scored.append({"rollout_s": time.perf_counter() - t0,
                       "prompt_tokens": int(batch["prompt_mask"].sum()),
                       "trained_tokens": int(batch["completion_mask"].sum())})
        return batch

    trainer._generate_and_score_completions = timed_score
    _reset_peak(device)
    base = _peak_bytes(device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.train()
    peak = _peak_bytes(device)
    if not len(walls) == len(gens) == len(scored) == 1 + steps:
        raise RuntimeError(f"expected {1 + steps} steps with one generation each, got {len(walls)} steps, "
                           f"{len(gens)} generations")
    out = []
    for i, (wall, g, s) in enumerate(zip(walls, gens, scored)):
        out.append({"warmup": i == 0, "step_s": wall, "rollout_s": s["rollout_s"],
                    "actor_s": wall - s["rollout_s"],
                    "generate_s": g["generate_s"], "questions": list(dict.fromkeys(questions[i])),
                    **_work(s["prompt_tokens"], g["tokens"], s["trained_tokens"], g["rows"], g["width"],
                            g["cut"], g["stopped"])})
    return {"model_source": source, "setup_s": setup_s, "steps": out, "rss_after_setup_bytes": base,
            "peak_bytes": peak}


def _arm_main(arm: str, config_json: str, steps: int, out: str) -> None:
    """A subprocess's work: one arm on the config in ``config_json``; its result into ``out``."""
    from mcpg.grpo.configs import resolve_config

    cfg = resolve_config(json.loads(Path(config_json).read_text()))
    if cfg["threads"]:
        torch.set_num_threads(cfg["threads"])
    if arm == "trl":
        with tempfile.TemporaryDirectory() as work:
            res = run_trl(cfg, steps, work)
    else:
        res = run_ours(cfg, arm == "ours/shared", steps)
    import resource

    res.update(arm=arm, torch_threads=torch.get_num_threads(),
               peak_bytes_process=int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024)
    Path(out).write_text(json.dumps(res) + "\n")


# -- the comparison ----------------------------------------------------------------------------
def _spawn(arm: str, config_json: str, steps: int, threads: int) -> dict:
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "arm.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--arm", arm, "--arm-config", config_json,
               "--steps", str(steps), "--arm-out", str(out)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"arm {arm} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        return json.loads(out.read_text())


def compare(cfg, repeats: int = 3, steps: int = 1, arms=ARMS) -> dict:
    """The arms in alternating subprocesses, ``repeats`` rounds; returns the results (module
    docstring): per arm its runs, each timed step's phases, medians, peak memory and work; the
    paired ratios against TRL per round; whether every arm saw the same problems and prompts."""
    runs = {a: [] for a in arms}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(cfg.to_dict()))
        for r in range(repeats):
            for a in arms:
                runs[a].append(_spawn(a, str(path), steps, cfg["threads"]))
                t = [s["step_s"] for s in runs[a][-1]["steps"] if not s["warmup"]]
                print(f"  round {r + 1} {a}: step {statistics.median(t):.2f} s", file=sys.stderr, flush=True)
    res = {}
    for a in arms:
        timed = [s for run in runs[a] for s in run["steps"] if not s["warmup"]]
        seconds = {p: [s[f"{p}_s"] for s in timed] for p in PHASES}
        res[a] = {
            "seconds": seconds, "median_s": {p: statistics.median(v) for p, v in seconds.items()},
            "peak_bytes": max(run["peak_bytes"] for run in runs[a]),
            "rss_after_setup_bytes": max(run["rss_after_setup_bytes"] for run in runs[a]),
            "peak_bytes_process": max(run["peak_bytes_process"] for run in runs[a]),
            "setup_s": [run["setup_s"] for run in runs[a]],
            "work": [{k: v for k, v in s.items() if not k.endswith("_s") and k != "questions"}
                     for s in runs[a][0]["steps"]],
            "model_source": runs[a][0]["model_source"], "torch_threads": runs[a][0]["torch_threads"],
        }

    def per_round(a: str, p: str) -> list[float]:
        return [statistics.median(s[f"{p}_s"] for s in run["steps"] if not s["warmup"]) for run in runs[a]]

    ratios = {}
    if "trl" in arms:
        for a in (x for x in arms if x != "trl"):
            ratios[a] = {p: statistics.median(x / y for x, y in zip(per_round(a, p), per_round("trl", p)))
                         for p in PHASES}
            ratios[a]["peak_bytes"] = res[a]["peak_bytes"] / res["trl"]["peak_bytes"]
    first = {a: [s for s in runs[a][0]["steps"]] for a in arms}

    def agree(key, f=lambda x: x) -> bool:
        return all([f(s[key]) for s in first[a]] == [f(s[key]) for s in first[arms[0]]] for a in arms)

    same = {"questions": agree("questions", sorted), "prompt_tokens": agree("prompt_tokens"),
            "rows": agree("rows")}
    return {"arms": res, "ratio_to_trl": ratios, "same_work": same,
            "problems": [s["questions"] for s in first[arms[0]]]}


def _summary(cfg) -> dict:
    a = cfg["agents"][0]
    keys = ("model", "dtype", "device", "task", "prompts_per_update", "completions_per_agent",
            "max_completion_length",
            "lora_r", "lora_alpha", "lora_target_modules", "learning_rate", "weight_decay", "max_grad_norm",
            "loss_type", "scale_rewards", "epsilon", "num_iterations", "train_micro_batch", "stop_at_answer",
            "mask_truncated_completions", "gradient_checkpointing", "seed")
    return {**{k: cfg[k] for k in keys}, "temperature": a.get("temperature"), "agent_role": a["role"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=str(CONTROL))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config key (JSON value), after mask_truncated_completions=true")
    ap.add_argument("--tiny-random", action="store_true",
                    help="CI mode: " + ", ".join(f"{k}={v}" for k, v in TINY.items()))
    ap.add_argument("--repeats", type=int, default=3, help="rounds of the alternating arms")
    ap.add_argument("--steps", type=int, default=1,
                    help="timed steps per arm and round, after one warm-up step")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per arm (0: torch's default)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)
    ap.add_argument("--arm-config", help=argparse.SUPPRESS)
    ap.add_argument("--arm-out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.arm:
        return _arm_main(args.arm, args.arm_config, args.steps, args.arm_out)
    from mcpg.grpo._runtime import write_json
    from mcpg.grpo.provenance import commit_state, machine_info, now

    overrides = {**(TINY if args.tiny_random else {}), **_parse_sets(args.set)}
    if args.threads:
        overrides.setdefault("threads", args.threads)
    cfg = setting(args.config, **overrides)
    started = now()
    t = time.perf_counter()
    result = {
        "command": " ".join(["python benchmarks/bench_trl.py", *(sys.argv[1:] if argv is None else argv)]),
        **commit_state(ROOT), "date": started, "machine": machine_info(),
        "device": torch.cuda.get_device_name() if _device(cfg).type == "cuda" else "cpu",
        "torch_threads": cfg["threads"] or torch.get_num_threads(),
        "versions": {m: importlib.import_module(m).__version__
                     for m in ("torch", "transformers", "trl", "peft")},
        "config": args.config, "overrides": overrides, "setting": _summary(cfg),
        "repeats": args.repeats, "steps": args.steps,
        **compare(cfg, args.repeats, args.steps),
    }
    result["wall_s"] = time.perf_counter() - t
    if args.out:
        write_json(Path(args.out), result)
        print(f"written to {args.out}", file=sys.stderr)
    print(json.dumps({"median_s": {a: r["median_s"] for a, r in result["arms"].items()},
                      "peak_bytes": {a: r["peak_bytes"] for a, r in result["arms"].items()},
                      "ratio_to_trl": result["ratio_to_trl"], "same_work": result["same_work"]}, indent=2))
    return result


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
