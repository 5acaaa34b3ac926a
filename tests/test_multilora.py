"""Batched multi-LoRA (mcpg.grpo.multilora) and the pool's fast scoring: the same function as
peft's mixed-adapter path, gradients only to each row's own adapter, the generator's own
log-probabilities reproduced by scoring, chunking and checkpointing change nothing, and far
fewer ops per decoding step."""

import warnings

import pytest
import torch

from mcpg.grpo.agents import AgentPool, AgentSpec
from mcpg.grpo.models import load_base

warnings.filterwarnings("ignore", category=FutureWarning)
pytestmark = pytest.mark.usefixtures("one_torch_thread")

AGENTS = [AgentSpec("ann", "You are Ann.", 0.8), AgentSpec("bob", "You are Bob.", 1.3),
          AgentSpec("cy", "You are Cy.", 1.0)]


def _pool(dtype="float32", **kw):
    model, tok, _ = load_base("tiny-random", dtype=dtype, seed=1)
    pool = AgentPool(model, tok, AGENTS, lora_r=4, seed=0, **kw)
    with torch.no_grad():  # adapters that differ from each other and from the base
        g = torch.Generator().manual_seed(0)
        for n, p in pool.model.named_parameters():
            if "lora_B" in n:
                p.copy_((torch.randn(p.shape, generator=g) * 0.3).to(p))
    return pool


@pytest.fixture(scope="module")
def pool():
    return _pool()


def _batch(pool, adapters):
    prompts = [pool.prompt(f"What is {i} + 3?", AGENTS[i % 3]) for i in range(len(adapters))]
    enc = pool.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc.input_ids, enc.attention_mask


def _grads(pool):
    return {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p))
            for n, p in pool.model.named_parameters() if ".lora_" in n}


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-4), ("bfloat16", 2e-2)])
def test_batched_multilora_equals_peft_mixed_batch_and_its_gradients(dtype, tol):
    pool = _pool(dtype)
    adapters = ["bob", "ann", "__base__", "cy", "bob", "ann"]
    ids, mask = _batch(pool, adapters)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(len(adapters), ids.shape[1], len(pool.tokenizer), generator=g)

    def run(fast):
        pool.model.zero_grad(set_to_none=True)
        if fast:
            with pool.multilora.rows(adapters):
                logits = pool.model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        else:  # peft's own per-adapter split
            logits = pool.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                adapter_names=adapters).logits
        (logits.float() * w).sum().backward()
        return logits.detach().float(), _grads(pool)

    fast, g_fast = run(True)
    slow, g_slow = run(False)
    torch.testing.assert_close(fast, slow, rtol=tol, atol=tol)
    scale = max(float(g.abs().max()) for g in g_slow.values())
    for n in g_slow:
        torch.testing.assert_close(g_fast[n], g_slow[n], rtol=tol, atol=tol * scale)
    # each adapter's gradient comes from its own rows only: drop cy's row and cy gets exactly nothing
    pool.model.zero_grad(set_to_none=True)
    keep = [i for i, a in enumerate(adapters) if a != "cy"]
    sub = [adapters[i] for i in keep]
    with pool.multilora.rows(sub):
        out = pool.model(input_ids=ids[keep], attention_mask=mask[keep], position_ids=pos[keep]).logits
    (out.float() * w[keep]).sum().backward()
    got = _grads(pool)
    for n, g in got.items():
        owner = n.split(".lora_")[1].split(".")[1]
        assert (float(g.abs().sum()) > 0) == (owner != "cy"), n


