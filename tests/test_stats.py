"""mcpg.stats: Student-t intervals, paired differences and summary tables, against known values."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpg import plotting, stats


def test_t_quantiles_are_the_table_values():
    assert stats.t_quantile(0.95, 9) == pytest.approx(2.2621571627982, rel=1e-10)
    assert stats.t_quantile(0.95, np.inf) == pytest.approx(1.959963984540054, rel=1e-12)
    assert stats.t_quantile(0.99, 4) == pytest.approx(4.604094871, rel=1e-8)
    with pytest.raises(ValueError, match="level"):
        stats.t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="df"):
        stats.t_quantile(0.95, 0)


def test_mean_ci_by_hand_ten_seeds():
    x = np.arange(10.0)  # mean 4.5, sd sqrt(55/6)
    m, hw = stats.mean_ci(x)
    assert m == pytest.approx(4.5)
    assert hw == pytest.approx(2.2621571627982 * np.sqrt(55 / 6) / np.sqrt(10), rel=1e-10)
    # along an axis
    y = np.stack([x, 2 * x], axis=1)
    m2, hw2 = stats.mean_ci(y, axis=0)
    np.testing.assert_allclose(m2, [4.5, 9.0])
    np.testing.assert_allclose(hw2, [hw, 2 * hw])
    assert plotting.mean_ci is stats.mean_ci  # chapters importing it from plotting keep working
    with pytest.raises(ValueError, match="two samples"):
        stats.mean_ci([1.0])


def test_t_interval_covers_at_its_level_for_small_n():
    # coverage of the 95% t-interval with n = 5 normal samples is 95%; the z-interval's is lower
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40_000, 5))
    m, hw = stats.mean_ci(x, axis=1)
    cover_t = np.mean(np.abs(m) <= hw)
    _, se = stats.mean_se(x, axis=1)
    cover_z = np.mean(np.abs(m) <= stats.half_width(se))
    assert abs(cover_t - 0.95) < 0.005
    assert cover_z < 0.89  # the normal approximation undercovers (about 87.8% at n = 5)


def test_paired_difference():
    a = np.array([0.5, 0.6, 0.7, 0.8])
    b = np.array([0.4, 0.45, 0.5, 0.7])
    iv = stats.paired_difference(a, b)
    d = a - b
    assert iv.mean == pytest.approx(d.mean())
    assert iv.half_width == pytest.approx(stats.t_quantile(0.95, 3) * d.std(ddof=1) / 2)
    assert iv.n == 4 and iv.sd == pytest.approx(d.std(ddof=1))
    mean, hw, n = iv
    assert (mean, hw, n) == (iv.mean, iv.half_width, 4)
    assert iv.excludes_zero() and "t_3" in str(iv)
    assert not stats.paired_difference(a, a + [0.1, -0.1, 0.1, -0.1]).excludes_zero()
    with pytest.raises(ValueError, match="same length"):
        stats.paired_difference(a, b[:3])
    with pytest.raises(ValueError, match="NaN"):
        stats.paired_difference(a, [np.nan, 0, 0, 0])


def test_summary_table():
    frame = pd.DataFrame({"method": ["x"] * 3 + ["y"] * 3, "seed": [0, 1, 2] * 2,
                          "acc": [0.1, 0.2, 0.3, 0.5, 0.5, np.nan]})
    t = stats.summary_table(frame, ["acc"])
    assert list(t.index) == ["x", "y"]
    assert t.loc["x", "acc"] == pytest.approx(0.2)
    assert t.loc["x", "acc ±"] == pytest.approx(stats.t_quantile(0.95, 2) * 0.1 / np.sqrt(3))
    assert t.loc["y", "acc ±"] == pytest.approx(0.0)  # two equal values
    assert t.loc["x", "n"] == 3
    f = stats.summary_table(frame, ["acc"], formatted=True, digits=2)
    assert f.loc["x", "acc"].startswith("0.20 ± ")
    with pytest.raises(ValueError, match="not in frame"):
        stats.summary_table(frame, ["nope"])


def test_shared_vocabulary():
    assert stats.EVAL_KEYS == ("accuracy", "entropy", "brier", "specialization", "oracle", "regret")
    assert stats.SPECIALTIES == ("money", "time", "geometry")


def test_roc_auc_is_the_mann_whitney_probability():
    from mcpg.stats import roc_auc

    assert roc_auc([0.9, 0.8, 0.1, 0.2], [1, 1, 0, 0]) == 1.0
    assert roc_auc([0.1, 0.2, 0.9, 0.8], [1, 1, 0, 0]) == 0.0
    assert roc_auc([0.5, 0.5, 0.5], [1, 0, 0]) == 0.5  # ties count one half
    assert roc_auc([0.3, 0.4], [1, 1]) is None  # one class: undefined
    with pytest.raises(ValueError, match="labels"):
        roc_auc([0.1, 0.2], [2, 0])
    with pytest.raises(ValueError, match="same length"):
        roc_auc([0.1, 0.2], [1])


@given(st.lists(st.tuples(st.integers(0, 6), st.booleans()), min_size=2, max_size=40))
def test_roc_auc_equals_the_pair_count(pairs):
    """AUC against its definition, counted pair by pair (an independent path: no ranks)."""
    from mcpg.stats import roc_auc

    s = np.array([float(x) for x, _ in pairs])
    y = np.array([b for _, b in pairs])
    pos, neg = s[y], s[~y]
    got = roc_auc(s, y)
    if pos.size == 0 or neg.size == 0:
        assert got is None
        return
    want = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert got == pytest.approx(want, abs=1e-12)


def test_format_interval_and_bounds():
    """The two ways the chapters print an interval: ``mean ± half-width`` and
    ``mean [low, high]``, signed, with ``(no interval)`` where a bound is NaN."""
    assert stats.format_interval(0.1234, 0.0456) == "0.123 ± 0.046"
    assert stats.format_interval(-0.1234, 0.0456, signed=True) == "-0.123 ± 0.046"
    assert stats.format_interval(0.1, 0.02, digits=1, signed=True) == "+0.1 ± 0.0"
    assert stats.format_bounds(0.203, 0.148, 0.258) == "+0.203 [+0.148, +0.258]"
    assert stats.format_bounds(-0.0261, -0.0634, 0.0112) == "-0.026 [-0.063, +0.011]"
    assert stats.format_bounds(0.5, np.nan, np.nan, digits=2) == "+0.50 (no interval)"
    assert stats.format_bounds(0.5, 0.4, np.nan) == "+0.500 (no interval)"


@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=12),
       st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=12))
def test_side_of_zero_agrees_with_the_interval(a, b):
    """The label of a paired interval is "level" exactly when it does not exclude 0, and
    otherwise names the side its mean lies on; scalars and arrays give the same labels."""
    n = min(len(a), len(b))
    iv = stats.paired_difference(np.array(a[:n]), np.array(b[:n]))
    got = stats.side_of_zero(iv.low, iv.high)
    assert isinstance(got, str)
    if iv.excludes_zero():
        assert got == ("ahead" if iv.mean > 0 else "behind")
    else:
        assert got == "level"
    labels = stats.side_of_zero(pd.Series([iv.low, -1.0, 0.5]), [iv.high, -0.5, 0.9],
                                labels=("> 0", "covers 0", "< 0"))
    assert list(labels) == [{"ahead": "> 0", "level": "covers 0", "behind": "< 0"}[got],
                            "< 0", "> 0"]


# the sentence builders: an interval's words say what the interval shows (issue 58)


def test_compare_reading_far_behind_with_wide_interval_cannot_be_told_apart():
    # chapter 9's case: an arm far behind on average (0.328 against 0.604) whose interval over
    # three seeds covers 0 is not "reaching" or "level with" the other: the seeds cannot tell
    # them apart, it is behind on average, and both means are given
    s = stats.compare_reading("uniform-b0.1-group", "the oracle", 0.328, 0.604, -0.70, 0.15)
    assert "cannot be told apart" in s and "behind on average" in s
    assert "0.328" in s and "0.604" in s and "-0.276 [-0.700, +0.150]" in s
    for word in ("reach", "level", "match", "same as"):
        assert word not in s
    assert "is behind" in stats.compare_reading("removal", "wta", 0.30, 0.51, -0.36, -0.065)
    assert "is ahead of" in stats.compare_reading("a", "b", 0.6, 0.5, 0.02, 0.18)


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0.001, 1.0))
def test_compare_reading_follows_the_interval(ma, mb, hw):
    # whatever the means and the width, the verb is the interval's side of 0 and nothing else
    d = ma - mb
    low, high = d - hw, d + hw
    s = stats.compare_reading("a", "b", ma, mb, low, high)
    side = stats.side_of_zero(low, high)
    assert ("is ahead of" in s) == (side == "ahead")
    assert ("is behind" in s) == (side == "behind")
    assert ("cannot be told apart" in s) == (side == "level")
    assert "reach" not in s and "level" not in s


def test_seeds_where_names_the_seeds_a_statement_holds_on():
    # "the mask fixed that" at ten seeds holds on some seeds only: the words name them
    fixed = {k: k not in (3, 4, 6, 7) for k in range(10)}
    assert stats.seeds_where(fixed) == "on seeds 0, 1, 2, 5, 8 and 9 (6 of 10)"
    assert stats.seeds_where({k: True for k in range(10)}) == "on all 10 seeds"
    assert stats.seeds_where({3: True, 4: False}) == "on seed 3 (1 of 2)"
    assert stats.seeds_where({0: False, 1: False}) == "on no seed (0 of 2)"
    with pytest.raises(ValueError):
        stats.seeds_where({})


def test_seed_names_joins_the_seeds_as_seeds_where_does():
    assert stats.seed_names([3]) == "seed 3"
    assert stats.seed_names([3, 6]) == "seeds 3 and 6"
    assert stats.seed_names((0, 3, 6, 9)) == "seeds 0, 3, 6 and 9"
    assert stats.seed_names([1, 2], noun="run") == "runs 1 and 2"
    assert stats.seeds_where({3: True, 6: True, 7: False}) == (
        f"on {stats.seed_names([3, 6])} (2 of 3)")
    with pytest.raises(ValueError, match="no seed"):
        stats.seed_names([])


def test_join_words_joins_phrases_as_prose():
    assert stats.join_words(["2 are in centred runs"]) == "2 are in centred runs"
    assert stats.join_words(("a", "b")) == "a and b"
    assert stats.join_words(["a", "b, c", "d"]) == "a, b, c and d"
    with pytest.raises(ValueError, match="nothing"):
        stats.join_words([])


def test_compare_reading_takes_the_paired_mean_and_other_verbs():
    # the mean of the per-seed differences is printed when given (rounding at a half unit can
    # differ from mean_a - mean_b), and a lower-is-better measure reads "is above" / "is below"
    s = stats.compare_reading("removal", "wta", 0.405, 0.6175, -0.36, -0.065, difference=-0.2124)
    assert "-0.212 [" in s and "is behind" in s
    s = stats.compare_reading("removal", "wta", 0.205, 0.188, 0.009, 0.026,
                              verbs=("is above", "is below"))
    assert "removal (0.205) is above wta (0.188)" in s
    s = stats.compare_reading("a", "b", 0.2, 0.1, -0.1, 0.3, verbs=("is above", "is below"))
    assert "above on average" in s and "cannot be told apart" in s


def test_holm_adjusts_step_down_and_keeps_at_least_bonferronis():
    from mcpg.stats import holm

    p = {"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.5}
    adj = holm(p)
    # sorted 0.01, 0.03, 0.04, 0.5: 4 x 0.01, max(0.04, 3 x 0.03), max(0.09, 2 x 0.04), max(0.09, 0.5)
    assert adj == pytest.approx({"a": 0.04, "c": 0.09, "b": 0.09, "d": 0.5})
    kept = {k for k, v in adj.items() if v < 0.05}
    assert kept == {"a"} and kept >= {k for k, v in p.items() if len(p) * v < 0.05}
    with pytest.raises(ValueError):
        holm({"x": 1.5})
