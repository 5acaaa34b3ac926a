"""mcpg.glue: the prose's numbers, filled on the site by MyST-NB and in Colab by show()."""

import pytest

from mcpg import glue as g


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Each test starts with nothing glued and no display waiting."""
    monkeypatch.setattr(g, "_VALUES", {})
    monkeypatch.setattr(g, "_WAITING", [])


def test_fill_applies_format_specs_and_leaves_placeholders():
    g.glue("gap", -0.2317)
    g.glue("verdict", "contains 0")
    g.glue("table", "**bold**", md=True)
    text = ("Gap {glue:text}`gap:+.2f` ({glue:text}`gap`), it {glue:text}`verdict`; "
            "{glue:md}`table`, {glue}`gap:.1%` and {glue:text}`later`.")
    assert g.fill(text) == "Gap -0.23 (-0.2317), it contains 0; **bold**, -23.2% and `⟨later⟩`."
    assert g.missing(text) == ["later"]
    assert g.glued("verdict") == "contains 0" and repr(g.glued("verdict")) == "contains 0"
    with pytest.raises(KeyError):
        g.glued("later")


@pytest.mark.parametrize("name", ["", "a:b", "a`b", 3])
def test_glue_refuses_a_name_no_role_can_hold(name):
    with pytest.raises(ValueError, match="glue name"):
        g.glue(name, 1.0)


def test_show_fills_in_a_value_glued_after_it(monkeypatch):
    """A paragraph shown before its value exists is updated when a later cell glues it.
    (IPython comes with the book's install; tests/test_colab.py runs show() in a kernel.)"""
    pytest.importorskip("IPython.display", reason="show() displays through IPython")
    shown = []

    class Handle:
        def update(self, obj):
            shown.append(obj.data)

    monkeypatch.setattr("IPython.display.display", lambda obj, display_id=False: shown.append(obj.data)
                        or Handle())
    g.glue("a", 1)
    g.show("{glue:text}`a` and {glue:text}`b:.1f`")
    assert shown == ["1 and `⟨b⟩`"]
    g.glue("c", 3)  # not the one it waits for: the same text again
    g.glue("b", 2)
    assert shown[-1] == "1 and 2.0" and g._WAITING == []
    g.glue("b", 5)  # filled displays no longer follow their keys
    assert shown[-1] == "1 and 2.0"