def test_base_rows_are_the_base_model_and_unknown_adapters_are_refused(pool):
    ids, mask = _batch(pool, ["__base__"] * 2)
    with torch.no_grad():
        with pool.multilora.rows(["__base__", "__base__"]):
            fast = pool.model(input_ids=ids, attention_mask=mask).logits
        with pool.model.disable_adapter():
            base = pool.model(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(fast, base, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="unknown adapters"):
        with pool.multilora.rows(["ann", "dan"]):
            pass


def test_scoring_logprobs_equal_the_generators_own(pool):
    """Sampled rows of three agents (each its own temperature) in one batch: the scoring pass
    reproduces the log-probability the generator sampled each token with (within 1e-4)."""
    prompts, adapters, temps = [], [], []
    for q in ["What is 2+3?", "A square has side 3."]:
        for a in AGENTS:
            for _ in range(2):
                prompts.append(pool.prompt(q, a))
                adapters.append(a.name)
                temps.append(a.temperature)
    torch.manual_seed(0)
    roll = pool.generate(prompts, adapters, temps, max_new_tokens=10, keep_logprobs=True)
    assert roll.sampler_logprobs.shape == roll.completion_ids.shape
    m = roll.completion_mask.bool()
    with torch.no_grad():
        lp = pool.token_logprobs(roll)
    torch.testing.assert_close(lp[m], roll.sampler_logprobs[m], rtol=0, atol=1e-4)
    # and the same with peft's path (multilora off) for both
    saved, pool.multilora = pool.multilora, None
    try:
        with torch.no_grad():
            lp_peft = pool.token_logprobs(roll)
    finally:
        pool.multilora = saved
    torch.testing.assert_close(lp[m], lp_peft[m], rtol=0, atol=1e-4)


@pytest.mark.parametrize("chunk,ckpt,share", [(7, True, True), (7, True, False), (0, False, True),
                                              (1000, False, True)])
def test_chunks_and_checkpointing_change_neither_logprobs_nor_gradients(pool, chunk, ckpt, share):
    """Against one unchunked pass without checkpointing: chunked head, checkpointed layers, with
    the prompt shared by the 2 rows of each (prompt, agent) pair (its KV cache indexed out) or not."""
    prompts = [pool.prompt("What is 2+3?", a) for a in AGENTS] * 2
    adapters = [a.name for a in AGENTS] * 2
    torch.manual_seed(1)
    roll = pool.generate(prompts, adapters, [1.0] * 6, max_new_tokens=8)

    def run(c, k, shared=True):
        pool.logprob_chunk, pool.gradient_checkpointing, pool.share_prefill = c, k, shared
        pool.model.zero_grad(set_to_none=True)
        lp = pool.token_logprobs(roll)
        (lp * roll.completion_mask).sum().backward()
        return lp.detach(), _grads(pool)

    try:
        ref_lp, ref_g = run(512, False)
        lp, g = run(chunk, ckpt, share)
    finally:
        pool.logprob_chunk, pool.gradient_checkpointing, pool.share_prefill = 512, True, True
        pool.model.zero_grad(set_to_none=True)
    torch.testing.assert_close(lp, ref_lp, rtol=1e-5, atol=1e-5)
    for n in ref_g:
        torch.testing.assert_close(g[n], ref_g[n], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("m", [1, 3])
def test_checkpointing_keeps_fewer_tensors_for_backward(m):
    """With gradient checkpointing the autograd graph saves fewer bytes (the layers' inputs only):
    with one row per prompt (one pass over prompt + completion) and with m rows per (prompt,
    agent) pair (shared-prompt scoring, whose layers also extend a KV cache)."""
    pool = _pool()
    prompts = [pool.prompt("What is 2+3?", a) for a in AGENTS for _ in range(m)]
    adapters = [a.name for a in AGENTS for _ in range(m)]
    roll = pool.generate(prompts, adapters, [1.0] * 3 * m, max_new_tokens=8, greedy=True)

    def saved_bytes(ckpt):
        pool.gradient_checkpointing = ckpt
        total = []

        def pack(t):
            total.append(t.numel() * t.element_size())
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            pool.token_logprobs(roll)
        return sum(total)

    assert saved_bytes(True) < 0.5 * saved_bytes(False)


def test_multilora_cuts_the_ops_of_a_decoding_step(pool):
    """torch.profiler aten ops of one decoding step: batched multi-LoRA within 1.5x a plain
    step of the base model, peft's split far above (here 2 layers x 7 adapted linears)."""
    from torch.profiler import ProfilerActivity, profile

    adapters = ["ann", "bob", "cy", "__base__"] * 3
    ids, mask = _batch(pool, adapters)
    with torch.no_grad():
        out = pool.model(input_ids=ids, attention_mask=mask, use_cache=True, adapter_names=adapters)
    name = "cache" if "cache" in out else "past_key_values"  # transformers >= 5.2 renamed it
    cache = out[name]
    step_ids = torch.full((len(adapters), 1), 65)
    step_mask = torch.cat([mask, torch.ones_like(step_ids)], 1)

    def ops(f, fast=False):
        import contextlib
        import copy

        c = copy.deepcopy(cache)
        # the batch's concatenated weights are built once per generate() call, before the steps
        with torch.no_grad(), pool.multilora.rows(adapters) if fast else contextlib.nullcontext():
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                f(c)
        return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))

    def fast(c):
        pool.model(input_ids=step_ids, attention_mask=step_mask, use_cache=True, **{name: c})

    def peft(c):
        pool.model(input_ids=step_ids, attention_mask=step_mask, use_cache=True, adapter_names=adapters,
                   **{name: c})

    def plain(c):
        with pool.model.disable_adapter():
            pool.model(input_ids=step_ids, attention_mask=step_mask, use_cache=True, **{name: c})

    n_fast, n_peft, n_plain = ops(fast, True), ops(peft), ops(plain)
    assert n_fast <= 1.5 * n_plain < n_peft
