"""Exercise references read as the reader sees the number.

sphinx-exercise numbers the exercises across the whole book (the third exercise of chapter 3
is shown as Exercise 12 when chapters 1 and 2 hold nine), while the Colab notebooks number
them by chapter (Exercise 3.3, ``scripts/notebooks.py``). A number written by hand in a link
text is right in at most one of the two, and goes wrong as soon as an exercise is added
earlier in the book. So the chapters refer to an exercise by its label alone,
``{ref}`ch03-ex3``` (rendered "Exercise 12" on the site, "Exercise 3.3" in a notebook), or by
``{numref}`` with ``%s`` where a link needs more words; never with a number of their own.

Two checks, one per medium:

- :func:`source_problems`, on the chapters' MyST sources (runs everywhere): no reference to an
  exercise carries a hand-written number, and no prose names "Exercise N" outside a role;
- :func:`site_problems`, on the built HTML without a browser: every link to an exercise whose
  text says "Exercise N" says the number the exercise displays, and no page names an
  exercise number outside a link or an exercise's own title. ``tests/test_site.py`` runs it
  on ``MCPG_SITE``; the tests below run it on small pages that break it, so it can fail.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

BOOK = Path(__file__).resolve().parents[1] / "book"

# --- sources -------------------------------------------------------------------------------

_FENCE = re.compile(r"^(`{3,}|:{3,})\{(?P<name>[\w:-]+)\}", re.M)
_ROLE = re.compile(r"\{(?P<role>ref|numref)\}`(?P<content>[^`]*)`")
_NUMBER = re.compile(r"\bExercises?\s+\d", re.I)


def exercise_labels(text: str) -> set[str]:
    """The labels of the ``{exercise}`` directives of one MyST page."""
    labels = set()
    for m in re.finditer(r"^```\{exercise\}[^\n]*\n((?::[^\n]*\n)*)", text, re.M):
        labels |= set(re.findall(r"^:label:\s*(\S+)", m.group(1), re.M))
    return labels


def _prose(text: str) -> str:
    """The page with its code cells blanked (the reader sees their text as code, not prose);
    line numbers are kept."""
    return re.sub(r"^```\{code-cell\}.*?^```[ \t]*$", lambda m: "\n" * m.group(0).count("\n"),
                  text, flags=re.M | re.S)


def source_problems(pages: dict[str, str]) -> list[str]:
    """Hand-written exercise numbers in MyST sources ({name: text}); [] when there are none."""
    labels = set().union(*(exercise_labels(t) for t in pages.values()))
    problems = []
    for name, text in pages.items():
        prose = _prose(text)
        for m in _ROLE.finditer(prose):
            ref = re.match(r"^(?P<text>.*?)\s*<(?P<label>[^<>]+)>$", m.group("content"), re.S)
            if not ref or ref.group("label") not in labels:
                continue
            if _NUMBER.search(ref.group("text")):
                line = prose[: m.start()].count("\n") + 1
                problems.append(f"{name}:{line}: hand-written number in {m.group(0)!r}")
        for m in _NUMBER.finditer(_ROLE.sub("", prose)):
            problems.append(f"{name}: exercise number outside a reference: {m.group(0)!r}")
    return problems


# --- the built site ------------------------------------------------------------------------

_EXERCISE = re.compile(
    r'<div class="exercise\b[^"]*"\s+id="(?P<id>[^"]+)">\s*'
    r'<p class="admonition-title"><span class="caption-number">Exercise (?P<n>\d+)\s*</span>')
_LINK = re.compile(r'<a\b[^>]*\bhref="(?P<href>[^"]*)"[^>]*>(?P<text>.*?)</a>', re.S)
_TITLE = re.compile(r'<p class="admonition-title">.*?</p>', re.S)


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def displayed_numbers(pages: dict[str, str]) -> dict[tuple[str, str], int]:
    """{(page, exercise id): the number the exercise displays} over the site's pages."""
    shown = {}
    for rel, text in pages.items():
        found = {m.group("id"): int(m.group("n")) for m in _EXERCISE.finditer(text)}
        n_divs = len(re.findall(r'<div class="exercise\b', text))
        if len(found) != n_divs:  # the theme's markup changed: fail loudly, not silently
            raise ValueError(f"{rel}: {n_divs} exercises, {len(found)} with a readable number")
        shown |= {(rel, ex): n for ex, n in found.items()}
    return shown


