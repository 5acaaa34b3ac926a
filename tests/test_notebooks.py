"""The Colab notebooks are in sync with their MyST chapters, and the student edition strips
every solution while keeping the exercises."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("notebooks", ROOT / "scripts" / "notebooks.py")
notebooks = importlib.util.module_from_spec(spec)
spec.loader.exec_module(notebooks)

CHAPTER = """# T

```{exercise} One
:label: t-ex1

Do it.
```

```{solution-start} t-ex1
:class: dropdown
```

```{code-cell} ipython3
print("secret answer")
```

```{solution-end}
```

```{exercise} Two
:label: t-ex2

Again.
```

```{solution-start} t-ex2
:class: dropdown
```

Words of the solution.

```{solution-end}
```

After.
"""


def test_strip_solutions_keeps_exercises_and_removes_solutions():
    out = notebooks.strip_solutions(CHAPTER)
    assert "secret answer" not in out and "Words of the solution" not in out
    assert "solution-start" not in out and "solution-end" not in out
    assert out.count("{exercise}") == 2 and ":label: t-ex1" in out and ":label: t-ex2" in out
    assert out.rstrip().endswith("After.")


def test_every_chapter_has_a_notebook_in_sync():
    stale = notebooks.check()
    assert not stale, f"run `python scripts/notebooks.py sync`: {stale}"


@pytest.mark.parametrize("md", notebooks.chapters(), ids=lambda p: p.name)
def test_chapter_solutions_are_gated(md):
    """Every exercise of a chapter has a gated solution, and stripping leaves none behind."""
    text = md.read_text(encoding="utf-8")
    assert text.count("{exercise}") >= 3
    assert text.count("{solution-start}") == text.count("{exercise}") == text.count("{solution-end}")
    assert "{solution" not in notebooks.strip_solutions(text)
