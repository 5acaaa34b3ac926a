"""Chapters as Jupyter notebooks: generate, check, and build the student edition.

The MyST Markdown chapters in ``book/`` are the only source. This script derives from them

- ``sync``: first each chapter's Colab install, in its set-up cell (its first code cell),
  written from the book's repository (``repository.url`` and ``.branch`` of
  ``book/_config.yml``, the one place the address is written by hand; :func:`colab_install`);
  then one ``.ipynb`` per chapter beside its source (``book/NN_name.ipynb``, without
  outputs). These are what the Colab button opens. Sphinx ignores them (``_config.yml``).
- ``check``: exits 1 when a committed notebook's cells differ from its source, or a chapter's
  Colab install from the configuration (CI runs it).
- ``fold-setup``: rewrites each chapter's set-up cell (its first code cell) so that the site
  shows it folded behind a one-line summary (tags ``hide-input``, ``remove-output`` and
  MyST-NB's ``code_prompt_show``/``code_prompt_hide``). Idempotent.
- ``student [--out DIR]``: the student edition, in its own folder (default
  ``_build/student``): the site built with every solution removed (sphinx-exercise's
  ``hide_solutions``, and the gated solution cells stripped before execution) and the
  notebooks without solution cells. Exercises keep their labels and numbers.

Usage::

    python scripts/notebooks.py sync
    python scripts/notebooks.py check
    python scripts/notebooks.py fold-setup
    python scripts/notebooks.py student

Colab renders plain Markdown only, so the notebooks' Markdown cells are converted from MyST
(:func:`myst_to_markdown`): a ``{prf:...}`` block becomes a paragraph that opens with a bold
"**Proposition 2 (title).**", ``{exercise}`` and ``{solution-start}`` bold headings
("**Exercise 3.1: title**", "**Solution to Exercise 3.1**"), admonitions blockquotes,
cross-references (``{prf:ref}``, ``{ref}``, ``{numref}``, ``{eq}``) their text, citations
(``{cite}``, ``{cite:p}``, ``{cite:t}``) author-year links built from ``book/references.bib``,
and ``{py:func}``-like roles inline code. Code cells are copied as they are. A glue role (a
number a cell computes, :mod:`mcpg.glue`) becomes a placeholder ``⟨key⟩``, and a form cell
after its Markdown cell (:func:`glue_cell`) shows the paragraph with the number once the
chapter's cells have run.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import quote_plus

import jupytext
import nbformat

from mcpg.glue import ROLE as GLUE_ROLE  # a glue role, as mcpg.glue.show fills it

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
CHAPTER = re.compile(r"^\d\d_.*\.md$")
# a gated solution: from its solution-start fence to the closing fence of its solution-end
SOLUTION = re.compile(r"^```\{solution-start\}.*?^```\{solution-end\}\s*\n```[ \t]*\n?", re.S | re.M)


def chapters(book: Path = BOOK) -> list[Path]:
    """The chapter sources, in order."""
    return sorted(p for p in book.glob("*.md") if CHAPTER.match(p.name))


def strip_solutions(text: str) -> str:
    """Remove every gated solution (its directives and the cells between them) from a MyST chapter."""
    return SOLUTION.sub("", text)


# ------------------------------------------------------------------------------------------
# MyST to plain Markdown, for Colab
# ------------------------------------------------------------------------------------------
ADMONITIONS = ("admonition", "attention", "caution", "danger", "error", "hint", "important", "note",
               "seealso", "tip", "warning")
OPENING = re.compile(r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[^}\s]+)\}[ \t]*(?P<arg>.*?)\s*$")
ROLE = re.compile(r"\{(?P<role>[a-z]+(?::[a-z]+)*)\}`(?P<content>[^`]+)`")
LABEL_LINK = re.compile(r"\[(?P<text>[^\]]+)\]\((?P<label>#?[\w-]+)\)")
TARGET = re.compile(r"^\((?P<label>[^()\s]+)\)=\s*$")
LATEX_ACCENTS = {'\\"': "\u0308", "\\'": "\u0301", "\\`": "\u0300", "\\^": "\u0302", "\\~": "\u0303",
                 "\\c": "\u0327", "\\v": "\u030c", "\\=": "\u0304"}


def _bib_fields(body: str) -> dict[str, str]:
    fields, i = {}, 0
    for m in re.finditer(r"(\w+)\s*=\s*", body):
        if m.start() < i:
            continue
        j = m.end()
        if j < len(body) and body[j] == "{":
            depth, k = 0, j
            while k < len(body):
                depth += {"{": 1, "}": -1}.get(body[k], 0)
                if depth == 0:
                    break
                k += 1
            value, i = body[j + 1:k], k + 1
        else:
            end = re.match(r'"[^"]*"|[^,}]*', body[j:])
            value, i = end.group(0).strip('" '), j + end.end()
        fields[m.group(1).lower()] = value
    return fields


def read_bib(path: Path = BOOK / "references.bib") -> dict[str, dict[str, str]]:
    """The entries of a BibTeX file: key -> lower-case field -> raw value (enough for citations)."""
    text = path.read_text(encoding="utf-8")
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"@\w+\s*\{\s*([^,\s]+)\s*,", text)]
    return {key: _bib_fields(text[a:b]) for (a, key), (b, _) in zip(starts, starts[1:] + [(len(text), "")])}


def _plain(latex: str) -> str:
    """BibTeX text without braces and with accented letters: {\\"o} -> ö."""
    for cmd, mark in LATEX_ACCENTS.items():
        pattern = r"\{?" + re.escape(cmd) + r"\{?(\w)\}?\}?"
        latex = re.sub(pattern, lambda m, mark=mark: m.group(1) + mark, latex)
    import unicodedata

    return unicodedata.normalize("NFC", re.sub(r"\s+", " ", latex.replace("{", "").replace("}", ""))).strip()


def _surnames(entry: dict[str, str]) -> str:
    authors = entry.get("author", entry.get("editor", "")).strip()
    names = [n.strip() for n in re.split(r"\s+and\s+", authors) if n.strip()]
    last = [_plain(n.split(",")[0] if "," in n else n.split()[-1]) for n in names]
    if not last:
        return "Anonymous"
    if len(last) == 1:
        return last[0]
    return f"{last[0]} and {last[1]}" if len(last) == 2 else f"{last[0]} et al."


def _bib_url(entry: dict[str, str]) -> str:
    if entry.get("url"):
        return entry["url"]
    if entry.get("doi"):
        return "https://doi.org/" + entry["doi"]
    arxiv = re.search(r"arXiv[:\s]*(\d{4}\.\d{4,5})", " ".join(entry.values()), re.I) or (
        re.match(r"(\d{4}\.\d{4,5})", entry.get("eprint", "")))
    if arxiv:
        return "https://arxiv.org/abs/" + arxiv.group(1)
    return "https://scholar.google.com/scholar?q=" + quote_plus(f'"{_plain(entry.get("title", ""))}"')


def cite(keys: str, bib: dict, textual: bool = False) -> str:
    """Author-year citation links: (Ben-Gal and Tong, 2026) or, textual, Ben-Gal and Tong (2026)."""
    parts = []
    for key in (k.strip() for k in keys.split(",") if k.strip()):
        entry = bib.get(key)
        if entry is None:
            parts.append(key)
            continue
        who, year, url = _surnames(entry), entry.get("year", "n.d."), _bib_url(entry)
        parts.append(f"[{who} ({year})]({url})" if textual else f"[{who}, {year}]({url})")
    return "; ".join(parts) if textual else "(" + "; ".join(parts) + ")"


def _prf_heading(kind: str, title: str) -> str:
    """'Valid baselines (Lemma 1)' of a lemma -> 'Lemma 1 (Valid baselines)'."""
    kind = kind.capitalize()
    m = re.match(r"^(?P<rest>.*\S)\s*\((?P<number>" + kind + r"\b[^()]*)\)$", title.strip())
    if m:
        return f"{m.group('number')} ({m.group('rest')})"
    return f"{kind} ({title.strip()})" if title.strip() else kind


def _chapter_number(path: Path) -> int | None:
    m = re.match(r"^(\d\d)_", path.name)
    return int(m.group(1)) if m else None


def _options(lines: list[str]) -> tuple[dict[str, str], list[str]]:
    """A directive's options (``:key: value`` lines or a YAML block) and the rest of its body."""
    opts: dict[str, str] = {}
    if lines and lines[0].strip() == "---":
        end = next((i for i in range(1, len(lines)) if lines[i].strip() == "---"), None)
        if end is not None:
            for line in lines[1:end]:
                key, _, value = line.partition(":")
                opts[key.strip()] = value.strip()
            return opts, lines[end + 1:]
    i = 0
    while i < len(lines) and re.match(r"^:[\w-]+:", lines[i]):
        key, value = re.match(r"^:([\w-]+):\s*(.*)$", lines[i]).groups()
        opts[key] = value
        i += 1
    return opts, lines[i:]


def _directives(path: Path):
    """Yield (name, argument, options) of every directive of a chapter, in order."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        m = OPENING.match(line)
        if m:
            end = _closing(lines, i, m.group("fence"))
            yield m.group("name"), m.group("arg"), _options(lines[i + 1:end])[0]


def book_labels(book: Path = BOOK) -> dict[str, str]:
    """Readable text for every label of the book: chapter and section titles, results, exercises."""
    labels: dict[str, str] = {}
    for md in chapters(book):
        number = _chapter_number(md)
        lines = md.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            m = TARGET.match(line)
            heading = next((h for h in lines[i + 1:i + 4] if h.startswith("#")), None) if m else None
            if heading:
                level, title = re.match(r"^(#+)\s*(.*?)\s*$", heading).groups()
                where = f" (Chapter {number})" if number is not None else ""
                chapter_title = len(level) == 1 and number is not None
                text = f"Chapter {number} ({title})" if chapter_title else f"“{title}”{where}"
                labels[m.group("label")] = text
        exercises = 0
        for name, arg, opts in _directives(md):
            if name == "exercise":
                exercises += 1
                if "label" in opts:
                    labels[opts["label"]] = f"Exercise {number}.{exercises}" if number else "Exercise"
            elif name.startswith("prf:") and "label" in opts:
                labels[opts["label"]] = _prf_heading(name[4:], arg).split(" (")[0]
    return labels


def _reference(role: str, content: str, labels: dict[str, str]) -> str:
    m = re.match(r"^(?P<text>.*?)\s*<(?P<label>[^<>]+)>$", content, re.S)
    text, label = (m.group("text"), m.group("label")) if m else ("", content.strip())
    label = label.lstrip("~")
    if role == "eq":
        return text or f"Eq. ({label})"
    known = labels.get(label, label)
    if text:
        return text.replace("%s", known.split()[-1]) if role == "numref" else text
    return known


def _roles(text: str, labels: dict[str, str], bib: dict, keep_glue: bool = False) -> str:
    def one(m):
        role, content = m.group("role"), m.group("content")
        if role == "glue" or role.startswith("glue:"):  # a number a cell computes (mcpg.glue)
            return m.group(0) if keep_glue else f"`⟨{content.split(':', 1)[0]}⟩`"
        if role in ("cite", "cite:p", "cite:ps", "cite:alp", "cite:author", "cite:year"):
            return cite(content, bib)
        if role in ("cite:t", "cite:ts"):
            return cite(content, bib, textual=True)
        if role in ("ref", "prf:ref", "numref", "eq", "doc", "any"):
            return _reference(role, content, labels)
        if role.startswith("py:") or role in ("func", "class", "meth", "mod", "attr", "obj"):
            m2 = re.match(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>$", content)
            if m2:
                return f"`{m2.group('text')}`"
            return f"`{content[1:].rsplit('.', 1)[-1]}`" if content.startswith("~") else f"`{content}`"
        if role == "math":
            return f"${content}$"
        return content

    def link(m):  # [text](label): a MyST link to a label of the book
        label = m.group("label").lstrip("#")
        return f"{m.group('text')} ({labels[label]})" if label in labels else m.group(0)

    return LABEL_LINK.sub(link, ROLE.sub(one, text))


def myst_to_markdown(text: str, labels: dict[str, str] | None = None, bib: dict | None = None,
                     macros: dict[str, str] | None = None, keep_glue: bool = False) -> str:
    """Plain Markdown from one Markdown cell of a MyST chapter (see the module docstring).

    ``labels`` maps labels to readable text (:func:`book_labels`), ``bib`` is
    :func:`read_bib`'s dict, ``macros`` the book's MathJax macros (name -> expansion, which
    Colab does not know; :func:`math_macros`). A glue role (a number a cell computes) becomes a
    placeholder ``⟨key⟩``, or stays as it is with ``keep_glue`` (for :func:`glue_cell`)."""
    labels = {} if labels is None else labels
    bib = {} if bib is None else bib
    for name, expansion in (macros or {}).items():
        text = re.sub(r"\\" + name + r"(?![A-Za-z])", lambda _m, e=expansion: e, text)
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        m = OPENING.match(line)
        plain = re.match(r"^\s*(`{3,}|~{3,})(?!\{)", line)
        if plain:  # an ordinary code block: copied as it is
            fence = plain.group(1)
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), len(lines))
            out += lines[i:end + 1]
            i = end + 1
            continue
        if TARGET.match(line) or (line.startswith("%") and not line.startswith("%%")):
            i += 1  # a label target or a MyST comment
            continue
        if not m:
            out.append(_roles(line, labels, bib, keep_glue))
            i += 1
            continue
        end = _closing(lines, i, m.group("fence"))
        opts, body = _options(lines[i + 1:end])
        name, arg = m.group("name"), m.group("arg")
        inner = myst_to_markdown("\n".join(body), labels, bib, keep_glue=keep_glue).strip("\n")
        i = end + 1
        if name.startswith("prf:"):
            heading = f"**{_roles(_prf_heading(name[4:], arg), labels, bib, keep_glue)}.**"
            first = inner.lstrip().split("\n", 1)[0] if inner.strip() else ""
            joins = first and not re.match(r"^(\$\$|[-*+] |\d+\. |>|\||`{3}|#|\\\[)", first)
            out += [heading + " " + inner.lstrip()] if joins else [heading, "", inner] if inner else [heading]
        elif name == "exercise":
            number = labels.get(opts.get("label", ""), "Exercise")
            title = f"**{number}: {_roles(arg, labels, bib, keep_glue)}**" if arg else f"**{number}**"
            out += [title, "", inner]
        elif name in ("solution-start", "solution"):
            target = labels.get(arg.strip(), "the exercise")
            out += [f"**Solution to {target}**"] + (["", inner] if inner else [])
        elif name == "solution-end":
            continue
        elif name in ADMONITIONS or name == "dropdown":
            title = arg if name in ("admonition", "dropdown") and arg else name.capitalize()
            out += [f"> **{_roles(title, labels, bib, keep_glue)}**", ">"]
            out += [f"> {x}".rstrip() for x in inner.split("\n")]
        elif name in ("math", "equation"):
            out += ["$$", inner, "$$"]
        else:  # any other directive: its content, as Markdown
            out += [inner] if inner else []
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out))


def _closing(lines: list[str], i: int, fence: str) -> int:
    """Index of the line that closes the directive opened on line i (nested ones skipped)."""
    depth = 0
    for j in range(i + 1, len(lines)):
        m = OPENING.match(lines[j])
        if m and m.group("fence") == fence:
            depth += 1
        elif lines[j].strip() == fence:
            if depth == 0:
                return j
            depth -= 1
    return len(lines)


def math_macros(config: Path = BOOK / "_config.yml") -> dict[str, str]:
    """The MathJax macros of the book's configuration: name -> expansion (e.g. E -> \\mathbb{E})."""
    import yaml

    cfg = yaml.safe_load(config.read_text(encoding="utf-8"))
    tex = cfg.get("sphinx", {}).get("config", {}).get("mathjax3_config", {}).get("tex", {})
    macros = tex.get("macros", {})
    return {name: value if isinstance(value, str) else value[0] for name, value in macros.items()}


GLUE_TITLE = '# @title ▶ The text above, with its numbers { display-mode: "form" }'


def glue_cell(markdown: str):
    """The Colab form cell that follows a Markdown cell holding glue roles (or, for the prose
    above the set-up cell, follows that cell, which installs the library): it shows the
    paragraphs that hold them, with the numbers the chapter's cells glued
    (:func:`mcpg.glue.show`; a value computed further down fills in when its cell runs).
    None for a cell without glue roles. ``markdown`` is the cell converted with its roles kept."""
    blocks = [b for b in re.split(r"\n\s*\n", markdown.strip("\n")) if GLUE_ROLE.search(b)]
    if not blocks:
        return None
    text = "\n\n".join(blocks)
    literal = f'r"""\n{text}\n"""' if '"""' not in text else repr(text)
    source = f"{GLUE_TITLE}\nfrom mcpg.glue import show\n\nshow({literal})"
    return nbformat.v4.new_code_cell(source, metadata={"cellView": "form", "tags": ["glue"]})


def _is_glue(cell) -> bool:
    """Whether ``cell`` is a form cell of :func:`glue_cell`."""
    return cell.cell_type == "code" and "glue" in cell.metadata.get("tags", [])


def _notebook(text: str, book: Path = BOOK, number: int | None = None):
    """The Colab notebook of chapter ``number`` from its MyST text: Markdown cells converted."""
    nb = jupytext.reads(text, fmt="md:myst")
    nb.metadata.pop("jupytext", None)  # version-dependent; the kernelspec stays
    labels, bib = book_labels(book), read_bib(book / "references.bib")
    if number is not None:  # a section of this very chapter needs no "(Chapter N)"
        labels = {k: v.replace(f" (Chapter {number})", "") for k, v in labels.items()}
    macros = math_macros(book / "_config.yml")
    cells = []
    for cell in nb.cells:
        cells.append(cell)
        if cell.cell_type == "markdown":
            myst = cell.source
            cell.source = myst_to_markdown(myst, labels, bib, macros).strip("\n")
            numbers = glue_cell(myst_to_markdown(myst, labels, bib, macros, keep_glue=True))
            if numbers is not None:
                cells.append(numbers)
    # a form cell needs the library: one for the prose above the set-up cell follows that cell
    setup = next((i for i, c in enumerate(cells) if c.cell_type == "code" and not _is_glue(c)), None)
    if setup is not None:
        early = [c for c in cells[:setup] if _is_glue(c)]
        cells = [c for c in cells[:setup] if not _is_glue(c)] + [cells[setup]] + early + cells[setup + 1:]
    # a cell that held only MyST markup (e.g. the end of a solution) has nothing left to show
    nb.cells = [c for c in cells if c.cell_type != "markdown" or c.source.strip()]
    for i, cell in enumerate(nb.cells):  # stable ids, so that a sync without edits changes nothing
        cell.id = f"cell-{i:03d}"
    return nb


def _cells(nb) -> list[tuple[str, str, tuple]]:
    return [(c.cell_type, c.source, tuple(c.metadata.get("tags", []))) for c in nb.cells]


def sync(book: Path = BOOK) -> list[Path]:
    """Write every chapter's Colab install from the book's repository (:func:`set_colab_install`)
    and ``NN_name.ipynb`` beside every chapter; return the paths written."""
    out = []
    url, branch = repository(book / "_config.yml")
    for md in chapters(book):
        text = md.read_text(encoding="utf-8")
        if set_colab_install(text, url, branch) != text:
            md.write_text(set_colab_install(text, url, branch), encoding="utf-8")
            out.append(md)
        path = md.with_suffix(".ipynb")
        nb = _notebook(md.read_text(encoding="utf-8"), book, _chapter_number(md))
        jupytext.write(nb, path, fmt="ipynb")
        out.append(path)
    return out


def check(book: Path = BOOK) -> list[str]:
    """Chapters whose notebook is missing or whose cells differ from the source, or whose Colab
    install is not the one the book's repository (``_config.yml``) gives."""
    stale = []
    url, branch = repository(book / "_config.yml")
    for md in chapters(book):
        path = md.with_suffix(".ipynb")
        text = md.read_text(encoding="utf-8")
        want = _cells(_notebook(text, book, _chapter_number(md)))
        if set_colab_install(text, url, branch) != text or not path.exists() or \
                _cells(jupytext.read(path)) != want:
            stale.append(md.name)
    return stale


# ------------------------------------------------------------------------------------------
# The set-up cell: its Colab install, and its folding on the site
# ------------------------------------------------------------------------------------------
COLAB_IF = 'if "google.colab" in sys.modules:'
REPOSITORY_VARIABLE = "MCPG_REPOSITORY"  # names another repository to install from (a fork, a test)


def repository(config: Path = BOOK / "_config.yml") -> tuple[str, str]:
    """The book's repository: its address and branch (``repository.url`` and ``.branch`` of the
    configuration), the one place where they are written by hand."""
    import yaml

    repo = yaml.safe_load(config.read_text(encoding="utf-8"))["repository"]
    return repo["url"].rstrip("/"), str(repo.get("branch") or "")


def colab_install(url: str, branch: str, extras: str = "") -> list[str]:
    """The lines of a set-up cell's Colab block: in Colab (``google.colab`` imported), install
    ``mcpg{extras}`` from the repository ``url`` at ``branch`` (the environment variable
    ``MCPG_REPOSITORY``, when set, names another address). IPython's ``{...}`` expansion puts
    the address into the ``%pip`` line."""
    ref = f"@{branch}" if branch else ""
    one = f'    REPOSITORY = os.environ.get("{REPOSITORY_VARIABLE}", "{url}")'
    address = [one] if len(one) <= 80 else [
        "    REPOSITORY = os.environ.get(", f'        "{REPOSITORY_VARIABLE}", "{url}"', "    )"]
    return [f"{COLAB_IF}  # running in Colab: install the library first",
            "    import os",
            "",
            f"    # from the book's repository, or the one {REPOSITORY_VARIABLE} names (a fork)",
            *address,
            f'    %pip install -q "mcpg{extras} @ git+{{REPOSITORY}}{ref}"']


def set_colab_install(text: str, url: str, branch: str) -> str:
    """The chapter with its set-up cell's Colab block (``if "google.colab" in sys.modules:``
    and the lines indented below it) written by :func:`colab_install`, keeping the extras it
    installs (``mcpg[llm]``); a set-up cell without one gains one at its top. Idempotent."""
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if re.match(r"^```\{code-cell\}", line)), None)
    if start is None:
        return text
    end = _closing(lines, start, "```")
    first = end - len(_options(lines[start + 1:end])[1])
    while first < end and not lines[first].strip():
        first += 1  # the first line of code
    block = next((i for i in range(first, end) if lines[i].startswith(COLAB_IF)), None)
    if block is None:
        return "\n".join(lines[:first] + ["import sys", ""] + colab_install(url, branch) + [""]
                         + lines[first:])
    stop = block + 1
    while stop < end and (not lines[stop].strip() or lines[stop][0] in " \t"):
        stop += 1
    while not lines[stop - 1].strip():
        stop -= 1
    extras = re.search(r'"mcpg(\[[\w,]+\])? @', "\n".join(lines[block:stop]))
    new = colab_install(url, branch, (extras.group(1) or "") if extras else "")
    return "\n".join(lines[:block] + new + lines[stop:])


