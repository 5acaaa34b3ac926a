"""mcpg.grpo.objective: credit signals, group standardisation and the clipped loss, against hand
computations."""

import itertools

import numpy as np
import pytest
import torch

from mcpg import routing
from mcpg.grpo.objective import (
    ADVANTAGE_EPS,
    LOSS_TYPES,
    SCALE_REWARDS,
    SIGNALS,
    clipped_grpo_loss,
    credit,
    group_advantages,
    group_standardize,
    route_and_credit,
    zero_std_groups,
)


def _slate(scores, tau=1.0, eps=0.1):
    s = np.asarray(scores, dtype=float)
    return routing.router_propensities(s, tau, eps), routing.leave_one_out_propensities(s, tau, eps)


def test_wta_is_indicator_times_reward():
    p, P = _slate([[0.0, 1.0, -1.0], [2.0, 0.0, 0.0]])
    got = credit("wta", np.array([1, 2]), np.array([1.0, 0.0]), p, P, np.full((2, 3), 0.5))
    np.testing.assert_array_equal(got, [[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


def test_oracle_two_agents_by_hand():
    # K = 2: deleting one candidate leaves the other with probability 1, so
    # Delta_0 = p0 g0 + p1 g1 - g1 = p0 (g0 - g1) and Delta_1 = p1 (g1 - g0).
    p = np.array([0.7, 0.3])
    P = np.array([[0.0, 1.0], [1.0, 0.0]])
    R = np.array([1.0, 0.0])
    got = credit("oracle", 0, 1.0, p, P, None, rewards_all=R)
    np.testing.assert_allclose(got, [0.7, -0.3])


def test_removal_by_hand_three_agents():
    # p from Eq. (3) with eps = 0 on scores log(1), log(2), log(1): p = (1/4, 1/2, 1/4)
    s = np.log([1.0, 2.0, 1.0])
    p, P = _slate(s, eps=0.0)
    np.testing.assert_allclose(p, [0.25, 0.5, 0.25])
    np.testing.assert_allclose(P[0], [0, 2 / 3, 1 / 3])
    mu = np.array([0.5, 0.5, 0.5])
    # I = 1, G = 1: g_hat = (0.5, 0.5 + (1 - 0.5)/0.5, 0.5) = (0.5, 1.5, 0.5)
    got = credit("removal", 1, 1.0, p, P, mu)
    g_hat = np.array([0.5, 1.5, 0.5])
    full = p @ g_hat  # 1.0
    expect = [full - P[i] @ g_hat for i in range(3)]  # (1 - 7/6, 1 - 1/2, 1 - 7/6)
    np.testing.assert_allclose(got, expect)
    np.testing.assert_allclose(got, [-1 / 6, 0.5, -1 / 6])


def test_removal_equals_exact_when_outcome_model_is_exact():
    rng = np.random.default_rng(0)
    s = rng.normal(size=(5, 4))
    p, P = _slate(s, eps=0.2)
    R = rng.integers(0, 2, size=(5, 4)).astype(float)
    exact = routing.removal_contributions(R, p, P)
    for I in range(4):  # noqa: E741 (the paper's name)
        sel = np.full(5, I)
        got = credit("removal", sel, R[:, I], p, P, mu_hat=R)
        np.testing.assert_allclose(got, exact, atol=1e-12)


@pytest.mark.parametrize("eps", [0.05, 0.3])
def test_removal_unbiased_by_exact_average_over_selection(eps):
    # Corollary 3: E_I[Delta_hat^rem] = Delta^rem for ANY fixed outcome model (R deterministic)
    rng = np.random.default_rng(1)
    s = rng.normal(size=(3, 3))
    p, P = _slate(s, eps=eps)
    R = rng.integers(0, 2, size=(3, 3)).astype(float)
    mu_bad = rng.uniform(size=(3, 3))  # deliberately wrong
    avg = sum(
        p[:, [I]] * credit("removal", np.full(3, I), R[:, I], p, P, mu_bad)
        for I in range(3)  # noqa: E741 (the paper's name)
    )
    np.testing.assert_allclose(avg, credit("oracle", np.zeros(3, int), R[:, 0], p, P, None, rewards_all=R),
                               atol=1e-12)
    # and a single draw is not the exact value in general (the estimate has variance)
    one = credit("removal", np.zeros(3, int), R[:, 0], p, P, mu_bad)
    assert not np.allclose(one, avg)


def test_wta_average_is_not_removal():
    # winner-take-all credits agent i with p_i R_i on average: private utility, not removal
    p, P = _slate([0.0, 2.0, 0.0], eps=0.1)
    R = np.array([1.0, 1.0, 0.0])
    avg = sum(p[I] * credit("wta", I, R[I], p, P, None) for I in range(3))  # noqa: E741 (the paper's name)
    np.testing.assert_allclose(avg, p * R)
    assert not np.allclose(avg, credit("oracle", 0, 1.0, p, P, None, rewards_all=R))


def test_credit_accepts_torch_and_batch_shapes():
    s = torch.randn(2, 3, 4, dtype=torch.float64)
    p, P = _slate(s.numpy())
    sel = torch.zeros(2, 3, dtype=torch.long)
    mu_hat = torch.full((2, 3, 4), 0.3)
    out = credit("removal", sel, torch.ones(2, 3), torch.from_numpy(p), torch.from_numpy(P), mu_hat)
    assert isinstance(out, np.ndarray) and out.shape == (2, 3, 4)


def test_credit_bad_inputs():
    p, P = _slate([0.0, 0.0])
    with pytest.raises(ValueError, match="signal"):
        credit("shapley", 0, 1.0, p, P, None)
    with pytest.raises(ValueError, match="rewards_all"):
        credit("oracle", 0, 1.0, p, P, None)
    with pytest.raises(ValueError, match="rewards_all"):
        credit("oracle", 0, 1.0, p, P, None, rewards_all=[1.0, 0.0, 1.0])
    with pytest.raises(ValueError, match="reward"):
        credit("oracle", 0, 0.0, p, P, None, rewards_all=[1.0, 0.0])  # G != R^(I)
    with pytest.raises(ValueError, match="p"):
        credit("removal", 0, 1.0, [1.0, 0.0], P, [0.5, 0.5])  # zero propensity: Eq. (19) divides by it
    with pytest.raises(ValueError, match="selected"):
        credit("wta", 2, 1.0, p, P, None)
    with pytest.raises(ValueError, match="NaN"):
        credit("removal", 0, float("nan"), p, P, [0.5, 0.5])


def test_group_standardize_by_hand():
    x = np.array([[1.0, 5.0], [0.0, 5.0], [0.0, 5.0], [1.0, 5.0]])  # (m=4, K=2): agent 1 constant
    z = group_standardize(x)
    a = 0.5 / (np.sqrt(1 / 3) + 1e-4)  # mean 0.5, unbiased std sqrt(1/3), TRL's eps 1e-4
    np.testing.assert_allclose(z[:, 0], [a, -a, -a, a], rtol=1e-12)
    np.testing.assert_array_equal(z[:, 1], 0.0)  # a constant group gets no advantage
    # batch of prompts (B, m, K): each (prompt, agent) group separately
    rng = np.random.default_rng(0)
    y = rng.normal(size=(3, 5, 4)) * rng.uniform(1, 10, size=(3, 1, 4)) + 7
    zy = group_standardize(y, eps=0.0)
    np.testing.assert_allclose(zy.mean(axis=1), 0.0, atol=1e-12)
    np.testing.assert_allclose(zy.std(axis=1, ddof=1), 1.0)
    t = group_standardize(torch.tensor(y))
    assert isinstance(t, torch.Tensor)
    np.testing.assert_allclose(t.numpy(), group_standardize(y))


def test_group_standardize_bad_inputs():
    with pytest.raises(ValueError, match="at least 2"):
        group_standardize(np.ones((1, 3)))
    with pytest.raises(ValueError, match="NaN"):
        group_standardize(np.array([[np.nan], [1.0]]))
    with pytest.raises(ValueError, match="eps"):
        group_standardize(np.ones((2, 2)), eps=-1)


def test_clipped_loss_on_policy_is_minus_mean_advantage_per_token():
    logp = torch.randn(3, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    adv = torch.tensor([1.0, -2.0, 0.5])
    loss = clipped_grpo_loss(logp, logp.detach(), adv, mask)
    expect = -(4 * 1.0 + 2 * -2.0 + 1 * 0.5) / 7  # dapo: sum over active tokens / their number
    assert float(loss.detach()) == pytest.approx(expect)
    g = torch.autograd.grad(loss, logp)[0]  # d/dlogp of -r A at r = 1 is -A / n_tokens on active tokens
    np.testing.assert_allclose(g.numpy(), (-adv[:, None] * mask / 7).numpy(), rtol=1e-6)
    grpo = clipped_grpo_loss(logp, logp.detach(), adv, mask, loss_type="grpo")
    assert float(grpo.detach()) == pytest.approx(-(1.0 - 2.0 + 0.5) / 3)
    dr = clipped_grpo_loss(logp, logp.detach(), adv, mask, loss_type="dr_grpo", max_completion_length=10)
    assert float(dr.detach()) == pytest.approx(-(4 - 4 + 0.5) / 30)


def test_clipped_loss_clips_by_hand():
    old = torch.zeros(2, 1)
    new = torch.full((2, 1), float(np.log(1.5)), requires_grad=True)  # ratio 1.5 > 1 + 0.2
    adv = torch.tensor([2.0, -2.0])
    mask = torch.ones(2, 1)
    loss = clipped_grpo_loss(new, old, adv, mask, clip_eps=0.2, loss_type="grpo")
    # positive advantage: min(1.5 A, 1.2 A) = 1.2 A (clipped, no gradient)
    # negative advantage: min(1.5 A, 1.2 A) = 1.5 A (unclipped, gradient -A * r)
    assert float(loss.detach()) == pytest.approx((-1.2 * 2 + 1.5 * 2) / 2)
    g = torch.autograd.grad(loss, new)[0]
    np.testing.assert_allclose(g.numpy().ravel(), [0.0, 1.5 * 2 / 2], rtol=1e-6)
    # asymmetric clipping (DAPO's epsilon_high): 1.5 < 1 + 0.6, so nothing is clipped
    loss_hi = clipped_grpo_loss(new, old, adv, mask, clip_eps=0.2, clip_eps_high=0.6, loss_type="grpo")
    assert float(loss_hi.detach()) == pytest.approx(0.0, abs=1e-6)


def test_clipped_loss_kl_term():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -2.0]])
    loss = clipped_grpo_loss(logp, logp, torch.zeros(1), torch.ones(1, 2), beta=0.1, logp_ref=ref)
    d = -0.5
    assert float(loss.detach()) == pytest.approx(0.1 * (np.exp(d) - d - 1) / 2)


def test_clipped_loss_bad_inputs():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="loss_type"):
        clipped_grpo_loss(x, x, torch.zeros(2), x, loss_type="ppo")
    with pytest.raises(ValueError, match="shape"):
        clipped_grpo_loss(x, torch.zeros(2, 4), torch.zeros(2), x)
    with pytest.raises(ValueError, match="advantages"):
        clipped_grpo_loss(x, x, torch.zeros(3), x)
    with pytest.raises(ValueError, match="NaN"):
        clipped_grpo_loss(x, x, torch.tensor([0.0, float("nan")]), x)
    with pytest.raises(ValueError, match="logp_ref"):
        clipped_grpo_loss(x, x, torch.zeros(2), x, beta=0.1)
    with pytest.raises(ValueError, match="clip_eps"):
        clipped_grpo_loss(x, x, torch.zeros(2), x, clip_eps=-0.1)


