"""Tests of mcpg.systems: the planner-solver-critic pipeline, random systems, valuation fields."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpg import fields, systems
from mcpg import mechanisms as M


def psc_value_by_hand(plan, solve, revise, fix, keep, ph=(0.5, 0.5)):
    """J_sys of the planner-solver-critic pipeline by explicit loops over its story."""
    J = 0.0
    for h, a0, a1, a2 in itertools.product(range(2), repeat=4):
        p = ph[h] * (plan[h] if a0 else 1 - plan[h]) * (solve[h][a0] if a1 else 1 - solve[h][a0])
        p *= revise[h][a1] if a2 else 1 - revise[h][a1]
        if a2 == 0:
            g = float(a1)
        else:
            g = keep if a1 else fix[h][a0]
        J += p * g
    return J


def test_planner_solver_critic_value_by_hand():
    kw = dict(plan=(0.5, 0.4), solve=((0.6, 0.9), (0.2, 0.6)), revise=((0.8, 0.2), (0.7, 0.1)),
              fix=((0.6, 0.8), (0.3, 0.6)), keep=0.9)
    pl = systems.planner_solver_critic(**kw)
    assert M.system_value(pl).item() == pytest.approx(psc_value_by_hand(**kw), abs=1e-14)
    assert pl.layers == [[0], [1], [2]]
    assert pl.history_agents(2) == [0, 1]


def test_planner_solver_critic_removal_breaks_where_an_input_is_missing():
    pl = systems.planner_solver_critic()
    q_rem = M.removal_values(pl).numpy()
    defined = [S for S in range(8) if not np.isnan(q_rem[S]).any()]
    undefined = [S for S in range(8) if np.isnan(q_rem[S]).all()]
    assert defined == [0b000, 0b001, 0b011, 0b111]
    assert undefined == [0b010, 0b100, 0b101, 0b110]
    np.testing.assert_array_equal(q_rem[0b001], 0.0)  # a plan alone answers nothing
    answer = np.arange(2).reshape(1, 1, 2, 1)
    np.testing.assert_array_equal(q_rem[0b011], np.broadcast_to(answer, q_rem[0b011].shape))
    assert not np.isnan(M.retention_values(pl).numpy()).any()


def test_valuation_fields_retention_everywhere_removal_with_gaps():
    pl = systems.planner_solver_critic()
    out = systems.valuation_fields(pl, 1, [1, 0, 1])
    assert out["v_ret"][0] == 0.0 and out["v_rem"][0] == 0.0
    # retention: ordered totality along every ordering of the full group
    for order in itertools.permutations(range(3)):
        assert fields.ordered_sum(out["field_ret"], order) == pytest.approx(out["v_ret"][7], abs=1e-14)
    # removal: defined entries are exactly those with both endpoints defined
    rem = out["field_rem"]
    assert np.argwhere(~np.isnan(rem)).tolist() == [[0, 0], [1, 1], [2, 3]]
    # the critic revised a wrong answer after a precise plan on a hard prompt: fixed w.p. 0.6
    assert rem[2, 3] == pytest.approx(0.6)
    assert rem[1, 1] == 0.0 and rem[0, 0] == 0.0


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 4), st.integers(2, 3))
def test_random_pipeline_shapes_and_removal_pattern(seed, K, M_):
    pl = systems.random_pipeline(np.random.default_rng(seed), K=K, n_actions=M_)
    assert pl.joint_shape == (2,) + (M_,) * K
    P = pl.joint_prob().detach().numpy()
    assert P.sum() == pytest.approx(1.0)
    q_rem = M.removal_values(pl).numpy()
    prefixes = {(1 << k) - 1 for k in range(K + 1)}
    for S in range(1 << K):
        assert np.isnan(q_rem[S]).any() == (S not in prefixes)


def test_random_parallel_pool_is_one_layer():
    pool = systems.random_parallel_pool(np.random.default_rng(0), K=3, n_actions=3)
    assert pool.layers == [[0, 1, 2]] and pool.joint_shape == (2, 3, 3, 3)


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 2**31 - 1), st.floats(0.0, 1.0))
def test_random_team_is_additive_exactly_without_interaction(seed, lam):
    team = systems.random_team(np.random.default_rng(seed), K=3, n_prompts=1, n_actions=2, interaction=lam)
    G = team.reward_mean().numpy()
    assert G.min() >= 0.0 and G.max() <= 1.0
    v = M.valuation_at(M.retention_values(team), 0, [1, 0, 1])
    if lam == 0.0:
        assert fields.is_additive(v)
    # the mixed second difference of E[G | H, A] vanishes iff the reward has no interaction
    mixed = G[0, 1, 1, :] - G[0, 1, 0, :] - G[0, 0, 1, :] + G[0, 0, 0, :]
    if lam == 0.0:
        assert np.abs(mixed).max() < 1e-12
    elif lam > 1e-3:
        assert np.abs(mixed).max() > 1e-9


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda: systems.planner_solver_critic(plan=(0.5, 1.0)), "plan"),
        (lambda: systems.planner_solver_critic(solve=((0.5, 0.5, 0.5),)), "solve"),
        (lambda: systems.planner_solver_critic(fix=((0.5, 1.5), (0.5, 0.5))), "fix"),
        (lambda: systems.planner_solver_critic(keep=np.nan), "keep"),
        (lambda: systems.random_pipeline(np.random.default_rng(0), K=1), "K"),
        (lambda: systems.random_parallel_pool(np.random.default_rng(0), n_actions=1), "n_actions"),
        (lambda: systems.random_team(np.random.default_rng(0), interaction=1.5), "interaction"),
        (lambda: systems.valuation_fields(systems.planner_solver_critic(), 2, [0, 0, 0]), "h"),
        (lambda: systems.valuation_fields(systems.planner_solver_critic(), 0, [0, 2, 0]), "actions"),
    ],
)
def test_bad_input_names_the_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_layer_fields_pipeline_are_the_cross_layer_entries_at_the_history():
    """Per-layer fields of a chain: one entry per agent, S = ∅, equal to the cross-layer entry
    Δ_{i|H_l}; removal is defined only for the last agent, and is the fix probability there."""
    psc = systems.planner_solver_critic()
    for h, a0, a1, a2 in itertools.product(range(2), repeat=4):
        lf = systems.layer_fields(psc, h, [a0, a1, a2], systems.PSC_AGENTS)
        vf = systems.valuation_fields(psc, h, [a0, a1, a2])
        assert list(lf.S) == ["∅"] * 3 and list(lf.layer) == [1, 2, 3]
        np.testing.assert_allclose(lf.ret, [vf["field_ret"][0, 0], vf["field_ret"][1, 0b001],
                                            vf["field_ret"][2, 0b011]], atol=1e-12)
        assert np.isnan(lf.rem[0]) and np.isnan(lf.rem[1])
        assert lf.rem[2] == pytest.approx(vf["field_rem"][2, 0b011])


def test_layer_fields_of_a_pool_are_the_whole_field():
    pool = M.random_routed_pool(np.random.default_rng(3), K=3)
    lf = systems.layer_fields(pool, 1, [2, 0, 1])
    vf = systems.valuation_fields(pool, 1, [2, 0, 1])
    assert len(lf) == 3 * 4
    for row in lf.itertuples():
        i = int(row.agent) - 1
        S = 0 if row.S == "∅" else sum(1 << (int(k) - 1) for k in row.S.strip("{}").split(","))
        assert row.ret == pytest.approx(vf["field_ret"][i, S], abs=1e-12)
        assert row.rem == pytest.approx(vf["field_rem"][i, S], abs=1e-12)
