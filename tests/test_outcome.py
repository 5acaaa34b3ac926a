"""Tests of mcpg.outcome: outcome models from filtered feedback and the exact moments of Eq. (19)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpg import mechanisms as mech
from mcpg import outcome as oc
from mcpg import routing

SETTINGS = settings(max_examples=60, deadline=None)
CELLS = np.zeros((2, 2), int)  # two slates of two candidates, all in cell 0


def _slate(seed: int, K: int, tau: float, eps: float):
    rng = np.random.default_rng(seed)
    s, g, mu = rng.normal(size=K), rng.uniform(size=K), rng.uniform(size=K)
    return g, routing.router_propensities(s, tau, eps), routing.leave_one_out_propensities(s, tau, eps), mu


def _enumerated_moments(values: np.ndarray, prob: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w = prob[..., None]
    mean = np.sum(w * values, axis=0)
    return mean, np.sum(w * (values - mean) ** 2, axis=0)


# --- exact moments of the doubly robust and winner-take-all scores ------------------------


@SETTINGS
@given(st.integers(0, 10**6), st.integers(2, 5), st.floats(0.2, 3.0), st.floats(0.01, 1.0),
       st.sampled_from(["bernoulli", "fixed"]))
def test_dr_moments_match_enumeration_of_the_library_estimator(seed, K, tau, eps, noise):
    """The closed form of dr_removal_moments against routing.dr_removal_contributions averaged
    over every (I, G) outcome; and its mean is Delta^rem for any outcome model (Corollary 3)."""
    g, p, P, mu = _slate(seed, K, tau, eps)
    sel, rew, prob = oc.enumerate_feedback(g, p, noise)
    n_out = sel.shape[0]
    est = routing.dr_removal_contributions(
        sel, rew, np.tile(p, (n_out, 1)), np.tile(P, (n_out, 1, 1)), np.tile(mu, (n_out, 1))
    )
    m_enum, v_enum = _enumerated_moments(est, prob)
    mean, var = oc.dr_removal_moments(g, p, P, mu, noise)
    np.testing.assert_allclose(prob.sum(), 1.0)
    np.testing.assert_allclose(mean, m_enum, atol=1e-10)
    np.testing.assert_allclose(var, v_enum, atol=1e-9, rtol=1e-7)
    np.testing.assert_allclose(mean, routing.removal_contributions(g, p, P), atol=1e-10)


@SETTINGS
@given(st.integers(0, 10**6), st.integers(2, 5), st.floats(0.01, 1.0),
       st.sampled_from(["bernoulli", "fixed"]))
def test_wta_moments_match_enumeration(seed, K, eps, noise):
    g, p, _, _ = _slate(seed, K, 1.0, eps)
    sel, rew, prob = oc.enumerate_feedback(g, p, noise)
    m_enum, v_enum = _enumerated_moments(routing.winner_take_all_scores(sel, rew, K), prob)
    mean, var = oc.wta_moments(g, p, noise)
    np.testing.assert_allclose(mean, m_enum, atol=1e-12)
    np.testing.assert_allclose(var, v_enum, atol=1e-12)
    assert (var <= 0.25 + 1e-12).all()


def test_dr_moments_batched_over_a_whole_pool():
    pool = mech.random_routed_pool(np.random.default_rng(3), K=3, n_prompts=2, n_actions=3, eps=0.2)
    g, p, P = pool.candidate_values(), pool.propensities(), pool.leave_one_out_propensities()
    mean, var = oc.dr_removal_moments(g, p, P, np.zeros_like(g))
    np.testing.assert_allclose(mean, pool.exact_removal_contributions(), atol=1e-12)
    assert var.shape == g.shape and (var >= 0).all()


def test_perfect_outcome_model_with_fixed_rewards_has_zero_variance():
    g, p, P, _ = _slate(1, 4, 1.0, 0.1)
    _, var = oc.dr_removal_moments(g, p, P, g, noise="fixed")
    np.testing.assert_allclose(var, 0.0, atol=1e-14)
    _, var_b = oc.dr_removal_moments(g, p, P, g, noise="bernoulli")
    assert (var_b > 0).all()  # Bernoulli rewards keep an irreducible part


def test_dr_variance_grows_like_one_over_eps_for_a_greedy_router():
    """Hard router (tau -> 0): the disfavoured propensities are eps / K and Var ~ c / eps."""
    s, g = np.array([0.0, 1.0, 2.0]), np.array([0.3, 0.6, 0.8])
    eps = np.array([1e-2, 1e-3, 1e-4])
    var = np.array([oc.dr_removal_moments(g, routing.router_propensities(s, 1e-3, e),
                                          routing.leave_one_out_propensities(s, 1e-3, e), np.zeros(3))[1]
                    for e in eps])
    ratio = var[1:] / var[:-1]
    np.testing.assert_allclose(ratio[:, 2], 10.0, rtol=0.02)  # removing the favourite: 1/eps growth
    wta = np.array([oc.wta_moments(g, routing.router_propensities(s, 1e-3, e))[1] for e in eps])
    assert (wta <= 0.25).all()


def test_draw_feedback_frequencies_and_means():
    rng = np.random.default_rng(0)
    g, p, _, _ = _slate(2, 3, 1.0, 0.3)
    n = 200_000
    sel, rew = oc.draw_feedback(g, p, n, rng)
    freq = np.bincount(sel, minlength=3) / n
    np.testing.assert_allclose(freq, p, atol=5 * np.sqrt(p * (1 - p) / n).max())
    for j in range(3):
        r = rew[sel == j]
        assert abs(r.mean() - g[j]) < 5 * np.sqrt(g[j] * (1 - g[j]) / r.size)
    sel_f, rew_f = oc.draw_feedback(g, p, 10, rng, noise="fixed")
    np.testing.assert_allclose(rew_f, g[sel_f])


# --- fitting the outcome model ------------------------------------------------------------


def _router_reads_answers(seed: int = 0, n_prompts: int = 6, blind: bool = False):
    """A pool whose router strongly prefers candidates with high g (it reads the answer)."""
    rng = np.random.default_rng(seed)
    K, M = 3, 3
    g = rng.beta(0.5, 0.5, size=(K, n_prompts, M))
    scores = rng.normal(size=(K, n_prompts, 1)) if blind else 4.0 * g
    return mech.RoutedPool(rng.normal(size=(K, n_prompts, M)), g, scores, tau=1.0, eps=0.1), rng


def _skill_pool(seed: int = 0, n_prompts: int = 30):
    """Right (g = 0.9) or wrong (g = 0.1) answers; agent j is right on prompt H with
    probability q[j, H]; the router recognises right answers (score gap 3, some noise)."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.05, 0.95, size=(3, n_prompts))
    logits = np.stack([np.zeros_like(q), np.log(q / (1 - q))], axis=-1)
    scores = np.array([0.0, 3.0]) + 0.5 * rng.normal(size=(3, n_prompts, 2))
    check = np.broadcast_to([0.1, 0.9], (3, n_prompts, 2))
    return mech.RoutedPool(logits, check, scores, tau=1.0, eps=0.1), q


