"""Appendix B.9's second identity on the library's critic tables (chapter 4).

A fixed critic's q̂(S) is a function of (H, A^(S)), so for i ∉ S

    E[G − q̂(S) | H, A^(S∪{i})] = E[G | H, A^(S∪{i})] − q̂(S) = Δ^ret_{i|S} + (q^ret(S) − q̂(S)):

the residual reports the field entry plus the critic's error at S. What the library must get
right for it is that :func:`mcpg.critic.critic_values` at S reads nothing of the agents outside
S (the mask zeroes their inputs); the test fails for a table that does read them, q̂(N).
"""

from __future__ import annotations

import numpy as np
import pytest

from mcpg import critic as cr
from mcpg import fields, signals
from mcpg import mechanisms as mech


def _gap(system, Q, at):
    K, G = system.n_agents, system.reward_mean().numpy()
    q_ret = mech.retention_values(system).numpy()
    return max(
        np.abs(signals.conditional_expectation(system, G - Q[at(S)], S | 1 << i)
               - (q_ret[S | 1 << i] - Q[at(S)])).max()
        for i in range(K) for S in range(1 << K) if not S >> i & 1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_residual_reports_the_entry_plus_the_critic_error(seed):
    system = mech.random_routed_pool(np.random.default_rng(seed), K=3, tau=0.5)
    Q = cr.critic_values(cr.MaskedCritic.for_system(system, seed=seed), system)
    assert _gap(system, Q, lambda S: S) < 1e-12
    # the second form: the entry Δ^ret_{i|S} plus the critic's error q^ret(S) − q̂(S)
    q_ret, G = mech.retention_values(system).numpy(), system.reward_mean().numpy()
    S = fields.group(2)  # agent 2 present; i = agent 1 (bit 0)
    mean = signals.conditional_expectation(system, G - Q[S], S | 1)
    entry = q_ret[S | 1] - q_ret[S]
    np.testing.assert_allclose(mean, entry + (q_ret[S] - Q[S]), atol=1e-12)
    assert np.abs(q_ret[S] - Q[S]).max() > 1e-3  # an untrained critic errs


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_table_that_reads_the_others_breaks_it(seed):
    system = mech.random_routed_pool(np.random.default_rng(seed), K=3, tau=0.5)
    Q = cr.critic_values(cr.MaskedCritic.for_system(system, seed=seed), system)
    full = (1 << system.n_agents) - 1
    assert _gap(system, Q, lambda S: full) > 1e-3
