"""Tests of mcpg.signals: Lemma 1, Corollary 1, Proposition 4 and estimator variances (paper §5)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpg import mechanisms as M
from mcpg import signals, systems

seeds = st.integers(0, 2**31 - 1)
TOL = 1e-12


@st.composite
def small_systems(draw):
    """A random routed pool, parallel pool or pipeline: random policies, rewards and routers."""
    rng = np.random.default_rng(draw(seeds))
    kind = draw(st.sampled_from(["routed", "parallel", "pipeline"]))
    noise = draw(st.sampled_from(["bernoulli", "fixed"]))
    K = draw(st.integers(2, 3))
    scale = draw(st.floats(0.1, 3.0))
    if kind == "routed":
        return M.random_routed_pool(rng, K=K, n_prompts=2, n_actions=draw(st.integers(2, 3)),
                                    tau=draw(st.floats(0.1, 3.0)), eps=draw(st.floats(0.0, 0.5)),
                                    blind=draw(st.booleans()), noise=noise, logit_scale=scale)
    if kind == "parallel":
        return systems.random_parallel_pool(rng, K=K, n_prompts=2, n_actions=draw(st.integers(2, 3)),
                                            logit_scale=scale, noise=noise)
    return systems.random_pipeline(rng, K=K, n_prompts=2, n_actions=draw(st.integers(2, 3)),
                                   logit_scale=scale, noise=noise)


# --- Corollary 1 -------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(small_systems())
def test_corollary1_every_retention_entry_is_gradient_correct(system):
    table = signals.corollary1_table(system)
    expected_rows = sum(len(signals.layer_backgrounds(system, i)) for i in range(system.n_agents))
    assert len(table) == expected_rows
    assert table["ret_entry_error"].max() < TOL
    assert table["ret_residual_error"].max() < TOL


def test_corollary1_table_rows_of_a_pool_are_every_background():
    pool = M.random_routed_pool(np.random.default_rng(0), K=3)
    table = signals.corollary1_table(pool, ["a", "b", "c"])
    assert list(table[table.agent == "a"].S) == ["∅", "{b}", "{c}", "{b,c}"]


def test_removal_entries_are_not_all_gradient_correct_on_a_routed_pool():
    # Delta^rem_{i|∅} = g_i(H, A^(i)), the agent alone: its gradient is not that of J_sys ...
    pool = M.random_routed_pool(np.random.default_rng(1), K=3, tau=0.5, eps=0.1)
    table = signals.corollary1_table(pool)
    assert table[table.S == "∅"]["rem_entry_error"].min() > 1e-3
    # ... while the leave-one-out removal entry (S = N \ {i}) is (Corollary 2)
    full = table[table.S.str.count(",") == 1]
    assert full["rem_entry_error"].max() < TOL


def test_removal_entry_bias_by_hand_on_a_routed_pool():
    pool = M.random_routed_pool(np.random.default_rng(2), K=2, tau=0.7, eps=0.2)
    g = pool.candidate_values()
    for i in range(2):
        entry = signals.removal_entry(pool, i, 0)
        np.testing.assert_allclose(entry, g[..., i], atol=1e-15)  # one candidate is always deployed
        bias = signals.signal_bias(pool, entry)[i]
        # E[Psi_i g_i(H, A^(i))] = grad of E[g_i] = sum_h P(h) pi_i(a|h) (g_i(h,a) - E_pi g_i(h,.))
        pi = M.ParallelPool.policies(pool)[i].detach().numpy()
        gi = pool.candidate_reward[i]
        by_hand = 0.5 * pi * (gi - (pi * gi).sum(axis=1, keepdims=True))
        np.testing.assert_allclose(bias, by_hand - M.system_gradient(pool)[i], atol=1e-15)


def test_pipeline_out_of_scope_backgrounds_fail_and_removal_is_undefined():
    pl = systems.planner_solver_critic()
    table = signals.corollary1_table(pl, systems.PSC_AGENTS, include_out_of_scope=True)
    assert len(table) == 12
    inside = table[table.in_scope]
    assert list(zip(inside.agent, inside.S)) == [("planner", "∅"), ("solver", "{planner}"),
                                                 ("critic", "{planner,solver}")]
    assert inside[["ret_entry_error", "ret_residual_error"]].to_numpy().max() < TOL
    # the planner's baseline q^ret({solver}) reads the solver, who reads the planner: biased
    row = table[(table.agent == "planner") & (table.S == "{solver}")].iloc[0]
    assert row.ret_residual_error > 1e-3
    # the paper's per-layer removal: deleting the planner or the solver leaves its successor
    # without an input, so only the critic's layer has a removal entry, and it is exact
    defined = table[~table.rem_entry_error.isna()]
    assert set(zip(defined.agent, defined.S)) == {("critic", "{planner,solver}")}
    crit = defined.iloc[0]
    assert crit.rem_entry_error < TOL
    # rows name the entry in the paper's notation
    assert list(zip(inside.layer, inside.H_l, inside.S_l)) == [(1, "∅", "∅"), (2, "{planner}", "∅"),
                                                              (3, "{planner,solver}", "∅")]


def test_layer_removal_entry_pool_and_pipeline():
    pool = M.random_routed_pool(np.random.default_rng(6), K=3, tau=0.5, eps=0.1)
    for i in range(3):
        for S in [S for S in range(8) if not S >> i & 1]:
            np.testing.assert_allclose(signals.layer_removal_entry(pool, i, S),
                                       signals.removal_entry(pool, i, S), atol=1e-15)
    pl = systems.planner_solver_critic()
    assert np.isnan(signals.layer_removal_entry(pl, 0, 0)).all()
    assert np.isnan(signals.layer_removal_entry(pl, 1, 0)).all()
    # the critic: G with the verdict, minus the answer deployed unrevised (by hand)
    G = pl.reward_mean().numpy()
    answer = np.broadcast_to(np.arange(2)[None, None, :, None], G.shape)
    np.testing.assert_allclose(signals.layer_removal_entry(pl, 2, 0), G - answer, atol=1e-15)
    with pytest.raises(ValueError, match="layer"):
        signals.layer_removal_entry(pl, 2, 0b001)        # the planner is not in the critic's layer


# --- Lemma 1 -----------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(small_systems(), seeds)
def test_lemma1_valid_baselines_leave_the_gradient_unbiased(system, seed):
    """A baseline built from H_l and other agents of the layer satisfies Lemma 1's condition."""
    rng = np.random.default_rng(seed)
    K = system.n_agents
    B = []
    for i in range(K):
        # a random function of (H, A^(hist)), plus q^ret of the other agents of i's layer
        reads = signals.history_mask(system, i)
        f = signals.conditional_expectation(system, rng.normal(size=system.joint_shape), reads)
        B.append(f + M.retention_value(system, signals.layer_backgrounds(system, i)[-1]).numpy())
    for i in range(K):
        assert signals.is_valid_baseline(system, i, B)
    for i, b in enumerate(signals.baseline_bias(system, B)):
        assert np.abs(b).max() < TOL
    for i, err in enumerate(signals.signal_bias(system, [system.reward_mean().numpy() - b for b in B])):
        assert np.abs(err).max() < TOL