def site_problems(pages: dict[str, str]) -> tuple[list[str], int]:
    """Exercise references on a built site ({path relative to the root: HTML}).

    Returns the problems and the number of links to an exercise that were checked.
    """
    shown = displayed_numbers(pages)
    problems, checked = [], 0
    for rel, text in pages.items():
        body = re.sub(r"<(script|style)\b.*?</\1>", "", text, flags=re.S)
        for m in _LINK.finditer(body):
            url = urlparse(urljoin("http://site/" + rel, m.group("href")))
            key = (unquote(url.path.lstrip("/")), unquote(url.fragment))
            if key not in shown:
                continue
            checked += 1
            said = [int(n) for n in re.findall(r"\bExercise\s+(\d+)", _text(m.group("text")))]
            if any(n != shown[key] for n in said):
                problems.append(f"{rel}: link {_text(m.group('text'))!r} opens Exercise {shown[key]}")
        outside = _text(_TITLE.sub("", _LINK.sub("", body)))
        problems += [f"{rel}: exercise number outside a link: {m.group(0)!r}"
                     for m in _NUMBER.finditer(outside)]
    return problems, checked


def read_site(root: Path) -> dict[str, str]:
    """Every page of a built site, by its path relative to the root."""
    skip = ("_static", "_sources", "_images", "jupyter_execute", "_modules")
    return {p.relative_to(root).as_posix(): p.read_text(encoding="utf-8")
            for p in sorted(root.rglob("*.html")) if not p.relative_to(root).parts[0].startswith(skip)}


# --- tests -------------------------------------------------------------------------------------


def test_chapters_write_no_exercise_number_by_hand():
    pages = {p.name: p.read_text(encoding="utf-8") for p in sorted(BOOK.glob("*.md"))}
    assert sum(len(exercise_labels(t)) for t in pages.values()) >= 20
    problems = source_problems(pages)
    assert not problems, "\n".join(problems)


def test_source_check_can_fail():
    ex = "```{exercise} A title\n:label: ch01-ex1\n\nText.\n```\n"
    good = {"a.md": ex + "See {ref}`ch01-ex1` and {numref}`chapter 1's Exercise %s <ch01-ex1>`.\n"}
    assert source_problems(good) == []
    for bad in ("See {ref}`Exercise 1 <ch01-ex1>`.", "See {numref}`Exercise 2 <ch01-ex1>`.",
                "As Exercise 4 shows."):
        assert len(source_problems({"a.md": ex + bad + "\n"})) == 1, bad
    # a reference to something that is not an exercise may say any number
    assert source_problems({"a.md": ex + "{ref}`Figure 3 <fig-3>`\n"}) == []


def _page(exercises, body=""):
    divs = "".join(f'<div class="exercise admonition" id="{ex}">\n\n<p class="admonition-title">'
                   f'<span class="caption-number">Exercise {n} </span> (Title)</p></div>'
                   for ex, n in exercises.items())
    return f"<html><body>{body}{divs}</body></html>"


def test_site_check_can_fail():
    target = {"03.html": _page({"ch03-ex5": 14})}
    link = '<a class="reference internal" href="03.html#ch03-ex5"><span>{}</span></a>'
    ok = target | {"04.html": _page({}, link.format("Exercise 14") + link.format("an exercise"))}
    assert site_problems(ok) == ([], 2)
    wrong = target | {"04.html": _page({}, link.format("chapter 3’s Exercise 5"))}
    problems, checked = site_problems(wrong)
    assert checked == 1 and len(problems) == 1 and "opens Exercise 14" in problems[0]
    loose = target | {"04.html": _page({}, "<p>as Exercise 14 shows</p>")}
    assert len(site_problems(loose)[0]) == 1
    # a link within the page itself, and an exercise's own title, are read too
    own = {"03.html": _page({"ch03-ex5": 14}, '<a href="#ch03-ex5">Exercise 5</a>')}
    assert len(site_problems(own)[0]) == 1
