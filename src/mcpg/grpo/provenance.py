"""Provenance: which code ran, where, when; written in one place and read in one form.

- :func:`code_origin`: where the imported ``mcpg`` came from: the git checkout whose tracked
  files it is (an editable install, or ``src`` on ``PYTHONPATH``), or an installed copy, whose
  origin is the installer's PEP 610 record (``direct_url.json``: a git URL and commit, or a
  folder, whose commit is then unknown); with a SHA-256 of the imported package's files.
- :func:`commit_state`: the commit of that code (or of a given checkout), and whether it is
  **dirty**, which here means one thing only: some tracked file differs from that commit
  (staged or not; untracked files do not count).
- :func:`machine_info`: the machine as fields (CPUs, platform, Python, the versions of torch,
  transformers, peft, trl, accelerate and datasets (None when not installed), the load average).
- :func:`call_record`: one call of a program: its command, start, commit, dirty, machine.
- :func:`start_run`: what :func:`mcpg.grpo.train.train` writes into a run directory's
  ``PROVENANCE.json`` when it starts (with the problems it reads: source and SHA-256); a
  resumed run appends its call to ``calls``, and so does an evaluation (:func:`add_call`), which
  leaves the training record as it was.
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

import hashlib
import json
import os
import platform
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["FILE", "LIBRARIES", "code_origin", "commit_state", "machine_info", "call_record", "start_run",
           "add_call", "recorded_provenance", "write_provenance", "read_provenance", "now"]

FILE = "PROVENANCE.json"
PACKAGE = Path(__file__).resolve().parents[1]
"""The imported ``mcpg`` package's folder."""
CODE = PACKAGE.parents[1]
"""Where a source checkout would hold the package (``src/mcpg`` -> its root); :func:`code_origin`
says whether it does."""
LIBRARIES = ("torch", "transformers", "peft", "trl", "accelerate", "datasets")
"""The libraries whose versions :func:`machine_info` records."""