@settings(max_examples=30, deadline=None)
@given(small_systems(), seeds)
def test_lemma1_a_baseline_that_reads_the_own_action_is_detected_and_its_bias_is_exact(system, seed):
    rng = np.random.default_rng(seed)
    i = int(rng.integers(system.n_agents))
    reads = signals.history_mask(system, i) | (1 << i)
    B = signals.conditional_expectation(system, rng.normal(size=system.joint_shape), reads)
    assert not signals.is_valid_baseline(system, i, B)
    # the bias E[Psi_i B] by an independent route: sum over cells of P * B * Psi_i
    cells = signals.all_cells(system)
    psi = system.score_vectors(cells)[i]
    P = system.joint_prob().detach().numpy().ravel()
    direct = np.tensordot(P * B.ravel(), psi, axes=1)
    np.testing.assert_allclose(signals.baseline_bias(system, B)[i], direct, atol=1e-13)
    np.testing.assert_allclose(signals.signal_bias(system, system.reward_mean().numpy() - B)[i], -direct,
                               atol=1e-13)


def test_baseline_bias_single_agent_by_hand():
    # one prompt, one agent, pi = softmax(logits), B(a) = b_a: E[Psi B] = pi * (b - pi . b)
    logits = np.array([[[0.3, -1.0, 0.5]]])
    pool = M.ParallelPool(logits, np.array([[0.2, 0.5, 0.9]]), noise="fixed")
    b = np.array([[1.0, -2.0, 0.5]])
    pi = np.exp(logits[0, 0]) / np.exp(logits[0, 0]).sum()
    np.testing.assert_allclose(signals.baseline_bias(pool, b)[0], [pi * (b[0] - pi @ b[0])], atol=1e-15)
    assert not signals.is_valid_baseline(pool, 0, b)
    assert signals.is_valid_baseline(pool, 0, np.full((1, 3), 0.7))


def test_conditional_expectation_matches_retention_and_the_tower_property():
    pool = M.random_routed_pool(np.random.default_rng(4), K=3)
    G = pool.reward_mean().numpy()
    P = pool.joint_prob().detach().numpy()
    for S in range(8):
        q = signals.conditional_expectation(pool, G, S)
        np.testing.assert_allclose(q, M.retention_value(pool, S).numpy(), atol=1e-14)
        assert (P * q).sum() == pytest.approx((P * G).sum(), abs=1e-14)


