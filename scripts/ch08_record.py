"""Record chapter 8's long CPU runs: the positive control and the multi-seed comparison.

Each job is one ``python -m mcpg.grpo train`` run in its own directory under ``--runs``
(resumable: a job whose run directory holds a checkpoint continues with ``--resume``; one
with an ``eval.json`` is done). ``--parallel`` jobs run at once, each on one torch thread.
When a job finishes, its ``config.json``, ``initial_eval.json``, ``metrics.jsonl``,
``slates.jsonl`` and ``eval.json`` (not the weights) are copied to
``data/results/ch08/<what>/...`` with a ``PROVENANCE.json``: the command, the commit, the
machine, the date, the seed, wall time and CPU time. The commit, dirty flag, machine and start
are the run's own record when its code writes one (``train`` does since issue 47:
:mod:`mcpg.grpo.provenance`); for older code (a recording at an earlier commit, ``--code``) the
recorder takes them itself, with the same ``commit_state``; either way the file has one schema.
With ``--share-initial`` each seed's untrained pool is evaluated once, by its first arm, and
handed to the seed's other arms (``train --initial_eval``, which refuses an evaluation of
another pool): the same files, about 12 minutes less per arm at two runs on two cores.

    python scripts/ch08_record.py control                 # data/results/ch08/control
    python scripts/ch08_record.py compare --parallel 2    # data/results/ch08/compare/<signal>/seed<k>
    python scripts/ch08_record.py compare-unscaled        # removal with scale_rewards "none"
    python scripts/ch08_record.py grid --parallel 2       # data/results/ch08/grid/<arm>/seed<k>
    python scripts/ch08_record.py grid-stop --parallel 2  # the grid with stop_at_answer: ch08/grid-stop
    python scripts/ch08_record.py grid-mask --parallel 2  # the stop grid, no gradient from cut answers
    python scripts/ch08_record.py grid-mask --status      # where its jobs stand; starts nothing
    python scripts/ch08_record.py grid-mask-centred --parallel 2  # its centred arm on seeds 3-9
                                                          # and the centred oracle on seeds 1, 2
    python scripts/ch08_record.py grid-mask-batch --parallel 2 --share-initial  # batch (withdrawn)
    python scripts/ch08_record.py grid-mask-oracle --parallel 2   # the oracle on seeds 3-9, centred first
    python scripts/ch08_record.py ch09 --only ...         # data/results/ch09/llm/<arm>/seed<k>
                                                          # and the grid's oracle on seeds 1, 2
    python scripts/ch08_record.py ch09-mask --parallel 2  # ch09/llm/grid-mask/<allocation>-b<b>-group/seed<k>

The configs are ``data/configs/ch08-<what>.json`` (the grid's K = 1 controls:
``ch08-grid-control.json``, ``ch08-grid-stop-control.json``); a grid job may override keys (its
advantage scaling).

**One recording, one commit.** The grid's runs are compared with each other, so every one
of them must run the same code: a job refuses to start when the commit differs from the one
the grid's recorded runs name in their PROVENANCE.json. A recording that spans sessions
runs the code of a worktree at that commit (``--code``: the jobs import its ``src``, read its
configs and record its commit), writing into this checkout's results::

    git worktree add /tmp/grid-rec <commit>
    python scripts/ch08_record.py grid --parallel 2 --code /tmp/grid-rec

A job is always given its seeded ``--config``, resumed or not (``train`` ignores it on resume;
before 839a64d it required it), so this script resumes the jobs of older commits too.

**A recording that outlives its machine.** A run directory lives outside the repository, and a
session may be handed a new machine. Before such a session ends, stop the recorder and park
its started jobs: ``--park`` copies each started, unfinished run directory (its checkpoint
included) into ``data/recording/<job>/``, to be committed. The recorder, started anywhere,
resumes a job from its parked copy when the copy has more updates than the run directory (or
there is none), and deletes the copy once the job is recorded. A routed grid run's checkpoint
is 86 MB (three LoRA adapters, 29 MB, and their Adam moments, 57 MB), and a parked copy stays
in the repository's history after it is deleted: park a job that has hours left, not one that
a session can run again from its start in an hour::

    python scripts/ch08_record.py grid-mask --park --runs /tmp/runs   # then commit data/recording
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's library, wherever the script is started
from mcpg.grpo.provenance import commit_state, machine_info, now, recorded_provenance, write_provenance  # noqa: E402

RESULTS = ROOT / "data" / "results"
PARKED = ROOT / "data" / "recording"
"""Where ``--park`` leaves started jobs' run directories, checkpoints included, for a later session."""
COPIED = ("config.json", "initial_eval.json", "metrics.jsonl", "slates.jsonl", "eval.json")

