"""The allocation "leverage": Eq. (22) fixed before the router's draw, p = 0 allowed (chapter 9)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpg import routing
from mcpg.allocation import (
    ExactBudget,
    predraw_allocation,
    predraw_error_proxy,
    predraw_risk,
    removal_error_proxy,
    slate_allocation,
)
from mcpg.grpo.objective import budgeted_removal, credit, route_and_credit
from random_slates import budget_rollout  # tests/random_slates.py

# the routed arms of the masked grid (the control arm has one agent: nothing to allocate)
# anchored on this file, so that pytest finds them from any working directory
RESULTS = Path(__file__).resolve().parents[1] / "data" / "results"
LOGGED = sorted(p for p in (RESULTS / "ch08" / "grid-mask").glob("*/seed0/slates.jsonl")
                if p.parent.parent.name != "control")


def _system(seed, N=None, K=3):
    rng = np.random.default_rng(seed)
    N = N or int(rng.integers(1, 5))
    s = rng.normal(size=(N, K)) * 2
    p = routing.router_propensities(s, 1.0, 0.1)
    P = routing.leave_one_out_propensities(s, 1.0, 0.1)
    mu = 1 / (1 + np.exp(-rng.normal(size=(N, K))))
    return p, P, mu


@pytest.mark.parametrize("seed", range(6))
def test_predraw_error_proxy_is_the_expected_squared_error_over_the_draw_and_the_rewards(seed):
    # Enumerate I ~ p and R ~ Bernoulli(mu_hat) (independent), exactly: E[(Δ̂ - Δ)²] per agent.
    p, P, mu = _system(seed, N=1, K=3 + seed % 2)
    K = p.shape[-1]
    want = np.zeros(K)
    for R in itertools.product([0.0, 1.0], repeat=K):
        R = np.array(R)[None]
        pr_R = np.prod(np.where(R == 1, mu, 1 - mu))
        delta = routing.removal_contributions(R, p, P)
        for i in range(K):
            dh = credit("removal", np.array([i]), R[:, i], p, P, mu)
            want += pr_R * p[0, i] * ((dh - delta) ** 2)[0]
    np.testing.assert_allclose(predraw_error_proxy(p, P, mu)[0], want, rtol=1e-12, atol=1e-15)


def _brute_force(w2, c, C):
    """Least predraw_risk over every active set A and every saturated subset S of A (q = 1 on
    S, q ∝ w on A \\ S spending the rest): the KKT points of each active set, no sorting."""
    N, B = len(w2), C / c
    w = np.sqrt(w2)
    best = w2.sum() if N * c > C else 0.0
    for labels in itertools.product((0, 1, 2), repeat=N):  # 0 off, 1 saturated, 2 interior
        lab = np.array(labels)
        sat, inner = lab == 1, lab == 2
        left = B - sat.sum()
        if left < -1e-12 or (inner.any() and (left <= 0 or w[inner].sum() == 0)):
            continue
        q = np.where(sat, 1.0, 0.0)
        if inner.any():
            q[inner] = left * w[inner] / w[inner].sum()
        if (q > 1 + 1e-12).any():
            continue
        best = min(best, predraw_risk(np.minimum(q, 1.0), w2))
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=1, max_size=6), st.floats(0.0, 1.0), st.floats(0.5, 3.0))
def test_predraw_allocation_is_the_optimum_of_a_brute_force_search(w2, frac, c):
    w2 = np.array(w2) ** 2
    C = frac * len(w2) * c
    p = predraw_allocation(w2, np.full(len(w2), c), C)
    risk = predraw_risk(p, w2)
    assert p @ np.full(len(w2), c) <= C * (1 + 1e-12) + 1e-12
    assert not ((p > 0) & (p <= 0.5)).any()  # only {0} ∪ (½, 1]
    assert risk <= _brute_force(w2, c, C) * (1 + 1e-9) + 1e-12
    # the budget binds: spent to within one slate. A weight below the largest's float precision
    # (1e-28 beside 1) changes no risk the allocation can compute, so it need not be evaluated
    # (hypothesis found w2 = (1, 1e-28, 1e-28), whose equal risks keep the fewest slates)
    distinct = (w2 > 1e-12 * w2.max()).sum() if w2.size else 0
    if len(w2) * c > C and distinct * c > C:
        assert p.sum() * c > C - c - 1e-9


def test_predraw_allocation_by_hand_and_refusals():
    # B = 1.2 evaluations, w = (1, 1): (1, 0) has risk 1, (0.6, 0.6) has 2(1/0.6 - 1) = 4/3.
    np.testing.assert_array_equal(predraw_allocation([1.0, 1.0], [1.0, 1.0], 1.2), [1.0, 0.0])
    # B = 0.3: any p <= 1/2 is worse than none
    np.testing.assert_array_equal(predraw_allocation([4.0, 1.0], [1.0, 1.0], 0.3), [0.0, 0.0])
    # w = (2, 1, 1), B = 2: water-filling on all three gives (1, .5, .5), risk 1 + 1 = 2;
    # (1, 1, 0) has risk 1: evaluate two, drop one.
    np.testing.assert_array_equal(predraw_allocation([4.0, 1.0, 1.0], [1.0] * 3, 2.0), [1.0, 1.0, 0.0])
    np.testing.assert_array_equal(predraw_allocation([0.0, 1.0], [1.0, 1.0], 2.0), [1.0, 1.0])  # all covered
    assert predraw_risk([0.0, 1.0, 0.8], [1.0, 2.0, 4.0]) == pytest.approx(1.0 + 0.0 + 4 * 0.25)
    with pytest.raises(ValueError, match="one positive cost"):
        predraw_allocation([1.0, 1.0], [1.0, 2.0], 1.0)
    with pytest.raises(ValueError, match="no floor"):
        slate_allocation(np.ones((2, 3)), np.zeros((2, 3)), np.ones((2, 3)), [1.0, 1.0], 1.0,
                         rule="leverage", floor=0.1)


def test_the_leverage_is_not_ignored():
    # Equal predicted errors, different leverages: the allocation must follow a (Eq. 22). An
    # allocation that ignored a (a ≡ 1) evaluates other slates and pays a higher gradient risk.
    rng = np.random.default_rng(0)
    N, K = 16, 3
    a = rng.lognormal(0.0, 1.0, size=(N, K))
    v = np.full((N, K), 0.2)
    cost = np.full(N, 2.0)
    b = ExactBudget(0.25, "leverage")
    q = b.probabilities(a, v, cost)
    q_flat = b.probabilities(np.ones_like(a), v, cost)
    w2 = (a**2 * v).sum(-1)
    assert not np.array_equal(q, q_flat)
    assert predraw_risk(q, w2) < 0.9 * predraw_risk(q_flat, w2)
    assert np.array_equal(q > 0, w2 >= np.sort(w2)[-int((q > 0).sum())])  # the top slates by w


def _logged_rollouts(path, n=3):
    """The first n logged rollouts, each with a leverage per (slate, agent) drawn independently
    of the router's draw (a stand-in for ‖Ψ‖: the grid's logs predate the key)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()[:n]]
    rng = np.random.default_rng(0)
    for r in rows:
        out = {k: np.array(r[k], dtype=float) for k in ("R", "I", "G", "p", "P", "mu_hat")}
        out["a"] = rng.lognormal(0.0, 0.5, size=out["p"].shape)
        yield out


