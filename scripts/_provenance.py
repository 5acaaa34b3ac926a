"""What a recording writes about itself: the commit whose code it ran and the machine it ran on.

Every recording script imports it: ``ch07_grid.py``, ``ch07_reversal.py`` and ``ch09_budget.py``
write ``machine()``'s line, the GSM8K scripts (``ch08_record.py``, ``ch08_grid_probe.py``,
``ch08_cut_answers.py``, ``gsm8k_measure.py``) ``machine_info()``'s fields. A script run as
``python scripts/x.py`` finds it beside itself.
"""

from __future__ import annotations

import importlib
import os
import platform
import subprocess
from pathlib import Path


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


def machine_info() -> dict:
    """The machine as fields: CPUs and their model, platform, Python, torch and transformers
    (when installed) and the load average when the run began, which tells whether its timings
    shared the cores."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    info = {"nproc": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
            "python": platform.python_version()}
    for name in ("torch", "transformers"):
        try:
            info[name] = importlib.import_module(name).__version__
        except ImportError:
            pass
    info["load_average"] = os.getloadavg()
    return info
