"""Numbers in a chapter's prose, computed by the chapter's own cells: on the site and in Colab.

A chapter's Markdown writes ``{glue:text}`key``` (or ``{glue:text}`key:.2f```, a format spec
for a number, or ``{glue:md}`key``` for Markdown) where a number computed by its cells
belongs, so that the sentence stays true when the recorded data change. A cell gives the
value with :func:`glue`.

- In the book's build, :func:`glue` hands the value to MyST-NB's ``glue``, which fills the
  role on the rendered page.
- Colab renders plain Markdown and has no MyST-NB. There :func:`glue` keeps the value here,
  and the chapter's Colab notebook follows each paragraph that holds a role with a form
  cell, ``show(...)``, that displays the paragraph with its numbers filled in
  (``scripts/notebooks.py`` writes those cells). A value that a later cell computes fills in
  when that cell runs: :func:`show` leaves a placeholder, ``⟨key⟩``, and updates the
  display.

Example::

    glue("gap", -0.232)                       # {glue:text}`gap:+.3f` -> -0.232
    glue("verdict", "contains 0")             # {glue:text}`verdict`  -> contains 0
    fill("The gap is {glue:text}`gap:+.2f`.")  # 'The gap is -0.23.'
"""

from __future__ import annotations

import re

__all__ = ["ROLE", "Text", "glue", "glued", "fill", "missing", "show"]

ROLE = re.compile(r"\{glue(?::(?P<kind>text|md|any|))?\}`(?P<key>[^`:]+)(?::(?P<spec>[^`]*))?`")
"""A glue role of MyST-NB, with its key and, for ``{glue:text}``, a format spec."""

_VALUES: dict[str, object] = {}
_WAITING: list[tuple[str, object]] = []  # (Markdown with a role not yet glued, its display handle)


class Text(str):
    """A string glued as it is: its repr is itself, so the page shows it without quotes."""

    def __repr__(self) -> str:
        return str(self)


def glue(name: str, value, md: bool = False) -> None:
    """Give the prose's role ``name`` its value: a number (formatted by the role's spec, if
    any), a string (shown as it is) or, with ``md``, Markdown (for a ``{glue:md}`` role).

    In a book build (MyST-NB importable) the value goes to MyST-NB as well; every open
    :func:`show` that waited for ``name`` is filled in."""
    if not isinstance(name, str) or not name or ":" in name or "`" in name:
        raise ValueError(f"a glue name is a non-empty string without ':' or '`', got {name!r}")
    if md or isinstance(value, str):
        value = Text(value)
    _VALUES[name] = value
    try:
        from myst_nb import glue as myst_glue
    except ImportError:  # Colab, or plain Python: the value stays here, for show()
        pass
    else:
        if md:
            from IPython.display import Markdown

            myst_glue(name, Markdown(value), display=False)
        else:
            myst_glue(name, value, display=False)
    _refresh()


def glued(name: str):
    """The value glued as ``name`` (KeyError if none yet)."""
    return _VALUES[name]


def _one(m: re.Match) -> str:
    key, spec = m.group("key"), m.group("spec")
    if key not in _VALUES:
        return f"`⟨{key}⟩`"
    value = _VALUES[key]
    return format(value, spec) if spec else str(value)


def fill(markdown: str) -> str:
    """``markdown`` with every glue role replaced by its value (its format spec applied), or
    by a placeholder ``⟨key⟩`` where no cell has glued the key yet."""
    return ROLE.sub(_one, markdown)


def missing(markdown: str) -> list[str]:
    """The keys of ``markdown``'s glue roles that no cell has glued yet, in order."""
    return [m.group("key") for m in ROLE.finditer(markdown) if m.group("key") not in _VALUES]


def show(markdown: str) -> None:
    """Display ``markdown`` with its numbers (:func:`fill`); a role whose value a later cell
    computes shows ``⟨key⟩`` until that cell runs, and then its value."""
    from IPython.display import Markdown, display

    markdown = markdown.strip("\n")
    handle = display(Markdown(fill(markdown)), display_id=True)
    if missing(markdown) and handle is not None:
        _WAITING.append((markdown, handle))


def _refresh() -> None:
    if not _WAITING:
        return
    from IPython.display import Markdown

    for item in list(_WAITING):
        markdown, handle = item
        handle.update(Markdown(fill(markdown)))
        if not missing(markdown):
            _WAITING.remove(item)