def test_slate_layout_round_trip():
    # rows (b, k, g) <-> slates (b, g, k): the layout the trainer relies on
    B, K, m = 2, 3, 4
    rows = np.arange(B * K * m)
    slates = rows.reshape(B, K, m).transpose(0, 2, 1)
    for b, k, g in itertools.product(range(B), range(K), range(m)):
        assert slates[b, g, k] == (b * K + k) * m + g
    np.testing.assert_array_equal(slates.transpose(0, 2, 1).reshape(-1), rows)


def test_public_names_and_trl_constants():
    assert SIGNALS == ("wta", "removal", "oracle")
    assert "dapo" in LOSS_TYPES
    assert SCALE_REWARDS == ("group", "batch", "none")  # TRL's three values
    assert ADVANTAGE_EPS == 1e-4  # TRL's GRPOTrainer adds 1e-4 to the group std


def test_group_advantages_none_is_centred_and_keeps_scale():
    x = np.array([[1.0, 5.0], [0.0, 5.0], [0.0, 5.0], [3.0, 5.0]])  # (m=4, K=2)
    a = group_advantages(x, scale_rewards="none")
    np.testing.assert_allclose(a[:, 0], [0.0, -1.0, -1.0, 2.0])  # mean 1
    np.testing.assert_array_equal(a[:, 1], 0.0)
    # scaling the scores scales centred advantages, leaves standardised ones (eps = 0) unchanged
    np.testing.assert_allclose(group_advantages(10 * x, "none"), 10 * a)
    np.testing.assert_allclose(group_advantages(10 * x, "group", eps=0.0)[:, 0],
                               group_advantages(x, "group", eps=0.0)[:, 0])
    # "group" is group_standardize with TRL's eps: (x - mean) / (std + 1e-4)
    std = x[:, 0].std(ddof=1)
    np.testing.assert_allclose(group_advantages(x)[:, 0], (x[:, 0] - 1.0) / (std + 1e-4))
    t = group_advantages(torch.tensor(x), "none")
    assert isinstance(t, torch.Tensor)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_advantages(x, "batchwise")
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages(np.ones((1, 2)), "none")


