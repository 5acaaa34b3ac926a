"""Chapters as Jupyter notebooks: generate, check, and build the student edition.

The MyST Markdown chapters in ``book/`` are the only source. This script derives from them

- ``sync``: one ``.ipynb`` per chapter beside its source (``book/NN_name.ipynb``, without
  outputs). These are what the Colab button opens. Sphinx ignores them (``_config.yml``).
- ``check``: exits 1 when a committed notebook's cells differ from its source (CI runs it).
- ``student [--out DIR]``: the student edition, in its own folder (default
  ``_build/student``): the site built with every solution removed (sphinx-exercise's
  ``hide_solutions``, and the gated solution cells stripped before execution) and the
  notebooks without solution cells. Exercises keep their labels and numbers.

Usage::

    python scripts/notebooks.py sync
    python scripts/notebooks.py check
    python scripts/notebooks.py student
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jupytext

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


def _notebook(text: str):
    nb = jupytext.reads(text, fmt="md:myst")
    nb.metadata.pop("jupytext", None)  # version-dependent; the kernelspec stays
    for i, cell in enumerate(nb.cells):  # stable ids, so that a sync without edits changes nothing
        cell.id = f"cell-{i:03d}"
    return nb


def _cells(nb) -> list[tuple[str, str, tuple]]:
    return [(c.cell_type, c.source, tuple(c.metadata.get("tags", []))) for c in nb.cells]


def sync(book: Path = BOOK) -> list[Path]:
    """Write ``NN_name.ipynb`` beside every chapter; return the paths written."""
    out = []
    for md in chapters(book):
        path = md.with_suffix(".ipynb")
        jupytext.write(_notebook(md.read_text(encoding="utf-8")), path, fmt="ipynb")
        out.append(path)
    return out


def check(book: Path = BOOK) -> list[str]:
    """Chapters whose notebook is missing or whose cells differ from the source."""
    stale = []
    for md in chapters(book):
        path = md.with_suffix(".ipynb")
        want = _cells(_notebook(md.read_text(encoding="utf-8")))
        if not path.exists() or _cells(jupytext.read(path)) != want:
            stale.append(md.name)
    return stale


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
        subprocess.run([str(jb) if jb.exists() else "jupyter-book", "build", str(book), "-W", "-n", "--keep-going"],
                       check=True)
        shutil.copytree(book / "_build" / "html", out / "html")
        (out / "notebooks").mkdir(parents=True)
        for md in chapters(book):
            jupytext.write(_notebook(md.read_text(encoding="utf-8")), out / "notebooks" / md.with_suffix(".ipynb").name,
                           fmt="ipynb")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("sync", help="write book/NN_name.ipynb from every chapter")
    sub.add_parser("check", help="fail when a notebook is out of sync with its chapter")
    st = sub.add_parser("student", help="build the student edition without solutions")
    st.add_argument("--out", type=Path, default=ROOT / "_build" / "student")
    args = parser.parse_args(argv)
    if args.command == "sync":
        for p in sync():
            print(f"wrote {p.relative_to(ROOT)}")
    elif args.command == "check":
        stale = check()
        if stale:
            print("out of sync with their chapters (run `python scripts/notebooks.py sync`):", *stale, sep="\n  ")
            return 1
        print(f"{len(chapters())} notebooks in sync with their chapters")
    else:
        out = student(args.out)
        print(f"student edition: open {out / 'html' / 'index.html'}; notebooks in {out / 'notebooks'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