MASKED = {"mask_truncated_completions": True}
JOBS = {
    "control": [("wta", 0, "ch08/control")],
    # wta and removal on 3 seeds each, the full-feedback oracle on 1; interleaved so that a
    # partial recording still pairs the two signals seed by seed
    "compare": [
        ("wta", 0, "ch08/compare/wta/seed0"),
        ("removal", 0, "ch08/compare/removal/seed0"),
        ("oracle", 0, "ch08/compare/oracle/seed0"),
        ("wta", 1, "ch08/compare/wta/seed1"),
        ("removal", 1, "ch08/compare/removal/seed1"),
        ("wta", 2, "ch08/compare/wta/seed2"),
        ("removal", 2, "ch08/compare/removal/seed2"),
    ],
    # a diagnosis, not part of the comparison: removal with centred advantages (scale_rewards
    # "none"), which keeps Eq. (19)'s estimator noise at its own scale instead of dividing a
    # group of near-equal credits by their tiny spread
    "compare-unscaled": [("removal", 0, "ch08/compare-unscaled/removal/seed0")],
    # the verdict's grid: K = 1 controls first (they fix the budget), then wta and removal under
    # both advantage scalings, seed by seed so that a partial recording stays paired, and the
    # full-feedback oracle under both scalings
    "grid": [
        *[("wta", k, f"ch08/grid/control/seed{k}", {}, "grid-control") for k in range(3)],
        *[(sig, k, f"ch08/grid/{sig}-{sc}/seed{k}", {"scale_rewards": sc}, "grid")
          for k in range(3) for sc in ("group", "none") for sig in ("wta", "removal")],
        *[("oracle", 0, f"ch08/grid/oracle-{sc}/seed0", {"scale_rewards": sc}, "grid")
          for sc in ("group", "none")],
    ],
    # the grid again with the answer line as a stop (config key stop_at_answer): the first grid's
    # cut answers were mostly answers that had committed ("#### 35") and then repeated their
    # marker line to the budget. Standardised wta and removal on seed 0 go first (the pair whose
    # cut share decides whether the stop meets the health bar), then the controls and the rest
    "grid-stop": [
        *[(sig, 0, f"ch08/grid-stop/{sig}-group/seed0", {"scale_rewards": "group"}, "grid-stop")
          for sig in ("wta", "removal")],
        *[("wta", k, f"ch08/grid-stop/control/seed{k}", {}, "grid-stop-control") for k in range(3)],
        *[(sig, k, f"ch08/grid-stop/{sig}-{sc}/seed{k}", {"scale_rewards": sc}, "grid-stop")
          for k in range(3) for sc in ("group", "none") for sig in ("wta", "removal")
          if (k, sc) != (0, "group")],
        *[("oracle", 0, f"ch08/grid-stop/oracle-{sc}/seed0", {"scale_rewards": sc}, "grid-stop")
          for sc in ("group", "none")],
    ],
    # the stop grid with no gradient from a cut answer: standardised removal cut over a third of
    # its answers on every seed of the stop grid. DAPO's overlong filtering (config key
    # mask_truncated_completions, TRL's name) trains on no cut answer, in every arm alike. The
    # standardised pair's seed 0 goes first: it asks whether the key brings removal under the
    # bar (chapter 8's probe); then the controls and the rest, in the stop grid's order
    "grid-mask": [
        *[(sig, 0, f"ch08/grid-mask/{sig}-group/seed0", {"scale_rewards": "group", **MASKED},
           "grid-stop") for sig in ("wta", "removal")],
        *[("wta", k, f"ch08/grid-mask/control/seed{k}", MASKED, "grid-stop-control") for k in range(3)],
        *[(sig, k, f"ch08/grid-mask/{sig}-{sc}/seed{k}", {"scale_rewards": sc, **MASKED}, "grid-stop")
          for k in range(3) for sc in ("group", "none") for sig in ("wta", "removal")
          if (k, sc) != (0, "group")],
        *[("oracle", 0, f"ch08/grid-mask/oracle-{sc}/seed0", {"scale_rewards": sc, **MASKED}, "grid-stop")
          for sc in ("group", "none")],
        # the verdict at ten seeds: the paper's protocol pair (standardised wta and removal) on
        # seeds 3 to 9, seed by seed so that a partial recording stays paired; then the
        # standardised oracle on seeds 1 and 2; then, as time allows, the centred pair on 3 to 9.
        # Same config, held-out problems and commit as seeds 0 to 2
        *[(sig, k, f"ch08/grid-mask/{sig}-group/seed{k}", {"scale_rewards": "group", **MASKED},
           "grid-stop") for k in range(3, 10) for sig in ("wta", "removal")],
        *[("oracle", k, f"ch08/grid-mask/oracle-group/seed{k}", {"scale_rewards": "group", **MASKED},
           "grid-stop") for k in (1, 2)],
        *[(sig, k, f"ch08/grid-mask/{sig}-none/seed{k}", {"scale_rewards": "none", **MASKED},
           "grid-stop") for k in range(3, 10) for sig in ("wta", "removal")],
    ],
    # the centred arm at ten seeds (issue 61): wta and removal with centred advantages on seeds
    # 3 to 9, seed by seed so that a partial recording stays paired, then the centred oracle on
    # seeds 1 and 2. The grid of record's jobs with only scaling and seed set, into the same
    # folders; recorded at one commit of today's engine (the reference test ties it to the
    # grid's dfdbc84 bit for bit), so its one-commit rule reads these jobs only
    "grid-mask-centred": [
        *[(sig, k, f"ch08/grid-mask/{sig}-none/seed{k}", {"scale_rewards": "none", **MASKED},
           "grid-stop") for k in range(3, 10) for sig in ("wta", "removal")],
        *[("oracle", k, f"ch08/grid-mask/oracle-none/seed{k}", {"scale_rewards": "none", **MASKED},
           "grid-stop") for k in (1, 2)],
    ],
    # the oracle at ten seeds (chapter 8's third box, H3 at ten seeds): full-feedback removal
    # credit on seeds 3 to 9, centred first, then standardised; two at a time. The grid of
    # record's jobs with only scaling and seed set, at the commit the box names (95ffaa9)
    "grid-mask-oracle": [
        *[("oracle", k, f"ch08/grid-mask/oracle-{sc}/seed{k}", {"scale_rewards": sc, **MASKED},
           "grid-stop") for sc in ("none", "group") for k in range(3, 10)],
    ],
    # the rollout's scale (issue 61, chapter 8's H5; withdrawn in the third box before any of
    # its runs existed: nothing of it is recorded or read): wta and removal with TRL's
    # scale_rewards "batch" (centred in the group, divided by the agent's standard deviation over
    # the whole rollout) on seeds 0 to 9, seed by seed so that a partial recording stays paired.
    # The grid of record's jobs with only scaling and seed set; recorded with --share-initial at
    # the one commit chapter 8's box names, after the centred arm
    "grid-mask-batch": [
        (sig, k, f"ch08/grid-mask/{sig}-batch/seed{k}", {"scale_rewards": "batch", **MASKED}, "grid-stop")
        for k in range(10) for sig in ("wta", "removal")
    ],
    # chapter 9's LLM arms: removal with exact evaluations on a budget (square-root allocation),
    # on the grid's pool and commit. Chapter 9 records the standardised ones (--only
    # ch09/llm/removal-b0.1-group/seed0 ...): there the grid's oracle is far ahead of Eq. (19),
    # a gap a budget can close; centred, the oracle's seed 0 is level with Eq. (19)
    "ch09": [
        ("removal", k, f"ch09/llm/removal-b{b}-{sc}/seed{k}",
         {"scale_rewards": sc, "exact_budget": b, "allocation": "sqrt"}, "grid")
        for sc in ("group", "none") for k in range(3) for b in (0.1, 0.3)
    ] + [
        # the grid's standardised oracle on the budgets' other seeds (--only
        # ch08/grid/oracle-group/seed1 ...), so that the budgets meet the oracle seed by seed
        ("oracle", k, f"ch08/grid/oracle-group/seed{k}", {"scale_rewards": "group"}, "grid")
        for k in (1, 2)
    ],
    # chapter 9's LLM arms on the grid of record's configuration (the masked stop grid):
    # standardised removal with exact evaluations on a budget, allocated by the gradient's
    # leverage before the draw (allocation "leverage") and, as the control that tells "a budget
    # buys nothing" from "this allocation is wrong", uniformly; budgets 0.1 and 0.3; seed by seed
    # so that a partial recording stays paired. The baselines are grid-mask's removal-group and
    # oracle-group runs (budget 0 and 1 are removal and the oracle bit for bit)
    "ch09-mask": [
        ("removal", k, f"ch09/llm/grid-mask/{alloc}-b{b}-group/seed{k}",
         {"scale_rewards": "group", "exact_budget": b, "allocation": alloc, **MASKED}, "grid-stop")
        for k in range(3) for b in (0.1, 0.3) for alloc in ("leverage", "uniform")
    ],
}
ONE_COMMIT = {"grid": ("ch08/grid", "ch09/llm"), "ch09": ("ch08/grid", "ch09/llm"),
              "grid-stop": ("ch08/grid-stop",), "grid-mask": ("ch08/grid-mask",),
              "ch09-mask": ("ch09/llm/grid-mask",), "grid-mask-centred": None,
              "grid-mask-batch": None, "grid-mask-oracle": None}
