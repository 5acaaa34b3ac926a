"""Where the book's recorded results are: the repository's ``data/results``, found or fetched.

Chapters 7, 8 and 9 report runs that were recorded once (hours of training) and committed under
``data/results``. A chapter asks :func:`results_dir` for that folder, which looks, in order:

1. at the folder named by the environment variable ``MCPG_RESULTS``, when it is set;
2. for ``data/results`` in the working directory or a folder above it (the book builds from
   ``book/``, inside a clone);
3. for ``data/results`` in the source tree the library was installed from (``pip install -e .``
   or ``pip install .`` in a clone, or ``src/`` on the path);
4. when the library was installed from a git repository (``pip install "mcpg @ git+URL@ref"``,
   as the chapters' set-up cells do in Colab), at that very commit's ``data/results``, fetched
   once with git into ``mcpg-data/<commit>/`` under the working directory: a shallow, sparse
   fetch of that folder alone, so that the data are the ones the library was committed with.

When none of these holds, :class:`ResultsNotFound` says in one sentence where the results were
looked for and how to get them (and a notebook shows that sentence, not a traceback).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["ResultsNotFound", "results_dir", "installed_from", "fetch_results"]

RESULTS = Path("data") / "results"  # the folder, relative to the repository's root
FETCHED = "mcpg-data"  # where fetched results go, under the working directory
_DONE = ".mcpg-fetched"  # written into a fetched checkout once it is complete


class ResultsNotFound(FileNotFoundError):
    """The recorded results are nowhere :func:`results_dir` looks; the message says how to get them."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        return [f"{type(self).__name__}: {self}"]


def installed_from() -> dict | None:
    """Where pip installed the library from: its ``direct_url.json`` (PEP 610), or None.

    A git install gives ``{"url": ..., "vcs_info": {"vcs": "git", "commit_id": ...,
    "requested_revision": ...}}``; an install from a folder ``{"url": "file://...",
    "dir_info": {...}}``. None when the library imported is not the one pip installed (an
    editable install, ``src/`` on the path): such a copy lives in its source tree."""
    try:
        dist = importlib.metadata.distribution("mcpg")
    except importlib.metadata.PackageNotFoundError:
        return None
    here = Path(__file__).resolve()
    if Path(dist.locate_file(f"mcpg/{here.name}")).resolve() != here:
        return None  # that metadata is another copy's (an editable install, src/ on the path)
    text = dist.read_text("direct_url.json")
    return json.loads(text) if text else None


def _git(*args: str, cwd: Path) -> None:
    out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        raise RuntimeError(f"git {args[0]}: {last}")


def fetch_results(url: str, commit: str, dest: Path) -> Path:
    """``data/results`` of the repository at ``url`` at ``commit``, fetched into ``dest``.

    A shallow (one commit), sparse (that folder alone) checkout, without the other files'
    contents where the server filters them (``--filter=blob:none``). Done once: a complete
    checkout is marked and reused. Returns ``dest / "data" / "results"``."""
    dest = Path(dest)
    done = dest / _DONE
    if done.is_file() and done.read_text().strip() == commit:
        return dest / RESULTS
    if dest.exists():  # an interrupted fetch: start again
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    _git("init", "--quiet", cwd=dest)
    _git("remote", "add", "origin", url, cwd=dest)
    _git("sparse-checkout", "set", RESULTS.as_posix(), cwd=dest)
    _git("fetch", "--quiet", "--depth", "1", "--filter=blob:none", "origin", commit, cwd=dest)
    _git("checkout", "--quiet", "FETCH_HEAD", cwd=dest)
    if not (dest / RESULTS).is_dir():
        raise RuntimeError(f"commit {commit[:12]} has no {RESULTS.as_posix()} folder")
    done.write_text(commit + "\n")
    return dest / RESULTS


def results_dir(fetch: bool = True) -> Path:
    """The folder of recorded results (the repository's ``data/results``): found, else fetched.

    See the module's docstring for where it looks. With ``fetch=False`` nothing is fetched.
    Raises :class:`ResultsNotFound` (one sentence: where it looked, how to get them)."""
    named = os.environ.get("MCPG_RESULTS")
    if named:
        if Path(named).is_dir():
            return Path(named)
        raise ResultsNotFound(f"MCPG_RESULTS names {named}, which is not a folder; point it at a copy "
                              f"of the repository's {RESULTS.as_posix()} folder, or unset it.")
    here = Path.cwd()
    for folder in (here, *here.parents):
        if (folder / RESULTS).is_dir():
            return folder / RESULTS
    source = installed_from() or {}
    trees = [Path(__file__).resolve().parents[2]]
    if source.get("url", "").startswith("file://") and "dir_info" in source:
        trees.insert(0, Path(source["url"][len("file://"):]))
    for tree in trees:
        if (tree / RESULTS).is_dir():
            return tree / RESULTS
    vcs = source.get("vcs_info", {})
    failed = ""
    if fetch and vcs.get("vcs") == "git" and vcs.get("commit_id"):
        url, commit = source["url"], vcs["commit_id"]
        try:
            return fetch_results(url, commit, here / FETCHED / commit[:12])
        except (OSError, RuntimeError) as e:
            failed = f", and fetching them from {url} at commit {commit[:12]} failed ({e})"
    raise ResultsNotFound(
        f"The recorded results this chapter reads (the repository's {RESULTS.as_posix()} folder) "
        f"are not in {here} or a folder above it, nor beside the installed library{failed}: run "
        f"the chapter from a clone of the book's repository, or install the library from it with "
        f'`pip install "mcpg @ git+<repository>"`, or set MCPG_RESULTS to a copy of that folder.'
    )