# --- Proposition 4 and estimator variance --------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(small_systems(), st.randoms(use_true_random=False))
def test_proposition4_variance_is_non_increasing_along_every_nested_chain(system, rnd):
    K = system.n_agents
    order = list(range(K))
    rnd.shuffle(order)
    chain = [sum(1 << k for k in order[:m]) for m in range(K + 1)]
    var = signals.variance_by_conditioning_set(system, chain)
    assert np.all(np.diff(var) <= 1e-12)
    assert var[-1] >= -1e-12
    # the full chain's end: E[Var(G | H, A)] is the reward's own noise
    G1, G2 = system.reward_mean().numpy(), system.reward_second_moment().numpy()
    P = system.joint_prob().detach().numpy()
    assert var[-1] == pytest.approx((P * (G2 - G1**2)).sum(), abs=1e-12)


def test_proposition4_ordering_is_by_inclusion_not_by_size():
    # G = A^(1) exactly: conditioning on agent 1 removes all variance, on agent 2 none
    determines, _ = M.proposition1_systems()
    v = signals.variance_by_conditioning_set
    assert v(determines, [0, 0b01])[1] == pytest.approx(0.0)
    assert v(determines, [0, 0b10])[1] == pytest.approx(0.25)


def test_exact_estimator_variance_single_agent_by_hand():
    # one prompt, two actions with pi = (1/4, 3/4), G = action (fixed); Psi = e_a - pi
    pool = M.ParallelPool(np.array([[[0.0, np.log(3.0)]]]), np.array([[0.0, 1.0]]), noise="fixed")
    pi = np.array([0.25, 0.75])
    psi = np.eye(2) - pi  # row a: Psi at action a
    for b in (0.0, 0.75, 2.0):
        terms = psi * (np.array([0.0, 1.0]) - b)[:, None]
        mean = pi @ terms
        expected = pi @ (terms**2).sum(axis=1) - (mean**2).sum()
        assert signals.exact_estimator_variance(pool, np.full((1, 2), b))[0] == pytest.approx(expected)


def test_estimator_variance_monte_carlo_covers_the_exact_value():
    """n = 100 000 draws: the sample variance lies within 5 standard errors of the exact one."""
    rng = np.random.default_rng(7)
    pool = M.random_routed_pool(rng, K=3, tau=0.5, eps=0.1)
    s = pool.sample(100_000, rng)
    for B in (signals.q_ret(0), [signals.q_ret(S) for S in (0b110, 0b101, 0b011)]):
        exact = signals.exact_estimator_variance(pool, B)
        var, se = signals.estimator_variance(pool, s, B)
        assert np.all(np.abs(var - exact) <= 5 * se)


def test_a_good_baseline_lowers_the_estimator_variance_here():
    pool = M.random_routed_pool(np.random.default_rng(8), K=3, tau=0.3, noise="fixed", logit_scale=2.0)
    none = signals.exact_estimator_variance(pool, signals.NO_BASELINE)
    prompt = signals.exact_estimator_variance(pool, signals.q_ret(0))   # q^ret(∅) = E[G | H]
    others = signals.exact_estimator_variance(pool, [signals.q_ret(S) for S in (0b110, 0b101, 0b011)])
    assert np.all(others < prompt) and np.all(prompt < none)


def test_baseline_estimate_covers_the_lemma1_targets():
    """n = 100 000 draws: valid baselines estimate ∇J; g_i(H, A^(i)) estimates ∇J − E[Ψ_i g_i]
    (each coordinate within 5 standard errors)."""
    rng = np.random.default_rng(9)
    pool = M.random_routed_pool(rng, K=3, tau=0.5, eps=0.1)
    s = pool.sample(100_000, rng)
    grad = M.system_gradient(pool)
    own = [pool.candidate_values()[..., i] for i in range(3)]
    others = [signals.q_ret(S) for S in (0b110, 0b101, 0b011)]
    for B, shift in ((signals.NO_BASELINE, None), (others, None), (own, signals.baseline_bias(pool, own))):
        for i, (m, se) in enumerate(signals.baseline_estimate(pool, s, B)):
            target = grad[i] if shift is None else grad[i] - shift[i]
            assert np.all(np.abs(m - target) <= 5 * se)
    # and the invalid baseline's estimate is far from the gradient
    m, se = signals.baseline_estimate(pool, s, own)[2]
    assert np.abs(m - grad[2]).max() > 20 * se.max()


