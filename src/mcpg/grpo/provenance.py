"""Provenance: which code ran, where, when; written in one place and read in one form.

- :func:`commit_state`: the commit of the checkout that holds the code, and whether it is
  **dirty**, which here means one thing only: some tracked file differs from that commit
  (staged or not; untracked files do not count).
- :func:`machine_info`: the machine as fields (CPUs, platform, Python, torch and transformers
  versions, the load average).
- :func:`call_record`: one call of a program: its command, start, commit, dirty, machine.
- :func:`start_run`: what :func:`mcpg.grpo.train.train` writes into a run directory's
  ``PROVENANCE.json`` when it starts; a resumed run appends its call to ``calls``.
- :func:`recorded_provenance`: what a recorder (``scripts/ch08_record.py``) writes beside the
  files it copies: the run's own record (commit, dirty, machine, started of its last call)
  plus the recorder's timings; for code that wrote no record of its own (runs of commits
  before this module), the recorder's own :func:`commit_state` of that code stands in.
- :func:`write_provenance`: the one writer of these files.
- :func:`read_provenance`: every variant in ``data/results`` (the recorders' files, with or
  without ``updates_s`` and ``resume_note``; the hand-written chapter 8 files; the GSM8K
  measurement's ``provenance.json``; chapter 7's and 9's ``sha+dirty-src`` commits) in one form.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["FILE", "commit_state", "machine_info", "call_record", "start_run", "recorded_provenance",
           "write_provenance", "read_provenance", "now"]

FILE = "PROVENANCE.json"
CODE = Path(__file__).resolve().parents[3]
"""The checkout this module was imported from (``src/mcpg/grpo/provenance.py`` -> its root)."""


def now() -> str:
    """UTC, to the second, ISO 8601 (the recorders' format)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _git(code: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=code, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def commit_state(code: str | os.PathLike | None = None) -> dict:
    """``{"commit": HEAD's hash, "dirty": bool}`` of the git checkout ``code`` (default: the one
    this module was imported from). Dirty: some tracked file differs from HEAD (``git status
    --porcelain --untracked-files=no`` is not empty). Outside a checkout both are None."""
    code = Path(code) if code is not None else CODE
    sha = _git(code, "rev-parse", "HEAD")
    if not sha:
        return {"commit": None, "dirty": None}
    return {"commit": sha, "dirty": bool(_git(code, "status", "--porcelain", "--untracked-files=no"))}


def machine_info() -> dict:
    """The machine as fields: CPUs and their model, platform, Python, torch and transformers
    (when installed) and the load average when the call began, which tells whether its timings
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


def _command() -> str:
    """This process's command line, ``python -m mcpg.grpo ...`` for the command line's module."""
    argv = list(sys.argv)
    if argv and argv[0].endswith(os.path.join("mcpg", "grpo", "__main__.py")):
        argv = ["-m", "mcpg.grpo", *argv[1:]]
    threads = os.environ.get("OMP_NUM_THREADS")
    return shlex.join(([f"OMP_NUM_THREADS={threads}"] if threads else []) + ["python", *argv])


def call_record(code: str | os.PathLike | None = None, command: str | None = None) -> dict:
    """One call: its command, when it started, the code's :func:`commit_state` and the machine."""
    return {"command": command or _command(), "started": now(), **commit_state(code),
            "machine": machine_info()}


def start_run(run: str | os.PathLike, resume: bool = False, what: str | None = None) -> dict:
    """Write (or, resumed, extend) a run directory's ``PROVENANCE.json`` at the start of a call.

    The top-level ``commit``, ``dirty``, ``command`` and ``machine`` are the last call's (the
    code the run's remaining updates import); ``started`` is the first call's; ``calls`` lists
    every call. A resumed run whose directory holds no record (written by older code) starts
    its list with this call and says so in ``resume_note``."""
    path = Path(run) / FILE
    call = call_record()
    old = json.loads(path.read_text()) if resume and path.exists() else None
    calls = [*(old or {}).get("calls", []), call]
    prov = {
        "what": what or (old or {}).get("what") or "mcpg.grpo train run",
        "command": call["command"],
        "commit": call["commit"],
        "dirty": call["dirty"],
        "commit_note": "HEAD of the checkout the code was imported from, when the run's last call "
                       "started; dirty: a tracked file differed from it",
        "started": calls[0]["started"],
        "machine": call["machine"],
        "calls": calls,
    }
    if resume and old is None:
        prov["resume_note"] = "resumed a run whose earlier calls wrote no provenance"
    write_provenance(path, prov)
    return prov


def recorded_provenance(run: str | os.PathLike, fields: dict, fallback: dict) -> dict:
    """What a recorder writes for a finished run: ``fields`` (its own keys: what, command,
    config, timings, ...) with ``commit``, ``dirty``, ``started`` and ``machine`` taken from the
    run directory's own ``PROVENANCE.json`` (its last call), or from ``fallback`` (the
    recorder's :func:`commit_state`, start and :func:`machine_info` of the call it started)
    when the code wrote none. Keys keep ``fields``' order; the run's ``calls`` are appended."""
    own_path = Path(run) / FILE
    own = json.loads(own_path.read_text()) if own_path.exists() else None
    source = own["calls"][-1] if own and own.get("calls") else fallback
    out = {k: (source.get(k, v) if k in ("commit", "dirty", "started", "machine") else v)
           for k, v in fields.items()}
    if own and own.get("calls"):
        out["calls"] = own["calls"]
    return out


def write_provenance(path: str | os.PathLike, prov: dict) -> None:
    """The one writer: ``prov`` as indented JSON at ``path`` (a file, or a folder to hold
    ``PROVENANCE.json``)."""
    path = Path(path)
    if path.is_dir():
        path = path / FILE
    path.write_text(json.dumps(prov, indent=1) + "\n")


def _machine(m) -> dict:
    if m is None:
        return {}
    if isinstance(m, str):  # chapter 7's and 9's one line
        return {"description": m}
    m = dict(m)
    if "cpus" in m and "nproc" not in m:  # the GSM8K measurement's name
        m["nproc"] = m.pop("cpus")
    if isinstance(m.get("nproc"), str):
        m["nproc"] = int(m["nproc"])
    return m


def read_provenance(source: str | os.PathLike | dict) -> dict:
    """Any provenance record of this repository in one form.

    Returns ``commit`` (the full or short hash; None when unknown), ``dirty`` (True, False or
    None when the record does not say), ``started`` (ISO time or date), ``finished`` (None when
    not recorded), ``commands`` (list), ``machine`` (dict; a one-line description lands in
    ``machine["description"]``), ``seed``, ``wall_s`` (seconds, or a dict per run for the one
    hand-written record of two runs), ``user_s``, ``updates_s`` (None where not recorded),
    ``notes`` (every free-text note, by key) and ``calls`` (train's per-call records, else []).

    ``source``: a file, a folder holding ``PROVENANCE.json`` (or ``provenance.json``), or a dict
    (e.g. the ``commit``/``machine`` keys of a results file such as ``ch07/grid.json``).
    """
    if isinstance(source, dict):
        raw = source
    else:
        path = Path(source)
        if path.is_dir():
            path = path / FILE if (path / FILE).exists() else path / "provenance.json"
        raw = json.loads(path.read_text())
    commit, dirty = raw.get("commit"), raw.get("dirty")
    if isinstance(commit, str) and commit.endswith("+dirty-src"):  # scripts/_provenance.commit()
        commit, dirty = commit[: -len("+dirty-src")], True
    if commit == "unknown":
        commit = None
    if "commands" in raw:
        commands = list(raw["commands"])
    elif "command" in raw:
        commands = [raw["command"]]
    else:
        commands = []
    time = raw.get("time") or {}
    return {
        "commit": commit,
        "dirty": dirty,
        "started": raw.get("started") or raw.get("date"),
        "finished": raw.get("finished"),
        "commands": commands,
        "machine": _machine(raw.get("machine")),
        "seed": raw.get("seed"),
        "wall_s": raw.get("wall_s"),
        "user_s": raw.get("user_s", time.get("user_s")),
        "updates_s": raw.get("updates_s"),
        "notes": {k: v for k, v in raw.items() if k.endswith("note") and isinstance(v, str)},
        "calls": list(raw.get("calls", [])),
    }
