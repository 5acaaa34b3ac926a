"""mcpg.grpo.slate_measures on slates whose answers are known, and chapter 7's twin pool."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpg.grpo import simulated as sim
from mcpg.grpo.objective import credit
from mcpg.grpo.slate_measures import first_rollout, slate_measures
from mcpg.routing import leave_one_out_propensities, router_propensities


def _router(n, K, rng, scale=1.0):
    s = scale * rng.normal(size=(n, K))
    return (router_propensities(s, tau=1.0, eps=0.1), leave_one_out_propensities(s, tau=1.0, eps=0.1),
            1 / (1 + np.exp(-s)))


def test_measures_of_constructed_slates():
    # m = 2, K = 3, four prompts (8 slates). Agent 0 and 1 are right together on prompt 0,
    # agent 2 alone on prompt 1's first slate, nobody on prompts 2 and 3.
    R = np.zeros((8, 3))
    R[0, :2] = R[1, :2] = 1
    R[2, 2] = 1
    rng = np.random.default_rng(0)
    p, P, mu = _router(8, 3, rng)
    out = slate_measures(R, p, P, mu, m=2, alignment=False)
    assert out["team_success"] == pytest.approx(3 / 8)
    assert out["multi_right"] == pytest.approx(2 / 3)  # slates 0 and 1 hold two right, slate 2 one
    assert out["no_right"] == pytest.approx(2 / 4)
    assert [out[f"accuracy_{k}"] for k in range(3)] == pytest.approx([2 / 8, 2 / 8, 1 / 8])
    assert out["accuracy"] == pytest.approx(5 / 24)
    # agents 0 and 1 are right on the same slates: their pair's correlation is 1
    r01 = np.corrcoef(R[:, 0], R[:, 1])[0, 1]
    r02, r12 = np.corrcoef(R[:, 0], R[:, 2])[0, 1], np.corrcoef(R[:, 1], R[:, 2])[0, 1]
    assert r01 == pytest.approx(1.0)
    assert out["rightness_corr"] == pytest.approx((r01 + r02 + r12) / 3)
    assert out["exploration"] == pytest.approx(float((1 - p.max(1)).mean()))
    assert np.isnan(out["credit_max"])


def test_correlation_signs_and_the_question_level():
    # agents right on alternating slates never share one: slate-level correlation -1; on the
    # question level (m = 2 slates per prompt) each prompt gives both the same share: +1
    R = np.zeros((8, 2))
    R[0::2, 0] = 1
    R[1::2, 1] = 1
    R[4:, :] = 0  # prompts 2 and 3: nobody right, so the shares vary across prompts
    p, P, mu = _router(8, 2, np.random.default_rng(1))
    out = slate_measures(R, p, P, mu, m=2, alignment=False)
    assert out["rightness_corr"] == pytest.approx(-1 / 3)  # the anti-aligned halves and the zeros
    assert out["question_corr"] == pytest.approx(1.0)
    assert out["multi_right"] == 0.0


def test_auc_and_the_credit_tail():
    R = np.array([[1, 0], [0, 1], [0, 0], [1, 1]], float)
    rng = np.random.default_rng(2)
    p, P, _ = _router(4, 2, rng)
    perfect = slate_measures(R, p, P, 0.1 + 0.8 * R, m=2, alignment=False, selected=[0, 1, 0, 1])
    assert perfect["auc"] == 1.0
    backwards = slate_measures(R, p, P, 0.9 - 0.8 * R, m=2, alignment=False)
    assert backwards["auc"] == 0.0
    # Eq. (19)'s credits given the draws made: the largest |credit| and its share of the squares
    sel = np.array([0, 1, 1, 0])
    mu = 0.5 * np.ones((4, 2))
    c = credit("removal", sel, R[np.arange(4), sel], p, P, mu)
    out = slate_measures(R, p, P, mu, m=2, alignment=False, selected=sel)
    assert out["credit_max"] == pytest.approx(np.abs(c).max())
    assert out["credit_top_share"] == pytest.approx((c**2).max() / (c**2).sum())


def test_alignment_of_the_exact_contribution_by_hand():
    # K = 2, m = 2, two prompts; agent 0 right on each prompt's first slate, agent 1 never.
    # With p = 1/2 and P^{-i} putting all weight on the other agent, the exact contribution is
    # 0.5 R_0 for agent 0 and 0.5 R_0 - R_0 = -0.5 R_0 for agent 1; centred in each group of
    # two: agent 0 (+1/4, -1/4), agent 1 (-1/4, +1/4). Over the eight completions
    # corr(A, R) = (1/16) / sqrt(1/16 * 3/16) = 1/sqrt(3): agent 1's wrong answers move too.
    R = np.zeros((4, 2))
    R[[0, 2], 0] = 1
    p = np.full((4, 2), 0.5)
    P = np.broadcast_to(np.array([[0.0, 1.0], [1.0, 0.0]]), (4, 2, 2)).copy()
    mu = np.full((4, 2), 0.5)
    out = slate_measures(R, p, P, mu, m=2)
    assert out["align_oracle_none"] == pytest.approx(1 / np.sqrt(3))
    assert -1 <= out["align_removal_none"] <= 1


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(2, 3), K=st.integers(2, 3), prompts=st.integers(2, 6))
def test_measures_lie_in_their_ranges_on_random_slates(seed, m, K, prompts):
    rng = np.random.default_rng(seed)
    n = m * prompts
    R = (rng.random((n, K)) < 0.4).astype(float)
    p, P, mu = _router(n, K, rng, scale=2.0)
    out = slate_measures(R, p, P, mu, m=m, selected=rng.integers(0, K, n))
    for key in ("team_success", "accuracy", "no_right", "exploration"):
        assert 0 <= out[key] <= 1
    assert 0 <= out["exploration"] <= 1 - 1 / K + 1e-12
    # a slate with a right candidate is in a group with one: no_right ≤ 1 − team_success per group
    assert out["no_right"] <= 1 - out["team_success"] + 1e-12 or out["team_success"] == 0
    for key in ("rightness_corr", "question_corr", "auc", "multi_right"):
        assert np.isnan(out[key]) or -1 - 1e-12 <= out[key] <= 1 + 1e-12
    assert out["credit_max"] >= 0


def test_bad_slates_are_refused():
    R = np.zeros((5, 3))
    p, P, mu = _router(5, 3, np.random.default_rng(0))
    with pytest.raises(ValueError, match="whole groups"):
        slate_measures(R, p, P, mu, m=2)
    with pytest.raises(ValueError, match="must be"):
        slate_measures(R[:, :2], p, P, mu, m=5)


def test_first_rollout_pools_one_run_per_seed(tmp_path):
    class Run:  # the attributes first_rollout reads
        def __init__(self, seed, R):
            p, P, mu = _router(4, 2, np.random.default_rng(seed))
            self.config = {"seed": seed, "completions_per_agent": 2}
            self.slates = [{"update": 1, "R": R, "p": p, "P": P, "mu_hat": mu, "I": [0, 1, 0, 1],
                            "cut": [[1, 0]] * 4}]

    ones, zeros = np.ones((4, 2)), np.zeros((4, 2))
    out = first_rollout([Run(0, ones), Run(0, zeros), Run(1, zeros)], alignment=False)
    assert out["seeds"] == 2 and out["slates"] == 8  # seed 0's second run is not read again
    assert out["team_success"] == 0.5 and out["cut"] == 0.5


# --- chapter 7's twin: the competence pool -------------------------------------------------------

def test_competence_pool_is_right_by_skill_on_shared_difficulty():
    comp = sim.Competence(skill=(2.0, 0.0, -2.0), difficulty_sd=0.0)
    cfg = sim.SimConfig(competence=comp, specialty_bonus=0.0, init_noise=0.0, prompts_per_update=4000)
    out = sim.untrained_measures(cfg, seeds=(0,))
    # no difficulty spread: agent k is right with probability sigmoid(skill_k), independently
    for k, s in enumerate(comp.skill):
        assert out[f"accuracy_{k}"] == pytest.approx(1 / (1 + np.exp(-s)), abs=0.015)
    assert abs(out["rightness_corr"]) < 0.03
    # a shared difficulty correlates the agents' rightness
    harder = dataclasses.replace(comp, difficulty_sd=2.0)
    hard = sim.untrained_measures(dataclasses.replace(cfg, competence=harder),
                                  seeds=(0,))
    assert hard["rightness_corr"] > 0.15 and hard["question_corr"] > 0.3


def test_competence_cut_answers_earn_nothing_and_enter_no_gradient():
    comp = sim.Competence(skill=(0.0, 0.0, 0.0), difficulty_sd=0.0, cut_logit=0.0)
    cfg = sim.SimConfig(competence=comp, specialty_bonus=0.0, init_noise=0.0, prompts_per_update=3000)
    out = sim.untrained_measures(cfg, seeds=(0,))
    assert out["cut"] == pytest.approx(1 / 3, abs=0.02) and out["accuracy"] == pytest.approx(1 / 3, abs=0.02)
    # every answer cut but a tiny share: the cut logit's gradient comes only through the softmax
    run = sim.train_pool(dataclasses.replace(cfg, prompts_per_update=8, updates=3, eval_questions=20),
                         "wta", seeds=(0,), keep_slates=3)
    for row in run.slates:
        R, cut = row["R"][0], row["cut"][0]
        assert (R[cut] == 0).all()


def test_default_pool_is_unchanged_by_the_competence_option():
    # the recorded grids of chapter 7 were trained without it: the same seeds give the same run
    cfg = sim.SimConfig(updates=4, prompts_per_update=8, eval_questions=50, eval_every=2)
    a = sim.train_pool(cfg, "removal", seeds=(0, 1))
    b = sim.train_pool(cfg, "removal", seeds=(0, 1), keep_slates=2)
    np.testing.assert_array_equal(a.logits, b.logits)
    assert b.slates is not None and len(b.slates) == 2 and a.slates is None


def test_gradient_clipping_bounds_each_agents_step():
    import torch

    from mcpg.grpo.simulated.loop import _clip_grad

    theta = torch.zeros((2, 3, 3, 3), requires_grad=True)
    theta.grad = torch.randn(2, 3, 3, 3) * 10
    theta.grad[0, 0] = 0.01
    small = theta.grad[0, 0].clone()
    _clip_grad(theta, 1.0)
    norms = theta.grad.flatten(2).norm(dim=-1)
    assert (norms <= 1.0 + 1e-5).all()
    assert torch.equal(theta.grad[0, 0], small)  # under the bound: untouched


def test_competence_config_is_checked():
    with pytest.raises(ValueError, match="skill"):
        sim.SimConfig(competence=sim.Competence(skill=(0.0, 0.0)))
    with pytest.raises(ValueError, match="difficulty_sd"):
        sim.Competence(skill=(0.0,), difficulty_sd=-1.0)
    with pytest.raises(ValueError, match="default pool"):
        sim.calibrated_router(sim.SimConfig(competence=sim.Competence(skill=(0.0, 0.0, 0.0))))
    with pytest.raises(ValueError, match="ablation"):
        sim.ablation(sim.SimConfig(competence=sim.Competence(skill=(0.0, 0.0, 0.0))), "nothing")


def test_competence_expectations_match_the_simulated_first_rollout():
    # the quadrature's exact measures against a large Monte Carlo rollout of the same pool
    comp = sim.Competence(skill=(-1.0, -1.5, -2.5), difficulty_sd=1.5, idiosyncratic_sd=1.0, cut_logit=-0.3)
    cfg = sim.SimConfig(competence=comp, unsolvable=0.2, init_noise=0.0, specialty_bonus=0.0)
    exact = sim.competence_expectations(cfg)
    mc = sim.untrained_measures(cfg, seeds=range(4), prompts=3000, alignment=False)
    for key in (*sim.MATCHED, "team_success", "multi_right", "accuracy"):
        assert mc[key] == pytest.approx(exact[key], abs=0.015), key


def test_fit_competence_recovers_the_measures_of_a_known_pool():
    truth = sim.SimConfig(competence=sim.Competence(skill=(-1.0, -2.0, -3.0), difficulty_sd=1.2,
                                                    idiosyncratic_sd=0.8, cut_logit=-0.5), unsolvable=0.1)
    targets = sim.competence_expectations(truth)
    fitted = sim.fit_competence(targets, sim.SimConfig())
    got = sim.competence_expectations(fitted)
    for key in sim.MATCHED:
        assert got[key] == pytest.approx(targets[key], rel=0.05, abs=0.005), key


def test_each_ablation_moves_one_variable():
    twin = sim.SimConfig(competence=sim.Competence(skill=(-1.0, -2.0, -3.0), difficulty_sd=1.2,
                                                   idiosyncratic_sd=0.8, cut_logit=-0.5),
                         prompts_per_update=8, updates=32, router_tau=0.3, check_flip=0.08, max_grad_norm=1.0)
    default = sim.SimConfig()
    fields = {f.name for f in dataclasses.fields(sim.SimConfig)}
    for name in sim.ABLATIONS:
        cfg = sim.ablation(twin, name)
        moved = {f for f in fields if getattr(cfg, f) != getattr(twin, f)}
        expected = {"rightness": {"competence", "answer_probs"}, "difficulty": {"competence"},
                    "updates": {"updates"}, "prompts": {"prompts_per_update"}, "cut": {"competence"},
                    "clipping": {"max_grad_norm"}, "router": {"router_tau", "check_flip"}}[name]
        assert moved <= expected and moved, (name, moved)
        for f in moved - {"competence", "answer_probs"}:
            assert getattr(cfg, f) == getattr(default, f)