def test_group_advantages_batch_centres_per_group_and_divides_by_each_agents_batch_std():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(3, 4, 2)) * np.array([1.0, 10.0])  # (B=3, m=4, K=2), agents of two scales
    x[1, :, 0] = 7.0  # a group with no spread: advantages 0, as with "group"
    a = group_advantages(x, "batch", batch_axis=0)
    for k in range(2):
        std = x[..., k].reshape(-1).std(ddof=1)  # one agent's 12 scores, unbiased (TRL's nanstd)
        want = (x[..., k] - x[..., k].mean(axis=1, keepdims=True)) / (std + 1e-4)
        np.testing.assert_allclose(a[..., k], want, rtol=1e-12)
    np.testing.assert_array_equal(a[1, :, 0], 0.0)
    assert a.sum(axis=1) == pytest.approx(np.zeros((3, 2)), abs=1e-9)  # centred in every group
    # one std for the whole batch: not the group's (which "group" uses)
    assert not np.allclose(a, group_advantages(x, "group"))
    # a common scale of every score leaves it unchanged (up to eps), as "group" does
    np.testing.assert_allclose(group_advantages(5 * x, "batch", eps=0.0, batch_axis=0),
                               group_advantages(x, "batch", eps=0.0, batch_axis=0))
    t = group_advantages(torch.tensor(x), "batch", batch_axis=0)
    assert isinstance(t, torch.Tensor)
    np.testing.assert_allclose(t.numpy(), a)
    # the leverage of a score under "batch" is 1 / (the agent's batch std + eps)
    lev = credit_leverage(x, "batch", batch_axis=0)
    np.testing.assert_allclose(lev[0, 0], 1.0 / (x.reshape(-1, 2).std(axis=0, ddof=1) + 1e-4))
    with pytest.raises(ValueError, match="batch_axis"):
        group_advantages(x, "batch")  # which axis holds the prompts must be said
    with pytest.raises(ValueError, match="batch_axis"):
        group_advantages(x, "batch", batch_axis=5)
    with pytest.raises(ValueError, match="agents"):
        group_advantages(x, "batch", batch_axis=-1)


