"""The built site in a real browser: every page loads in headless Chromium without console
errors, its math is typeset by MathJax, its figures load, no internal link is broken, and
no code cell or output is wider than the page's column at a 1280-pixel window, which shows
one search field. Without a browser, every link to an exercise says the number the exercise
displays (``tests/test_exercise_refs.py``).

Runs when ``MCPG_SITE`` names a built site (``book/_build/html``); CI sets it after the
build. Needs Debian's ``chromium`` (``/usr/bin/chromium``, or ``MCPG_CHROMIUM``) and the
``playwright`` package (only its driver is used; it downloads no browser). With
``MCPG_SCREENSHOTS`` set to a folder, a full-page screenshot of every page is saved there.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import threading
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest

SITE = os.environ.get("MCPG_SITE")
CHROMIUM = os.environ.get("MCPG_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.skipif(not SITE, reason="set MCPG_SITE to a built site (book/_build/html) to run")


def _pages(root: Path) -> list[Path]:
    skip = ("_static", "_sources", "_images", "jupyter_execute")
    return sorted(p for p in root.rglob("*.html") if not p.relative_to(root).parts[0].startswith(skip))


@pytest.fixture(scope="module")
def site():
    root = Path(SITE).resolve()
    assert (root / "index.html").exists(), f"no built site at {root}"
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output readable
        pass


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with playwright.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


def _ids(html: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', html))


def test_exercise_references_read_as_displayed():
    """Plain HTML, no browser: the number in every link to an exercise is the number the
    exercise shows (sphinx-exercise numbers them across the book, not by chapter)."""
    from test_exercise_refs import read_site, site_problems

    pages = read_site(Path(SITE).resolve())
    problems, checked = site_problems(pages)
    assert checked >= 10, f"only {checked} links to exercises found: has the markup changed?"
    assert not problems, "\n".join(problems)


def test_every_page_in_chromium(site, browser):
    root, base = site
    pages = _pages(root)
    assert len(pages) >= 2
    shots = os.environ.get("MCPG_SCREENSHOTS")
    problems: list[str] = []
    ids_cache: dict[Path, set[str]] = {}
    for path in pages:
        rel = path.relative_to(root).as_posix()
        source = path.read_text(encoding="utf-8")
        redirect = re.search(r'http-equiv="refresh" content="0; url=([^"]+)"', source, re.I)
        if redirect:  # index.html only forwards to the first page
            if not (path.parent / redirect.group(1)).exists():
                problems.append(f"{rel}: redirects to a missing page {redirect.group(1)}")
            continue
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("console", lambda m, errors=errors: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
        page.on("requestfailed", lambda r, errors=errors: errors.append(f"failed request {r.url}"))
        page.on("response", lambda r, errors=errors: (
            errors.append(f"HTTP {r.status} for {r.url}") if r.status >= 400 else None))
        page.goto(base + rel, wait_until="load")
        # math: wait for MathJax, then every math element must hold a typeset container
        n_math = page.evaluate("document.querySelectorAll('.math').length")
        if n_math:
            page.wait_for_function("window.MathJax && MathJax.startup && MathJax.startup.promise",
                                   timeout=20_000)
            page.evaluate("MathJax.startup.promise")
            raw = page.evaluate("[...document.querySelectorAll('.math')]"
                                ".filter(e => !e.querySelector('mjx-container')).length")
            if raw:
                problems.append(f"{rel}: {raw} of {n_math} math elements not typeset")
        # figures and other images
        broken = page.evaluate("[...document.images]"
                               ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
        problems += [f"{rel}: image did not load: {src}" for src in broken]
        # every chapter draws: its executed cells must have put figures on the page (a kernel
        # on a non-inline matplotlib backend, e.g. MPLBACKEND=Agg, silently draws none)
        if re.match(r"\d\d_", path.name):
            n_fig = page.evaluate("document.querySelectorAll('.cell_output img').length")
            if not n_fig:
                problems.append(f"{rel}: no figure in the executed cells' output")
        # code cells fit the column: a reader at a 1280-pixel window scrolls none sideways
        wide = page.evaluate("[...document.querySelectorAll('div.cell_input pre')]"
                             ".filter(e => e.scrollWidth > e.clientWidth + 1)"
                             ".map(e => e.innerText.split('\\n')"
                             ".reduce((a, x) => x.length > a.length ? x : a, ''))")
        problems += [f"{rel}: code cell wider than the column: {line!r}" for line in wide]
        # and so do the visible outputs: printed text wraps, tables fit (book/_static/output.css)
        wide_out = page.evaluate("[...document.querySelectorAll("
                                 "'div.cell_output > div, div.cell_output pre, div.cell_output table')]"
                                 ".filter(e => e.scrollWidth > e.clientWidth + 1 && e.innerText.trim())"
                                 ".map(e => e.innerText.trim().slice(0, 60))")
        problems += [f"{rel}: output wider than the column: {text!r}" for text in wide_out]
        # one search field: the theme's top bar repeats the sidebar's (book/_static/header.css)
        n_search = page.evaluate("[...document.querySelectorAll('.search-button-field')]"
                                 ".filter(e => e.offsetParent !== null).length")
        if n_search != 1:
            problems.append(f"{rel}: {n_search} search fields visible at 1280 pixels, not 1")
        # a phone: at 390 pixels a chapter does not scroll sideways; whatever is wider (display
        # maths, a table, a long name) scrolls or breaks inside its own box (book/_static/small.css).
        # The reference pages (the API page and the highlighted sources) are read on a desktop.
        if re.match(r"(\d\d_|intro|recording_log)", path.name) and "_modules" not in rel:
            page.set_viewport_size({"width": 390, "height": 844})
            page.wait_for_timeout(100)
            over = page.evaluate("document.documentElement.scrollWidth")
            if over > 391:
                culprits = page.evaluate(
                    "[...document.querySelectorAll('article *')]"
                    ".filter(e => e.getBoundingClientRect().right > 391 && e.children.length === 0)"
                    ".slice(0, 3).map(e => e.tagName + ': ' + (e.innerText || '').trim().slice(0, 50))")
                problems.append(f"{rel}: at 390 pixels the page is {over} wide: {culprits}")
            if shots:
                Path(shots).mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(Path(shots) / f"{path.stem}-390.png"), full_page=False)
            page.set_viewport_size({"width": 1280, "height": 900})
        # internal links: the target file exists and so does the anchor
        hrefs = page.evaluate("[...document.querySelectorAll('a[href]')].map(a => a.getAttribute('href'))")
        for href in hrefs:
            if re.match(r"^(https?:|mailto:|javascript:|data:)", href):
                continue
            url = urlparse(urljoin(base + rel, href))
            target = root / unquote(url.path.lstrip("/"))
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                problems.append(f"{rel}: broken link {href}")
            elif url.fragment and target.suffix == ".html":
                ids = ids_cache.setdefault(target, _ids(target.read_text(encoding="utf-8")))
                if unquote(url.fragment) not in ids:
                    problems.append(f"{rel}: link to a missing anchor {href}")
        problems += [f"{rel}: console: {e}" for e in errors]
        if shots:
            Path(shots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(shots) / (rel.replace("/", "__") + ".png")), full_page=True)
        page.close()
    assert not problems, "\n".join(problems)