def test_tabular_fit_is_the_cellwise_weighted_mean():
    """The minimiser of the (IPW) cross-entropy of a saturated model is, in each cell, the
    self-normalised weighted mean sum (G / p_I) / sum (1 / p_I) (unweighted: the plain mean)."""
    pool, rng = _router_reads_answers(1)
    s = pool.sample(5000, rng)
    cells, n = oc.candidate_cells(pool, s, "agent")
    c_sel = cells[np.arange(len(s)), s.selected]
    w = 1.0 / s.p[np.arange(len(s)), s.selected]
    for weighted, ww in ((True, w), (False, np.ones_like(w))):
        closed = (np.bincount(c_sel, weights=ww * s.reward, minlength=n)
                  / np.bincount(c_sel, weights=ww, minlength=n))
        model = oc.fit_outcome_model(cells, s.selected, s.reward, s.p, weighted=weighted, n_cells=n, l2=0.0)
        ok = (closed > 0) & (closed < 1)
        np.testing.assert_allclose(model.predict(np.arange(n))[ok], closed[ok], atol=1e-5)


@pytest.mark.parametrize("weighted", [True, False])
def test_ridge_pull_on_a_cell_with_constant_rewards(weighted):
    """A cell whose rewards are all 0 or all 1 has no finite unpenalised optimum. With the ridge,
    the first-order condition n_eff (σ(s) − y) / B + l2 s = 0 gives |μ̂ − y| = l2 B |s| / n_eff,
    n_eff the cell's deployments, each counted 1/p when weighted (chapter 5, Exercise 2)."""
    pool, rng = _router_reads_answers(3)
    s = pool.sample(3000, rng)
    cells, n = oc.candidate_cells(pool, s, "answer")
    rows = np.arange(len(s))
    c_sel = cells[rows, s.selected]
    y_cell = (np.arange(n) % 2).astype(float)  # every cell's reward is constant, 0 or 1
    l2 = 1e-4
    model = oc.fit_outcome_model(cells, s.selected, y_cell[c_sel], s.p, weighted=weighted, n_cells=n, l2=l2)
    w = 1.0 / s.p[rows, s.selected] if weighted else np.ones(len(s))
    n_eff = np.bincount(c_sel, weights=w, minlength=n)
    seen = n_eff > 0
    mu, target = model.predict(np.arange(n))[seen], y_cell[seen]
    pull = l2 * len(s) * np.abs(np.log(mu / (1 - mu))) / n_eff[seen]
    np.testing.assert_allclose(np.abs(mu - target), pull, rtol=1e-3)
    assert np.abs(mu - target).max() > 1e-3  # the pull is visible, not rounding