def test_zero_std_groups():
    x = np.zeros((2, 3, 2))  # (B=2, m=3, K=2)
    x[0, :, 0] = [1.0, 0.0, 0.0]  # prompt 0, agent 0 varies
    x[1, :, 1] = 2.0  # prompt 1, agent 1 constant (nonzero)
    z = zero_std_groups(x)
    np.testing.assert_array_equal(z, [[False, True], [True, True]])


def _rollout(B=4, m=5, K=3, seed=0, eps=0.2):
    rng = np.random.default_rng(seed)
    s = rng.normal(size=(B, m, K))
    p, P = _slate(s, eps=eps)
    R = rng.integers(0, 2, size=(B, m, K)).astype(float)
    mu = 1 / (1 + np.exp(-s))
    return p, P, mu, R


@pytest.mark.parametrize("signal", SIGNALS)
@pytest.mark.parametrize("scale", SCALE_REWARDS)
def test_route_and_credit_matches_the_steps_by_hand(signal, scale):
    p, P, mu, R = _rollout()
    out = route_and_credit(signal, p, P, mu, R, np.random.default_rng(7), scale_rewards=scale)
    I = routing.sample_selection(p, np.random.default_rng(7))  # noqa: E741 (same generator: same draw)
    np.testing.assert_array_equal(out.I, I)
    G = np.take_along_axis(R, I[..., None], -1)[..., 0]
    np.testing.assert_array_equal(out.G, G)
    sc = credit(signal, I, G, p, P, mu, rewards_all=R if signal == "oracle" else None)
    np.testing.assert_allclose(out.scores, sc)
    if scale == "group":
        np.testing.assert_allclose(out.advantages, group_standardize(sc, eps=1e-4, axis=1))
    elif scale == "batch":  # the batch of B prompts x m slates, per agent
        std = sc.reshape(-1, sc.shape[-1]).std(axis=0, ddof=1)
        np.testing.assert_allclose(out.advantages, (sc - sc.mean(axis=1, keepdims=True)) / (std + 1e-4))
    else:
        np.testing.assert_allclose(out.advantages, sc - sc.mean(axis=1, keepdims=True))
    np.testing.assert_allclose(out.zero_std_fraction, (sc.std(axis=1, ddof=1) < 1e-8).mean(axis=0))
    assert out.zero_std_fraction.shape == (3,)