def _expected_credit(r, q):
    """E[Δ̃] over I ~ p and Z ~ Bernoulli(q), exactly: per slate, K draws and a two-point sum."""
    K = r["p"].shape[-1]
    y = routing.removal_contributions(r["R"], r["p"], r["P"])
    out = np.zeros_like(y)
    for i in range(K):
        I = np.full(len(r["G"]), i)  # noqa: E741
        dh = credit("removal", I, r["R"][:, i], r["p"], r["P"], r["mu_hat"])
        with np.errstate(divide="ignore", invalid="ignore"):
            corrected = dh + np.where(q > 0, 1.0, 0.0)[:, None] * (y - dh) / np.where(q > 0, q, 1.0)[:, None]
        out += r["p"][:, i : i + 1] * ((1 - q)[:, None] * dh + q[:, None] * corrected)
    return out, y


def test_the_logged_slates_are_found_from_any_working_directory(tmp_path, monkeypatch):
    # committed data: the tests below must run, never skip, wherever pytest starts
    monkeypatch.chdir(tmp_path)
    found = sorted(p for p in (RESULTS / "ch08" / "grid-mask").glob("*/seed0/slates.jsonl")
                   if p.parent.parent.name != "control")
    assert found == LOGGED and {p.parent.parent.name for p in LOGGED} == {
        f"{s}-{a}" for s in ("oracle", "removal", "wta") for a in ("group", "none")}