@pytest.mark.parametrize("weighted", [True, False])
def test_tabular_objective_is_the_ipw_loss_on_the_raw_slates(weighted):
    """The tabular fit evaluates its loss from per-cell sums; at the fitted parameters that
    equals routing.ipw_outcome_loss (or the unweighted loss) on every raw slate, plus the ridge."""
    pool, rng = _router_reads_answers(6)
    s = pool.sample(2000, rng)
    cells, n = oc.candidate_cells(pool, s, "agent")
    l2 = 1e-3
    model = oc.fit_outcome_model(cells, s.selected, s.reward, s.p, weighted=weighted, n_cells=n, l2=l2)
    logits = torch.as_tensor(model.logits(cells))
    raw = (routing.ipw_outcome_loss(logits, s.selected, s.reward, s.p) if weighted
           else oc.selected_cross_entropy(logits, s.selected, s.reward))
    ridge = 0.5 * l2 * np.sum(model.logits(np.arange(n)) ** 2)
    assert model.loss == pytest.approx(float(raw) + ridge, rel=1e-10)
    assert model.loss <= min(model.history) + 1e-12


def test_weighted_fit_recovers_the_all_candidate_mean_and_unweighted_does_not():
    """Outcome model seeing (H, agent) only; the router reads the answer. With n = 60000 slates
    the IPW fit is within 0.05 of E[R^(j) | H, j] in every cell; the unweighted fit converges to
    E[R^(j) | H, j, I = j] instead and misses the all-candidate mean by more than 0.1."""
    pool, rng = _router_reads_answers(0)
    s = pool.sample(60_000, rng)
    cells, n = oc.candidate_cells(pool, s, "agent")
    target = oc.cell_targets(pool, "agent")
    gap = np.abs(target["selected_mean"] - target["mean"])
    assert gap.max() > 0.15  # the example really has selection bias
    fit_w = oc.fit_outcome_model(cells, s.selected, s.reward, s.p, weighted=True, n_cells=n)
    fit_u = oc.fit_outcome_model(cells, s.selected, s.reward, s.p, weighted=False, n_cells=n)
    mu_w, mu_u = fit_w.predict(np.arange(n)), fit_u.predict(np.arange(n))
    assert np.abs(mu_w - target["mean"]).max() < 0.05
    assert np.abs(mu_u - target["mean"]).max() > 0.1
    assert np.abs(mu_u - target["selected_mean"]).max() < 0.05


def test_selection_bias_is_largest_for_rarely_selected_agents():
    """Skill example: a weak agent is selected mostly when it happens to be right, so the
    selected-only mean overstates it; rarely selected cells carry most of the bias (exact)."""
    from scipy.stats import spearmanr

    pool, q = _skill_pool(0)
    t = oc.cell_targets(pool, "agent")
    bias = t["selected_mean"] - t["mean"]
    assert (bias > 0).all()
    np.testing.assert_allclose(t["mean"], 0.1 + 0.8 * q.T.ravel(), atol=1e-12)  # cells are (H, j)
    rare = t["selection_rate"] < np.median(t["selection_rate"])
    assert bias[rare].mean() > 1.5 * bias[~rare].mean()
    assert spearmanr(t["selection_rate"], bias)[0] < -0.3


