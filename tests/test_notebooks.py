"""The Colab notebooks are in sync with their MyST chapters, and the student edition strips
every solution while keeping the exercises."""

import re
import shutil
from pathlib import Path

import jupytext
import pytest

from repo_scripts import load_script  # tests/repo_scripts.py

ROOT = Path(__file__).resolve().parents[1]
notebooks = load_script("scripts/notebooks.py")

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


# --- Colab notebooks in plain Markdown --------------------------------------------------

BIB = {
    "bengal2026mcpg": {"author": "Ben-Gal, Elai and Tong, Stela", "year": "2026",
                       "journal": "arXiv preprint arXiv:2604.22785", "title": "Marginal-Contribution"},
    "holmstrom1982moral": {"author": "Holmstr{\\\"o}m, Bengt", "year": "1982", "title": "Moral Hazard"},
    "three": {"author": "A, B and C, D and E, F", "year": "2020", "doi": "10.1/xyz", "title": "T"},
}
LABELS = {"lem-base": "Lemma 1", "ch02": "Chapter 2 (Contribution fields)", "t-ex1": "Exercise 3.1",
          "sec": "“A section”"}
MYST = """(sec)=
## A section

```{prf:lemma} Valid baselines (Lemma 1)
:label: lem-base
:nonumber:

Let $B_i$ be a baseline with $\\E[B_i] = 0$.
```

```{prf:definition} Retention (Section 4)
:label: def-ret

- first
```

```{exercise} One
:label: t-ex1

Do {prf:ref}`lem-base` and {prf:ref}`Lemma 1 again <lem-base>`; see {ref}`ch02` and [the section](sec).
```

```{solution-start} t-ex1
:class: dropdown
```

:::{important}
Mind {cite}`bengal2026mcpg` and {cite:t}`holmstrom1982moral`, also {cite:p}`three,holmstrom1982moral`.
:::

```{solution-end}
```

The function {py:func}`~mcpg.routing.removal_contributions`, {py:class}`mcpg.fields.Game`, {eq}`eq-3`.
% a MyST comment

```bash
% not a comment in a code block, nor is {cite}`this`
```
"""


def test_myst_to_markdown():
    out = notebooks.myst_to_markdown(MYST, LABELS, BIB, {"E": "\\mathbb{E}"})
    assert "**Lemma 1 (Valid baselines).** Let $B_i$ be a baseline with $\\mathbb{E}[B_i] = 0$." in out
    assert "**Definition (Retention (Section 4)).**\n\n- first" in out  # a list starts its own paragraph
    assert "**Exercise 3.1: One**\n\nDo Lemma 1 and Lemma 1 again; see Chapter 2 (Contribution fields)" in out
    assert "and the section (“A section”)." in out
    assert "**Solution to Exercise 3.1**" in out
    assert "> **Important**\n>\n> Mind ([Ben-Gal and Tong, 2026](https://arxiv.org/abs/2604.22785)) and " \
           "[Holmström (1982)](" in out
    assert "also ([A et al., 2020](https://doi.org/10.1/xyz); [Holmström, 1982](" in out
    assert "`removal_contributions`, `mcpg.fields.Game`, Eq. (eq-3)." in out
    assert out.endswith("```bash\n% not a comment in a code block, nor is {cite}`this`\n```")
    prose = out[:out.index("```bash")]
    for myst in ("{", "```", ":::", "(sec)=", "% a MyST", ":label:", ":class:", "\\E["):
        assert myst not in prose.replace("\\mathbb{E}", "").replace("{B_i}", ""), myst


@pytest.mark.parametrize("md", notebooks.chapters(), ids=lambda p: p.name)
def test_colab_notebook_has_no_myst_left(md):
    """Every directive, role and label of the chapter is plain Markdown in its notebook."""
    text = md.read_text(encoding="utf-8")
    nb = notebooks._notebook(text, number=int(md.name[:2]))
    markdown = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    left = re.findall(r"\{(?:prf:[a-z]+|exercise|solution-start|solution-end|cite|ref|numref|eq|py:\w+"
                      r"|glue:?\w*)\}|^[`:]{3}\{|^:::|^\([\w-]+\)=$", markdown, re.M)
    assert not left, left
    assert all(c.source.strip() for c in nb.cells if c.cell_type == "markdown")
    results = re.findall(r"^```\{prf:(\w+)\}[ \t]*(.*)$", text, re.M)
    assert results
    for kind, title in results:  # each result opens a paragraph with its bold heading
        heading = notebooks._prf_heading(kind, title)
        assert re.search(r"^\*\*" + re.escape(heading) + r"\.\*\*", markdown, re.M), heading
    assert markdown.count("**Exercise ") == text.count("```{exercise}")
    code = [c.source for c in nb.cells if c.cell_type == "code" and "glue" not in c.metadata.get("tags", [])]
    assert code == [c.source for c in jupytext.reads(text, fmt="md:myst").cells if c.cell_type == "code"]


