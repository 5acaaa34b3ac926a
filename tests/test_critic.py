"""Tests of mcpg.critic: the masked critic of paper §6 (Lemma 2, Proposition 5, Corollary 2)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpg import critic as cr
from mcpg import mechanisms as mech

SETTINGS = settings(max_examples=15, deadline=None)
seeds = st.integers(0, 2**31 - 1)


def random_pipeline(rng, K=3, n_H=2, M=2):
    logits = [rng.normal(size=(n_H, M))] + [rng.normal(size=(n_H, M, M)) for _ in range(K - 1)]
    return mech.Pipeline(logits, rng.uniform(size=(n_H,) + (M,) * K))


def random_system(seed: int, kind: str):
    rng = np.random.default_rng(seed)
    if kind == "routed":
        return mech.random_routed_pool(rng, K=3, n_prompts=2, n_actions=3)
    if kind == "pool":
        return mech.ParallelPool(rng.normal(size=(3, 2, 2)), rng.uniform(size=(2, 2, 2, 2)))
    return random_pipeline(rng)


def flat(grads):
    return np.concatenate([g.ravel() for g in grads])


# --- Lemma 2 -------------------------------------------------------------------------


@SETTINGS
@given(seed=seeds, kind=st.sampled_from(["routed", "pool", "pipeline"]))
def test_population_minimiser_is_retention_value(seed, kind):
    """Lemma 2: with masks independent of the actions the loss minimiser is q^ret(S), for every S."""
    system = random_system(seed, kind)
    data = cr.population_dataset(system)
    best = cr.empirical_minimiser(data.inputs, data.targets, data.weights)
    q = mech.retention_values(system).numpy()
    np.testing.assert_allclose(best.reshape(q.shape), q, rtol=0, atol=1e-12)


@SETTINGS
@given(seed=seeds, prob=st.floats(0.05, 0.95))
def test_any_action_independent_mask_law_identifies_retention(seed, prob):
    """Lemma 2 needs only independence: agents present with any probability, not just 1/2."""
    system = random_system(seed, "routed")
    K = system.n_agents
    bits = cr.group_masks(np.arange(1 << K), K)
    pS = np.prod(np.where(bits, prob, 1 - prob), axis=1)
    data = cr.population_dataset(system, np.broadcast_to(pS.reshape((-1,) + (1,) * (K + 1)),
                                                          (1 << K,) + system.joint_shape))
    best = cr.empirical_minimiser(data.inputs, data.targets, data.weights)
    q = mech.retention_values(system).numpy()
    np.testing.assert_allclose(best.reshape(q.shape), q, rtol=0, atol=1e-12)


def test_masks_that_read_the_actions_break_lemma2():
    """Drop agent 0 exactly when its action is 0: the minimiser at groups without 0 is no longer q^ret."""
    system = random_system(3, "routed")
    K = system.n_agents
    bits = cr.group_masks(np.arange(1 << K), K)
    a0 = np.indices(system.joint_shape)[1]
    has0 = bits[:, 0].reshape((-1,) + (1,) * (K + 1))
    # S uniform among groups with agent 0 when A^(0) != 0, among groups without it when A^(0) == 0
    pS = np.where(has0 == (a0 != 0)[None], 1.0 / (1 << (K - 1)), 0.0)
    data = cr.population_dataset(system, pS)
    best = cr.empirical_minimiser(data.inputs, data.targets, data.weights)
    best = best.reshape((1 << K,) + system.joint_shape)
    q = mech.retention_values(system).numpy()
    without0 = [S for S in range(1 << K) if not S & 1]
    gap = max(np.nanmax(np.abs(best[S] - q[S])) for S in without0)
    assert gap > 0.02


def test_training_reaches_the_population_minimiser():
    """Trained on the population loss, the MLP is within 0.01 of q^ret at every (S, H, A)."""
    system = mech.random_routed_pool(np.random.default_rng(11), K=3, n_prompts=2, n_actions=3,
                                     logit_scale=0.5)
    data = cr.population_dataset(system)
    critic = cr.fit_critic(data.inputs, data.targets, data.weights, steps=1200, seed=1)
    err = cr.critic_values(critic, system) - mech.retention_values(system).numpy()
    assert np.abs(err).max() < 0.01


def test_critic_converges_from_sampled_trajectories():
    """20 000 trajectories, every mask: max |q̂ − q^ret| < 0.05 over every (S, H, A)."""
    rng = np.random.default_rng(5)
    system = mech.ParallelPool(0.5 * rng.normal(size=(3, 2, 3)), rng.uniform(size=(2, 3, 3, 3)),
                               noise="fixed")
    critic = cr.train_critic(system, system.sample(20_000, rng), steps=1000)
    err = cr.critic_values(critic, system) - mech.retention_values(system).numpy()
    assert np.abs(err).max() < 0.05


def test_critic_error_shrinks_with_data_on_a_noisy_routed_pool():
    rng = np.random.default_rng(6)
    system = mech.random_routed_pool(rng, K=3, n_prompts=2, n_actions=3, tau=0.5, eps=0.1, logit_scale=0.5)
    q = mech.retention_values(system).numpy()
    P = system.joint_prob().detach().numpy()
    rmse = []
    for n in (300, 30_000):
        err = cr.critic_values(cr.train_critic(system, system.sample(n, rng)), system) - q
        rmse.append(np.sqrt((P * err**2).sum(axis=tuple(range(1, err.ndim))).mean()))
    assert rmse[1] < 0.02 < rmse[0]


def test_merged_loss_has_the_gradient_of_the_raw_loss():
    """Merging equal rows changes the squared loss by a constant only: identical gradients."""
    rng = np.random.default_rng(0)
    system = random_system(0, "routed")
    samples = system.sample(400, rng)
    data = cr.masked_dataset(system, samples, masks="random", rng=rng, n_random=2)
    net = cr.MaskedCritic(data.inputs.shape[1], hidden=8, seed=3)
    y = torch.as_tensor(data.targets, dtype=torch.float32)
    raw = ((net(data.inputs)[0] - y) ** 2).mean()
    g_raw = torch.autograd.grad(raw, list(net.parameters()))
    member = np.zeros(len(y), dtype=int)
    x, W, Y = cr._merge_rows(data.inputs, data.targets, member, np.arange(len(y)), np.ones(len(y)), 1)
    assert W.sum() == len(y) and x.shape[0] < len(y)
    merged = (torch.as_tensor(W / W.sum(), dtype=torch.float32)
              * (net(x) - torch.as_tensor(Y, dtype=torch.float32)) ** 2).sum()
    g_merged = torch.autograd.grad(merged, list(net.parameters()))
    for a, b in zip(g_raw, g_merged):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@SETTINGS
@given(seed=seeds)
def test_empirical_minimiser_is_the_weighted_cell_mean(seed):
    """The minimiser is each cell's weighted mean, up to the rounding of the sums that form it.

    Tolerances follow from the floating-point computation (no fixed rtol): a sum of n
    products of doubles is off by at most γ_n Σ|terms|, γ_n = n u / (1 − n u) with u the unit
    roundoff (Higham, Accuracy and Stability of Numerical Algorithms, §3.1 and §4.2). The cell
    mean m_c = Σ w y / Σ w, computed by the library (bincount) and here (np.sum) in different
    orders, differs by at most twice that, with one more rounding for the division.
    """
    rng = np.random.default_rng(seed)
    cells = rng.integers(0, 4, size=30)
    x = torch.as_tensor(np.eye(4)[cells], dtype=torch.float32)
    y, w = rng.normal(size=30), rng.uniform(0.1, 2.0, size=30)
    best = cr.empirical_minimiser(x, y, w)
    u = np.finfo(np.float64).eps / 2

    def gamma(n):
        return n * u / (1 - n * u)

    tol = {}
    for c in np.unique(cells):
        at = cells == c
        mean = np.sum(w[at] * y[at]) / np.sum(w[at])
        # |fl(Σwy) − Σwy| ≤ γ_{n+1} Σ|wy| and |fl(Σw) − Σw| ≤ γ_n Σw, then the division;
        # one such error in the library's value and one in ours.
        W = np.sum(w[at])
        tol[c] = 2 * gamma(at.sum() + 2) * (np.sum(np.abs(w[at] * y[at])) + abs(mean) * W) / W
        assert np.abs(best[at] - mean).max() <= tol[c]
    shift = rng.normal(size=4)
    shifted = best + shift[cells]  # any other function of the input
    # Exactly, L(shifted) − L(best) = Σ w δ² − 2 Σ_c δ_c W_c (m_c − best_c) ≥ Σ w δ² − Σ_c |δ_c| W_c tol_c;
    # each computed loss Σ w r² carries a relative error of at most γ_{n+3}.
    delta = shifted - best
    loss_best, loss_shifted = np.sum(w * (y - best) ** 2), np.sum(w * (y - shifted) ** 2)
    slack = gamma(len(y) + 3) * (loss_best + loss_shifted) + sum(
        abs(shift[c]) * np.sum(w[cells == c]) * tol[c] for c in tol)
    assert loss_best <= loss_shifted + slack
    assert loss_shifted - loss_best >= np.sum(w * delta**2) - 2 * slack  # the excess is the shift's


def test_ensemble_members_do_not_interact():
    """Member 0 trains the same whatever member 1 is shown (cross-fitting relies on this)."""
    rng = np.random.default_rng(1)
    system = random_system(1, "routed")
    data = cr.masked_dataset(system, system.sample(300, rng))
    n = len(data.targets)
    w0 = (rng.random(n) < 0.5).astype(float)
    a = cr.fit_critic(data.inputs, data.targets, np.stack([w0, rng.random(n)]), steps=100, hidden=8)
    w1 = (rng.random(n) < 0.2).astype(float)
    b = cr.fit_critic(data.inputs, data.targets, np.stack([w0, w1]), steps=100, hidden=8)
    np.testing.assert_allclose(cr.critic_values(a, system, 0), cr.critic_values(b, system, 0),
                               rtol=0, atol=1e-5)
    assert np.abs(cr.critic_values(a, system, 1) - cr.critic_values(b, system, 1)).max() > 1e-3


# --- masks and inputs ----------------------------------------------------------------


def test_sampled_masks_are_independent_of_the_actions():
    """Group frequencies are uniform and do not vary with the actions (chi-square, fixed seed)."""
    from scipy.stats import chi2_contingency, chisquare

    rng = np.random.default_rng(2)
    system = random_system(2, "routed")
    samples = system.sample(4000, rng)
    data = cr.masked_dataset(system, samples, masks="random", rng=rng, n_random=3)
    counts = np.bincount(data.groups, minlength=8)
    assert chisquare(counts).pvalue > 1e-3
    a0 = samples.actions[data.trajectory, 0]
    table = np.array([np.bincount(data.groups[a0 == a], minlength=8) for a in range(3)])
    assert chi2_contingency(table).pvalue > 1e-3
    # the same test does detect masks that read the actions
    dep = np.where(a0 == 0, data.groups | 1, data.groups & ~1)
    table = np.array([np.bincount(dep[a0 == a], minlength=8) for a in range(3)])
    assert chi2_contingency(table).pvalue < 1e-6


def test_masked_actions_are_invisible():
    rng = np.random.default_rng(4)
    system = random_system(4, "routed")
    s = system.sample(50, rng)
    other = mech.Samples(h=s.h, actions=s.actions.copy(), reward=s.reward)
    other.actions[:, 2] = (other.actions[:, 2] + 1) % system.n_actions
    S = 0b011  # agent 2 absent
    assert torch.equal(cr.encode(system, s, S), cr.encode(system, other, S))
    assert not torch.equal(cr.encode(system, s, 0b111), cr.encode(system, other, 0b111))
    q = cr.critic_values(cr.MaskedCritic.for_system(system, seed=2), system)
    assert np.ptp(q[S], axis=3).max() == 0  # q̂(S) is constant along the absent agent's axis
    assert np.ptp(q[0b111], axis=3).max() > 0


def test_mask_designs():
    rng = np.random.default_rng(3)
    system = random_system(3, "routed")
    s = system.sample(7, rng)
    one = cr.masked_dataset(system, s, masks=5)
    assert (one.groups == 5).all() and len(one.targets) == 7
    listed = cr.masked_dataset(system, s, masks=[6, 5, 3])
    np.testing.assert_array_equal(np.bincount(listed.groups, minlength=8)[[3, 5, 6]], [7, 7, 7])
    np.testing.assert_array_equal(listed.targets, np.tile(s.reward, 3))
    every = cr.masked_dataset(system, s)
    assert sorted(set(every.groups)) == list(range(8)) and len(every.targets) == 56
    # the critic reads float64 inputs too
    c = cr.MaskedCritic.for_system(system)
    np.testing.assert_allclose(c.predict(one.inputs.double()), c.predict(one.inputs), rtol=1e-6)


def test_group_masks_roundtrip():
    m = cr.group_masks([0, 1, 5, 7], 3)
    np.testing.assert_array_equal(m, [[0, 0, 0], [1, 0, 0], [1, 0, 1], [1, 1, 1]])
    np.testing.assert_array_equal(cr._mask_to_group(m), [0, 1, 5, 7])


# --- Proposition 5 and Corollary 2 ----------------------------------------------------


@SETTINGS
@given(seed=seeds, kind=st.sampled_from(["routed", "pool", "pipeline"]))
def test_any_fixed_critic_gives_a_gradient_correct_residual(seed, kind):
    """Proposition 5 exactly: E[Ψ_i (G − q̂(S))] = ∇_i J for an arbitrary (untrained) critic, every valid S."""
    system = random_system(seed, kind)
    q_hat = cr.critic_values(cr.MaskedCritic.for_system(system, hidden=8, seed=seed % 1000), system)
    G = system.reward_mean().numpy()
    grad = mech.system_gradient(system)
    K = system.n_agents
    for i in range(K):
        full = cr.default_groups(system)[i]
        for S in range(1 << K):
            if S & ~full:
                continue  # S reads A^(i) or a later agent
            got = mech.score_expectation(system, G - q_hat[S])[i]
            np.testing.assert_allclose(got, grad[i], rtol=0, atol=1e-12)


def test_a_critic_that_reads_the_agent_is_not_a_baseline():
    """q̂(N) contains A^(i): for a good critic E[Ψ_i (G − q̂(N))] is near 0, far from ∇_i J."""
    rng = np.random.default_rng(8)
    system = random_system(8, "routed")
    data = cr.population_dataset(system)
    q_hat = cr.critic_values(cr.fit_critic(data.inputs, data.targets, data.weights, steps=800), system)
    G = system.reward_mean().numpy()
    for i, g in enumerate(mech.system_gradient(system)):
        got = mech.score_expectation(system, G - q_hat[-1])[i]
        assert np.linalg.norm(got - g) > 0.5 * np.linalg.norm(g)
    with pytest.raises(ValueError, match="groups"):
        cr.baselines(cr.MaskedCritic.for_system(system), system, system.sample(5, rng), groups=[7, 7, 7])


def test_critic_difference_bias_is_the_critic_error_at_s_plus_i():
    """E[Ψ_i (q̂(S∪i) − q̂(S))] − ∇_i J = E[Ψ_i (q̂(S∪i) − q^ret(S∪i))]: critic error enters the gradient.

    (The diagnostic difference is not a training signal, §6.)
    """
    system = random_system(9, "routed")
    q_hat = cr.critic_values(cr.MaskedCritic.for_system(system, seed=4), system)
    q = mech.retention_values(system).numpy()
    grad = mech.system_gradient(system)
    for i in range(system.n_agents):
        S = cr.default_groups(system)[i]
        diff = mech.score_expectation(system, q_hat[S | 1 << i] - q_hat[S])[i]
        err = mech.score_expectation(system, q_hat[S | 1 << i] - q[S | 1 << i])[i]
        np.testing.assert_allclose(diff - grad[i], err, rtol=0, atol=1e-12)
        assert np.abs(err).max() > 1e-3


def test_default_groups():
    pool = random_system(0, "routed")
    assert cr.default_groups(pool) == [0b110, 0b101, 0b011]
    pipe = random_system(0, "pipeline")
    assert cr.default_groups(pipe) == [0b000, 0b001, 0b011]
    blank, draws = cr.MaskedCritic.for_system(pipe), pipe.sample(4, np.random.default_rng(0))
    # the solver as the planner's background: i ∉ S holds, S within i's own layer does not
    with pytest.raises(ValueError, match=r"groups\[0\].*\[1\].*own layer") as err:
        cr.baselines(blank, pipe, draws, groups=[0b010, 0, 0])
    assert "needs i ∉ S" not in str(err.value)
    # agent i in its own group: that is the condition i ∉ S
    with pytest.raises(ValueError, match=r"groups\[1\] contains agent 1 itself.*i ∉ S"):
        cr.baselines(blank, pipe, draws, groups=[0, 0b010, 0])
    # an earlier layer's agent is part of the history H_ℓ: accepted
    assert cr.baselines(blank, pipe, draws, groups=[0, 0b001, 0b011]).shape == (4, 3)


# --- cross-fitting --------------------------------------------------------------------


def test_folds_are_disjoint_balanced_and_cover_every_trajectory():
    fold = cr.fold_assignment(103, 4, np.random.default_rng(0))
    assert fold.shape == (103,) and set(np.unique(fold)) == {0, 1, 2, 3}
    assert np.bincount(fold).max() - np.bincount(fold).min() <= 1


def test_cross_fitted_baseline_never_sees_its_own_trajectory():
    """Changing the rewards in fold k leaves fold k's baselines unchanged and changes the others'."""
    system = random_system(5, "routed")
    samples = system.sample(200, np.random.default_rng(1))
    a = cr.cross_fit(system, samples, np.random.default_rng(7), n_folds=2, steps=60, hidden=8)
    fold0 = a.fold == 0
    flipped = mech.Samples(h=samples.h, actions=samples.actions, reward=np.where(fold0, 1 - samples.reward,
                                                                                     samples.reward))
    b = cr.cross_fit(system, flipped, np.random.default_rng(7), n_folds=2, steps=60, hidden=8)
    np.testing.assert_array_equal(a.fold, b.fold)
    np.testing.assert_allclose(a.baselines[fold0], b.baselines[fold0], rtol=0, atol=1e-5)
    assert np.abs(a.baselines[~fold0] - b.baselines[~fold0]).max() > 1e-2


def test_in_sample_critic_biases_the_gradient_and_cross_fitting_does_not():
    """Over 150 repetitions of 48 trajectories: in-sample shrinks the gradient, cross-fitting is on target."""
    rng = np.random.default_rng(2026)
    system = mech.random_routed_pool(rng, K=3, n_prompts=2, n_actions=3, tau=0.5, eps=0.1, logit_scale=0.5)
    exact = flat(mech.system_gradient(system))
    est = cr.repeated_gradient_estimates(system, 48, 150, rng, hidden=16, steps=150)
    ratio = {k: v @ exact / (exact @ exact) for k, v in est.items()}
    half = {k: 3.0 * r.std(ddof=1) / np.sqrt(len(r)) for k, r in ratio.items()}  # 3-sigma intervals
    assert ratio["in-sample critic"].mean() + half["in-sample critic"] < 1.0
    for k in ("no baseline", "cross-fitted critic", "independent critic"):
        assert abs(ratio[k].mean() - 1.0) < half[k], k


# --- bad input -----------------------------------------------------------------------


def test_bad_input_raises_value_errors_naming_the_argument():
    rng = np.random.default_rng(0)
    system = random_system(0, "routed")
    s = system.sample(10, rng)
    x = cr.encode(system, s, 0b111)
    with pytest.raises(ValueError, match="prob"):
        cr.sample_masks(5, 3, rng, prob=1.5)
    with pytest.raises(ValueError, match="n_agents"):
        cr.sample_masks(5, 0, rng)
    with pytest.raises(ValueError, match="groups"):
        cr.group_masks([8], 3)
    with pytest.raises(ValueError, match="masks"):
        cr.encode(system, s, np.ones((9, 3)))
    with pytest.raises(ValueError, match="masks"):
        cr.encode_inputs(np.ones((2, 1)), np.full((2, 3), 2.0), np.ones((2, 3, 1)))
    with pytest.raises(ValueError, match="action_features"):
        cr.encode_inputs(np.ones((2, 1)), np.ones((2, 3)), np.ones((2, 2, 1)))
    with pytest.raises(ValueError, match="prompt_features"):
        cr.encode_inputs(np.full((2, 1), np.nan), np.ones((2, 3)), np.ones((2, 3, 1)))
    with pytest.raises(ValueError, match="masks"):
        cr.masked_dataset(system, s, masks="some")
    with pytest.raises(ValueError, match="rng"):
        cr.masked_dataset(system, s, masks="random")
    with pytest.raises(ValueError, match="n_random"):
        cr.masked_dataset(system, s, masks="random", rng=rng, n_random=0)
    with pytest.raises(ValueError, match="groups"):
        cr.masked_dataset(system, s, masks=[1, 9])
    with pytest.raises(ValueError, match="targets"):
        cr.fit_critic(x, np.ones(3))
    with pytest.raises(ValueError, match="targets"):
        cr.fit_critic(x, np.full(10, np.nan))
    with pytest.raises(ValueError, match="weights"):
        cr.fit_critic(x, np.ones(10), -np.ones(10))
    with pytest.raises(ValueError, match="weights"):
        cr.fit_critic(x, np.ones(10), np.zeros((2, 10)))
    with pytest.raises(ValueError, match="lr"):
        cr.fit_critic(x, np.ones(10), lr=0.0)
    with pytest.raises(ValueError, match="steps"):
        cr.fit_critic(x, np.ones(10), steps=-1)
    with pytest.raises(ValueError, match="inputs"):
        cr.fit_critic(x.numpy(), np.ones(10))
    with pytest.raises(ValueError, match="hidden"):
        cr.MaskedCritic(4, hidden=0)
    with pytest.raises(ValueError, match="x"):
        cr.MaskedCritic(4)(torch.ones(2, 5))
    with pytest.raises(ValueError, match="member"):
        cr.critic_values(cr.MaskedCritic.for_system(system), system, member=1)
    with pytest.raises(ValueError, match="groups"):
        cr.baselines(cr.MaskedCritic.for_system(system), system, s, groups=[0, 0])
    with pytest.raises(ValueError, match="n_folds"):
        cr.fold_assignment(10, 1, rng)
    with pytest.raises(ValueError, match="n must"):
        cr.fold_assignment(3, 4, rng)
    with pytest.raises(ValueError, match="mask_probs"):
        cr.population_dataset(system, np.ones((8,) + system.joint_shape))
    with pytest.raises(ValueError, match="weights"):
        cr.empirical_minimiser(x, np.ones(10), np.zeros(10))
    with pytest.raises(ValueError, match="n_reps"):
        cr.repeated_gradient_estimates(system, 10, 0, rng)
