"""Chapters 7, 8 and 9 run as Colab runs them: the notebook alone, in a fresh folder.

Colab opens a chapter's notebook by itself, in ``/content``, with ``google.colab`` imported;
the set-up cell pip-installs the library from the book's repository and nothing else of the
repository is there. Here, for each chapter that reads recorded results:

- a local git repository holds the working tree (its tracked and untracked files, not the
  ignored ones) on the book's branch: the repository's address, given to the set-up cell by
  the environment variable ``MCPG_REPOSITORY`` as a fork would give it;
- a fresh Python environment without the library sees the test environment's other packages
  (so that pip installs ``mcpg`` alone, offline) and has ``google.colab`` in ``sys.modules``
  from its start, as Colab's kernel has;
- the chapter's ``.ipynb`` is copied alone into a temporary folder outside the repository, and
  a kernel of that environment, started there, runs its set-up cell and its cells up to the
  first one that uses a recorded result (the chapter's run would take minutes more).

The set-up cell's ``%pip install`` must put ``mcpg`` from that repository into the fresh
environment, and the recorded results must reach the chapter (:func:`mcpg.results.results_dir`
fetches them from the repository at the installed commit).

CI installs ipykernel and nbclient with the book (``.ci/run`` runs this file after the build
with ``MCPG_COLAB_TEST=required``, which turns a missing one into a failure); elsewhere the
test is skipped without them.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import nbformat
import pytest

from repo_scripts import load_script  # tests/repo_scripts.py

ROOT = Path(__file__).resolve().parents[1]
notebooks = load_script("scripts/notebooks.py")

CHAPTERS = ["07_routed_grpo_simulation", "08_grpo_gsm8k", "09_exact_budget"]
KERNEL = "mcpg-colab-test"
# Colab's kernel has imported google.colab before the first cell runs
STUB = 'import sys, types; sys.modules.setdefault("google.colab", types.ModuleType("google.colab"))'


def _require(module: str):
    if os.environ.get("MCPG_COLAB_TEST") == "required":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} (installed with the book) runs the notebooks")


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@localhost", "-c",
                           "commit.gpgsign=false", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout


def working_tree_files() -> list[Path]:
    """The repository's files as a clone would hold them: tracked and untracked, not ignored."""
    try:
        out = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=ROOT)
    except (OSError, subprocess.CalledProcessError):  # not a git checkout: all but the usual junk
        skip = {".git", ".venv", "_build", "__pycache__", ".hypothesis", ".pytest_cache", ".ruff_cache"}
        return [p.relative_to(ROOT) for p in ROOT.rglob("*")
                if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]
    return [Path(f) for f in out.split("\0") if f and (ROOT / f).is_file()]


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> str:
    """A local git repository holding the working tree, on the book's branch; its address."""
    repo = tmp_path_factory.mktemp("repository")
    for f in working_tree_files():
        (repo / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, repo / f)
    _, branch = notebooks.repository()
    _git("init", "--quiet", "--initial-branch", branch or "main", cwd=repo)
    _git("config", "uploadpack.allowFilter", "true", cwd=repo)  # as a hosting service does
    _git("add", "--all", cwd=repo)
    _git("commit", "--quiet", "-m", "the working tree", cwd=repo)
    return "file://localhost" + repo.as_posix()  # pip refuses git+file:///, not this