"""Recordings whose runs are compared with each other: each must run at one commit. The value
names the folders whose recorded runs set that commit; ``None``: the recording's own jobs."""


def _job(job: tuple, what: str) -> tuple[str, int, str, dict, str]:
    """A job as (signal, seed, folder, config overrides, config name)."""
    signal, seed, rel, *rest = job
    overrides = rest[0] if rest else {}
    return signal, seed, rel, overrides, rest[1] if len(rest) > 1 else what


def _command(what: str, signal: str, seed: int, run: Path, overrides: dict | None = None,
             code: Path = ROOT) -> list[str]:
    """The train command; the config is ``data/configs/ch08-<what>.json`` of the checkout
    ``code`` with ``seed`` and the job's ``overrides`` set, written beside the run directory.
    A run directory that holds a run (its ``config.json``) is continued with ``--resume``."""
    seeded = run.with_suffix(".config.json")
    resume = (run / "config.json").exists()
    if not (resume and seeded.exists()):
        spec = json.loads((code / "data" / "configs" / f"ch08-{what}.json").read_text())
        seeded.write_text(json.dumps({**spec, **(overrides or {}), "seed": seed}, indent=1) + "\n")
    cmd = [sys.executable, "-W", "ignore", "-m", "mcpg.grpo", "train", "--signal", signal,
           "--output", str(run), "--no-progress", "--config", str(seeded)]
    return cmd + ["--resume"] if resume else cmd


