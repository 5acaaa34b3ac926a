"""A reader's budgets: words of prose per page and sentence length (scripts/prose.py)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import prose  # noqa: E402

BUDGETS = {
    "book/07_routed_grpo_simulation.md": 5000,
    "book/08_grpo_gsm8k.md": 5000,
    "book/09_exact_budget.md": 4500,
    "README.md": 1500,
}
"""Words of prose each page may hold (the third edition's budgets)."""
LONGEST = 60
"""No sentence of chapters 7 to 9 is longer."""


def test_prose_counts_what_a_reader_reads():
    page = """---
jupytext:
  formats: md:myst
---
(label)=
# A title here

One two three. Four five six seven.

```{code-cell} ipython3
:tags: [hide-input]
these words are code and do not count
```

:::{admonition} Box title
:class: important
Inside the box: {glue:text}`value` and {ref}`the table <tab>` and $x^2$.
:::

| a | table | row |
| --- | --- | --- |

<!-- a comment
over lines -->
- a list item, e.g. this one
- another
"""
    bs = prose.blocks(page)
    assert bs == ["A title here", "One two three. Four five six seven.", "Box title",
                  "Inside the box: x and the table and  x .", "a list item, e.g. this one", "another"]
    assert prose.sentences(bs[1]) == ["One two three.", "Four five six seven."]
    assert prose.sentences(bs[4]) == ["a list item, e.g. this one"]  # "e.g." ends nothing
    assert prose.words(bs[3]) == 9  # the glued value and $x^2$ one word each


@pytest.mark.parametrize("page, budget", BUDGETS.items())
def test_each_page_keeps_its_budget(page, budget):
    m = prose.measure(ROOT / page)
    assert m["words"] <= budget, f"{page}: {m['words']} words of prose, budget {budget}"
    if page.startswith("book/"):
        long = [(n, s[:80]) for n, s in m["sentences"] if n > LONGEST]
        assert not long, f"{page}: sentences over {LONGEST} words: {long}"
