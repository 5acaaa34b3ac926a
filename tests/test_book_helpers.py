"""The introduction's claim about the chapters' own code: chapters 1 to 7 define only short
helpers, none reaching fifteen lines (a function or class, counted from its ``def`` or
``class`` line to its last line); anything longer belongs in the library. Chapters 8 and 9
may define longer ones (their readings of recorded runs, written as sentences)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

BOOK = Path(__file__).resolve().parents[1] / "book"
SHORT = 15  # "none reaching fifteen lines" (book/intro.md)


def helper_lengths(text: str) -> dict[str, int]:
    """{name: lines} of every function and class defined in a MyST page's code cells."""
    lengths = {}
    for cell in re.findall(r"^```\{code-cell\}[^\n]*\n(.*?)^```", text, re.M | re.S):
        body = re.sub(r"^---\n.*?\n---\n", "", cell, flags=re.S)  # the cell's YAML options
        code = "\n".join(re.sub(r"^(\s*)[%!].*", r"\1pass", line)  # magics
                         for line in body.splitlines() if not line.startswith(":"))  # options
        for node in ast.walk(ast.parse(code)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                lengths[node.name] = max(lengths.get(node.name, 0), node.end_lineno - node.lineno + 1)
    return lengths


def test_intro_states_the_claim():
    intro = " ".join((BOOK / "intro.md").read_text(encoding="utf-8").split())
    assert "short ones in chapters 1 to 7, none reaching fifteen lines" in intro


def test_chapters_1_to_7_define_only_short_helpers():
    pages = sorted(p for p in BOOK.glob("0[1-7]_*.md"))
    assert len(pages) == 7
    long = {f"{p.name}: {name}": n for p in pages
            for name, n in helper_lengths(p.read_text(encoding="utf-8")).items() if n >= SHORT}
    assert not long, long


def test_the_count_can_fail():
    page = "```{code-cell} ipython3\n:tags: [x]\ndef f(x):\n" + "    x += 1\n" * 14 + "    return x\n```\n"
    assert helper_lengths(page) == {"f": 16}
