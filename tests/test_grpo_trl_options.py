"""TRL's ``beta`` and ``scale_rewards="batch"`` in the engine (config keys of those names).

What each computes is tested against TRL's own ``GRPOTrainer`` in tests/test_grpo_trl.py; here,
that the engine feeds them what TRL does: the KL term's reference is the frozen base model (TRL
disables the adapter of a PEFT model), and the batch of ``"batch"`` is each agent's whole rollout.
"""

import types

import numpy as np
import pytest
import torch

from mcpg.grpo.configs import resolve_config
from mcpg.grpo.objective import clipped_grpo_loss, group_advantages

pytestmark = pytest.mark.usefixtures("one_torch_thread", "gsm8k_fixture")


def _trained_engine(**overrides):
    """A tiny-random engine whose adapters are away from 0 (so each agent differs from the base)."""
    from mcpg.grpo.train import Engine

    eng = Engine(resolve_config("tiny-random", **overrides), "removal")
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in eng.pool.model.named_parameters():
            if ".lora_B." in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return eng


def test_config_keys():
    assert resolve_config("tiny-random")["beta"] == 0.0  # TRL's default: no KL term
    assert resolve_config("tiny-random", scale_rewards="batch")["scale_rewards"] == "batch"
    with pytest.raises(ValueError, match="'beta'"):
        resolve_config("tiny-random", beta=-0.1)
    with pytest.raises(ValueError, match="'scale_rewards'"):
        resolve_config("tiny-random", scale_rewards="global")


def test_the_kl_term_is_taken_against_the_base_model():
    """With beta > 0 each agent's loss is clipped_grpo_loss with the frozen base model's
    log-probabilities (peft's adapter disabled) as the reference, at the agent's temperature."""
    beta = 0.5
    eng = _trained_engine(beta=beta, max_grad_norm=0)
    roll = eng._rollout(["What is 2+3?", "Add 4 and 5."], 2, progress=False)
    with torch.no_grad():
        logp = eng.pool.token_logprobs(roll)
        with eng.pool.model.disable_adapter():  # peft's own way to the base model
            ref = eng.pool.token_logprobs(roll)
        torch.testing.assert_close(eng.pool.reference_logprobs(roll), ref, rtol=1e-5, atol=1e-6)
    adv = torch.linspace(-1.0, 1.0, len(roll))
    agents = torch.tensor([eng.pool.names.index(a) for a in roll.adapters])
    mask = roll.completion_mask
    want, without = [], []
    for k in range(eng.K):
        rows = agents == k
        kw = dict(loss_type=eng.cfg["loss_type"], max_completion_length=eng.cfg.max_completion_length)
        want.append(float(clipped_grpo_loss(logp[rows], logp[rows], adv[rows], mask[rows], beta=beta,
                                            logp_ref=ref[rows], **kw)))
        without.append(float(clipped_grpo_loss(logp[rows], logp[rows], adv[rows], mask[rows], **kw)))
    losses, _, _ = eng._actor_update(roll, adv)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    assert np.abs(np.array(want) - np.array(without)).min() > 1e-4  # the KL term is there


def test_batch_scaling_reads_each_agents_whole_rollout(monkeypatch):
    """The engine's advantages under ``"batch"``: centred in each prompt's group, divided by the
    agent's standard deviation over all B x m of its scores in the rollout."""
    import mcpg.grpo.train as train_module

    seen = {}
    real = train_module.route_and_credit

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen["scores"], seen["advantages"] = out.scores, out.advantages
        return out

    monkeypatch.setattr(train_module, "route_and_credit", spy)
    eng = _trained_engine(scale_rewards="batch", prompts_per_update=3, completions_per_agent=3)
    eng.update()
    s, a = seen["scores"], seen["advantages"]
    assert s.shape == (3, 3, eng.K)
    std = s.reshape(-1, eng.K).std(axis=0, ddof=1)
    np.testing.assert_allclose(a, (s - s.mean(axis=1, keepdims=True)) / (std + 1e-4), rtol=1e-10)
    np.testing.assert_allclose(a, group_advantages(s, "batch", batch_axis=0), rtol=1e-12)
    assert not np.allclose(a, group_advantages(s, "group"), atol=1e-3)  # not the group's std


def test_batch_scaling_refuses_data_parallel():
    from mcpg.grpo.train import Engine

    two = types.SimpleNamespace(world=2, rank=0, main=True, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="'scale_rewards'.*one process"):
        Engine(resolve_config("tiny-random", scale_rewards="batch"), "removal", dist=two)