def test_both_fits_recover_g_when_the_model_sees_the_answer():
    """Condition (17): given (H, A^(j)), R^(j) does not depend on selection, so with cells
    (H, j, A^(j)) both fits converge to g_j (the weights then only change the variance)."""
    pool, rng = _router_reads_answers(2, n_prompts=3)
    target = oc.cell_targets(pool, "answer")
    np.testing.assert_allclose(target["selected_mean"], target["mean"], atol=1e-12)
    np.testing.assert_allclose(target["mean"], pool.candidate_reward.transpose(1, 0, 2).ravel(), atol=1e-12)
    s = pool.sample(60_000, rng)
    cells, n = oc.candidate_cells(pool, s, "answer")
    for weighted in (True, False):
        model = oc.fit_outcome_model(cells, s.selected, s.reward, s.p, weighted=weighted, n_cells=n)
        mu = model.predict(np.arange(n))
        assert np.abs(mu - target["mean"]).max() < 0.08


def test_candidate_table_lifts_like_the_pool():
    pool, _ = _router_reads_answers(7, n_prompts=2)
    np.testing.assert_array_equal(oc.candidate_table(pool, pool.candidate_reward), pool.candidate_values())
    shared = np.arange(6.0).reshape(2, 3)
    lifted = oc.candidate_table(pool, shared)
    assert lifted[1, 2, 0, 1, 0] == shared[1, 2] and lifted[1, 2, 0, 1, 2] == shared[1, 1]
    with pytest.raises(ValueError, match="table"):
        oc.candidate_table(pool, np.zeros((2, 2)))


@pytest.mark.parametrize("by", ["agent", "answer"])
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_cell_table_inverts_the_cell_layout(by, seed):
    """Lifting cell_table(range(n cells)) to the sampled joint actions gives back each
    candidate's cell: the table and candidate_cells index the same cells."""
    pool, rng = _router_reads_answers(seed % 50, n_prompts=4)
    logged = pool.sample(200, np.random.default_rng(seed))
    cells, n = oc.candidate_cells(pool, logged, by=by)
    table = oc.cell_table(pool, np.arange(n), by=by)
    assert table.shape == (pool.n_agents, pool.n_prompts, pool.n_actions)
    np.testing.assert_array_equal(oc.candidate_table(pool, table)[logged.index()], cells)
    # by agent the answer does not matter; by answer every cell appears once
    if by == "agent":
        assert (table == table[..., :1]).all()
    else:
        np.testing.assert_array_equal(np.sort(table.ravel()), np.arange(n))


def test_cell_table_of_exact_targets_is_g_when_the_model_sees_the_answer():
    """With by="answer" the exact per-cell mean E[R | h, j, a] is g_j(h, a) wherever the cell
    has mass: the table of the targets is the pool's own candidate values."""
    pool, _ = _router_reads_answers(3, n_prompts=3)
    target = oc.cell_targets(pool, by="answer")
    table = oc.cell_table(pool, np.nan_to_num(target["mean"]), by="answer")
    has_mass = oc.cell_table(pool, target["mass"], by="answer") > 0
    np.testing.assert_allclose(table[has_mass], pool.candidate_reward[has_mass], atol=1e-12)


def test_cell_table_refuses_a_wrong_length_or_grouping():
    pool, _ = _router_reads_answers(1, n_prompts=2)
    with pytest.raises(ValueError, match="predictions"):
        oc.cell_table(pool, np.zeros(5))
    with pytest.raises(ValueError, match="by"):
        oc.cell_table(pool, np.zeros(6), by="prompt")


def test_candidate_blind_router_has_no_selection_bias():
    pool, _ = _router_reads_answers(4, blind=True)
    t = oc.cell_targets(pool, "agent")
    np.testing.assert_allclose(t["selected_mean"], t["mean"], atol=1e-12)
    np.testing.assert_allclose(t["mass"].sum(), pool.n_agents)


