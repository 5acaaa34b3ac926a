"""Replay the first updates of recorded runs with today's engine, which logs each candidate's cut
flag and length, and check that the replay reproduces the recording row for row.

Chapter 8's grid of record was logged at ``dfdbc84``, before the engine wrote each candidate's
``cut`` flag into ``slates.jsonl``; its hypothesis H2 needs those flags. A replay trains the
recorded run's own ``config.json`` (same seed, same config, nothing changed) with the code of
``--code`` and stops after ``--updates`` updates. Its metrics and slates are then compared with
the recording's first rows: on the recording's CPU type every value must be identical (bit for
bit); on another CPU every value that is not a float must be identical and every float agree
within ``--rtol`` (the engine's reference test's cross-CPU rule), and the comparison says for how
many updates that holds. The replay's config, metrics, slates (with ``cut`` and ``tokens``), its
comparison ``REPLAY.json`` and ``PROVENANCE.json`` are copied to ``data/results/ch08/replay/
<arm>/seed<k>/`` (no weights). A replay is resumable: its run directory, under ``--runs``, is
continued with ``--resume``.

    git worktree add /tmp/rec 95ffaa9
    python scripts/ch08_replay.py --code /tmp/rec --runs /tmp/runs/replay --parallel 2
    python scripts/ch08_replay.py --status --runs /tmp/runs/replay
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from mcpg.grpo.provenance import commit_state, machine_info, now, write_provenance  # noqa: E402

RESULTS = ROOT / "data" / "results"
GRID = "ch08/grid-mask"
JOBS = ("removal-group/seed3", "removal-group/seed6", "removal-group/seed0", "removal-group/seed9",
        "wta-group/seed3")
"""Standardised removal: collapsed (3) and failing (6), then healthy (0, 9); winner-take-all's
seed 3 for contrast (chapter 8's H2)."""
SLATE_COMPARED = ("R", "I", "G", "p", "P", "mu_hat", "score")
"""The slate keys the recording logged; a replay adds ``cut``, ``tokens`` and ``zero_std``."""


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []


def _close(a, b, rtol: float) -> bool:
    """Equal; floats within ``rtol`` relative (of at least 1) when ``rtol`` > 0; recursively."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (rtol > 0 and abs(a - b) <= rtol * max(1.0, abs(b)))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and type(a) is not type(b):
        return rtol > 0 and abs(a - b) <= rtol * max(1.0, abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rtol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rtol) for x, y in zip(a, b))
    return a == b


def compare(run: Path, recorded: Path, updates: int, rtol: float = 0.0) -> dict:
    """Compare a replay's first ``updates`` metrics and slates rows with the recording's (every
    metrics key but ``seconds``; the slate keys the recording has). ``rtol`` 0: bit for bit.
    Returns ``updates`` compared, ``agree`` (the number of leading updates on which every
    compared value agrees), ``differences`` (the first few, as ``update: file key``) and
    ``initial_eval_identical`` (the untrained pool's evaluation, byte for byte)."""
    got_m, want_m = _rows(run / "metrics.jsonl")[:updates], _rows(recorded / "metrics.jsonl")[:updates]
    got_s, want_s = _rows(run / "slates.jsonl")[:updates], _rows(recorded / "slates.jsonl")[:updates]
    if len(got_m) < updates or len(got_s) < updates:
        raise ValueError(f"{run}: {len(got_m)} updates logged, {updates} needed")
    diffs, agree = [], None
    for t in range(updates):
        here = []
        for key in (k for k in want_m[t] if k != "seconds"):  # the recording's keys
            if not _close(got_m[t].get(key), want_m[t][key], rtol):
                here.append(f"{t + 1}: metrics {key}")
        for key in (k for k in SLATE_COMPARED if k in want_s[t]):
            if not _close(got_s[t].get(key), want_s[t][key], rtol):
                here.append(f"{t + 1}: slates {key}")
        if here and agree is None:
            agree = t
        diffs += here
    a, b = run / "initial_eval.json", recorded / "initial_eval.json"
    return {"updates": updates, "agree": updates if agree is None else agree, "rtol": rtol,
            "differences": diffs[:20], "n_differences": len(diffs),
            "initial_eval_identical": a.exists() and b.exists() and a.read_bytes() == b.read_bytes()}


def _command(job: str, runs: Path, results: Path) -> tuple[list[str], Path]:
    """The train command of a replay: the recording's own config and signal, resumed when its run
    directory holds a run."""
    saved = json.loads((results / GRID / job / "config.json").read_text())
    run = runs / job
    cfg = run.with_suffix(".config.json")
    run.parent.mkdir(parents=True, exist_ok=True)
    if not cfg.exists():
        cfg.write_text(json.dumps(saved["config"], indent=1) + "\n")
    cmd = [sys.executable, "-W", "ignore", "-m", "mcpg.grpo", "train", "--signal", saved["signal"],
           "--output", str(run), "--no-progress", "--config", str(cfg)]
    return (cmd + ["--resume"] if (run / "config.json").exists() else cmd), run


def _done(run: Path) -> int:
    return len(_rows(run / "metrics.jsonl"))


def record(job: str, run: Path, results: Path, updates: int, rtol: float, cmd: list[str], started: str,
           state: dict, machine: dict) -> dict:
    """Compare the replay with its recording and copy it to ``data/results/ch08/replay/<job>``."""
    recorded = results / GRID / job
    rec_cpu = (json.loads((recorded / "PROVENANCE.json").read_text()).get("machine") or {}).get("cpu")
    same_cpu = rec_cpu == machine.get("cpu")
    out = compare(run, recorded, updates, 0.0 if same_cpu else rtol)
    out.update({"recorded": f"data/results/{GRID}/{job}", "recorded_cpu": rec_cpu, "cpu": machine.get("cpu"),
                "rule": "bit for bit (same CPU type)" if same_cpu else
                f"cross-CPU: non-floats identical, floats within {rtol:g} relative"})
    dest = results / "ch08" / "replay" / job
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    shutil.copy2(run / "config.json", dest / "config.json")
    for name in ("metrics.jsonl", "slates.jsonl"):
        rows = (run / name).read_text().splitlines(keepends=True)[:updates]
        (dest / name).write_text("".join(rows))
    (dest / "REPLAY.json").write_text(json.dumps(out, indent=1) + "\n")
    write_provenance(dest / "PROVENANCE.json", {
        "what": f"chapter 8 replay of {GRID}/{job}, first {updates} updates",
        "command": " ".join(["OMP_NUM_THREADS=1"] + [c if c != sys.executable else "python" for c in cmd]),
        "commit": state["commit"], "dirty": state["dirty"], "started": started, "finished": now(),
        "seed": json.loads((run / "config.json").read_text())["config"].get("seed"), "machine": machine,
        "copied": ["config.json", f"metrics.jsonl and slates.jsonl (first {updates} rows)", "REPLAY.json",
                   "(not the weights)"]})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code", default=str(ROOT), help="the checkout whose engine replays (default: this one)")
    ap.add_argument("--runs", default=str(ROOT / "runs" / "replay"), help="where the run directories live")
    ap.add_argument("--results", default=str(RESULTS), help="the recorded results (default: data/results)")
    ap.add_argument("--only", nargs="+", metavar="JOB", help=f"replay only these, of {', '.join(JOBS)}")
    ap.add_argument("--updates", type=int, default=12, help="updates to replay and compare (default 12)")
    ap.add_argument("--rtol", type=float, default=1e-4, help="float tolerance on another CPU type")
    ap.add_argument("--parallel", type=int, default=1, help="replays at once (one torch thread each)")
    ap.add_argument("--status", action="store_true", help="updates done per replay; starts nothing")
    a = ap.parse_args(argv)
    runs, results, code = Path(a.runs), Path(a.results), Path(a.code).resolve()
    jobs = list(a.only or JOBS)
    unknown = [j for j in jobs if not (results / GRID / j / "config.json").exists()]
    if unknown:
        ap.error(f"no recorded run {unknown} under {results / GRID}")
    if a.status:
        for j in jobs:
            done = (results / "ch08" / "replay" / j / "REPLAY.json").exists()
            print(f"{j:<24} {'recorded' if done else f'{min(_done(runs / j), a.updates)} / {a.updates}'}")
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(code / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
    pending = [j for j in jobs if not (results / "ch08" / "replay" / j / "REPLAY.json").exists()]
    running: list[tuple] = []
    while pending or running:
        while pending and len(running) < a.parallel:
            job = pending.pop(0)
            cmd, run = _command(job, runs, results)
            if _done(run) >= a.updates:
                proc = None
            else:
                log = open(run.with_suffix(".log"), "a")
                proc = subprocess.Popen(cmd, cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT)
                print(f"started {job}: {' '.join(cmd[3:])}", flush=True)
            running.append((job, run, proc, cmd, now(), commit_state(code), machine_info()))
        time.sleep(2)
        for item in list(running):
            job, run, proc, cmd, started, state, machine = item
            if proc is not None and _done(run) < a.updates and proc.poll() is None:
                continue
            if proc is not None and proc.poll() is None:  # enough updates: stop it there
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            running.remove(item)
            if _done(run) < a.updates:
                print(f"failed {job} after {_done(run)} updates; see {run.with_suffix('.log')}", flush=True)
                continue
            out = record(job, run, results, a.updates, a.rtol, cmd, started, state, machine)
            print(f"recorded {job}: {out['agree']} of {out['updates']} updates agree ({out['rule']}); "
                  f"initial evaluation identical: {out['initial_eval_identical']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
