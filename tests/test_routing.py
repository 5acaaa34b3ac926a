"""Tests of mcpg.routing: Eq. (3), leave-one-out propensities, exact and doubly robust removal
contributions (Eq. 19, Corollary 3), winner-take-all scores and the IPW outcome loss."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mcpg import routing as R

finite = st.floats(-5, 5, allow_nan=False, allow_infinity=False)


def test_router_propensities_hand_computed():
    s = np.array([0.0, np.log(3.0)])
    # softmax = [1/4, 3/4]; with eps = 0.2: 0.8 * [.25, .75] + 0.1
    np.testing.assert_allclose(R.router_propensities(s, 1.0, 0.2), [0.3, 0.7])
    # tau = 2 halves the scores: softmax([0, log 3 / 2]) = [1, sqrt 3] / (1 + sqrt 3)
    np.testing.assert_allclose(R.router_propensities(s, 2.0), np.array([1, np.sqrt(3)]) / (1 + np.sqrt(3)))


def test_router_temperature_limits():
    s = np.array([1.0, 2.0, 5.0])
    np.testing.assert_allclose(R.router_propensities(s, 1e6), np.full(3, 1 / 3), atol=1e-5)
    np.testing.assert_allclose(R.router_propensities(s, 1e-3), [0, 0, 1], atol=1e-12)
    np.testing.assert_allclose(R.router_propensities(s, 1e-3, eps=0.3), [0.1, 0.1, 0.8], atol=1e-12)


@settings(max_examples=100, deadline=None)
@given(arrays(float, st.tuples(st.integers(1, 3), st.integers(2, 5)), elements=finite),
       st.floats(0.05, 10), st.floats(0, 1))
def test_propensities_are_distributions_with_overlap(s, tau, eps):
    p = R.router_propensities(s, tau, eps)
    np.testing.assert_allclose(p.sum(-1), 1.0)
    assert (p >= eps / s.shape[-1] - 1e-12).all()
    # monotone in the score
    order = np.argsort(s, axis=-1)
    assert (np.diff(np.take_along_axis(p, order, -1), axis=-1) >= -1e-12).all()


@settings(max_examples=100, deadline=None)
@given(arrays(float, st.integers(2, 5), elements=finite), st.floats(0.1, 5), st.floats(0, 1))
def test_leave_one_out_is_eq3_on_reduced_slate(s, tau, eps):
    K = len(s)
    P = R.leave_one_out_propensities(s, tau, eps)
    assert P.shape == (K, K)
    for i in range(K):
        keep = [j for j in range(K) if j != i]
        np.testing.assert_allclose(P[i, keep], R.router_propensities(s[keep], tau, eps), atol=1e-12)
        assert P[i, i] == 0.0


def test_removal_contributions_hand_computed():
    g = np.array([1.0, 0.0])
    p = np.array([0.5, 0.5])
    P = np.array([[0.0, 1.0], [1.0, 0.0]])
    # deleting the correct candidate loses 0.5; deleting the wrong one gains 0.5
    np.testing.assert_allclose(R.removal_contributions(g, p, P), [0.5, -0.5])


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 4), st.floats(0.2, 3), st.floats(0.01, 1), st.integers(0, 2**31 - 1))
def test_dr_removal_unbiased_in_exact_expectation(K, tau, eps, seed):
    """Corollary 3: averaging Eq. (19) over I ~ p (and over R^(I) given its mean) gives Delta^rem."""
    rng = np.random.default_rng(seed)
    s, g, mu = rng.normal(size=K), rng.uniform(size=K), rng.uniform(size=K)
    p, P = R.router_propensities(s, tau, eps), R.leave_one_out_propensities(s, tau, eps)
    exact = R.removal_contributions(g, p, P)
    # enumerate I and the Bernoulli reward of the selected candidate
    sel = np.repeat(np.arange(K), 2)
    reward = np.tile([0.0, 1.0], K)
    weight = p[sel] * np.where(reward == 1.0, g[sel], 1 - g[sel])
    est = R.dr_removal_contributions(sel, reward, np.tile(p, (2 * K, 1)), np.tile(P, (2 * K, 1, 1)),
                                     np.tile(mu, (2 * K, 1)))
    np.testing.assert_allclose(weight @ est, exact, atol=1e-10)


def test_dr_with_perfect_outcome_model_is_exact_whatever_is_selected():
    rng = np.random.default_rng(0)
    s, g = rng.normal(size=3), np.array([0.2, 0.9, 0.5])
    p, P = R.router_propensities(s, 1.0, 0.1), R.leave_one_out_propensities(s, 1.0, 0.1)
    for i in range(3):
        est = R.dr_removal_contributions(np.array(i), np.array(g[i]), p, P, g)
        np.testing.assert_allclose(est, R.removal_contributions(g, p, P))


def test_winner_take_all_scores():
    sc = R.winner_take_all_scores(np.array([0, 2]), np.array([1.0, 0.5]), 3)
    np.testing.assert_array_equal(sc, [[1, 0, 0], [0, 0, 0.5]])


def test_routing_entropy_and_sampling():
    np.testing.assert_allclose(R.routing_entropy(np.full(4, 0.25)), np.log(4))
    np.testing.assert_allclose(R.routing_entropy(np.array([1.0, 0.0])), 0.0)
    rng = np.random.default_rng(1)
    p = np.array([0.1, 0.6, 0.3])
    draws = R.sample_selection(np.tile(p, (200_000, 1)), rng)
    freq = np.bincount(draws, minlength=3) / len(draws)
    # 5 standard errors of a proportion with n = 200 000
    assert np.all(np.abs(freq - p) < 5 * np.sqrt(p * (1 - p) / len(draws)))


def test_ipw_outcome_loss_minimiser_is_candidate_mean():
    """Minimising the IPW loss over per-candidate logits recovers g_j for every candidate,
    including the rarely selected one; the unweighted loss does not when selection depends on R."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n, g = 20_000, np.array([0.8, 0.3])
    p = np.array([0.9, 0.1])
    sel = rng.choice(2, size=n, p=p)
    reward = (rng.random(n) < g[sel]).astype(float)
    logit = torch.zeros(2, requires_grad=True)
    opt = torch.optim.Adam([logit], lr=0.05)
    P = torch.tensor(np.tile(p, (n, 1)), dtype=torch.float32)
    for _ in range(600):
        opt.zero_grad()
        reward_t = torch.tensor(reward, dtype=torch.float32)
        loss = R.ipw_outcome_loss(logit.expand(n, 2), torch.tensor(sel), reward_t, P)
        loss.backward()
        opt.step()
    np.testing.assert_allclose(torch.sigmoid(logit).detach().numpy(), g, atol=0.03)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: R.router_propensities([1.0, np.nan]), "scores"),
        (lambda: R.router_propensities([1.0, 2.0], tau=0.0), "tau"),
        (lambda: R.router_propensities([1.0, 2.0], eps=1.5), "eps"),
        (lambda: R.leave_one_out_propensities([]), "scores"),
        (lambda: R.removal_contributions([1.0, 0.0], [0.5, 0.5, 0.0], np.zeros((3, 3))), "g"),
        (lambda: R.dr_removal_contributions(0, 1.0, [0.0, 1.0], np.zeros((2, 2)), [0.5, 0.5]), "p"),
        (lambda: R.dr_removal_contributions(0, 1.0, [0.5, 0.5], np.zeros((2, 2)), [0.5]), "mu_hat"),
        (lambda: R.dr_removal_contributions(3, 1.0, [0.5, 0.5], np.zeros((2, 2)), [0.5, 0.5]), "selected"),
        (lambda: R.dr_removal_contributions(0, np.nan, [0.5, 0.5], np.zeros((2, 2)), [0.5, 0.5]), "reward"),
        (lambda: R.winner_take_all_scores([0], [1.0], 0), "K"),
        (lambda: R.ipw_outcome_loss(torch.zeros(1, 2), torch.tensor([0]), torch.tensor([1.0]),
                                    torch.tensor([[0.0, 1.0]])), "p"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_leave_one_out_one_candidate_is_the_empty_slate():
    # K = 1: deleting the only candidate leaves an empty slate, which deploys nothing,
    # so the removal contribution of the single candidate is its whole value p g = g.
    s = np.array([[0.3], [-2.0]])
    P = R.leave_one_out_propensities(s, 1.0, 0.1)
    assert P.shape == (2, 1, 1) and not P.any()
    p = R.router_propensities(s, 1.0, 0.1)
    np.testing.assert_allclose(R.removal_contributions([[0.7], [0.2]], p, P), [[0.7], [0.2]])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 4), st.floats(0.2, 3), st.floats(0, 1), st.integers(0, 2**31 - 1))