def test_float_features_logistic_matches_tabular_on_one_hot():
    pool, rng = _router_reads_answers(5, n_prompts=2)
    s = pool.sample(1500, rng)
    cells, n = oc.candidate_cells(pool, s, "agent")
    onehot = np.eye(n)[cells]
    tab = oc.fit_outcome_model(cells, s.selected, s.reward, s.p, n_cells=n, l2=0.0)
    lin = oc.fit_outcome_model(onehot, s.selected, s.reward, s.p, l2=0.0)
    np.testing.assert_allclose(lin.predict(np.eye(n)), tab.predict(np.arange(n)), atol=1e-4)
    mlp = oc.fit_outcome_model(onehot, s.selected, s.reward, s.p, hidden=4, max_iter=20)
    assert mlp.predict(onehot).shape == cells.shape
    assert mlp.loss < mlp.history[0]


def test_selected_cross_entropy_is_the_loss_with_unit_propensities():
    logits = torch.tensor([[0.0, 2.0], [1.0, -1.0]])
    sel, rew = torch.tensor([1, 0]), torch.tensor([1.0, 0.0])
    expected = (np.log1p(np.exp(-2.0)) + np.log1p(np.exp(1.0))) / 2
    assert float(oc.selected_cross_entropy(logits, sel, rew)) == pytest.approx(expected)


# --- calibration --------------------------------------------------------------------------


def test_brier_and_reliability_by_hand():
    assert oc.brier_score([0.5, 0.5], [0, 1]) == pytest.approx(0.25)
    assert oc.brier_score([1.0, 0.0, 0.2], [1, 0, 1]) == pytest.approx(0.64 / 3)
    assert oc.brier_score([0.0, 1.0], [0, 0], weights=[3, 1]) == pytest.approx(0.25)
    rc = oc.reliability_curve([0.05, 0.05, 0.95, 0.95, 0.55], [0, 1, 1, 1, 0], n_bins=10)
    assert list(rc["bin"]) == [0, 5, 9] and rc["count"].sum() == 5
    np.testing.assert_allclose(rc["observed"], [0.5, 0.0, 1.0])
    np.testing.assert_allclose(rc["predicted"], [0.05, 0.55, 0.95])


def test_calibrated_predictions_lie_on_the_diagonal():
    rng = np.random.default_rng(0)
    q = rng.uniform(size=200_000)
    y = (rng.random(q.size) < q).astype(float)
    rc = oc.reliability_curve(q, y, n_bins=10)
    assert np.all(np.abs(rc["observed"] - rc["predicted"]) < 4 * rc["se"] + 1e-3)
    assert oc.brier_score(q, y) == pytest.approx(1 / 6, abs=3e-3)  # E[q(1-q)] for q ~ U(0,1)


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("call, name", [
    (lambda: oc.dr_removal_moments([0.5, 0.5], [1.0, 0.0], np.zeros((2, 2)), [0, 0]), "p"),
    (lambda: oc.dr_removal_moments([0.5, 0.5], [0.5, 0.5], np.zeros((2, 2)), [0, 0, 0]), "mu_hat"),
    (lambda: oc.dr_removal_moments([0.5, 0.5], [0.5, 0.5], np.zeros((2, 3)), [0, 0]), "P"),
    (lambda: oc.dr_removal_moments([0.5, 1.5], [0.5, 0.5], np.zeros((2, 2)), [0, 0]), "g"),
    (lambda: oc.wta_moments([0.5, 0.5], [0.5, 0.5], noise="gauss"), "noise"),
    (lambda: oc.enumerate_feedback([0.5, 0.5], [0.7, 0.7]), "p"),
    (lambda: oc.draw_feedback([0.5, 0.5], [0.5, 0.5], 0, np.random.default_rng(0)), "n"),
    (lambda: oc.brier_score([0.5, np.nan], [0, 1]), "prob"),
    (lambda: oc.brier_score([0.5, 0.5], [0, 2]), "outcome"),
    (lambda: oc.brier_score([0.5], [0, 1]), "prob"),
    (lambda: oc.reliability_curve([0.5], [1], n_bins=0), "n_bins"),
    (lambda: oc.fit_outcome_model(CELLS, np.array([0, 1]), [1.0, 0.0], [[0.5, 0.5], [1.0, 0.0]]), "p"),
    (lambda: oc.fit_outcome_model(CELLS, np.array([0, 1]), [1.0], [[0.5, 0.5]] * 2), "reward"),
    (lambda: oc.fit_outcome_model(CELLS, np.array([0.0, 1.0]), [1.0, 0.0], [[0.5, 0.5]] * 2), "selected"),
    (lambda: oc.fit_outcome_model(np.zeros((2, 3)), np.array([0, 1]), [1.0, 0.0], [[0.5, 0.5]] * 2),
     "features"),
    (lambda: oc.fit_outcome_model(CELLS, np.array([0, 1]), [1.0, 2.0], [[0.5, 0.5]] * 2), "reward"),
])
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_a_zero_propensity_at_the_selected_candidate_is_refused_only_when_weighting():
    cells, sel, rew, p = np.zeros((2, 2), int), np.array([0, 1]), [1.0, 0.0], [[0.5, 0.5], [1.0, 0.0]]
    with pytest.raises(ValueError, match="p must be strictly positive"):
        oc.fit_outcome_model(cells, sel, rew, p, weighted=True)
    oc.fit_outcome_model(cells, sel, rew, p, weighted=False)  # the unweighted loss never divides


