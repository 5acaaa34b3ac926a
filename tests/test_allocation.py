"""Tests of mcpg.allocation: Theorems 2 and 3 and the corrected estimate, Eq. (21) (paper §7)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mcpg import allocation
from mcpg.allocation import (
    allocation_risk,
    corrected_contribution,
    neyman_allocation,
    proportional_allocation,
    risk_lower_bound,
    simulate_corrected_risk,
    uniform_allocation,
)

SETTINGS = settings(max_examples=100, deadline=None)
positive = st.floats(1e-3, 10)  # away from underflow: the mathematics, not float edge cases
nonneg = st.just(0.0) | positive
positive_cost = st.floats(0.1, 10)


@st.composite
def problems(draw, min_m=1, max_m=20, values=nonneg, max_fraction=1.5):
    """(a, sigma2, eta2, cost, budget) with the budget a fraction of the total cost."""
    m = draw(st.integers(min_m, max_m))
    arrays = [np.array(draw(st.lists(values, min_size=m, max_size=m))) for _ in range(3)]
    cost = np.array(draw(st.lists(positive_cost, min_size=m, max_size=m)))
    budget = draw(st.floats(0.01, max_fraction)) * cost.sum()
    return (*arrays, cost, budget)


# --- hand-worked cases -------------------------------------------------------------------


def test_neyman_two_entries_by_hand():
    # a √(σ²+η²) / √c = 2, 1; p = t·(2, 1) with 3t = C = 1.
    a, sigma2, eta2, cost = [1.0, 1.0], [3.0, 0.5], [1.0, 0.5], [1.0, 1.0]
    p = neyman_allocation(a, sigma2, eta2, cost, 1.0)
    np.testing.assert_allclose(p, [2 / 3, 1 / 3])
    # R = 4/(2/3) − 1 + 1/(1/3) − 0.5 = 7.5 = (2 + 1)²/1 − 1.5
    assert allocation_risk(p, a, sigma2, eta2) == pytest.approx(7.5)
    assert risk_lower_bound(a, sigma2, eta2, cost, 1.0) == pytest.approx(7.5)


def test_neyman_saturates_the_heaviest_entry():
    # Unconstrained p ∝ (10, 1, 1) would exceed 1 for the first entry: it saturates,
    # the remaining budget C_U = 1 is split evenly. Risk = 100·1 + (1 + 1)²/1 = 104 (η = 0).
    a, sigma2, eta2, cost = [10.0, 1.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 1.0, 1.0]
    p = neyman_allocation(a, sigma2, eta2, cost, 2.0)
    np.testing.assert_allclose(p, [1.0, 0.5, 0.5])
    assert risk_lower_bound(a, sigma2, eta2, cost, 2.0) == pytest.approx(104.0)
    assert allocation_risk(p, a, sigma2, eta2) == pytest.approx(104.0)


def test_cost_enters_as_square_root():
    # Equal a, σ², η²; costs 1 and 4: p ∝ 1/√c = (1, 1/2); budget 1 = t + 4·t/2 → t = 1/3.
    p = neyman_allocation([1, 1], [1, 1], [0, 0], [1, 4], 1.0)
    np.testing.assert_allclose(p, [1 / 3, 1 / 6])


def test_everything_fits_in_the_budget():
    p = neyman_allocation([1, 2, 0], [1, 1, 1], [0, 1, 0], [1, 1, 5], 2.0)
    np.testing.assert_array_equal(p, [1.0, 1.0, 0.0])  # the zero-weight entry costs nothing
    # At p = 1 the risk is Σ a²σ² (exact evaluation everywhere).
    assert allocation_risk(p, [1, 2, 0], [1, 1, 1], [0, 1, 0]) == pytest.approx(5.0)
    assert risk_lower_bound([1, 2, 0], [1, 1, 1], [0, 1, 0], [1, 1, 5], 2.0) == pytest.approx(5.0)


def test_zero_weight_entries_get_zero_and_cost_nothing():
    a, sigma2, eta2 = [0.0, 1.0, 3.0, 1.0], [1.0, 0.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]
    cost = [1.0] * 4
    p = neyman_allocation(a, sigma2, eta2, cost, 1.0)
    assert p[0] == 0.0 and p[1] == 0.0
    assert (p * np.asarray(cost)).sum() == pytest.approx(1.0, rel=1e-12)
    np.testing.assert_allclose(p[2:], [0.75, 0.25])


def test_free_entries_are_always_evaluated():
    p = neyman_allocation([1.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0], 0.5)
    np.testing.assert_array_equal(p, [1.0, 0.5, 0.0])


def test_zero_budget():
    p = neyman_allocation([1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0], 0.0)
    np.testing.assert_array_equal(p, [0.0, 0.0])
    assert allocation_risk(p, [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]) == np.inf
    assert risk_lower_bound([1.0, 1.0], [1.0, 1.0], [0.0, 0.0], [1.0, 1.0], 0.0) == np.inf


def test_allocation_risk_zero_weight_cases():
    # a²(σ²+η²) = 0 at p = 0 is defined as 0; positive weight at p = 0 is infinite risk.
    assert allocation_risk([0.0, 0.5], [0.0, 1.0], [1.0, 1.0], [1.0, 0.0]) == pytest.approx(2.0)
    assert allocation_risk([0.0, 1.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]) == 0.0
    assert allocation_risk([0.0, 1.0], [1.0, 1.0], [1.0, 1.0], [0.0, 0.0]) == np.inf


def test_uniform_and_proportional_allocations():
    cost = np.array([1.0, 2.0, 3.0])
    np.testing.assert_allclose(uniform_allocation(cost, 3.0), [0.5, 0.5, 0.5])
    np.testing.assert_array_equal(uniform_allocation(cost, 10.0), [1.0, 1.0, 1.0])
    # p ∝ (4, 1, 1) capped at 1: first saturates, remaining budget 2 over costs 2 and 3.
    p = proportional_allocation([4.0, 1.0, 1.0], cost, 3.0)
    np.testing.assert_allclose(p, [1.0, 0.4, 0.4])
    np.testing.assert_allclose(proportional_allocation(cost, cost, 1.4), [0.1, 0.2, 0.3])


def test_shapes_are_kept():
    shape = (2, 3)
    ones = np.ones(shape)
    p = neyman_allocation(ones, ones, ones, ones, 3.0)
    assert p.shape == shape
    np.testing.assert_allclose(p, 0.5)


# --- Theorems 2 and 3 as properties -----------------------------------------------------


@SETTINGS
@given(problem=problems())
def test_neyman_meets_kkt_conditions(problem):
    a, sigma2, eta2, cost, budget = problem
    p = neyman_allocation(*problem)
    w2 = a**2 * (sigma2 + eta2)
    pos = w2 > 0
    assert np.all((p >= 0) & (p <= 1))
    assert np.all(p[~pos] == 0) and np.all(p[pos] > 0)
    spent = (p * cost).sum()
    if cost[pos].sum() <= budget:
        assert np.all(p[pos] == 1)
    else:  # the budget binds exactly
        assert spent == pytest.approx(budget, rel=1e-9)
    # Stationarity: a²(σ²+η²)/(p² c) = ν on the interior, ≥ ν on entries at 1.
    ratio = w2[pos] / (p[pos] ** 2 * cost[pos])
    interior = p[pos] < 1
    if interior.any():
        nu = ratio[interior]
        np.testing.assert_allclose(nu, nu[0], rtol=1e-9)
        assert np.all(ratio[~interior] >= nu[0] * (1 - 1e-9))


@SETTINGS
@given(problem=problems(), seed=st.integers(0, 2**32))
def test_neyman_beats_random_feasible_allocations_and_attains_the_bound(problem, seed):
    a, sigma2, eta2, cost, budget = problem
    p = neyman_allocation(*problem)
    best = allocation_risk(p, a, sigma2, eta2)
    bound = risk_lower_bound(*problem)
    assert best == pytest.approx(bound, rel=1e-9, abs=1e-9)
    rng = np.random.default_rng(seed)
    candidates = [uniform_allocation(cost, budget), proportional_allocation(cost, cost, budget)]
    for _ in range(10):  # random p in (0, 1], scaled (and capped) to the same expected cost
        candidates.append(proportional_allocation(rng.uniform(1e-3, 1, a.size), cost, budget))
    for q in candidates:
        assert (q * cost).sum() <= budget * (1 + 1e-9)
        assert allocation_risk(q, a, sigma2, eta2) >= bound * (1 - 1e-9) - 1e-9


@SETTINGS
@given(
    problem=problems(min_m=2, max_m=8, values=positive, max_fraction=0.3),
    seed=st.integers(0, 2**32),
)
def test_small_perturbations_of_neyman_do_not_help(problem, seed):
    # Move budget between two interior entries: the risk cannot go down (first-order optimal).
    a, sigma2, eta2, cost, budget = problem
    p = neyman_allocation(*problem)
    inner = np.flatnonzero((p > 0) & (p < 1))
    assume(inner.size >= 2)
    i, j = np.random.default_rng(seed).choice(inner, 2, replace=False)
    eps = 1e-3 * min(p[i], 1 - p[j]) * cost[i]
    q = p.copy()
    q[i] -= eps / cost[i]
    q[j] += eps / cost[j]
    assert allocation_risk(q, a, sigma2, eta2) >= allocation_risk(p, a, sigma2, eta2) * (1 - 1e-12)


# --- the corrected estimate, Eq. (21) ---------------------------------------------------


@SETTINGS
@given(
    delta_hat=st.floats(-10, 10),
    y=st.floats(-10, 10),
    p=st.floats(0.01, 1),
)
def test_corrected_contribution_exact_expectation_over_z(delta_hat, y, p):
    # E_Z[Δ̃] = p·(Δ̂ + (y − Δ̂)/p) + (1 − p)·Δ̂ = y exactly, for any fixed y.
    ran = corrected_contribution(delta_hat, y, 1, p)
    skipped = corrected_contribution(delta_hat, y, 0, p)
    assert skipped == delta_hat
    assert p * ran + (1 - p) * skipped == pytest.approx(y, abs=1e-9)


def test_corrected_contribution_unbiased_with_the_predicted_variance():
    rng = np.random.default_rng(12345)
    delta = np.array([0.0, 1.0, -2.0, 0.5])
    delta_hat = np.array([0.5, 1.0, -1.0, 3.0])
    sigma2 = np.array([1.0, 0.25, 0.0, 2.0])
    p = np.array([0.5, 0.1, 0.9, 1.0])
    n = 400_000
    z = rng.random((n, 4)) < p
    y = delta + np.sqrt(sigma2) * rng.standard_normal((n, 4))
    tilde = corrected_contribution(delta_hat, y, z, p)
    # Unbiased within 5 standard errors, entry by entry.
    se = tilde.std(axis=0, ddof=1) / np.sqrt(n)
    assert np.all(np.abs(tilde.mean(axis=0) - delta) <= 5 * se)
    # Mean squared error (σ² + η²)/p − η², within 5 standard errors.
    eta2 = (delta_hat - delta) ** 2
    sq = (tilde - delta) ** 2
    predicted = (sigma2 + eta2) / p - eta2
    assert np.all(np.abs(sq.mean(axis=0) - predicted) <= 5 * sq.std(axis=0, ddof=1) / np.sqrt(n))
    for k in range(4):  # the per-entry risk is allocation_risk with a = 1 on that entry
        unit = np.eye(4)[k]
        assert allocation_risk(p, unit, sigma2, eta2) == pytest.approx(predicted[k])


def test_simulated_risk_matches_the_formula():
    rng = np.random.default_rng(7)
    m = 12
    a, sigma2, cost = rng.uniform(0.1, 2, m), rng.uniform(0, 2, m), rng.uniform(0.5, 2, m)
    delta, delta_hat = rng.normal(size=m), rng.normal(size=m)
    eta2 = (delta_hat - delta) ** 2
    budget = 0.3 * cost.sum()
    for p in (neyman_allocation(a, sigma2, eta2, cost, budget), uniform_allocation(cost, budget)):
        risk, se = simulate_corrected_risk(
            p, delta, delta_hat, sigma2, a, 200_000, rng, return_stderr=True
        )
        assert abs(risk - allocation_risk(p, a, sigma2, eta2)) <= 5 * se
    assert isinstance(simulate_corrected_risk(p, delta, delta_hat, sigma2, a, 10, 0), float)


def test_corrected_contribution_ignores_y_where_not_run_and_broadcasts():
    out = corrected_contribution([1.0, 2.0], [0.0, 5.0], [0, 1], 0.5)
    np.testing.assert_array_equal(out, [1.0, 2.0 + 2 * 3.0])
    # p = 0 is allowed where the evaluation did not run.
    np.testing.assert_array_equal(corrected_contribution([1.0], [7.0], [0], [0.0]), [1.0])


# --- bad input ---------------------------------------------------------------------------


def test_bad_budget_and_cost():
    ok = dict(a=[1.0], sigma2=[1.0], eta2=[1.0], cost=[1.0], budget=1.0)
    with pytest.raises(ValueError, match="budget must be non-negative"):
        neyman_allocation(**{**ok, "budget": -1.0})
    with pytest.raises(ValueError, match="budget contains NaN"):
        neyman_allocation(**{**ok, "budget": np.nan})
    with pytest.raises(ValueError, match="budget must be a scalar"):
        neyman_allocation(**{**ok, "budget": [1.0, 2.0]})
    with pytest.raises(ValueError, match="cost must be non-negative"):
        neyman_allocation(**{**ok, "cost": [-1.0]})
    with pytest.raises(ValueError, match="budget"):
        risk_lower_bound(**{**ok, "budget": -1.0})
    with pytest.raises(ValueError, match="budget"):
        uniform_allocation([1.0], -2.0)
    with pytest.raises(ValueError, match="cost"):
        proportional_allocation([1.0], [-1.0], 1.0)
    with pytest.raises(ValueError, match="weights"):
        proportional_allocation([-1.0], [1.0], 1.0)


@pytest.mark.parametrize("name", ["a", "sigma2", "eta2", "cost"])
def test_bad_arrays_are_named(name):
    ok = dict(a=[1.0, 1.0], sigma2=[1.0, 1.0], eta2=[1.0, 1.0], cost=[1.0, 1.0], budget=1.0)
    with pytest.raises(ValueError, match=f"{name} contains NaN"):
        neyman_allocation(**{**ok, name: [np.nan, 1.0]})
    with pytest.raises(ValueError, match=name):
        neyman_allocation(**{**ok, name: [1.0, 1.0, 1.0]})
    with pytest.raises(ValueError, match=f"{name} must be non-negative"):
        neyman_allocation(**{**ok, name: [-1.0, 1.0]})
    with pytest.raises(ValueError, match=f"{name} must be finite"):
        neyman_allocation(**{**ok, name: [np.inf, 1.0]})


def test_bad_risk_inputs():
    with pytest.raises(ValueError, match="p must be at most 1"):
        allocation_risk([1.5], [1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="p must be non-negative"):
        allocation_risk([-0.5], [1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="p has shape"):
        allocation_risk([0.5, 0.5], [1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="eta2"):
        allocation_risk([0.5], [1.0], [1.0], [np.nan])


def test_bad_corrected_contribution_inputs():
    with pytest.raises(ValueError, match="p must be strictly positive"):
        corrected_contribution([1.0], [2.0], [1], [0.0])
    with pytest.raises(ValueError, match="z must be 0 or 1"):
        corrected_contribution([1.0], [2.0], [0.5], [0.5])
    with pytest.raises(ValueError, match="y contains NaN"):
        corrected_contribution([1.0], [np.nan], [0], [0.5])
    with pytest.raises(ValueError, match="delta_hat must be finite"):
        corrected_contribution([np.inf], [1.0], [0], [0.5])
    with pytest.raises(ValueError, match="p must be at most 1"):
        corrected_contribution([1.0], [2.0], [1], [2.0])
    with pytest.raises(ValueError, match="delta_hat, y, z and p must broadcast"):
        corrected_contribution([1.0, 2.0], [1.0, 2.0, 3.0], [0, 1], [0.5, 0.5])


def test_bad_simulation_inputs():
    with pytest.raises(ValueError, match="delta has shape"):
        simulate_corrected_risk([0.5], [0.0, 1.0], [0.0], [1.0], [1.0], 10)
    with pytest.raises(ValueError, match="n_rep"):
        simulate_corrected_risk([0.5], [0.0], [0.0], [1.0], [1.0], 0)


@pytest.mark.parametrize("fraction", [0.03, 0.3, 0.8])
def test_generic_convex_solve_agrees_with_eq22_and_theorem3(fraction):
    # an independent path: SLSQP on the risk, no square-root form, no water-filling
    rng = np.random.default_rng(7)
    n = 60
    a, s2, e2 = rng.uniform(0.1, 1, n), rng.uniform(0, 0.1, n), rng.uniform(0, 0.1, n)
    c = rng.integers(1, 8, n).astype(float)
    C = fraction * c.sum()
    p_cvx, r_cvx = allocation.convex_allocation(a, s2, e2, c, C)
    bound = allocation.risk_lower_bound(a, s2, e2, c, C)
    assert (p_cvx * c).sum() <= C * (1 + 1e-9)
    assert r_cvx >= bound * (1 - 1e-9)  # Theorem 3: nothing feasible beats the bound
    assert r_cvx == pytest.approx(bound, rel=1e-8)  # and the optimum attains it
    np.testing.assert_allclose(p_cvx, allocation.neyman_allocation(a, s2, e2, c, C), atol=1e-4)
    # random feasible allocations (Dirichlet weights spending the whole budget) never beat it either
    for _ in range(200):
        p = allocation.proportional_allocation(rng.dirichlet(np.ones(n)), c, C)
        assert allocation.allocation_risk(p, a, s2, e2) >= bound * (1 - 1e-12)


# --- exact evaluations of slates inside training (chapter 9) ---------------------------------

from itertools import product  # noqa: E402

from mcpg import routing  # noqa: E402
from mcpg.allocation import (  # noqa: E402
    ExactBudget,
    removal_error_proxy,
    slate_allocation,
    slate_entries,
)


def _slates(seed: int, N: int, K: int):
    """N random routed slates of K candidates: p, P, mu_hat, the deployed I, every reward R."""
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(N, K)) * 2
    p = routing.router_propensities(s, eps=0.1)
    P = routing.leave_one_out_propensities(s, eps=0.1)
    mu = 1 / (1 + np.exp(-rng.normal(size=(N, K))))
    R = (rng.random((N, K)) < 0.5).astype(float)
    I = routing.sample_selection(p, rng)  # noqa: E741
    G = R[np.arange(N), I]
    return p, P, mu, I, G, R


@given(st.integers(0, 10_000), st.integers(2, 4))
@SETTINGS
def test_removal_error_proxy_is_the_outcome_models_expected_squared_error(seed, K):
    # Enumerate the unobserved rewards R^(j), j != I, under independent Bernoulli(mu_hat_j):
    # the expectation of (Eq. 19 - exact removal)^2 is the proxy, exactly.
    p, P, mu, I, G, _ = _slates(seed, 3, K)  # noqa: E741
    v = removal_error_proxy(I, G, p, P, mu)
    dhat = routing.dr_removal_contributions(I, G, p, P, mu)
    for n in range(3):
        others = [j for j in range(K) if j != I[n]]
        expect = np.zeros(K)
        for bits in product((0.0, 1.0), repeat=K - 1):
            r = np.empty(K)
            r[I[n]] = G[n]
            r[others] = bits
            w = np.prod([mu[n, j] if b else 1 - mu[n, j] for j, b in zip(others, bits)])
            expect += w * (dhat[n] - routing.removal_contributions(r, p[n], P[n])) ** 2
        np.testing.assert_allclose(v[n], expect, rtol=1e-10, atol=1e-14)


def test_removal_error_proxy_fails_on_a_perturbed_input():
    p, P, mu, I, G, _ = _slates(1, 4, 3)  # noqa: E741
    v = removal_error_proxy(I, G, p, P, mu)
    assert not np.allclose(v, removal_error_proxy(I, 1 - G, p, P, mu))
    with pytest.raises(ValueError):
        removal_error_proxy(I, G, np.zeros_like(p), P, mu)


@given(st.integers(0, 10_000), st.integers(1, 5), st.integers(2, 4),
       st.sampled_from(("sqrt", "uniform", "proportional", "random")))
@SETTINGS
def test_eq21_is_unbiased_on_logged_slates_by_enumerating_z(seed, N, K, rule):
    # One Z per slate, shared by its K agents. Over all 2^N outcomes of Z, weighted by their
    # probabilities, E[Δ̃] = Y (the exact removal contribution) for every agent and slate,
    # whatever the allocation, as long as p > 0; and the risk is that of slate_entries.
    p, P, mu, I, G, R = _slates(seed, N, K)  # noqa: E741
    dhat = routing.dr_removal_contributions(I, G, p, P, mu)
    y = routing.removal_contributions(R, p, P)
    rng = np.random.default_rng(seed)
    a = rng.uniform(0.1, 3.0, size=(N, K))
    if rule == "random":
        q = rng.uniform(0.05, 1.0, size=N)
    else:
        v = removal_error_proxy(I, G, p, P, mu)
        cost = np.full(N, K - 1.0)
        q = slate_allocation(a, np.zeros_like(v), v, cost, 0.4 * cost.sum(), rule=rule, floor=0.1)
    assert (q > 0).all()
    mean, risk, unweighted = np.zeros((N, K)), 0.0, np.zeros((N, K))
    for z in product((0, 1), repeat=N):
        z = np.array(z)
        w = np.prod(np.where(z == 1, q, 1 - q))
        tilde = corrected_contribution(dhat, y, z[:, None], q[:, None])
        mean += w * tilde
        risk += w * np.sum(a**2 * (tilde - y) ** 2)
        unweighted += w * (dhat + z[:, None] * (y - dhat))  # the perturbed estimator: no 1/p
    np.testing.assert_allclose(mean, y, atol=1e-10)
    one, s2, e2 = slate_entries(a, np.zeros((N, K)), (dhat - y) ** 2)
    assert risk == pytest.approx(allocation_risk(q, one, s2, e2), rel=1e-9, abs=1e-12)
    # the same check fails on the perturbed estimator wherever p < 1 and Δ̂ != Y
    off = (q[:, None] < 1) & ~np.isclose(dhat, y)
    assert np.all(np.abs(unweighted - y)[off] > 1e-9)


def test_slate_allocation_spends_the_budget_and_sqrt_attains_theorem3():
    rng = np.random.default_rng(3)
    N, K = 40, 3
    a, eta2 = rng.uniform(0.1, 5, (N, K)), rng.exponential(1.0, (N, K))
    cost = np.full(N, K - 1.0)
    C = 0.1 * cost.sum()
    one, s2, e2 = slate_entries(a, np.zeros_like(eta2), eta2)
    bound = risk_lower_bound(one, s2, e2, cost, C)
    risks = {}
    for rule in ("sqrt", "uniform", "proportional"):
        q = slate_allocation(a, np.zeros_like(eta2), eta2, cost, C, rule=rule)
        assert q @ cost == pytest.approx(C)
        risks[rule] = allocation_risk(q, one, s2, e2)
    assert risks["sqrt"] == pytest.approx(bound, rel=1e-10)
    assert bound < risks["uniform"] and bound < risks["proportional"]
    # the floor: the same budget, every p at least λ C / Σc, and a risk between the two
    qf = slate_allocation(a, np.zeros_like(eta2), eta2, cost, C, rule="sqrt", floor=0.2)
    assert qf @ cost == pytest.approx(C) and qf.min() >= 0.2 * C / cost.sum() - 1e-15
    assert bound <= allocation_risk(qf, one, s2, e2) <= risks["uniform"]
    # the whole budget: every slate evaluated, p exactly 1
    assert (slate_allocation(a, 0 * eta2, eta2, cost, cost.sum(), floor=0.3) == 1.0).all()
    with pytest.raises(ValueError):
        slate_allocation(a, 0 * eta2, eta2, cost, C, rule="best")


def test_corrected_contribution_is_y_exactly_at_p_one():
    dh, y = np.array([0.1, 0.7]), np.array([0.3, -0.2])
    out = corrected_contribution(dh, y, 1, 1.0)
    assert np.array_equal(out, y)  # bit for bit (0.1 + (0.3 - 0.1) would round)
    assert np.array_equal(corrected_contribution(dh, y, 0, 0.5), dh)


def test_exact_budget_learns_kappa_from_evaluations_and_round_trips():
    p, P, mu, I, G, R = _slates(5, 30, 3)  # noqa: E741
    dhat = routing.dr_removal_contributions(I, G, p, P, mu)
    y = routing.removal_contributions(R, p, P)
    v = removal_error_proxy(I, G, p, P, mu)
    b = ExactBudget(0.2)
    a = np.ones_like(v)
    cost = np.full(30, 2.0)
    assert b.kappa() is None
    np.testing.assert_allclose(b.probabilities(a, v, cost), 0.2)  # the pilot: uniform
    z = np.zeros(30, int)
    z[:10] = 1
    q = np.full(30, 0.5)
    b.observe(z, q, dhat, y, v)
    expect = ((dhat[:10] - y[:10]) ** 2 / 0.5).sum(0) / v.sum(0)  # IPW total error / total proxy
    np.testing.assert_allclose(b.kappa(), expect)
    q2 = b.probabilities(a, v, cost)
    assert q2 @ cost == pytest.approx(0.2 * cost.sum()) and not np.allclose(q2, 0.2)
    c = ExactBudget(0.0)
    c.load_state_dict(b.state_dict())
    np.testing.assert_array_equal(c.probabilities(a, v, cost), q2)
    with pytest.raises(ValueError):
        ExactBudget(1.5)
    with pytest.raises(ValueError):
        ExactBudget(0.1, rule="best")
