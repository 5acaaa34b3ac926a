"""The repository's scripts and benchmarks as modules, for the tests that call their functions."""

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_script(path: str):
    """``path``, relative to the repository root (``"scripts/ch08_record.py"``), loaded as a module
    named after its file, with its own folder on ``sys.path`` while it loads, as when it is run
    (a script finds the modules beside it)."""
    file = ROOT / path
    spec = importlib.util.spec_from_file_location(file.stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(file.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(file.parent))
    return module