def test_cell_mean_predictions_by_hand_and_cross_fitting():
    # 4 slates, K = 2; cells of the deployed candidates: 0, 0, 1, 2
    cells = np.array([[0, 1], [0, 2], [3, 1], [2, 3]])
    sel = np.array([0, 0, 1, 0])
    G = np.array([1.0, 0.0, 1.0, 1.0])
    mu = oc.cell_mean_predictions(cells, sel, G, n_cells=4, prior=0.5, strength=1.0)
    cell_mean = np.array([(1 + 0 + 0.5) / 3, (1 + 0.5) / 2, (1 + 0.5) / 2, 0.5])
    np.testing.assert_allclose(mu, cell_mean[cells])
    # cross-fitted: slate t's predictions ignore the slates of its own fold
    folds = np.array([0, 1, 0, 1])
    cf = oc.cell_mean_predictions(cells, sel, G, n_cells=4, folds=folds, prior=0.5, strength=1.0)
    fit1 = np.array([(0 + 0.5) / 2, 0.5, (1 + 0.5) / 2, 0.5])     # from slates 1 and 3 (fold 1)
    fit0 = np.array([(1 + 0.5) / 2, (1 + 0.5) / 2, 0.5, 0.5])     # from slates 0 and 2 (fold 0)
    np.testing.assert_allclose(cf[[0, 2]], fit1[cells[[0, 2]]])
    np.testing.assert_allclose(cf[[1, 3]], fit0[cells[[1, 3]]])
    with pytest.raises(ValueError, match="folds"):
        oc.cell_mean_predictions(cells, sel, G, 4, folds=np.zeros(3, int))
    with pytest.raises(ValueError, match="strength"):
        oc.cell_mean_predictions(cells, sel, G, 4, strength=0.0)


def test_in_sample_outcome_model_biases_eq19_and_cross_fitting_does_not():
    # one fixed slate of K = 2, rewards Bernoulli(g); batches of n slates; the in-sample cell mean
    # of the deployed candidate moves with its own G, so E[Eq. 19] != Delta^rem (Corollary 3 needs
    # a fixed or cross-fitted model); the cross-fitted one stays unbiased.
    rng = np.random.default_rng(0)
    g = np.array([0.7, 0.4])
    p = np.array([0.8, 0.2])
    P = np.array([[0.0, 1.0], [1.0, 0.0]])
    exact = routing.removal_contributions(g, p, P)
    D, n = 6_000, 6
    sel = (rng.random((D, n)) > p[0]).astype(int)
    G = (rng.random((D, n)) < g[sel]).astype(float)
    cells = np.broadcast_to([0, 1], (n, 2))
    errs = {"in": [], "cross": []}
    for d in range(D):
        for name, folds in (("in", None), ("cross", np.arange(n) % 2)):
            mu = oc.cell_mean_predictions(cells, sel[d], G[d], 2, folds=folds, strength=0.5)
            pp, PP = np.tile(p, (n, 1)), np.tile(P, (n, 1, 1))
            est = routing.dr_removal_contributions(sel[d], G[d], pp, PP, mu)
            errs[name].append((est - exact).mean(0))
    for name, e in errs.items():
        e = np.array(e)
        m, h = e.mean(0), 4 * e.std(0, ddof=1) / np.sqrt(D)
        if name == "in":
            assert (np.abs(m) > h).any()
        else:
            assert (np.abs(m) < h).all()