def donor(job: tuple, jobs: list[tuple]) -> tuple | None:
    """The job whose evaluation of the untrained pool ``job`` takes with ``--share-initial``: the
    first of ``jobs`` with its seed and config (another arm of the seed), or None when ``job`` is
    that first one. The engine refuses a donor whose untrained pool differs (train's
    ``initial_eval``), so a wrong pairing fails the job; it cannot change a number."""
    signal, seed, rel, overrides, config = job
    first = next(j for j in jobs if j[1] == seed and j[4] == config)
    return None if first[2] == rel else first


def donor_folder(d: tuple, runs: Path, results: Path) -> Path | None:
    """Where the donor job ``d`` has its ``initial_eval.json`` now (recorded, or under way), or None."""
    return next((f for f in (results / d[2], runs / d[2]) if (f / "initial_eval.json").is_file()), None)


def _times(path: Path) -> dict:
    """CPU seconds and peak memory from ``/usr/bin/time -v``'s report (empty without it)."""
    if not path.exists():
        return {}
    keys = {
        "User time (seconds)": "user_s",
        "System time (seconds)": "system_s",
        "Maximum resident set size (kbytes)": "max_rss_kb",
    }
    out = {}
    for ln in path.read_text().splitlines():
        k, _, v = ln.strip().partition(": ")
        if k in keys:
            out[keys[k]] = float(v)
    return out


def _updates_seconds(run: Path) -> float:
    """Wall seconds of the run's updates from its metrics.jsonl (every call's, resumed or not)."""
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return sum(r["seconds"]["total"] for r in rows if "seconds" in r)