GLUED = """# T

Intro with {glue:text}`n` numbers, above the set-up cell.

```{code-cell} ipython3
import sys
```

Intro without numbers.

The gap is {glue:text}`gap:+.2f` over {glue:text}`n` seeds,
on two lines.

A paragraph between, with a {cite}`paper` and no number.

```{note}
The verdict: {glue:md}`verdict`.
```

```{code-cell} ipython3
x = 1
```
"""


def test_a_cell_with_numbers_is_followed_by_a_colab_form_cell_that_shows_them():
    """In the notebook a glue role is a placeholder; the form cell after the Markdown cell
    shows the paragraphs that hold roles (and only those), roles kept for mcpg.glue.show."""
    nb = notebooks._notebook(GLUED)
    kinds = [(c.cell_type, tuple(c.metadata.get("tags", []))) for c in nb.cells]
    assert kinds == [("markdown", ()), ("code", ()), ("code", ("glue",)),  # after the set-up cell
                     ("markdown", ()), ("code", ("glue",)), ("code", ())]
    early = 'show(r"""\nIntro with {glue:text}`n` numbers, above the set-up cell.\n""")'
    assert nb.cells[2].source.endswith(early)
    md, form = nb.cells[3].source, nb.cells[4].source
    assert "The gap is `⟨gap⟩` over `⟨n⟩` seeds" in md and "> The verdict: `⟨verdict⟩`." in md
    assert form.startswith(notebooks.GLUE_TITLE + "\nfrom mcpg.glue import show\n\nshow(r\"\"\"\n")
    assert "The gap is {glue:text}`gap:+.2f` over {glue:text}`n` seeds,\non two lines." in form
    assert "> The verdict: {glue:md}`verdict`." in form
    assert "Intro" not in form and "between" not in form
    assert nb.cells[4].metadata["cellView"] == "form"  # Colab shows the title, not the code
    assert notebooks.glue_cell("No numbers here.") is None


@pytest.mark.parametrize("md", [m for m in notebooks.chapters() if "{glue" in m.read_text(encoding="utf-8")],
                         ids=lambda p: p.name)
def test_every_glue_role_of_a_chapter_is_shown_by_a_form_cell(md):
    text = md.read_text(encoding="utf-8")
    nb = notebooks._notebook(text, number=int(md.name[:2]))
    forms = "\n".join(c.source for c in nb.cells if "glue" in c.metadata.get("tags", []))
    cells = jupytext.reads(text, fmt="md:myst").cells
    prose = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    roles = re.findall(r"\{glue(?::\w*)?\}`[^`]+`", prose)
    assert roles and all(r in forms for r in roles)
    compiled = [compile(c.source, md.name, "exec") for c in nb.cells if "glue" in c.metadata.get("tags", [])]
    assert len(compiled) >= 1


def test_every_citation_is_in_the_bibliography():
    bib = notebooks.read_bib()
    cited = set()
    for md in notebooks.chapters():
        for keys in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", md.read_text(encoding="utf-8")):
            cited |= {k.strip() for k in keys.split(",")}
    assert cited and cited <= set(bib), sorted(cited - set(bib))
    assert notebooks.cite("holmstrom1982moral", bib).startswith("([Holmström, 1982](")
    assert notebooks.cite("bengal2026mcpg", bib, textual=True) == \
        "[Ben-Gal and Tong (2026)](https://arxiv.org/abs/2604.22785)"


# --- the set-up cell ----------------------------------------------------------------------

SETUP = """# T

Words.

```{code-cell} ipython3
:tags: [hide-output]

import sys
x = 1
```

```{code-cell} ipython3
:tags: [hide-output]

y = 2
```
"""