@pytest.mark.parametrize("path", LOGGED, ids=lambda p: p.parent.parent.name)
def test_eq21_stays_unbiased_under_the_leverage_rule_on_logged_slates(path):
    # The allocation reads only pre-draw quantities (p, P, mu_hat and a leverage), so E over
    # I and Z of Eq. (21) is the exact removal contribution,
    # also on slates left at q = 0 (Eq. 19 is unbiased over the draw: Corollary 3).
    seen = {"zero": 0, "inner": 0}
    for r in _logged_rollouts(path):
        K = r["p"].shape[-1]
        budget = ExactBudget(0.2, "leverage")
        q = budget.probabilities(r["a"], predraw_error_proxy(r["p"], r["P"], r["mu_hat"]),
                                 np.full(len(r["G"]), K - 1.0))
        seen["zero"] += int((q == 0).sum())
        seen["inner"] += int(((q > 0) & (q < 1)).sum())
        mean, y = _expected_credit(r, q)
        np.testing.assert_allclose(mean, y, rtol=0, atol=1e-10)
    assert seen["zero"] > 0  # slates left uncorrected were checked


def test_a_draw_dependent_allocation_with_p_zero_is_biased_on_logged_slates():
    # The check above can fail: let the allocation read the draw (the error proxy given I and G),
    # with p = 0 allowed, and E[Δ̃] moves away from Δ on the same logged slates.
    path = next(p for p in LOGGED if p.parent.parent.name == "removal-group")
    worst = 0.0
    for r in _logged_rollouts(path):
        K, N = r["p"].shape[-1], len(r["G"])
        y = routing.removal_contributions(r["R"], r["p"], r["P"])
        mean = np.zeros_like(y)
        for i in range(K):
            I = np.full(N, i)  # noqa: E741
            v = removal_error_proxy(I, r["R"][:, i], r["p"], r["P"], r["mu_hat"])
            q = predraw_allocation((r["a"] ** 2 * v).sum(-1), np.full(N, K - 1.0), 0.2 * N * (K - 1))
            dh = credit("removal", I, r["R"][:, i], r["p"], r["P"], r["mu_hat"])
            corr = dh + (q > 0)[:, None] * (y - dh) / np.where(q > 0, q, 1.0)[:, None]
            mean += r["p"][:, i : i + 1] * ((1 - q)[:, None] * dh + q[:, None] * corr)
        worst = max(worst, float(np.abs(mean - y).max()))
    assert worst > 1e-3


def _rollout(seed, B=4, m=4, K=3):
    return budget_rollout(seed, B, m, K, leverage=True)  # some completions cut: a = 0