def _record(
    what: str, signal: str, seed: int, run: Path, dest: Path, cmd: list[str], started: str, wall: float,
    commit: str, dirty: bool, overrides: dict | None = None, machine: dict | None = None,
) -> None:
    """Copy the run's files to ``dest`` with its PROVENANCE.json: the run's own record of its
    code (commit, dirty, machine, start of its last call), when the code it ran writes one,
    else what this recorder saw when it started the call (``commit``, ``dirty``, ``started``,
    ``machine``); plus this recorder's timings (:func:`mcpg.grpo.provenance.recorded_provenance`)."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in COPIED:
        if (run / name).exists():
            shutil.copy2(run / name, dest / name)
    prov = {
        "what": f"chapter 8 {what}: signal {signal}, seed {seed}",
        "command": " ".join(["OMP_NUM_THREADS=1"] + [c if c != sys.executable else "python" for c in cmd]),
        "config": f"data/configs/ch08-{what}.json",
        "overrides": overrides or {},
        "commit": commit,
        "dirty": dirty,
        "commit_note": "HEAD when the run (its last call, if resumed) started: the code it imported",
        "started": started,
        "finished": now(),
        "seed": seed,
        "wall_s": round(wall),
        **_times(run.with_suffix(".time")),
        "updates_s": round(_updates_seconds(run)),
        "note": "wall and CPU time of this call (a resumed run counts its last call only); updates_s: the "
                "wall time of all the run's updates (metrics.jsonl's seconds), every call; one torch thread",
        "machine": machine or machine_info(),
        "copied": list(COPIED) + ["(not the adapter or router weights)"],
    }
    fallback = {"commit": commit, "dirty": dirty, "started": started, "machine": prov["machine"]}
    write_provenance(dest / "PROVENANCE.json", recorded_provenance(run, prov, fallback))


def _updates_done(run: Path) -> int:
    """Updates in a run directory's checkpoint (0 without one): what ``--resume`` continues from."""
    for name in ("checkpoint", "checkpoint.old"):
        state = run / name / "state.json"
        if state.exists():
            return int(json.loads(state.read_text())["step"])
    return 0