def now() -> str:
    """UTC, to the second, ISO 8601 (the recorders' format)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _git(code: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=code, capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def _package_sha256(folder: Path = PACKAGE) -> str:
    """SHA-256 over the package's ``.py`` files, each as its path (relative, POSIX) and its bytes,
    in sorted order: the code that ran, whatever its origin."""
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*.py")):
        h.update(f.relative_to(folder).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _distribution() -> tuple[object | None, dict | None]:
    """The installed ``mcpg`` distribution and its PEP 610 ``direct_url.json`` (None, None when
    not installed; a record of None when the installer wrote none)."""
    from importlib import metadata

    try:
        dist = metadata.distribution("mcpg")
    except metadata.PackageNotFoundError:
        return None, None
    text = dist.read_text("direct_url.json")
    try:
        return dist, (json.loads(text) if text else None)
    except json.JSONDecodeError:
        return dist, None


def code_origin() -> dict:
    """Where the imported ``mcpg`` came from, as ``source``, ``path``, ``commit``, ``dirty``,
    ``sha256`` (a SHA-256 of the package's files) and, installed, ``url`` and ``version``.

    - ``installed``: the imported files are an installed distribution's own (``pip install .``,
      ``pip install git+...``): its ``direct_url.json`` (PEP 610) says where it came from; a git
      URL gives its ``commit`` (``dirty`` False), a folder none (``commit`` and ``dirty`` None): the
      folder's HEAD now need not be what was installed, even when a virtual environment inside a
      checkout holds it. ``sha256`` identifies the code either way.
    - ``tree``: the files are tracked files of a git checkout (an editable install, or ``src`` on
      ``PYTHONPATH``): that checkout's :func:`commit_state`.
    - ``unknown``: neither (a copy outside any checkout, with no installer's record).
    """
    here = (PACKAGE / "__init__.py").resolve()
    digest = _package_sha256()
    dist, direct = _distribution()
    top = _git(PACKAGE, "rev-parse", "--show-toplevel")
    tracked = bool(top) and _git(Path(top), "ls-files", "--error-unmatch", str(here)) is not None
    if dist is not None:
        try:
            own = Path(dist.locate_file("mcpg/__init__.py")).resolve() == here
        except (OSError, TypeError, NotImplementedError):
            own = False
        # the build's own metadata beside the sources (src/mcpg.egg-info, found when src is on
        # sys.path) has no installer's record: the files are the checkout's, not an install's
        if own and not (direct is None and tracked):
            vcs = (direct or {}).get("vcs_info") or {}
            commit = vcs.get("commit_id")
            return {"source": "installed", "path": str(PACKAGE), "url": (direct or {}).get("url"),
                    "version": dist.version, "commit": commit, "dirty": False if commit else None,
                    "sha256": digest}
    if tracked:
        return {"source": "tree", "path": top, **commit_state(top), "sha256": digest}
    return {"source": "unknown", "path": str(PACKAGE), "commit": None, "dirty": None, "sha256": digest}


def commit_state(code: str | os.PathLike | None = None) -> dict:
    """``{"commit": HEAD's hash, "dirty": bool}`` of the git checkout ``code``; by default, of the
    code this module was imported from (:func:`code_origin`: an installed copy's own commit, not
    that of a checkout it happens to sit in). Dirty: some tracked file differs from HEAD (``git
    status --porcelain --untracked-files=no`` is not empty). Outside a checkout both are None."""
    if code is None:
        origin = code_origin()
        return {"commit": origin["commit"], "dirty": origin["dirty"]}
    code = Path(code)
    sha = _git(code, "rev-parse", "HEAD")
    if not sha:
        return {"commit": None, "dirty": None}
    return {"commit": sha, "dirty": bool(_git(code, "status", "--porcelain", "--untracked-files=no"))}


def library_versions() -> dict:
    """The version of each of :data:`LIBRARIES`, None when it is not installed (read from the
    installed metadata: nothing is imported)."""
    from importlib import metadata

    out = {}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine_info() -> dict:
    """The machine as fields: CPUs and their model, platform, Python, the versions of
    :data:`LIBRARIES` (None when not installed) and the load average when the call began, which
    tells whether its timings shared the cores."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                 if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    info = {"nproc": os.cpu_count(), "cpu": cpu, "platform": platform.platform(),
            "python": platform.python_version(), **library_versions()}
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
    """One call: its command, when it started, the code's :func:`commit_state` and the machine;
    for the imported code (``code`` None) also ``code``, its :func:`code_origin`."""
    rec = {"command": command or _command(), "started": now(), **commit_state(code),
           "machine": machine_info()}
    if code is None:
        rec["code"] = code_origin()
    return rec


def start_run(run: str | os.PathLike, resume: bool = False, what: str | None = None,
              data: dict | None = None, initial_eval: str | None = None) -> dict:
    """Write (or, resumed, extend) a run directory's ``PROVENANCE.json`` at the start of a call.

    The top-level ``commit``, ``dirty``, ``command``, ``machine`` and ``code`` are the last
    training call's (the code the run's remaining updates import); ``started`` is the first
    call's; ``calls`` lists every call (``call``: ``train``, ``resume`` or, by :func:`add_call`,
    ``evaluate``). ``data``: the problems the run reads (their source and SHA-256,
    ``mcpg.grpo.train.data_record``), kept at the top level and in the call. A resumed run
    whose directory holds no record (written by older code) starts its list with this call and
    says so in ``resume_note``. ``initial_eval``: the run directory whose evaluation of the
    untrained pool this run took (``mcpg.grpo.train.shared_initial_eval``), in the call and at
    the top level."""
    path = Path(run) / FILE
    call = {"call": "resume" if resume else "train", **call_record()}
    if data is not None:
        call["data"] = data
    if initial_eval is not None:
        call["initial_eval_from"] = initial_eval
    old = json.loads(path.read_text()) if resume and path.exists() else None
    calls = [*(old or {}).get("calls", []), call]
    prov = {
        "what": what or (old or {}).get("what") or "mcpg.grpo train run",
        "command": call["command"],
        "commit": call["commit"],
        "dirty": call["dirty"],
        "commit_note": "the commit of the code the run's last call imported (code: where that code came "
                       "from), when that call started; dirty: a tracked file differed from it",
        "started": calls[0]["started"],
        "machine": call["machine"],
        "code": call["code"],
    }
    if data is not None or (old or {}).get("data") is not None:
        prov["data"] = data if data is not None else old["data"]
    shared = [c["initial_eval_from"] for c in calls if "initial_eval_from" in c]
    if shared:
        prov["initial_eval_from"] = shared[0]
    prov["calls"] = calls
    if resume and old is None:
        prov["resume_note"] = "resumed a run whose earlier calls wrote no provenance"
    write_provenance(path, prov)
    return prov


def add_call(run: str | os.PathLike, call: str, **fields) -> dict:
    """Append a call that is not training (``call``: ``evaluate``) to a run directory's
    ``PROVENANCE.json``, with ``fields`` (what it wrote, the problems it read); the training
    record at the top level stays as it was. A directory without a record gets one holding
    this call alone."""
    path = Path(run) / FILE
    rec = {"call": call, **call_record(), **fields}
    prov = json.loads(path.read_text()) if path.exists() else {
        "what": "mcpg.grpo train run", "note": "the run's training wrote no provenance"}
    prov["calls"] = [*prov.get("calls", []), rec]
    write_provenance(path, prov)
    return prov


def _training_calls(calls: list[dict]) -> list[dict]:
    return [c for c in calls if c.get("call", "train") in ("train", "resume")]


def recorded_provenance(run: str | os.PathLike, fields: dict, fallback: dict) -> dict:
    """What a recorder writes for a finished run: ``fields`` (its own keys: what, command,
    config, timings, ...) with ``commit``, ``dirty``, ``started`` and ``machine`` taken from the
    run directory's own ``PROVENANCE.json`` (its last training call; an evaluation's call does
    not count), or from ``fallback`` (the recorder's :func:`commit_state`, start and
    :func:`machine_info` of the call it started) when the code wrote none. Keys keep ``fields``'
    order; the run's ``calls`` are appended."""
    own_path = Path(run) / FILE
    own = json.loads(own_path.read_text()) if own_path.exists() else None
    trained = _training_calls(own.get("calls", [])) if own else []
    source = trained[-1] if trained else fallback
    out = {k: (source.get(k, v) if k in ("commit", "dirty", "started", "machine") else v)
           for k, v in fields.items()}
    if own and own.get("calls"):
        out["calls"] = own["calls"]
    return out


def write_provenance(path: str | os.PathLike, prov: dict) -> None:
    """The one writer: ``prov`` as indented JSON at ``path`` (a file, or a folder to hold
    ``PROVENANCE.json``), atomically (a reader never sees half a file)."""
    path = Path(path)
    if path.is_dir():
        path = path / FILE
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(prov, indent=1) + "\n")
    os.replace(tmp, path)


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