def test_route_and_credit_filtered_feedback_ignores_unselected_rewards():
    # wta and removal must not read R off the selected candidate: change it, nothing moves
    p, P, mu, R = _rollout(seed=3)
    a = route_and_credit("removal", p, P, mu, R, np.random.default_rng(1))
    R2 = R.copy()
    onehot = np.arange(3) == a.I[..., None]
    R2[~onehot] = 1 - R2[~onehot]
    b = route_and_credit("removal", p, P, mu, R2, np.random.default_rng(1))
    np.testing.assert_array_equal(a.scores, b.scores)
    c = route_and_credit("oracle", p, P, mu, R2, np.random.default_rng(1))
    assert not np.allclose(c.scores, a.scores)


def test_route_and_credit_one_generator_per_seed():
    p, P, mu, R = _rollout(B=6)
    p2, P2, mu2, R2 = (x.reshape((2, 3) + x.shape[1:]) for x in (p, P, mu, R))  # (S=2, B=3, m, K)
    out = route_and_credit("wta", p2, P2, mu2, R2, [np.random.default_rng(0), np.random.default_rng(1)])
    np.testing.assert_array_equal(out.I[0], routing.sample_selection(p2[0], np.random.default_rng(0)))
    np.testing.assert_array_equal(out.I[1], routing.sample_selection(p2[1], np.random.default_rng(1)))
    with pytest.raises(ValueError, match="generator"):
        route_and_credit("wta", p2, P2, mu2, R2, [np.random.default_rng(0)])