def test_rerun_slates_draws_from_the_reduced_slate(K, tau, eps, seed):
    """A rerun deploys from the router of Eq. (3) on the present candidates only: its mean is
    sum_j p_j g_j on the physically reduced array (an independent path), 0 for the empty slate."""
    rng = np.random.default_rng(seed)
    s, g = rng.normal(size=K), rng.uniform(size=K)
    present = rng.random(K) < 0.6
    n = 40_000
    G = R.rerun_slates(s, g, present, rng, tau, eps, n=n)
    assert G.shape == (n,)
    if not present.any():
        assert (G == 0).all()
        return
    p_T = R.router_propensities(s[present], tau, eps)
    exact = p_T @ g[present]
    sd = np.sqrt(p_T @ (g[present] - exact) ** 2)  # the draw's exact standard deviation
    assert abs(G.mean() - exact) <= 5 * sd / np.sqrt(n) + 1e-12  # 5 standard errors
    assert np.isin(G, g[present]).all()  # only present candidates are ever deployed


def test_rerun_slates_fails_a_wrong_slate_and_draws_bernoulli():
    rng = np.random.default_rng(3)
    s, g = np.array([0.0, 1.0, 2.0]), np.array([0.9, 0.5, 0.1])
    n = 100_000
    G = R.rerun_slates(s, g, np.broadcast_to([True, True, False], (n, 3)), rng, 0.5, 0.1)
    right = R.router_propensities(s[:2], 0.5, 0.1) @ g[:2]
    # the -inf shortcut's value on the full slate is far from the reduced slate's: the test can fail
    wrong = R.router_propensities(s, 0.5, 0.1) @ g
    se = G.std() / np.sqrt(n)
    assert abs(G.mean() - right) < 5 * se < abs(G.mean() - wrong)
    B = R.rerun_slates(s, g, np.broadcast_to([True, True, False], (n, 3)), rng, 0.5, 0.1, noise="bernoulli")
    assert set(np.unique(B)) <= {0.0, 1.0}
    assert abs(B.mean() - right) < 5 * B.std() / np.sqrt(n)
    # n draws of each of two slates at once: the same law as n broadcast single draws
    both = R.rerun_slates(s, g, [[True, True, False], [False, False, True]], rng, 0.5, 0.1, n=n)
    assert both.shape == (n, 2) and (both[:, 1] == g[2]).all()
    assert abs(both[:, 0].mean() - right) < 5 * se
    with pytest.raises(ValueError, match="n must"):
        R.rerun_slates(s, g, [True, True, True], rng, n=0)
    with pytest.raises(ValueError, match="noise"):
        R.rerun_slates(s, g, [True, True, True], rng, noise="gaussian")
    with pytest.raises(ValueError, match="broadcast"):
        R.rerun_slates(s, g, [True, False], rng)


@given(st.integers(2, 5), st.floats(0.2, 3), st.floats(0, 1), st.floats(0.01, 4), st.integers(0, 2**31 - 1))
def test_a_wrong_candidate_only_gets_in_the_way(K, tau, eps, lift, seed):
    # Eq. (3) with its leave-one-out slates: deleting a candidate raises every other's propensity,
    # so a wrong candidate's exact removal contribution is never positive, and the more the router
    # believes it (a higher score, others fixed), the more the slate loses to it. Chapter 8 reads
    # this on the LLM slates: among wrong answers, removal's credit falls with the outcome model.
    rng = np.random.default_rng(seed)
    s = rng.normal(size=K)
    g = (rng.random(K) < 0.5).astype(float)
    i = int(rng.integers(K))
    g[i] = 0.0

    def delta(scores):
        p = R.router_propensities(scores, tau, eps)
        return R.removal_contributions(g, p, R.leave_one_out_propensities(scores, tau, eps))[i]

    assert delta(s) <= 1e-12
    higher = s.copy()
    higher[i] += lift
    assert delta(higher) <= delta(s) + 1e-12
    if g.any() and eps < 1:  # a right candidate to get in the way of, and a router that listens
        assert delta(higher) < delta(s)