@pytest.fixture(scope="module")
def colab_python(tmp_path_factory) -> Path:
    """A fresh environment without mcpg, google.colab imported at start; a kernel spec for it.

    It sees the test environment's packages through a folder of links to them that leaves out
    mcpg (its files, metadata and editable-install hooks), so pip installs mcpg and only mcpg,
    without an index; and that leaves out MyST-NB, which Colab does not have."""
    base = tmp_path_factory.mktemp("colab-python")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    own = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              check=True, capture_output=True, text=True).stdout.strip())
    others = base / "packages"
    others.mkdir()
    for folder in site.getsitepackages():
        for entry in Path(folder).iterdir():
            mcpg = re.match(r"(__editable__[._]+)?mcpg([-_.]|$)", entry.name)  # its files, hooks
            # nor MyST-NB, which the book's build has and Colab has not: the chapters' glued
            # numbers must not need it (mcpg.glue)
            myst_nb = re.match(r"myst_nb([-_.]|$)", entry.name)
            if not mcpg and not myst_nb and not (others / entry.name).exists():
                (others / entry.name).symlink_to(entry)
    (own / "colab.pth").write_text(f"{others}\n{STUB}\n")
    kernel = base / "jupyter" / "kernels" / KERNEL
    kernel.mkdir(parents=True)
    (kernel / "kernel.json").write_text(json.dumps({
        "argv": [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Colab, simulated", "language": "python"}))
    return base


def results_names(setup: str) -> set[str]:
    """The names the set-up cell binds to recorded results: RESULTS and the paths built on it
    (or, in older set-up cells, on the repository's data/results folder)."""
    names = {"RESULTS"}
    for name, value in re.findall(r"^([A-Z][A-Z0-9_]*) = (.+)$", setup, re.M):
        if "results" in value.lower() or any(re.search(rf"\b{n}\b", value) for n in names):
            names.add(name)
    return names


def cells_to_run(nb) -> list:
    """The set-up cell and the cells after it up to the first code cell using a recorded result."""
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    names = results_names(nb.cells[code[0]].source)
    pattern = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b")
    last = next(i for i in code[1:] if pattern.search(nb.cells[i].source))
    return [c for c in nb.cells[:last + 1] if c.cell_type == "code"]


REPORT = """
import importlib.metadata, json, mcpg
print(json.dumps({"mcpg": mcpg.__file__,
                  "installed_from": json.loads(importlib.metadata.distribution("mcpg")
                                               .read_text("direct_url.json")),
                  "results": str(globals().get("RESULTS"))}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_runs_as_in_colab(chapter, repository, colab_python, tmp_path, monkeypatch):
    nbclient = _require("nbclient")
    _require("ipykernel")
    folder = tmp_path / "content"  # Colab's /content: the notebook alone
    folder.mkdir()
    shutil.copy2(ROOT / "book" / f"{chapter}.ipynb", folder)
    nb = jupytext.read(folder / f"{chapter}.ipynb")
    nb.cells = cells_to_run(nb) + [nbformat.v4.new_code_cell(REPORT)]
    monkeypatch.setenv("JUPYTER_PATH", str(colab_python / "jupyter"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "MCPG_RESULTS") and not k.startswith("PIP_")}
    env.update(MCPG_REPOSITORY=repository,
               # offline: everything but mcpg is there already, and the installed setuptools
               # builds it (pip reads PIP_NO_BUILD_ISOLATION inverted: "false" is --no-build-isolation)
               PIP_NO_INDEX="1", PIP_NO_DEPS="1", PIP_NO_BUILD_ISOLATION="false", PIP_NO_CACHE_DIR="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=600,
                                     resources={"metadata": {"path": str(folder)}})
    start = time.perf_counter()
    try:
        client.execute(env=env, cwd=str(folder))
    except nbclient.exceptions.CellExecutionError as e:
        message = re.sub(r"\x1b\[[0-9;]*m", "", str(e))  # the kernel's traceback, without colours
        pytest.fail(f"{chapter} fails as Colab runs it:\n{message}", pytrace=False)
    seconds = time.perf_counter() - start
    report = json.loads(nb.cells[-1].outputs[-1]["text"].strip().splitlines()[-1])
    venv = colab_python / "venv"
    assert Path(report["mcpg"]).is_relative_to(venv), f"mcpg imported from {report['mcpg']}, not installed"
    assert report["installed_from"]["url"].rstrip("/") == repository.rstrip("/")
    assert report["installed_from"]["vcs_info"]["vcs"] == "git"
    results = Path(report["results"])
    assert results.is_relative_to(folder / "mcpg-data") and results.is_dir(), results
    print(f"{chapter}: {len(nb.cells) - 1} cells in {seconds:.0f} s; results at {results}")


GLUED = """# T

The gap is {glue:text}`gap:+.2f` over {glue:text}`n` seeds.

```{code-cell} ipython3
from mcpg.glue import glue

glue("n", 3)
```

Its reading: {glue:text}`reading`.

```{code-cell} ipython3
glue("gap", -0.2317)
glue("reading", "contains 0")
```
"""


@pytest.mark.slow
def test_form_cells_show_the_numbers_even_those_glued_further_down(tmp_path):
    """The notebook's form cells, run by a kernel: each shows its paragraph with the numbers
    glued so far and is updated as later cells glue the rest (a display update, which Colab
    and Jupyter apply to the earlier output)."""
    nbclient = _require("nbclient")
    _require("ipykernel")
    nb = notebooks._notebook(GLUED)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=120,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    forms = [c for c in nb.cells if "glue" in c.metadata.get("tags", [])]
    shown = [o["data"]["text/markdown"] for c in forms for o in c.outputs
             if "text/markdown" in o.get("data", {})]
    assert shown == ["The gap is -0.23 over 3 seeds.", "Its reading: contains 0."]