def park(what: str, runs: Path, parked: Path = PARKED, only=None) -> list[tuple[str, int]]:
    """Copy each started, unfinished job's run directory from ``runs`` to ``parked``, replacing
    an older copy with fewer updates; returns (job, updates) of the copies made. A job still
    running may swap its checkpoint while it is copied: the copy is checked (a checkpoint whose
    step its metrics reach) and taken again until it holds. Stop the recorder first to park the
    last update too."""
    made = []
    for _signal, _seed, rel, _o, _c in (_job(j, what) for j in JOBS[what]):
        run, dest = runs / rel, parked / rel
        if (only and rel not in only) or not (run / "config.json").exists() or (run / "eval.json").exists():
            continue
        for _ in range(5):
            n = _updates_done(run)
            if n == 0 or n <= _updates_done(dest):
                break
            tmp = dest.with_name(dest.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                shutil.copytree(run, tmp, ignore=shutil.ignore_patterns("*.tmp", "checkpoint.old"))
            except (FileNotFoundError, shutil.Error):  # a checkpoint swapped while it was copied
                continue
            got = _updates_done(tmp)
            metrics = tmp / "metrics.jsonl"
            rows = [r for r in metrics.read_text().splitlines() if r.strip()] if metrics.exists() else []
            if got and len(rows) >= got:
                shutil.rmtree(dest, ignore_errors=True)
                tmp.rename(dest)
                made.append((rel, got))
                break
        else:
            raise RuntimeError(f"{run} kept changing while it was parked: stop the recorder and park again")
    return made


def _restore(run: Path, parked_run: Path) -> bool:
    """Put a parked copy in place of ``run`` when it has more updates (or ``run`` holds none)."""
    if _updates_done(parked_run) <= _updates_done(run):
        return False
    shutil.rmtree(run, ignore_errors=True)
    shutil.copytree(parked_run, run)
    return True


def status(what: str, runs: Path, results: Path, code: Path = ROOT, parallel: int = 1,
           parked: Path = PARKED) -> list[dict]:
    """Where each job of a recording stands, starting nothing: ``recorded`` (its results are
    copied), ``evaluating`` (every update done, no eval.json yet), ``started`` (some updates in
    its run directory, resumable) or ``not started``; with its updates done out of its config's.
    The last row, ``left``, sums the updates still to run and estimates the wall hours from the
    median seconds per update of the recorded runs of each job's config (the K = 1 controls
    have their own), ``parallel`` jobs at once: updates only, not the final evaluations."""
    rows, per_update = [], {}
    for signal, seed, rel, overrides, config in (_job(j, what) for j in JOBS[what]):
        spec = json.loads((code / "data" / "configs" / f"ch08-{config}.json").read_text())
        total = {**spec, **overrides}["updates"]
        recorded = (results / rel / "eval.json").exists()
        here = runs / rel
        if not recorded and _updates_done(parked / rel) > _updates_done(here):
            here = parked / rel  # parked by an earlier session: resumed from there
        metrics = (results / rel if recorded else here) / "metrics.jsonl"
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        done = [json.loads(ln) for ln in lines if ln.strip()]
        per_update.setdefault(config, []).extend(r["seconds"]["total"] for r in done if "seconds" in r)
        state = ("recorded" if recorded else "evaluating" if len(done) >= total
                 else "started" if done else "not started")
        rows.append({"job": rel, "state": state, "updates": len(done), "of": total, "config": config})
    for config in [c for c, s in per_update.items() if not s]:
        per_update[config] = _recorded_seconds(config, what, results)  # none of its own yet
    left = sum(r["of"] - r["updates"] for r in rows)
    seconds = [(r["of"] - r["updates"]) * statistics.median(per_update[r["config"]])
               for r in rows if r["of"] > r["updates"] and per_update[r["config"]]]
    estimate = (f"about {sum(seconds) / 3600 / max(parallel, 1):.1f} h" if seconds
                else "no recorded run to time it by")
    rows.append({"job": "left", "state": f"{estimate} at --parallel {parallel}", "updates": left,
                 "of": sum(r["of"] for r in rows)})
    return rows


def _recorded_seconds(config: str, what: str, results: Path) -> list[float]:
    """Seconds per update of the recorded runs of ``config`` in the other recordings: the estimate
    of a recording that has none of its own yet."""
    out = []
    for other, jobs in JOBS.items():
        for _, _, rel, _, cfg in (_job(j, other) for j in jobs):
            metrics = results / rel / "metrics.jsonl"
            if other != what and cfg == config and (results / rel / "eval.json").exists():
                rows = [json.loads(ln) for ln in metrics.read_text().splitlines() if ln.strip()]
                out += [r["seconds"]["total"] for r in rows if "seconds" in r]
    return out


def recorded_commits(what: str, results: Path) -> set[str]:
    """The commits of the recorded runs that a one-commit recording must match (``ONE_COMMIT``)."""
    dirs = ONE_COMMIT[what]
    if dirs is None:  # the recording's own jobs
        files = [results / _job(j, what)[2] / "PROVENANCE.json" for j in JOBS[what]]
        files = [f for f in files if f.exists()]
    else:
        files = [f for d in dirs for f in (results / d).glob("*/seed*/PROVENANCE.json")]
    return {json.loads(f.read_text()).get("commit") for f in files}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=sorted(JOBS))
    ap.add_argument("--runs", default=str(ROOT / "runs"), help="where the run directories live")
    ap.add_argument("--parallel", type=int, default=1, help="jobs at once (one torch thread each)")
    ap.add_argument("--only", nargs="+", metavar="RUN",
                    help="record only these jobs, named by their folder (e.g. ch08/compare/removal/seed2)")
    ap.add_argument("--code", default=str(ROOT),
                    help="the checkout whose code, configs and commit the jobs use (default: this one)")
    ap.add_argument("--results", default=str(RESULTS),
                    help="where recorded runs are copied (default: this checkout's data/results)")
    ap.add_argument("--status", action="store_true",
                    help="say where each job stands (updates done, hours left) and start nothing")
    ap.add_argument("--share-initial", action="store_true",
                    help="evaluate each seed's untrained pool once: a seed's other arms wait for its "
                         "first arm's initial_eval.json and take it (train --initial_eval; code from "
                         "2026-12-06 on), while other jobs use the cores")
    ap.add_argument("--park", action="store_true",
                    help="copy the started, unfinished jobs' run directories, checkpoints included, into "
                         "data/recording/ for a later session (stop the recorder first) and start nothing")
    a = ap.parse_args(argv)
    results = Path(a.results)
    if a.status:
        for r in status(a.what, Path(a.runs), results, Path(a.code).resolve(), a.parallel):
            print(f"{r['job']:<40} {r['state']:<28} {r['updates']:>4} / {r['of']}")
        return 0
    if a.park:
        made = park(a.what, Path(a.runs), only=a.only)
        for rel, n in made:
            print(f"parked {rel} at update {n}: {PARKED / rel}")
        if not made:
            print(f"nothing to park: no started, unfinished job of {a.what!r} in {a.runs} "
                  "is ahead of its parked copy")
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    jobs = [_job(j, a.what) for j in JOBS[a.what]]
    known = [j[2] for j in jobs]
    unknown = sorted(set(a.only or ()) - set(known))
    if unknown:
        ap.error(f"no job {unknown} in {a.what!r}; its jobs are {known}")
    code = Path(a.code).resolve()
    if not (code / "src" / "mcpg" / "grpo").is_dir():
        ap.error(f"--code {code} is not a checkout of this repository (no src/mcpg/grpo)")
    env["PYTHONPATH"] = os.pathsep.join([str(code / "src"), *filter(None, [env.get("PYTHONPATH")])])
    head = commit_state(code)["commit"]
    if a.what in ONE_COMMIT:  # one recording, one commit
        commits = recorded_commits(a.what, results)
        if commits - {head}:
            ap.error(f"the grid's recorded runs ran at {sorted(commits)}, this checkout is at {head}: "
                     "record with --code, a worktree at that commit (see the docstring)")
    pending = [j for j in jobs
               if not (results / j[2] / "eval.json").exists() and (not a.only or j[2] in a.only)]
    running: list[tuple] = []
    while pending or running:
        while pending and len(running) < a.parallel:
            pick, source = _next(pending, jobs, Path(a.runs), results, a.share_initial, bool(running))
            if pick is None:
                break  # every pending job waits for a running job's untrained evaluation
            signal, seed, rel, overrides, config = pending.pop(pick)
            run = Path(a.runs) / rel
            run.parent.mkdir(parents=True, exist_ok=True)
            if _restore(run, PARKED / rel):
                print(f"restored {rel} from {PARKED / rel} at update {_updates_done(run)}", flush=True)
            cmd = _command(config, signal, seed, run, overrides, code)
            if source is not None and "--resume" not in cmd:
                cmd += ["--initial_eval", str(source)]
            log = open(run.with_suffix(".log"), "a")
            started = now()
            timer = (
                ["/usr/bin/time", "-v", "-o", str(run.with_suffix(".time"))]
                if Path("/usr/bin/time").exists()
                else []
            )
            proc = subprocess.Popen(timer + cmd, cwd=code, env=env, stdout=log, stderr=subprocess.STDOUT)
            state = commit_state(code)  # the code's own record, when it writes one, takes precedence
            running.append((proc, signal, seed, rel, run, cmd, started, time.time(), state, machine_info(),
                            overrides, config))
            print(f"started {rel}: {' '.join(cmd[3:])}", flush=True)
        time.sleep(5)
        for job in list(running):
            proc, signal, seed, rel, run, cmd, started, t0, state, machine, overrides, config = job
            if proc.poll() is None:
                continue
            running.remove(job)
            if proc.returncode == 0 and (run / "eval.json").exists():
                wall = time.time() - t0
                _record(config, signal, seed, run, results / rel, cmd, started, wall, state["commit"],
                        state["dirty"], overrides, machine)
                print(f"recorded {rel} in {time.time() - t0:.0f} s", flush=True)
                if (PARKED / rel).exists():  # its parked copy has served
                    shutil.rmtree(PARKED / rel)
            else:
                print(f"failed {rel} (exit {proc.returncode}); see {run.with_suffix('.log')}", flush=True)
    return 0


def _next(pending: list[tuple], jobs: list[tuple], runs: Path, results: Path, share: bool,
          busy: bool) -> tuple[int | None, Path | None]:
    """The index in ``pending`` of the job to start, and the folder whose untrained evaluation it
    takes (None: it computes its own). Without ``share``, the first. With it, the first that is a
    seed's first arm, has started already, or whose donor's evaluation is there; a job whose donor
    will not give one (not pending, not running: failed) computes its own; when nothing can start
    and nothing runs, the first computes its own."""
    if not share:
        return 0, None
    waiting = {j[2] for j in pending}
    for i, job in enumerate(pending):
        d = donor(job, jobs)
        if d is None or (runs / job[2] / "config.json").exists():
            return i, None
        source = donor_folder(d, runs, results)
        if source is not None:
            return i, source
        if d[2] in waiting or busy:
            continue  # its donor is still to run, or may be running
        return i, None
    return (None, None) if busy else (0, None)


if __name__ == "__main__":
    raise SystemExit(main())
