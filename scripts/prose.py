"""Count a page's prose: its words outside code and directive options, and its longest sentences.

A reader's budget is in words of prose, so this counts what a reader reads as text on a MyST
page (or the README): paragraphs, list items, headings and admonition bodies. It leaves out
the YAML header, fenced code (code cells included), directive options (``:class: ...``,
``:tags: [...]``), label targets (``(ch08-result)=``), HTML comments and table rows. A role
counts as the text it shows: ``{ref}`the table <ch08-result>``` as "the table", a glued value
(``{glue:text}`key```) as one word, inline math as one word.

A sentence ends at ``.``, ``!`` or ``?`` before a space and a capital, a digit or a bracket,
or at the end of a paragraph, a list item or a heading; abbreviations the book uses ("e.g.",
"Eq.", "Prop.", "i.e.", "cf.", "vs.") do not end one.

    python scripts/prose.py book/07_routed_grpo_simulation.md book/08_grpo_gsm8k.md
    python scripts/prose.py README.md --longest 5
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

ABBREVIATIONS = ("e.g.", "i.e.", "Eq.", "Eqs.", "Prop.", "Props.", "cf.", "vs.", "Fig.", "Sec.",
                 "Thm.", "Cor.", "al.", "etc.", "approx.", "resp.", "No.")
ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]+\$")
LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
WORD = re.compile(r"[\w'’+\-−.,%/×≤≥<>=]*[\w%][\w'’+\-−.,%/×≤≥<>=]*")  # with a letter, digit or %
END = re.compile(r"(?<=[.!?])[)\"'”*_]*\s+(?=[A-Z0-9(\[`*_\"“])")


def _role_text(m: re.Match) -> str:
    role, content = m.group(1), m.group(2)
    if role.startswith("glue"):
        return "x"
    content = re.sub(r"\s*<[^>]*>\s*$", "", content)  # {ref}`text <label>` shows "text"
    return content or "x"


def _clean(text: str) -> str:
    text = MATH.sub(" x ", text)
    text = ROLE.sub(_role_text, text)
    text = LINK.sub(r"\1", text)
    return text.replace("**", "")


def blocks(markdown: str) -> list[str]:
    """The page's prose blocks (paragraphs, list items, headings), each as one line of text."""
    lines = markdown.splitlines()
    if lines and lines[0].strip() == "---":  # YAML header (jupytext, MyST front matter)
        end = next((i for i, ln in enumerate(lines[1:], 1) if ln.strip() == "---"), 0)
        lines = lines[end + 1:]
    out: list[str] = []
    current: list[str] = []
    fence = None
    in_comment = False
    options = False

    def flush():
        if current:
            out.append(" ".join(current))
            current.clear()

    for raw in lines:
        line = raw.strip()
        if in_comment:
            in_comment = "-->" not in line
            continue
        if fence:
            if line.startswith(fence) and line.strip("`~") == "":
                fence = None
            continue
        m = re.match(r"^(`{3,}|~{3,})", line)
        if m:
            flush()
            fence = m.group(1)
            continue
        if line.startswith("<!--"):
            flush()
            in_comment = "-->" not in line
            continue
        if re.match(r"^:{3,}\s*\{", line):  # a directive opens: its options follow
            flush()
            title = re.sub(r"^:{3,}\s*\{[^}]*\}\s*", "", line)
            if title:
                out.append(title)
            options = True
            continue
        if re.match(r"^:{3,}\s*$", line):
            flush()
            options = False
            continue
        if options and re.match(r"^:[\w-]+:", line):
            continue
        options = False
        if not line or re.match(r"^\(.*\)=$", line) or line.startswith("|"):
            flush()
            continue
        if re.match(r"^(#+\s|[-*+]\s|\d+\.\s)", line):  # a heading or a new list item
            flush()
            line = re.sub(r"^(#+|[-*+]|\d+\.)\s+", "", line)
        current.append(line)
    flush()
    return [b for b in (_clean(b).strip() for b in out) if WORD.search(b)]


def words(text: str) -> int:
    return len(WORD.findall(text))


def sentences(block: str) -> list[str]:
    protected = block
    for a in ABBREVIATIONS:
        protected = protected.replace(a + " ", a.replace(".", "\0") + " ")
    return [s.replace("\0", ".") for s in END.split(protected) if s.strip()]


def measure(path: Path) -> dict:
    """``words``: prose words of the page; ``sentences``: (length, sentence), longest first."""
    bs = blocks(path.read_text(encoding="utf-8"))
    ss = sorted(((words(s), s) for b in bs for s in sentences(b)), key=lambda t: -t[0])
    return {"words": sum(words(b) for b in bs), "sentences": ss}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pages", nargs="+", type=Path)
    ap.add_argument("--longest", type=int, default=3, help="show the N longest sentences")
    a = ap.parse_args(argv)
    for page in a.pages:
        m = measure(page)
        over = sum(1 for n, _ in m["sentences"] if n > 60)
        print(f"{page}: {m['words']} words of prose; {over} sentences over 60 words")
        for n, s in m["sentences"][: a.longest]:
            print(f"  {n:4d}  {s[:160]}{'…' if len(s) > 160 else ''}")


if __name__ == "__main__":
    main()