SETUP_SHOW = "Set-up: installs the library in Colab, imports, settings"
SETUP_HIDE = "Hide the set-up"
SETUP_HEADER = f"""---
tags: [hide-input, remove-output]
mystnb:
  code_prompt_show: "{SETUP_SHOW}"
  code_prompt_hide: "{SETUP_HIDE}"
---"""


def fold_setup(text: str) -> str:
    """The chapter with its first code cell (the set-up cell) folded on the site.

    The cell's options (``:tags: [hide-output]`` or a YAML block) become :data:`SETUP_HEADER`:
    its input hidden behind a one-line summary (MyST-NB's ``code_prompt_show``) and its output
    left off the site (pip's in Colab; what its imports write to stderr, such as tqdm's notice
    that a kernel has no ipywidgets), so that the site shows one toggle: ``hide-output`` would
    add a second toggle with the same summary. The code is left as it is; a folded cell stays
    folded.
    """
    lines = text.split("\n")
    start = next((i for i, line in enumerate(lines) if re.match(r"^```\{code-cell\}", line)), None)
    if start is None:
        return text
    end = _closing(lines, start, "```")
    _, code = _options(lines[start + 1:end])
    while code and not code[0].strip():
        code = code[1:]
    return "\n".join(lines[:start + 1] + SETUP_HEADER.split("\n") + code + lines[end:])


