"""What a recording writes about itself: the commit whose code it ran and the machine it ran on.

The recording scripts (``ch07_grid.py``, ``ch07_reversal.py``, ``ch09_budget.py``) import it;
a script run as ``python scripts/x.py`` finds it beside itself.
"""

from __future__ import annotations

import os
import platform
import subprocess


def commit() -> str:
    """HEAD's hash, with ``+dirty-src`` when ``src/`` has uncommitted changes; ``unknown``
    outside a git checkout."""

    def git(*a):
        return subprocess.run(["git", *a], capture_output=True, text=True, check=True).stdout.strip()

    try:
        sha, dirty = git("rev-parse", "HEAD"), git("status", "--porcelain", "src")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty-src" if dirty else "")


def machine() -> str:
    """One line: host, processor, CPUs, Python, and the OMP_NUM_THREADS the run saw."""
    return (f"{platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
