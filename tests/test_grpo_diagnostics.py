"""The actor update's per-agent diagnostics (:data:`mcpg.grpo.rundir.AGENT_DIAGNOSTICS`), each
against its definition computed by hand on the same rollout of the tiny random model."""


import numpy as np
import pytest
import torch

from mcpg.grpo.configs import resolve_config
from mcpg.grpo.objective import clipped_grpo_loss
from mcpg.grpo.rundir import AGENT_DIAGNOSTICS

pytestmark = pytest.mark.usefixtures("one_torch_thread", "gsm8k_fixture")


def _engine(**overrides):
    from mcpg.grpo.train import Engine

    eng = Engine(resolve_config("tiny-random", **overrides), "removal")
    roll = eng._rollout(["What is 2+3?", "Add 4 and 5."], 3, progress=False)
    adv = torch.linspace(-1.5, 1.0, len(roll)) ** 3
    return eng, roll, adv


def test_grad_norm_entropy_and_advantage_spread_by_hand():
    eng, roll, adv = _engine(max_grad_norm=1e-3)  # clipping on: the norm logged is the one before it
    pool, K = eng.pool, eng.K
    agents = torch.tensor([pool.names.index(a) for a in roll.adapters])
    mask = roll.completion_mask
    logp, ent = pool.token_logprobs(roll, with_entropy=True)
    total = sum(clipped_grpo_loss(logp[agents == k], logp[agents == k].detach(), adv[agents == k],
                                  mask[agents == k]) for k in range(K))
    total.backward()
    norms = [float(torch.nn.utils.get_total_norm([p.grad for p in pool.adapter_params(a)]))
             for a in pool.names]
    eng.optimizer.zero_grad()
    _, _, diag = eng._actor_update(roll, adv)
    assert set(diag) == set(AGENT_DIAGNOSTICS)
    np.testing.assert_allclose(diag["agent/grad_norm"], norms, rtol=1e-4)
    assert min(norms) > 1e-3  # so the logged norm is the one before clipping
    want = [float((ent[agents == k] * mask[agents == k]).sum() / mask[agents == k].sum()) for k in range(K)]
    np.testing.assert_allclose(diag["agent/entropy"], want, rtol=1e-5)
    np.testing.assert_allclose(diag["agent/advantage_std"], [adv[agents == k].double().std(unbiased=False)
                                                             for k in range(K)], rtol=1e-9)
    assert diag["agent/approx_kl"] == [0.0] * K and diag["agent/kl"] == [0.0] * K  # one step, no beta
    assert diag["agent/clip_low"] == [0.0] * K and diag["agent/clip_high"] == [0.0] * K  # ratio 1


def test_clipping_and_kl_per_agent_add_up_to_the_clip_fraction():
    """Two optimizer steps at a large learning rate: tokens clip on both sides; the clip fraction is
    the token-weighted mean of every agent's clip_low + clip_high; beta > 0 gives a KL to the base."""
    eng, roll, adv = _engine(num_iterations=2, learning_rate=0.5, beta=0.1, max_grad_norm=0)
    agents = torch.tensor([eng.pool.names.index(a) for a in roll.adapters])
    tokens = np.array([float(roll.completion_mask[agents == k].sum()) for k in range(eng.K)])
    _, clip_fraction, diag = eng._actor_update(roll, adv)
    low, high = np.array(diag["agent/clip_low"]), np.array(diag["agent/clip_high"])
    assert low.sum() > 0 and high.sum() > 0
    assert clip_fraction == pytest.approx(float(((low + high) * tokens).sum() / tokens.sum()), rel=1e-12)
    assert min(diag["agent/approx_kl"]) > 0 and min(diag["agent/kl"]) > 0
    assert min(diag["agent/grad_norm"]) > 0