# --- the spellings of a baseline --------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(small_systems(), st.data())
def test_q_ret_is_the_retention_value_and_no_baseline_is_the_raw_reward(system, data):
    """q_ret(S) is E[G | H, A^(S)] (Eq. 8), NO_BASELINE the constant 0: checked through the
    variance, whose second moment E[(G - B)^2 | H, A] reads the table cell by cell."""
    K = system.n_agents
    S = data.draw(st.integers(0, (1 << K) - 1))
    table = M.retention_value(system, S).numpy()
    (from_q,) = {tuple(t.ravel()) for t in signals.baseline_tables(system, signals.q_ret(S))}
    np.testing.assert_array_equal(np.array(from_q), table.ravel())
    np.testing.assert_allclose(signals.exact_estimator_variance(system, signals.q_ret(S)),
                               signals.exact_estimator_variance(system, table), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(signals.exact_estimator_variance(system, signals.NO_BASELINE),
                               signals.exact_estimator_variance(system, np.zeros(system.joint_shape)),
                               rtol=1e-12, atol=1e-14)
    for b in signals.baseline_bias(system, signals.NO_BASELINE):
        assert not b.any()


def test_the_two_readings_of_a_bare_zero_differ_so_a_bare_int_is_refused():
    """The trap the explicit spellings remove: E[G | H] and no baseline give different variances."""
    pool = M.random_routed_pool(np.random.default_rng(8), K=3, tau=0.3, noise="fixed", logit_scale=2.0)
    none = signals.exact_estimator_variance(pool, signals.NO_BASELINE)
    prompt = signals.exact_estimator_variance(pool, signals.q_ret(0))
    assert np.all(np.abs(none - prompt) > 1e-3)
    with pytest.raises(ValueError, match=r"q_ret\(0\).*NO_BASELINE"):
        signals.exact_estimator_variance(pool, 0)
    # a 0-d integer array is the same bare 0; a 0-d float array is a constant
    with pytest.raises(ValueError, match=r"q_ret\(0\).*NO_BASELINE"):
        signals.exact_estimator_variance(pool, np.array(0))
    np.testing.assert_array_equal(signals.exact_estimator_variance(pool, np.array(0.0)), none)


@pytest.mark.parametrize("b, S", [(True, 1), (False, 0), (np.bool_(True), 1), (np.array(3), 3),
                                  (torch.tensor(2), 2), (np.uint8(5), 5)])
def test_the_refusal_suggests_a_spelling_that_is_accepted(b, S):
    """The error names q_ret(S) with a plain int S, which q_ret itself accepts (q_ret(True) is refused)."""
    with pytest.raises(ValueError) as err:
        signals.baseline_tables(POOL, b)
    assert f"write q_ret({S}) " in str(err.value)
    signals.q_ret(S)  # the suggestion is itself valid


# --- bad input -----------------------------------------------------------------------------


POOL = M.random_routed_pool(np.random.default_rng(0), K=2, n_prompts=1, n_actions=2)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: signals.baseline_bias(POOL, np.zeros((3, 3))), "B"),
        (lambda: signals.baseline_bias(POOL, [0.0, 0.0, 0.0]), "B"),
        (lambda: signals.baseline_bias(POOL, signals.q_ret(7)), "B"),
        (lambda: signals.baseline_bias(POOL, 0), "ambiguous"),
        (lambda: signals.baseline_bias(POOL, [signals.q_ret(0), 1]), "ambiguous"),
        (lambda: signals.signal_bias(POOL, np.int64(0)), "ambiguous"),
        (lambda: signals.baseline_bias(POOL, np.array(0)), "ambiguous"),
        (lambda: signals.baseline_bias(POOL, np.array(True)), "ambiguous"),
        (lambda: signals.baseline_bias(POOL, torch.tensor(0)), "ambiguous"),
        (lambda: signals.baseline_bias(POOL, [0.0, np.array(1)]), "ambiguous"),
        (lambda: signals.q_ret(-1), "S"),
        (lambda: signals.q_ret(True), "S"),
        (lambda: signals.is_valid_baseline(POOL, 2, signals.q_ret(0)), "i"),
        (lambda: signals.is_valid_baseline(POOL, 0, signals.q_ret(0), atol=-1.0), "atol"),
        (lambda: signals.conditional_expectation(POOL, np.full(POOL.joint_shape, np.nan), 0), "X"),
        (lambda: signals.retention_entry(POOL, 0, 1), "S"),
        (lambda: signals.removal_entry(POOL, 0, 4), "S"),
        (lambda: signals.variance_by_conditioning_set(POOL, [1, 2]), "chain"),
        (lambda: signals.variance_by_conditioning_set(POOL, []), "chain"),
        (lambda: signals.corollary1_table(POOL, ["only one"]), "agent_names"),
        (lambda: signals.estimator_variance(POOL, POOL.sample(1, np.random.default_rng(0)), 0.0), "samples"),
        (lambda: signals.estimator_variance(POOL, POOL.sample(5, np.random.default_rng(0)), [0.0]),
         "baseline"),
        (lambda: signals.estimator_variance(POOL, POOL.sample(5, np.random.default_rng(0)), 0), "ambiguous"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()