def test_fold_setup_folds_the_first_code_cell_only():
    out = notebooks.fold_setup(SETUP)
    assert notebooks.fold_setup(out) == out  # idempotent
    nb = jupytext.reads(out, fmt="md:myst")
    first, second = [c for c in nb.cells if c.cell_type == "code"]
    assert first.source == "import sys\nx = 1" and second.source == "y = 2"
    assert first.metadata["tags"] == ["hide-input", "remove-output"]  # one toggle on the site
    assert first.metadata["mystnb"] == {"code_prompt_show": notebooks.SETUP_SHOW,
                                        "code_prompt_hide": notebooks.SETUP_HIDE}
    assert second.metadata["tags"] == ["hide-output"]


@pytest.mark.parametrize("md", notebooks.chapters(), ids=lambda p: p.name)
def test_set_up_cell_is_folded_and_installs_what_the_chapter_needs(md):
    """The first code cell: folded on the site (`python scripts/notebooks.py fold-setup`), and
    in Colab it installs the library with the extras the chapter imports (``llm`` for mcpg.grpo
    beyond its light objective, transformers, peft)."""
    text = md.read_text(encoding="utf-8")
    assert notebooks.fold_setup(text) == text, "run `python scripts/notebooks.py fold-setup`"
    setup = next(c for c in jupytext.reads(text, fmt="md:myst").cells if c.cell_type == "code")
    install = re.search(r'%pip install[^\n]*"mcpg(\[[\w,]+\])? @ git\+[^"]+"', setup.source)
    assert install, "the set-up cell installs the library in Colab"
    needs_llm = re.search(r"mcpg\.grpo\.(train|agents|models|router)|import (transformers|peft)", text)
    extras = (install.group(1) or "[]")[1:-1].split(",")
    assert ("llm" in extras) == bool(needs_llm), f"extras {extras}; the chapter needs llm: {bool(needs_llm)}"


def test_colab_install_is_written_from_the_configuration(tmp_path):
    """The repository's address is written by hand in ``_config.yml`` alone: `check` fails on a
    chapter whose set-up cell installs from elsewhere, and `sync` rewrites every set-up cell's
    Colab install from the configuration (keeping the extras), and is then a no-op."""
    book = tmp_path / "book"
    shutil.copytree(notebooks.BOOK, book, ignore=shutil.ignore_patterns("_build"))
    names = [md.name for md in notebooks.chapters(book)]
    assert notebooks.check(book) == []
    url, branch = notebooks.repository(book / "_config.yml")
    config = (book / "_config.yml").read_text(encoding="utf-8")
    fork = "https://example.org/someone/mcpg-fork"
    assert config.count(f"url: {url}") == 1 and config.count(f"branch: {branch}") == 1
    (book / "_config.yml").write_text(config.replace(f"url: {url}", f"url: {fork}")
                                      .replace(f"branch: {branch}", "branch: dev"), encoding="utf-8")
    assert notebooks.check(book) == names
    notebooks.sync(book)
    assert notebooks.check(book) == []
    for name, extras in (("01_failures", ""), ("08_grpo_gsm8k", "[llm]")):
        text = (book / f"{name}.md").read_text(encoding="utf-8")
        assert url not in text and fork in text
        setup = next(c for c in jupytext.reads(text, fmt="md:myst").cells if c.cell_type == "code")
        assert f'%pip install -q "mcpg{extras} @ git+{{REPOSITORY}}@dev"' in setup.source
        assert setup.source.startswith(f'import sys\n\n{notebooks.COLAB_IF}')
        assert notebooks.set_colab_install(text, fork, "dev") == text
        ipynb = jupytext.read(book / f"{name}.ipynb")
        assert next(c for c in ipynb.cells if c.cell_type == "code").source == setup.source


def test_colab_install_added_to_a_set_up_cell_without_one():
    out = notebooks.set_colab_install(SETUP, "https://example.org/r", "main")
    assert notebooks.set_colab_install(out, "https://example.org/r", "main") == out
    first = next(c for c in jupytext.reads(out, fmt="md:myst").cells if c.cell_type == "code")
    assert first.source.startswith(f"import sys\n\n{notebooks.COLAB_IF}")
    assert first.source.endswith('%pip install -q "mcpg @ git+{REPOSITORY}@main"\n\nimport sys\nx = 1')
    assert first.metadata["tags"] == ["hide-output"]
    long = "https://example.org/" + "x" * 80  # an address too long for one line of 80
    assert all(len(line) <= 80 or long in line for line in notebooks.colab_install(long, "main"))
    assert notebooks.colab_install(long, "") != notebooks.colab_install(long, "main")
