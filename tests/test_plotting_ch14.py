"""mcpg.plotting's helpers for chapters 1-4: what they draw is what they were given."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from mcpg import fields  # noqa: E402
from mcpg.plotting import draw_field  # noqa: E402


@pytest.fixture
def ax():
    fig, ax = plt.subplots()
    yield ax
    plt.close(fig)


def test_draw_field_uses_the_given_range_names_and_values(ax):
    v = fields.unanimity_game(3, 0b011) + fields.additive_game([0.5, 0.0, -0.25])
    field = fields.contribution_field(v)
    draw_field(field, ax, 2.0, names=["a", "b", "c"], label="my label")
    mesh = ax.collections[0]
    assert (mesh.norm.vmin, mesh.norm.vmax) == (-2.0, 2.0)  # the given range, not the data's
    assert mesh.colorbar.ax.get_ylabel() == "my label"
    cols = [t.get_text() for t in ax.get_xticklabels()]
    assert cols == ["∅", "{a}", "{b}", "{a,b}", "{c}", "{a,c}", "{b,c}", "{a,b,c}"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b", "c"]
    # one annotation per defined entry (i ∉ S), in row-major order, with the entry's value
    shown = [float(t.get_text()) for t in ax.texts]
    np.testing.assert_allclose(shown, np.round(field[~np.isnan(field)], 2))
    assert len(shown) == 3 * 4


def test_draw_field_default_names_are_the_texts_numbering(ax):
    draw_field(fields.contribution_field(np.array([0.0, 1.0, 0.0, 3.0])), ax, 1.0)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["1", "2"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["∅", "{1}", "{2}", "{1,2}"]


@pytest.mark.parametrize(
    "field, lim, names, match",
    [
        (np.zeros((2, 3)), 1.0, None, "field"),
        (np.zeros(4), 1.0, None, "field"),
        (np.zeros((2, 4)), 0.0, None, "lim"),
        (np.zeros((2, 4)), np.nan, None, "lim"),
        (np.zeros((2, 4)), 1.0, ["x"], "names"),
    ],
)
def test_draw_field_refuses_bad_input(ax, field, lim, names, match):
    with pytest.raises(ValueError, match=match):
        draw_field(field, ax, lim, names)