@pytest.mark.parametrize("scale", ["group", "none"])
def test_leverage_budget_zero_is_removal_and_one_is_oracle_bit_for_bit(scale):
    budgets = {b: ExactBudget(b, "leverage") for b in (0.0, 1.0, 0.3)}
    for it in range(4):  # several rollouts: κ is learned in between
        p, P, mu, R, lev = _rollout(it)
        ref = {sig: route_and_credit(sig, p, P, mu, R, np.random.default_rng(it), scale_rewards=scale)
               for sig in ("removal", "oracle")}
        got = {b: route_and_credit("removal", p, P, mu, R, np.random.default_rng(it), scale_rewards=scale,
                                   budget=eb, budget_rng=np.random.default_rng(99 + it), leverage=lev)
               for b, eb in budgets.items()}
        for b, sig in ((0.0, "removal"), (1.0, "oracle")):
            assert np.array_equal(got[b].scores, ref[sig].scores)
            assert np.array_equal(got[b].advantages, ref[sig].advantages)
        assert got[0.0].exact.z.sum() == 0 and (got[1.0].exact.z == 1).all()
        assert not np.array_equal(got[0.3].scores, ref["removal"].scores)  # the check can fail
        assert (got[0.3].exact.p == 0).any()  # p = 0 is used
        np.testing.assert_array_equal(got[0.3].exact.leverage, lev)
    with pytest.raises(ValueError, match="leverage"):
        budgeted_removal(np.zeros((4, 4), int), R[..., 0], p, P, mu, R, ExactBudget(0.3, "leverage"),
                         np.random.default_rng(0))


def test_leverage_budget_learns_kappa_on_evaluable_slates_and_round_trips():
    b = ExactBudget(0.3, "leverage")
    assert b.floor == 0.0 and ExactBudget(0.3).floor == 0.1
    p, P, mu, R, lev = _rollout(5)
    I = routing.sample_selection(p, np.random.default_rng(0))  # noqa: E741
    G = np.take_along_axis(R, I[..., None], -1)[..., 0]
    _, ex = budgeted_removal(I, G, p, P, mu, R, b, np.random.default_rng(1), leverage=lev)
    live = ex.p.reshape(-1) > 0
    assert not live.all()
    np.testing.assert_allclose(b.proxy_sum, ex.proxy.reshape(-1, 3)[live].sum(0))
    y = routing.removal_contributions(R, p, P)
    z = ex.z.reshape(-1).astype(bool)
    err = ((ex.delta_hat - y).reshape(-1, 3)[z] ** 2 / ex.p.reshape(-1)[z][:, None]).sum(0)
    np.testing.assert_allclose(b.err_sum, err)
    c = ExactBudget(0.9)
    c.load_state_dict(json.loads(json.dumps(b.state_dict())))
    assert c.rule == "leverage" and c.floor == 0.0 and c.evaluations == b.evaluations
    np.testing.assert_array_equal(c.kappa(), b.kappa())
    a, v, cost = lev.reshape(-1, 3), ex.proxy.reshape(-1, 3), np.full(16, 2.0)
    np.testing.assert_array_equal(c.probabilities(a, v, cost), b.probabilities(a, v, cost))


def test_simulated_pool_leverage_budget_zero_is_removal_one_is_oracle_and_uses_exact_norms():
    from dataclasses import replace

    from mcpg.grpo import simulated as sim
    from mcpg.grpo.simulated.loop import score_norms

    cfg = sim.SimConfig(updates=4, eval_every=2, prompts_per_update=8, eval_questions=50,
                        allocation="leverage")
    seeds = [0, 1]
    rem, orc = sim.train_pool(cfg, "removal", seeds), sim.train_pool(cfg, "oracle", seeds)
    b1 = sim.train_pool(replace(cfg, exact_budget=1.0), "removal", seeds)
    b3 = sim.train_pool(replace(cfg, exact_budget=0.3), "removal", seeds)
    assert np.array_equal(b1.logits, orc.logits) and np.array_equal(b1.router, orc.router)
    np.testing.assert_array_equal(b1.exact["evaluations"], b1.exact["slates"])
    assert not np.array_equal(b3.logits, rem.logits) and not np.array_equal(b3.logits, orc.logits)
    # ‖e_a − π‖ by hand, against the closed form of score_norms
    pi = np.array([[[0.7, 0.2, 0.1]]])  # (B=1, K=1, M=3)
    actions = np.array([[[0], [2]]])  # (B=1, m=2, K=1)
    want = [np.linalg.norm(np.eye(3)[a] - pi[0, 0]) for a in (0, 2)]
    np.testing.assert_allclose(score_norms(pi, actions)[0, :, 0], want)
