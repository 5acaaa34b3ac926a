"""Tests of mcpg.mechanisms: exact expectations by enumeration against hand computations,
Theorem 1, Corollary 1, Proposition 4 and the Monte Carlo estimators."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpg import mechanisms as M

seeds = st.integers(0, 2**31 - 1)


def _norm(xs):
    return max(float(np.abs(x).max()) for x in xs)


def test_proposition1_same_law_opposite_credit():
    determines, never = M.proposition1_systems()
    assert M.system_value(determines).item() == pytest.approx(0.5)
    assert M.system_value(never).item() == pytest.approx(0.5)
    # value (2): E[G | H, A^(1)] - E[G | H]
    q1 = M.retention_value(determines, 0b01)[0, :, 0] - M.retention_value(determines, 0)[0, :, 0]
    q2 = M.retention_value(never, 0b01)[0, :, 0] - M.retention_value(never, 0)[0, :, 0]
    np.testing.assert_allclose(q1.numpy(), [-0.5, 0.5])
    np.testing.assert_allclose(q2.numpy(), [0.0, 0.0])


def test_parallel_pool_value_and_gradient_by_hand():
    # one prompt, one agent with two actions, logits (0, log 3): pi = (1/4, 3/4); G = action
    pool = M.ParallelPool(np.array([[[0.0, np.log(3.0)]]]), np.array([[0.0, 1.0]]), noise="fixed")
    assert M.system_value(pool).item() == pytest.approx(0.75)
    # dJ/dtheta = pi * (G - J) = (1/4 (0 - 3/4), 3/4 (1 - 3/4))
    np.testing.assert_allclose(M.system_gradient(pool)[0], [[-3 / 16, 3 / 16]])


def test_routed_pool_reward_is_propensity_weighted_candidate_value():
    pool = M.RoutedPool(np.zeros((2, 1, 2)), np.array([[[1.0, 0.0]], [[1.0, 0.0]]]),
                        np.array([[[1.0, 0.0]], [[1.0, 0.0]]]), tau=1.0, eps=0.0)
    e = np.e
    # joint (a1, a2): both right -> 1; one right with score 1 vs 0 -> e / (1 + e); both wrong -> 0
    expected = np.array([[1.0, e / (1 + e)], [e / (1 + e), 0.0]])
    np.testing.assert_allclose(pool.reward_mean()[0].numpy(), expected)
    assert M.system_value(pool).item() == pytest.approx(expected.mean())


@settings(max_examples=25, deadline=None)
@given(seeds, st.integers(2, 3), st.floats(0.2, 3.0), st.floats(0.0, 0.5))
def test_theorem1_exact(seed, K, tau, eps):
    """E[1{I=i} Psi_i G] = grad U_i and grad J_sys = grad U_i + E[Psi_i D_i]."""
    pool = M.random_routed_pool(np.random.default_rng(seed), K=K, tau=tau, eps=eps)
    gJ, gU, b = M.system_gradient(pool), M.private_utility_gradients(pool), M.winner_take_all_bias(pool)
    for i in range(K):
        wta = M.score_expectation(pool, pool.winner_return(i))[i]
        np.testing.assert_allclose(wta, gU[i], atol=1e-12)
        np.testing.assert_allclose(gJ[i], gU[i] + b[i], atol=1e-12)
    assert np.isclose(M.private_utilities(pool).sum().item(), M.system_value(pool).item())


@settings(max_examples=25, deadline=None)
@given(seeds, st.floats(0.2, 3.0), st.floats(0.0, 0.5))
def test_theorem1_candidate_blind_router_has_no_bias(seed, tau, eps):
    pool = M.random_routed_pool(np.random.default_rng(seed), K=3, tau=tau, eps=eps, blind=True)
    assert pool.candidate_blind
    assert _norm(M.winner_take_all_bias(pool)) < 1e-12
    np.testing.assert_allclose(M.winner_take_all_cosines(pool), 1.0, atol=1e-9)


@settings(max_examples=15, deadline=None)
@given(seeds, st.floats(0.2, 3.0), st.floats(0.0, 0.5))
def test_winner_take_all_cosines(seed, tau, eps):
    """cos(∇U_i, ∇J) from ∇J = ∇U_i + b_i: ⟨u, u + b⟩ / (‖u‖ ‖u + b‖), per agent."""
    pool = M.random_routed_pool(np.random.default_rng(seed), K=3, tau=tau, eps=eps)
    gU, b = M.private_utility_gradients(pool), M.winner_take_all_bias(pool)
    want = [np.vdot(u, u + c) / np.linalg.norm(u) / np.linalg.norm(u + c) for u, c in zip(gU, b)]
    np.testing.assert_allclose(M.winner_take_all_cosines(pool), want, atol=1e-12)
    assert (np.abs(M.winner_take_all_cosines(pool)) <= 1 + 1e-12).all()



@settings(max_examples=10, deadline=None)
@given(seeds, st.floats(0.2, 3.0), st.floats(0.0, 0.5))
def test_theorem1_by_finite_differences(seed, tau, eps):
    """Theorem 1 on a path that shares nothing with autograd or the score sums: central
    differences of the exact U_i and J_sys match E[1{I=i} Psi_i G] and E[Psi_i G]."""
    pool = M.random_routed_pool(np.random.default_rng(seed), K=3, tau=tau, eps=eps)
    fd_U = M.finite_difference_gradients(pool, M.private_utilities)
    fd_J = M.finite_difference_gradients(pool, M.system_value)
    for i in range(3):
        wta = M.score_expectation(pool, pool.winner_return(i))[i]
        np.testing.assert_allclose(fd_U[i], wta, atol=1e-8)
        np.testing.assert_allclose(fd_J[i], M.score_expectation(pool, pool.reward_mean())[i], atol=1e-8)
    # the parameters are restored, and a value that ignores theta has zero gradient
    np.testing.assert_allclose(M.system_gradient(pool)[0], fd_J[0], atol=1e-8)
    flat = M.finite_difference_gradients(pool, lambda p: torch.tensor(1.0))
    assert max(np.abs(g).max() for g in flat) == 0.0


def test_finite_differences_see_a_wrong_score():
    """The check can fail: a score table for the wrong agent is caught."""
    pool = M.random_routed_pool(np.random.default_rng(4), K=3, tau=0.3, eps=0.1)
    fd_U = M.finite_difference_gradients(pool, M.private_utilities)
    wrong = M.score_expectation(pool, pool.winner_return(1))[0]  # agent 2's share, agent 1's score
    assert np.abs(fd_U[0] - wrong).max() > 1e-3
    with pytest.raises(ValueError, match="step"):
        M.finite_difference_gradients(pool, M.system_value, step=0.0)


@pytest.mark.parametrize("blind", [False, True])
def test_theorem1_table_columns_are_the_quantities_they_name(blind):
    pool = M.random_routed_pool(np.random.default_rng(5), K=3, tau=0.4, eps=0.1, blind=blind)
    table = M.theorem1_table(pool)
    assert table.agent.tolist() == [1, 2, 3]
    assert table[["WTA − ∇U_i", "∇J − ∇U_i − b_i"]].to_numpy().max() < 1e-12
    assert 0 < table["FD − WTA"].max() < 1e-8  # the differencing error: small, not zero
    np.testing.assert_allclose(table["‖b_i‖"], [np.linalg.norm(b) for b in M.winner_take_all_bias(pool)])
    fd_J = M.finite_difference_gradients(pool, M.system_value)
    np.testing.assert_allclose(table["‖∇_θi J‖"], [np.linalg.norm(g) for g in fd_J], rtol=1e-6)
    # Theorem 1's candidate-blind case, and a reading router's bias of the gradient's size
    assert (table["‖b_i‖"].max() < 1e-12) if blind else (table["‖b_i‖"].min() > 1e-3)


def test_exact_gradient_ascent_follows_the_named_gradient():
    pool = M.random_routed_pool(np.random.default_rng(6), K=3, tau=0.3, eps=0.1)
    before = [t.detach().clone() for t in pool.params]
    sys_run = M.exact_gradient_ascent(pool, "system", steps=40, lr=0.1)
    wta_run = M.exact_gradient_ascent(pool, "wta", steps=40, lr=0.1)
    assert all(torch.equal(a, b) for a, b in zip(before, pool.params))  # pool untouched
    assert sys_run[0] == wta_run[0] == pytest.approx(M.system_value(pool).item())
    assert (np.diff(sys_run) > 0).all()  # small steps along ∇J raise J at every step
    # one step by hand: J at θ + lr ∇U
    theta = np.stack([t.detach().numpy() for t in pool.params]) + 0.1 * np.stack(
        M.private_utility_gradients(pool))
    moved = M.RoutedPool(theta, pool.candidate_reward, pool.router_scores, tau=pool.tau, eps=pool.eps)
    assert wta_run[1] == pytest.approx(M.system_value(moved).item(), abs=1e-14)
    assert np.abs(wta_run - sys_run).max() > 1e-4  # a reading router: the two runs part
    # a candidate-blind router has b_i = 0, so both credits give the same run
    blind = M.random_routed_pool(np.random.default_rng(6), K=3, tau=0.3, eps=0.1, blind=True)
    np.testing.assert_allclose(M.exact_gradient_ascent(blind, "wta", steps=20),
                               M.exact_gradient_ascent(blind, "system", steps=20), atol=1e-12)
    for kw, name in (({"credit": "J"}, "credit"), ({"credit": "wta", "steps": 0}, "steps"),
                     ({"credit": "wta", "lr": -1.0}, "lr")):
        with pytest.raises(ValueError, match=name):
            M.exact_gradient_ascent(pool, **kw)


def test_candidate_reading_router_is_biased():
    pool = M.random_routed_pool(np.random.default_rng(3), K=3, tau=0.3, eps=0.0)
    assert _norm(M.winner_take_all_bias(pool)) > 1e-3


@settings(max_examples=20, deadline=None)
@given(seeds, st.sampled_from(["bernoulli", "fixed"]))
def test_corollary1_and_proposition4_on_random_pools(seed, noise):
    pool = M.random_routed_pool(np.random.default_rng(seed), K=3, noise=noise)
    gJ, G = M.system_gradient(pool), pool.reward_mean()
    var = {}
    for S in range(8):
        e = M.score_expectation(pool, G - M.retention_value(pool, S))
        for i in range(3):
            if not (S >> i) & 1:
                np.testing.assert_allclose(e[i], gJ[i], atol=1e-12)
        var[S] = M.expected_conditional_variance(pool, S)
    for S in range(8):
        for T in range(8):
            if S & T == S:  # S subset of T
                assert var[T] <= var[S] + 1e-12


def test_retention_value_marginalises_by_hand():
    # two agents, uniform policies, G = a1 * a2: q({1}) = a1 / 2, q(empty) = 1/4
    pool = M.ParallelPool(np.zeros((2, 1, 2)), np.array([[[0.0, 0.0], [0.0, 1.0]]]), noise="fixed")
    np.testing.assert_allclose(M.retention_value(pool, 0b01)[0, :, 0].numpy(), [0.0, 0.5])
    np.testing.assert_allclose(M.retention_value(pool, 0)[0, 0, 0].item(), 0.25)
    v = M.valuation_at(M.retention_values(pool), 0, [1, 1])
    np.testing.assert_allclose(v, [0.0, 0.25, 0.25, 0.75])


def test_pipeline_removal_undefined_with_a_gap_and_corollary1():
    rng = np.random.default_rng(0)
    pl = M.Pipeline([rng.normal(size=(2, 3)), rng.normal(size=(2, 3, 3)), rng.normal(size=(2, 3, 3))],
                    rng.uniform(size=(2, 3, 3, 3)),
                    prefix_rewards=[rng.uniform(size=(2, 3)), rng.uniform(size=(2, 3, 3))])
    q_rem = M.removal_values(pl)
    defined = [S for S in range(8) if not torch.isnan(q_rem[S]).any()]
    assert defined == [0b000, 0b001, 0b011, 0b111]
    assert not torch.isnan(M.retention_values(pl)).any()
    gJ = M.system_gradient(pl)
    for i in range(3):
        H = sum(1 << k for k in pl.history_agents(i))
        e = M.score_expectation(pl, pl.reward_mean() - M.retention_value(pl, H))
        np.testing.assert_allclose(e[i], gJ[i], atol=1e-12)


def test_score_function_estimates_cover_exact_gradients():
    """Monte Carlo with n = 200 000: E[Psi G] and E[1{I=i} Psi_i G] within 5 standard errors
    of grad J_sys and grad U_i (a 5-sigma band per component: failure probability ~ 1e-5 each)."""
    rng = np.random.default_rng(11)
    pool = M.random_routed_pool(rng, K=3, tau=0.5, eps=0.1)
    s = pool.sample(200_000, rng)
    gJ, gU = M.system_gradient(pool), M.private_utility_gradients(pool)
    wta = np.stack([(s.selected == i) * s.reward for i in range(3)], axis=1)
    for i, ((m1, se1), (m2, se2)) in enumerate(zip(M.score_function_estimate(pool, s, s.reward),
                                                   M.score_function_estimate(pool, s, wta))):
        assert np.all(np.abs(m1 - gJ[i]) <= 5 * se1 + 1e-12)
        assert np.all(np.abs(m2 - gU[i]) <= 5 * se2 + 1e-12)


def test_samples_follow_the_joint_law():
    rng = np.random.default_rng(5)
    pool = M.random_routed_pool(rng, K=2, n_prompts=2, n_actions=2)
    s = pool.sample(100_000, rng)
    P = pool.joint_prob().detach().numpy()
    counts = np.zeros_like(P)
    np.add.at(counts, s.index(), 1)
    freq = counts / len(s)
    assert np.all(np.abs(freq - P) < 5 * np.sqrt(P * (1 - P) / len(s)))
    assert abs(s.reward.mean() - M.system_value(pool).item()) < 5 * s.reward.std() / np.sqrt(len(s))


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: M.ParallelPool(np.zeros((2, 1)), np.zeros((1, 2))), "logits"),
        (lambda: M.ParallelPool(np.zeros((2, 1, 2)), np.zeros((1, 2))), "reward"),
        (lambda: M.ParallelPool(np.zeros((1, 1, 2)), np.array([[0.5, np.nan]])), "reward"),
        (lambda: M.ParallelPool(np.zeros((1, 1, 2)), np.array([[0.5, 2.0]])), "reward"),
        (lambda: M.ParallelPool(np.zeros((1, 1, 2)), np.zeros((1, 2)), noise="gaussian"), "noise"),
        (lambda: M.RoutedPool(np.zeros((2, 1, 2)), np.zeros((3, 1, 2)), np.zeros((2, 1, 2))),
         "candidate_reward"),
        (lambda: M.RoutedPool(np.zeros((2, 1, 2)), np.zeros((1, 2)), np.zeros((2, 1, 5))), "router_scores"),
        (lambda: M.RoutedPool(np.zeros((2, 1, 2)), np.zeros((1, 2)), np.zeros((1, 2)), tau=-1.0), "tau"),
        (lambda: M.Pipeline([np.zeros((1, 2)), np.zeros((1, 3, 3))], np.zeros((1, 2, 2))), "logits"),
        (lambda: M.ParallelPool(np.zeros((1, 2, 2)), np.zeros((2, 2)), prompt_probs=[0.5, 0.6]),
         "prompt_probs"),
        (lambda: M.retention_value(M.proposition1_systems()[0], 4), "S"),
        (lambda: M.proposition1_systems()[0].sample(0, np.random.default_rng(0)), "n"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()