def test_route_and_credit_unbiased_removal_over_draws():
    # Corollary 3 through the whole step: the mean over many draws of I of the removal scores
    # is the exact removal contribution (the oracle's scores), for a wrong outcome model.
    p, P, _, R = _rollout(B=1, m=2, K=3, seed=5)
    mu_bad = np.full_like(p, 0.9)
    rng = np.random.default_rng(11)
    n = 20000
    pp, PP, mm, RR = (np.broadcast_to(x, (n,) + x.shape) for x in (p, P, mu_bad, R))
    out = route_and_credit("removal", pp, PP, mm, RR, rng)
    exact = routing.removal_contributions(R, p, P)
    se = out.scores.std(axis=0) / np.sqrt(n)
    assert np.all(np.abs(out.scores.mean(axis=0) - exact) < 5 * se + 1e-12)


@pytest.mark.parametrize("scale", SCALE_REWARDS)
def test_one_agent_removal_equals_wta_equals_reward(scale):
    # K = 1: the leave-one-out slate is empty and deploys nothing, so Delta^rem = G = wta
    rng = np.random.default_rng(0)
    s = rng.normal(size=(3, 4, 1))
    p = routing.router_propensities(s, eps=0.1)
    P = routing.leave_one_out_propensities(s, eps=0.1)
    np.testing.assert_array_equal(p, 1.0)
    assert P.shape == (3, 4, 1, 1) and not P.any()
    R = rng.integers(0, 2, size=(3, 4, 1)).astype(float)
    mu = 1 / (1 + np.exp(-s))
    outs = {sig: route_and_credit(sig, p, P, mu, R, np.random.default_rng(2), scale_rewards=scale)
            for sig in SIGNALS}
    for sig in SIGNALS:
        np.testing.assert_array_equal(outs[sig].I, 0)
        np.testing.assert_allclose(outs[sig].scores, R)
        np.testing.assert_allclose(outs[sig].advantages, outs["wta"].advantages)


# --- removal with exact evaluations on a budget (Eqs. 21-22 in the loop; chapter 9) ----------

from mcpg.allocation import ExactBudget  # noqa: E402
from mcpg.grpo.objective import budgeted_removal, credit_leverage  # noqa: E402
from random_slates import budget_rollout as _budget_rollout  # noqa: E402 (tests/random_slates.py)


@pytest.mark.parametrize("scale", SCALE_REWARDS)
@pytest.mark.parametrize("rule", ["sqrt", "uniform", "proportional"])
def test_budget_zero_is_removal_and_budget_one_is_oracle_bit_for_bit(scale, rule):
    budgets = {0.0: ExactBudget(0.0, rule), 1.0: ExactBudget(1.0, rule), 0.5: ExactBudget(0.5, rule)}
    for it in range(4):  # several rollouts: the budget's estimates are learned in between
        p, P, mu, R = _budget_rollout(it)
        ref = {sig: route_and_credit(sig, p, P, mu, R, np.random.default_rng(it), scale_rewards=scale)
               for sig in ("removal", "oracle")}
        got = {b: route_and_credit("removal", p, P, mu, R, np.random.default_rng(it), scale_rewards=scale,
                                   budget=eb, budget_rng=np.random.default_rng(99 + it))
               for b, eb in budgets.items()}
        for b, sig in ((0.0, "removal"), (1.0, "oracle")):
            assert np.array_equal(got[b].I, ref[sig].I)
            assert np.array_equal(got[b].scores, ref[sig].scores)
            assert np.array_equal(got[b].advantages, ref[sig].advantages)
        assert got[0.0].exact.z.sum() == 0 and (got[1.0].exact.z == 1).all()
        assert (got[1.0].exact.cost == 2).all()
        # the check can fail: a half budget is neither
        assert not np.array_equal(got[0.5].scores, ref["removal"].scores)
        assert not np.array_equal(got[0.5].scores, ref["oracle"].scores)


