"""Random routed slates for the tests of exact evaluations on a budget (chapter 9)."""

import numpy as np

from mcpg import routing


def budget_rollout(seed, B=4, m=4, K=3, leverage=False):
    """``p, P, mu, R`` of B prompts × m slates × K agents from one generator: router scores
    of spread 2 (τ = 1, ε = 0.1), outcome estimates ``mu = sigmoid(normal)``, rewards 1 with
    probability 0.4; with ``leverage``, then each completion's leverage ``a`` (log-normal, 0 for
    about a tenth of them, as a cut completion the loss leaves out)."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(B, m, K)) * 2
    p = routing.router_propensities(s, 1.0, 0.1)
    P = routing.leave_one_out_propensities(s, 1.0, 0.1)
    mu = 1 / (1 + np.exp(-rng.normal(size=(B, m, K))))
    R = (rng.random((B, m, K)) < 0.4).astype(float)
    if not leverage:
        return p, P, mu, R
    return p, P, mu, R, rng.lognormal(size=(B, m, K)) * (rng.random((B, m, K)) > 0.1)
