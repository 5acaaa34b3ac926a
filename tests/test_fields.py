"""Tests of mcpg.fields: contribution fields, ordered totality, Shapley value (paper §4)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mcpg.fields import (
    additive_game,
    best_scalar_contributions,
    contribution_field,
    group,
    interaction_spread,
    is_additive,
    mask_to_set,
    ordered_sum,
    ordered_totality_system,
    random_game,
    scalar_contributions,
    set_function_from_callable,
    set_to_mask,
    shapley_value,
    subset_sizes,
    unanimity_game,
)

SETTINGS = settings(max_examples=100, deadline=None)
values = st.floats(-10, 10, allow_nan=False, allow_infinity=False)


@st.composite
def games(draw, min_n=1, max_n=6):
    """A set function over n agents with arbitrary (not necessarily zero) v(∅)."""
    n = draw(st.integers(min_n, max_n))
    return np.array(draw(st.lists(values, min_size=1 << n, max_size=1 << n)))


def n_agents(v):
    return len(v).bit_length() - 1


def shapley_by_permutations(v):
    """Shapley value as the average ordered marginal over all n! orderings (definition)."""
    n = n_agents(v)
    phi = np.zeros(n)
    for perm in itertools.permutations(range(n)):
        mask = 0
        for i in perm:
            phi[i] += v[mask | 1 << i] - v[mask]
            mask |= 1 << i
    return phi / math.factorial(n)


# --- hand-worked cases -------------------------------------------------------------------


def test_complement_game_field_and_no_scalars():
    # Appendix B.3: v({1}) = v({2}) = 0, v({1,2}) = 1 (agents 0 and 1 here).
    v = [0.0, 0.0, 0.0, 1.0]
    field = contribution_field(v)
    expected = np.array([[0.0, np.nan, 1.0, np.nan], [0.0, 1.0, np.nan, np.nan]])
    np.testing.assert_array_equal(field, expected)  # NaNs compare equal here
    assert field[0, 0] == 0.0 and field[0, 0b10] == 1.0  # Δ_{1|∅} = 0, Δ_{1|{2}} = 1
    assert not is_additive(v)
    assert scalar_contributions(v) is None
    np.testing.assert_allclose(shapley_value(v), [0.5, 0.5])


# A three-agent game worked by hand. Index = bitmask: ∅,{0},{1},{01},{2},{02},{12},{012}.
V3 = np.array([0.0, 1.0, 2.0, 4.0, 0.0, 1.0, 3.0, 6.0])


def test_three_agent_field_by_hand():
    nan = np.nan
    expected = np.array(
        [
            # S = ∅, {0}, {1}, {01}, {2}, {02}, {12}, {012}
            [1.0, nan, 2.0, nan, 1.0, nan, 3.0, nan],  # agent 0: 1-0, 4-2, 1-0, 6-3
            [2.0, 3.0, nan, nan, 3.0, 5.0, nan, nan],  # agent 1: 2-0, 4-1, 3-0, 6-1
            [0.0, 0.0, 1.0, 2.0, nan, nan, nan, nan],  # agent 2: 0-0, 1-1, 3-2, 6-4
        ]
    )
    np.testing.assert_array_equal(contribution_field(V3), expected)


def test_three_agent_shapley_by_hand():
    # φ_0 = 1/3·1 + 1/6·2 + 1/6·1 + 1/3·3 = 11/6, φ_1 = 10/3, φ_2 = 1/6·1 + 1/3·2 = 5/6.
    np.testing.assert_allclose(shapley_value(V3), [11 / 6, 10 / 3, 5 / 6])
    assert scalar_contributions(V3) is None


def test_three_agent_ordered_sums_by_hand():
    field = contribution_field(V3)
    assert ordered_sum(field, [2, 0, 1]) == 0.0 + 1.0 + 5.0 == V3[7]
    assert ordered_sum(field, [1, 2]) == 2.0 + 1.0 == V3[0b110]
    assert ordered_sum(field, []) == 0.0


def test_glove_game_shapley():
    # Agent 0 holds a left glove, agents 1 and 2 right gloves; a pair is worth 1.
    v = set_function_from_callable(3, lambda s: float(0 in s and bool(s & {1, 2})))
    np.testing.assert_allclose(shapley_value(v), [2 / 3, 1 / 6, 1 / 6])


def test_additive_game_has_scalars_equal_to_singletons():
    v = additive_game([1.5, -2.0, 0.25])
    np.testing.assert_allclose(v, [0, 1.5, -2, -0.5, 0.25, 1.75, -1.75, -0.25])
    assert is_additive(v)
    np.testing.assert_array_equal(scalar_contributions(v), [1.5, -2.0, 0.25])


def test_nonzero_empty_value_is_not_additive():
    # Background-independent increments but v(∅) ≠ 0: totality fails at S = ∅.
    v = additive_game([1.0, 2.0]) + 3.0
    assert not is_additive(v) and scalar_contributions(v) is None


def test_single_agent_and_empty_system():
    np.testing.assert_array_equal(contribution_field([0.0, 2.0]), [[2.0, np.nan]])
    np.testing.assert_array_equal(shapley_value([0.0, 2.0]), [2.0])
    assert contribution_field([5.0]).shape == (0, 1)
    assert shapley_value([5.0]).shape == (0,)


# --- helpers -----------------------------------------------------------------------------


def test_subset_sizes_is_popcount():
    assert subset_sizes(0).tolist() == [0]
    for n in (1, 4, 9):
        assert subset_sizes(n).tolist() == [bin(m).count("1") for m in range(1 << n)]


def test_masks_and_sets_roundtrip():
    for m in range(64):
        assert set_to_mask(mask_to_set(m)) == m
    assert mask_to_set(0b1010) == frozenset({1, 3})
    assert set_to_mask({0, 2}) == 5


@SETTINGS
@given(st.sets(st.integers(1, 12)))
def test_group_numbers_agents_from_one(numbers):
    """group(k, ...) sets bit k - 1 for each agent number k: agent k of the text is index k - 1."""
    mask = group(*numbers)
    assert mask_to_set(mask) == frozenset(k - 1 for k in numbers)
    assert mask == set_to_mask(k - 1 for k in numbers)


def test_group_by_hand_and_bad_numbers():
    assert group() == 0 and group(2) == 0b010 and group(1, 3) == 0b101
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="start at 1"):
            group(bad)


def test_set_function_from_callable_indexing():
    v = set_function_from_callable(3, lambda s: sum(10**i for i in s))
    assert v.tolist() == [0, 1, 10, 11, 100, 101, 110, 111]


def test_random_game():
    v = random_game(5, np.random.default_rng(0))
    assert v.shape == (32,) and v[0] == 0.0
    assert not is_additive(v)
    np.testing.assert_array_equal(v, random_game(5, 0))  # seeds work too
    w = random_game(5, 1, interaction=0.0)
    assert is_additive(w)
    np.testing.assert_allclose(w, additive_game(w[[1, 2, 4, 8, 16]]))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_unanimity_game_has_one_dividend_and_one_interacting_pair(n):
    """v(S) = 1{T ⊆ S}: its Möbius inverse (the Harsanyi dividends) is the indicator of T."""
    for T in range(1 << n):
        v = unanimity_game(n, T)
        m = v.copy()
        for S in range(1 << n):  # m(S) = Σ_{U ⊆ S} (−1)^{|S∖U|} v(U)
            m[S] = sum((-1) ** bin(S & ~U).count("1") * v[U] for U in range(1 << n) if U & S == U)
        np.testing.assert_array_equal(m, np.eye(1 << n)[T])
    # additive plus a pair: exactly the pair's two agents fail condition (ii)
    pair = set_to_mask([0, n - 1])
    spread = interaction_spread(additive_game(np.arange(1.0, n + 1)) + 0.3 * unanimity_game(n, pair))
    np.testing.assert_allclose(spread, [0.3 if k in (0, n - 1) else 0.0 for k in range(n)], atol=1e-12)


@pytest.mark.parametrize("n, T", [(2, 4), (2, -1), (-1, 0), (2, True), (2.0, 1)])
def test_unanimity_game_refuses_bad_input(n, T):
    with pytest.raises(ValueError, match="n must|T must"):
        unanimity_game(n, T)


# --- properties --------------------------------------------------------------------------


@SETTINGS
@given(v=games(), data=st.data())
def test_ordered_totality_along_any_ordering(v, data):
    # Proposition 3: along every ordering of every group S the field sums to v(S) − v(∅).
    n = n_agents(v)
    order = data.draw(st.permutations(range(n)))[: data.draw(st.integers(0, n))]
    total = ordered_sum(contribution_field(v), order)
    assert total == pytest.approx(v[set_to_mask(order)] - v[0], abs=1e-9)


@SETTINGS
@given(v=games())
def test_field_entries_and_nan_pattern(v):
    n = n_agents(v)
    field = contribution_field(v)
    for i in range(n):
        for s in range(1 << n):
            if s >> i & 1:
                assert np.isnan(field[i, s])
            else:
                assert field[i, s] == v[s | 1 << i] - v[s]


@SETTINGS
@given(v=games(max_n=5))
def test_shapley_matches_average_over_orderings(v):
    np.testing.assert_allclose(shapley_value(v), shapley_by_permutations(v), atol=1e-9)


@SETTINGS
@given(v=games())
def test_shapley_efficiency(v):
    assert shapley_value(v).sum() == pytest.approx(v[-1] - v[0], abs=1e-9)


@SETTINGS
@given(v=games(min_n=2))
def test_shapley_symmetry(v):
    # Symmetrise v in agents 0 and 1; they must then get equal Shapley values.
    swap = [m & ~0b11 | (m & 1) << 1 | (m >> 1 & 1) for m in range(len(v))]
    sym = (v + v[swap]) / 2
    phi = shapley_value(sym)
    assert phi[0] == pytest.approx(phi[1], abs=1e-9)


@SETTINGS
@given(v=games(max_n=5), data=st.data())
def test_null_player(v, data):
    # Add a null agent k: w(S) = v(S without k). Its field row and Shapley value vanish.
    n = n_agents(v)
    k = data.draw(st.integers(0, n))
    low = (1 << k) - 1
    w = np.array([v[(m & low) | (m >> (k + 1)) << k] for m in range(1 << (n + 1))])
    row = contribution_field(w)[k]
    assert np.all(row[~np.isnan(row)] == 0.0)
    phi = shapley_value(w)
    assert phi[k] == pytest.approx(0.0, abs=1e-9)
    np.testing.assert_allclose(np.delete(phi, k), shapley_value(v), atol=1e-9)


@SETTINGS
@given(n=st.integers(1, 6), seed=st.integers(0, 2**32), alpha=values, beta=values)
def test_shapley_linearity(n, seed, alpha, beta):
    v, w = random_game(n, seed), random_game(n, seed + 1)
    np.testing.assert_allclose(
        shapley_value(alpha * v + beta * w),
        alpha * shapley_value(v) + beta * shapley_value(w),
        atol=1e-9,
    )


@SETTINGS
@given(weights=st.lists(values, min_size=1, max_size=6))
def test_additive_games_give_singleton_scalars(weights):
    v = additive_game(weights)
    scalars = scalar_contributions(v)
    assert scalars is not None
    np.testing.assert_allclose(scalars, weights)
    for m in range(len(v)):  # totality for every group
        assert scalars[list(mask_to_set(m))].sum() == pytest.approx(v[m], abs=1e-9)
    np.testing.assert_allclose(shapley_value(v), weights, atol=1e-9)


@SETTINGS
@given(
    weights=st.lists(values, min_size=2, max_size=6),
    data=st.data(),
    bump=st.floats(0.01, 10) | st.floats(-10, -0.01),
)
def test_interaction_destroys_scalars(weights, data, bump):
    # Perturb one group of size ≥ 2: no scalars satisfy totality any more.
    v = additive_game(weights)
    n = len(weights)
    mask = data.draw(st.sampled_from([m for m in range(1 << n) if bin(m).count("1") >= 2]))
    v[mask] += bump
    assert not is_additive(v)
    assert scalar_contributions(v) is None


@SETTINGS
@given(v=games())
def test_additive_iff_background_independent_and_null_empty(v):
    # Proposition 2 (ii) ⇔ (iii): rows of the field constant across backgrounds, and v(∅) = 0.
    # Both sides use a tolerance of 1e-9; a game whose distance from additivity lies near it
    # (e.g. v(∅) = 1e-9) sits on the two tolerances' boundary and says nothing, so it is skipped.
    n = n_agents(v)
    distance = np.abs(v - additive_game(v[1 << np.arange(n)])).max()
    assume(distance <= 1e-10 or distance >= 1e-8)
    field = contribution_field(v)
    constant = all(np.ptp(row[~np.isnan(row)]) <= 1e-9 for row in field)
    assert is_additive(v) == (constant and abs(v[0]) <= 1e-9)


# --- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fn", [contribution_field, shapley_value, is_additive, scalar_contributions]
)
def test_bad_set_functions_are_refused(fn):
    with pytest.raises(ValueError, match="v"):
        fn([0.0, 1.0, 2.0])  # length not a power of two
    with pytest.raises(ValueError, match="v contains NaN"):
        fn([0.0, np.nan])
    with pytest.raises(ValueError, match="v must be a 1-d"):
        fn(np.zeros((2, 2)))


def test_bad_orders_are_refused():
    field = contribution_field(V3)
    with pytest.raises(ValueError, match="order"):
        ordered_sum(field, [0, 0])
    with pytest.raises(ValueError, match="order"):
        ordered_sum(field, [3])


def test_bad_weights_are_refused():
    with pytest.raises(ValueError, match="weights"):
        additive_game([1.0, np.nan])


# --- Proposition 2 checked three ways, Proposition 3's uniqueness -------------------------


@SETTINGS
@given(games(max_n=5))
def test_proposition2_three_conditions_agree_when_v_empty_is_zero(v):
    """(i) least-squares scalars exist, (ii) no interaction, (iii) additive: equivalent when
    v(∅) = 0, each computed without assuming the others."""
    v = v - v[0]
    exists = best_scalar_contributions(v)[1] < 1e-7
    no_interaction = interaction_spread(v).max(initial=0.0) < 1e-7
    assert exists == no_interaction == is_additive(v, atol=1e-7)


def test_constant_game_has_no_interaction_but_no_scalars():
    """(ii) ⇒ (iii) needs v(∅) = 0: a constant game has no interaction and is not additive."""
    v = np.full(8, 2.0)
    assert interaction_spread(v).max() == 0.0
    assert not is_additive(v) and scalar_contributions(v) is None
    assert best_scalar_contributions(v)[1] > 0.5


def test_best_scalar_contributions_by_hand():
    delta, viol = best_scalar_contributions(np.array([0.0, 0.0, 0.0, 1.0]))  # complements
    assert viol == pytest.approx(1 / 3) and np.allclose(delta, 1 / 3)
    delta, viol = best_scalar_contributions(additive_game([1.0, -2.0, 0.5]))
    assert viol < 1e-12 and np.allclose(delta, [1.0, -2.0, 0.5])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_ordered_totality_has_a_unique_solution_the_field(n):
    A, groups, entries = ordered_totality_system(n)
    assert A.shape == (sum(math.comb(n, k) * math.factorial(k) for k in range(1, n + 1)),
                       n * 2 ** (n - 1))
    assert np.linalg.matrix_rank(A) == A.shape[1]          # unique: the "only if" of Prop. 3
    v = random_game(n, np.random.default_rng(n))
    x = np.linalg.lstsq(A, v[groups], rcond=None)[0]
    field = contribution_field(v)
    assert max(abs(x[k] - field[i, S]) for k, (i, S) in enumerate(entries)) < 1e-10
    assert np.abs(A @ x - v[groups]).max() < 1e-10


def test_ordered_totality_system_rejects_bad_n():
    with pytest.raises(ValueError, match="n must"):
        ordered_totality_system(7)