@pytest.mark.parametrize("rule", ["sqrt", "proportional"])
def test_budgeted_credit_is_unbiased_by_monte_carlo(rule):
    # Fixed slates and draws I; only Z varies. The mean of Eq. (21) over n draws is the exact
    # removal contribution within 5 Monte Carlo standard errors (the variance is known:
    # Var Δ̃ = (1/p - 1)(Y - Δ̂)^2), for every agent and slate.
    p, P, mu, R = _budget_rollout(7)
    I = routing.sample_selection(p, np.random.default_rng(1))  # noqa: E741
    G = np.take_along_axis(R, I[..., None], -1)[..., 0]
    y = routing.removal_contributions(R, p, P)
    budget, rng = ExactBudget(0.15, rule), np.random.default_rng(2)
    budgeted_removal(I, G, p, P, mu, R, budget, rng)  # the pilot: now the allocation is Eq. 22
    frozen = budget.state_dict()
    n, total, q = 4_000, 0.0, None
    for _ in range(n):
        budget.load_state_dict(frozen)  # the same allocation every draw
        scores, ex = budgeted_removal(I, G, p, P, mu, R, budget, rng)
        total = total + scores
        q = ex.p if q is None else q
        assert np.array_equal(ex.p, q)
    assert not np.allclose(q, q.mean())  # not uniform
    dhat = credit("removal", I, G, p, P, mu)
    se = np.sqrt((1 / q[..., None] - 1) * (y - dhat) ** 2 / n)
    assert np.all(np.abs(total / n - y) <= 5 * se + 1e-12)
    assert not np.all(np.abs(dhat - y) <= 5 * se + 1e-12)  # Eq. (19) alone would fail it here


def test_realised_share_matches_the_budget_within_its_binomial_interval():
    # Over 300 rollouts of 16 slates, the number of exact evaluations is a sum of independent
    # Bernoulli(p_s) with sum p_s = budget x slates: inside the 99.9% normal interval.
    budget, rng = ExactBudget(0.1), np.random.default_rng(0)
    count, expect, var = 0, 0.0, 0.0
    for it in range(300):
        p, P, mu, R = _budget_rollout(1000 + it)
        rc = route_and_credit("removal", p, P, mu, R, np.random.default_rng(it), budget=budget,
                              budget_rng=rng)
        assert rc.exact.p.mean() == pytest.approx(0.1)  # the expected share is the budget
        count += rc.exact.z.sum()
        expect += rc.exact.p.sum()
        var += (rc.exact.p * (1 - rc.exact.p)).sum()
    assert expect == pytest.approx(0.1 * 300 * 16)
    assert abs(count - expect) <= 3.29 * np.sqrt(var)
    assert abs(1.3 * count - expect) > 3.29 * np.sqrt(var)  # a 30% overspend would fail


def test_budget_per_seed_and_refusals():
    p, P, mu, R = _budget_rollout(3, B=4)
    rngs = [np.random.default_rng(s) for s in range(4)]
    brngs = [np.random.default_rng(10 + s) for s in range(4)]
    batch = route_and_credit("removal", p[:, None], P[:, None], mu[:, None], R[:, None], rngs,
                             budget=[ExactBudget(0.3) for _ in range(4)], budget_rng=brngs)
    for s in range(4):
        one = route_and_credit("removal", p[s, None], P[s, None], mu[s, None], R[s, None],
                               np.random.default_rng(s), budget=ExactBudget(0.3),
                               budget_rng=np.random.default_rng(10 + s))
        assert np.array_equal(batch.scores[s], one.scores) and np.array_equal(batch.exact.z[s], one.exact.z)
    with pytest.raises(ValueError, match="removal"):
        route_and_credit("wta", p, P, mu, R, np.random.default_rng(0), budget=ExactBudget(0.1),
                         budget_rng=np.random.default_rng(0))


def test_credit_leverage():
    x = np.array([[[0.0, 1.0], [2.0, 1.0]]])  # one group of m = 2, K = 2
    np.testing.assert_array_equal(credit_leverage(x, "none"), np.ones_like(x))
    a = credit_leverage(x, "group")
    np.testing.assert_allclose(a[0, :, 0], 1 / (np.sqrt(2.0) + ADVANTAGE_EPS))  # std of (0, 2) is √2
    np.testing.assert_allclose(a[0, :, 1], 1 / ADVANTAGE_EPS)  # no spread: an error is the advantage