def student(out: Path) -> Path:
    """Build the student edition (site and notebooks without solutions) into ``out``."""
    out = out.resolve()
    if out.exists():
        shutil.rmtree(out)
    with tempfile.TemporaryDirectory() as tmp:
        book = Path(tmp) / "book"
        shutil.copytree(BOOK, book, ignore=shutil.ignore_patterns("_build", "*.ipynb"))
        for md in chapters(book):
            md.write_text(strip_solutions(md.read_text(encoding="utf-8")), encoding="utf-8")
        config = book / "_config.yml"
        text = config.read_text(encoding="utf-8")
        text = text.replace('title: "', 'title: "Student edition: ', 1)
        text = text.replace("  config:\n", "  config:\n    hide_solutions: true\n", 1)
        config.write_text(text, encoding="utf-8")
        jb = Path(sys.executable).parent / "jupyter-book"  # the one beside this Python, else on PATH
        subprocess.run([str(jb) if jb.exists() else "jupyter-book", "build", str(book), "-W", "-n",
                        "--keep-going"], check=True)
        shutil.copytree(book / "_build" / "html", out / "html")
        (out / "notebooks").mkdir(parents=True)
        for md in chapters(book):
            jupytext.write(_notebook(md.read_text(encoding="utf-8"), book, _chapter_number(md)),
                           out / "notebooks" / md.with_suffix(".ipynb").name, fmt="ipynb")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sync", help="write every chapter's Colab install from _config.yml, then "
                   "book/NN_name.ipynb from every chapter")
    sub.add_parser("check", help="fail when a notebook is out of sync with its chapter, or a "
                   "chapter's Colab install with _config.yml")
    sub.add_parser("fold-setup", help="fold every chapter's set-up cell on the site (rewrites the chapters)")
    st = sub.add_parser("student", help="build the student edition without solutions")
    st.add_argument("--out", type=Path, default=ROOT / "_build" / "student")
    args = parser.parse_args(argv)
    if args.command == "sync":  # the chapters' Colab installs, then their notebooks
        for p in sync():
            print(f"wrote {p.relative_to(ROOT)}")
    elif args.command == "fold-setup":
        for md in chapters():
            text = md.read_text(encoding="utf-8")
            if fold_setup(text) != text:
                md.write_text(fold_setup(text), encoding="utf-8")
                print(f"folded the set-up cell of {md.relative_to(ROOT)}")
    elif args.command == "check":
        stale = check()
        if stale:
            print("out of sync with their chapters (run `python scripts/notebooks.py sync`):", *stale,
                  sep="\n  ")
            return 1
        print(f"{len(chapters())} notebooks in sync with their chapters")
    else:
        out = student(args.out)
        print(f"student edition: open {out / 'html' / 'index.html'}; notebooks in {out / 'notebooks'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