@SETTINGS
@given(st.integers(2, 4), st.floats(0.2, 3), st.floats(0.01, 0.9), st.floats(-3, 3),
       st.integers(0, 2**31 - 1))
def test_reward_aware_feedback_breaks_17_and_eq19_with_p_given_h_a(K, tau, eps, bonus, seed):
    """A judge that sees the rewards: the outcomes are a distribution, P(I = j | H, A) keeps
    overlap, E[R^(j) | I = j] moves with the bonus, and Eq. (19) with the propensities given
    (H, A) estimates sum_j w_ij E[R^(j) | H, A, I = j], whatever mu_hat is; with the router's
    own propensities (given the rewards it saw) it is unbiased for E[G - G^{-i}_route | H, A]."""
    rng = np.random.default_rng(seed)
    g, s, mu = rng.uniform(0.05, 0.95, size=K), rng.normal(size=K), rng.uniform(size=K)
    fb = oc.enumerate_reward_aware_feedback(g, s, bonus, tau, eps)
    prob, sel, G = fb["prob"], fb["selected"], fb["reward"]
    assert prob.shape == (2**K * K,) and np.isclose(prob.sum(), 1.0) and (prob >= 0).all()
    assert (G == fb["rewards"][np.arange(len(G)), sel]).all()
    onehot = sel[:, None] == np.arange(K)
    p_HA = prob @ onehot
    np.testing.assert_allclose(p_HA, prob @ fb["p"], atol=1e-12)
    assert (p_HA >= eps / K - 1e-12).all()
    P_HA = np.einsum("o,oij->ij", prob, fb["P"])
    g_sel = (prob @ (onehot * fb["rewards"])) / p_HA  # E[R^(j) | H, A, I = j]
    truth = prob @ np.einsum("oij,oj->oi", fb["p"][:, None, :] - fb["P"], fb["rewards"])
    est = routing.dr_removal_contributions(sel, G, np.tile(p_HA, (len(G), 1)), np.tile(P_HA, (len(G), 1, 1)),
                                           np.tile(mu, (len(G), 1)))
    np.testing.assert_allclose(prob @ est, (p_HA[None, :] - P_HA) @ g_sel, atol=1e-10)
    own = routing.dr_removal_contributions(sel, G, fb["p"], fb["P"], np.tile(mu, (len(G), 1)))
    np.testing.assert_allclose(prob @ own, truth, atol=1e-10)
    if abs(bonus) < 1e-9:  # no peeking: (17) holds and the propensities given (H, A) suffice
        np.testing.assert_allclose(g_sel, g, atol=1e-10)
        np.testing.assert_allclose(prob @ est, truth, atol=1e-10)
    elif abs(bonus) > 0.5 and eps < 0.9:  # the judge favours right answers (bonus > 0) or wrong ones
        assert (np.sign(bonus) * (g_sel - g) > 0).all()


def test_reward_aware_feedback_bias_is_visible():
    """At a fixed slate the bias of Eq. (19) with P(I = j | H, A) is far from 0 (the check can fail)."""
    g, s = np.array([0.3, 0.6, 0.5]), np.array([0.2, 0.0, -0.1])
    fb = oc.enumerate_reward_aware_feedback(g, s, 2.0, 0.5, 0.1)
    prob, sel = fb["prob"], fb["selected"]
    p_HA = prob @ (sel[:, None] == np.arange(3))
    P_HA = np.einsum("o,oij->ij", prob, fb["P"])
    n = len(sel)
    est = routing.dr_removal_contributions(sel, fb["reward"], np.tile(p_HA, (n, 1)), np.tile(P_HA, (n, 1, 1)),
                                           np.full((n, 3), 0.5))
    truth = prob @ np.einsum("oij,oj->oi", fb["p"][:, None, :] - fb["P"], fb["rewards"])
    assert np.abs(prob @ est - truth).max() > 0.05
    with pytest.raises(ValueError, match="g"):
        oc.enumerate_reward_aware_feedback([1.5, 0.2], [0.0, 0.0], 1.0)
