"""The command line ``python -m mcpg.grpo``: one ``error:`` line for a mistake in the command,
``--threads`` applied, ``--help`` with examples, only the known third-party warnings hidden."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from mcpg.grpo import __main__ as cli
from mcpg.grpo.configs import resolve_config
from repo_scripts import load_script  # tests/repo_scripts.py

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["train", "--config", "tiny-random", "--signal", "wta"]


def error_of(capsys, argv) -> str:
    """Run the command line in this process; return its one error line (and check it is one)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture
def no_training(monkeypatch):
    """Replace train/evaluate_run by recorders, so that only the command line itself runs."""
    from mcpg.grpo import train as train_module

    calls = []

    def fake_train(config, signal, output, **kwargs):
        calls.append(("train", config, signal, output, kwargs, torch.get_num_threads()))
        return {"accuracy": 0.0}

    def fake_evaluate(run, **kwargs):
        calls.append(("evaluate", run, kwargs, torch.get_num_threads()))
        return {"accuracy": 0.0}

    monkeypatch.setattr(train_module, "train", fake_train)
    monkeypatch.setattr(train_module, "evaluate_run", fake_evaluate)
    n = torch.get_num_threads()
    yield calls
    torch.set_num_threads(n)


def test_output_that_is_a_file(tmp_path, capsys, no_training):
    f = tmp_path / "taken.txt"
    f.write_text("x")
    err = error_of(capsys, [*TRAIN, "--output", str(f)])
    assert str(f) in err and "is an existing file" in err
    err = error_of(capsys, [*TRAIN, "--output", str(f / "run")])
    assert str(f) in err and "is a file" in err
    assert no_training == []


def test_malformed_config_names_the_file(tmp_path, capsys, no_training):
    bad = tmp_path / "bad.json"
    bad.write_text('{"base": "tiny-random", "updates": 3,}')
    out = ["--signal", "wta", "--output", str(tmp_path / "r")]
    err = error_of(capsys, ["train", "--config", str(bad), *out])
    assert str(bad) in err and "not valid JSON" in err and "line 1" in err
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"base": "tiny-random", "update": 3}')
    err = error_of(capsys, ["train", "--config", str(unknown), *out])
    assert str(unknown) in err and "'update'" in err
    err = error_of(capsys, ["train", "--config", str(tmp_path / "missing.json"), *out])
    assert "missing.json" in err and "neither a named config" in err
    err = error_of(capsys, ["train", "--config", str(tmp_path), *out])
    assert "is a directory" in err
    assert no_training == []


def test_unknown_signal(tmp_path, capsys):
    argv = ["train", "--config", "tiny-random", "--signal", "best", "--output", str(tmp_path / "r")]
    err = error_of(capsys, argv)
    assert "signal must be one of" in err and "'best'" in err


def test_bad_run_directories(tmp_path, capsys, no_training):
    err = error_of(capsys, ["evaluate", "--run", str(tmp_path / "nowhere")])
    assert "nowhere" in err and "does not exist" in err
    err = error_of(capsys, ["evaluate", "--run", str(tmp_path)])
    assert "no config.json" in err
    (tmp_path / "config.json").write_text("{not json")
    err = error_of(capsys, ["evaluate", "--run", str(tmp_path)])
    assert str(tmp_path / "config.json") in err and "not valid JSON" in err
    err = error_of(capsys, [*TRAIN, "--resume", "--output", str(tmp_path / "fresh")])
    assert "no run to resume" in err
    assert no_training == []


def test_resume_needs_no_config(tmp_path, capsys, no_training):
    # a run directory carries its own config: --resume continues without --config, and a
    # new run without --config is told which argument it lacks
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"config": {"updates": 3}, "signal": "wta"}))
    assert cli.main(["train", "--signal", "wta", "--output", str(run), "--resume"]) == 0
    assert [(c[0], c[3], c[4]["resume"]) for c in no_training] == [("train", str(run), True)]
    err = error_of(capsys, ["train", "--signal", "wta", "--output", str(tmp_path / "new")])
    assert "--config" in err and "unless --resume" in err
    assert len(no_training) == 1


def _recorder():
    """scripts/ch08_record.py, loaded by its path."""
    return load_script("scripts/ch08_record.py")


def test_recorder_commands_parse(tmp_path, capsys, no_training):
    # scripts/ch08_record.py starts a job with its seeded config and resumes it with --resume
    # and the same config (which train ignores on resume, and required before 839a64d); both
    # command lines must pass the train command's own parser
    rec = _recorder()
    run = tmp_path / "removal-group" / "seed0"
    run.parent.mkdir()
    new = rec._command("grid", "removal", 0, run, {"scale_rewards": "group"})
    seeded = json.loads(run.with_suffix(".config.json").read_text())
    assert seeded["seed"] == 0 and seeded["scale_rewards"] == "group"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"config": seeded, "signal": "removal"}))
    resumed = rec._command("grid", "removal", 0, run, {"scale_rewards": "group"})
    assert resumed == new + ["--resume"]
    for cmd in (new, resumed):
        assert cmd[3:6] == ["-m", "mcpg.grpo", "train"]
        assert cli.main(cmd[5:]) == 0, capsys.readouterr().err
    assert [c[4]["resume"] for c in no_training] == [False, True]
    # the updates' wall time counts every call of a resumed run
    rows = [{"update": u, "seconds": {"rollout": 1.0, "actor": 2.0, "total": 3.5}} for u in (1, 2)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert rec._updates_seconds(run) == 7.0
    # --code must be a checkout of this repository
    with pytest.raises(SystemExit):
        rec.main(["grid", "--code", str(tmp_path), "--runs", str(tmp_path / "runs")])
    assert "not a checkout" in capsys.readouterr().err


def test_recorder_status_reads_where_each_job_stands(tmp_path, capsys):
    # --status starts nothing: a job is recorded (results copied), evaluating (every update
    # done, no eval.json), started (resumable) or not started; the hours left come from the
    # median seconds per update of the jobs of the same config, shared by --parallel jobs
    rec = _recorder()
    runs, results = tmp_path / "runs", tmp_path / "results"
    jobs = [rec._job(j, "grid-mask") for j in rec.JOBS["grid-mask"]]
    (wta, rm, control), n = (j[2] for j in jobs[:3]), 32

    def metrics(folder, updates, seconds):
        folder.mkdir(parents=True, exist_ok=True)
        rows = [{"update": u, "seconds": {"total": seconds}} for u in range(1, updates + 1)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    metrics(results / wta, n, 100.0)
    (results / wta / "eval.json").write_text("{}")
    metrics(runs / rm, n, 300.0)  # every update done, the evaluation not yet
    metrics(runs / control, 5, 60.0)
    rows = {r["job"]: r for r in rec.status("grid-mask", runs, results, ROOT, parallel=2)}
    assert [rows[j]["state"] for j in (wta, rm, control)] == ["recorded", "evaluating", "started"]
    assert [rows[j]["updates"] for j in (wta, rm, control)] == [n, n, 5]
    assert {rows[j[2]]["state"] for j in jobs[3:]} == {"not started"}
    left = rows["left"]
    assert left["updates"] == len(jobs) * n - 2 * n - 5 == sum(r["of"] - r["updates"] for r in rows.values()
                                                                 if r["job"] != "left")
    # routed jobs: the median of 100 s (32 updates) and 300 s (32): 200 s; controls: 60 s
    routed_left = sum(1 for j in jobs[3:] if j[4] == jobs[0][4]) * n
    controls_left = (n - 5) + sum(1 for j in jobs[3:] if j[4] == jobs[2][4]) * n
    hours = (routed_left * 200.0 + controls_left * 60.0) / 3600 / 2
    assert left["state"] == f"about {hours:.1f} h at --parallel 2"
    assert rec.main(["grid-mask", "--status", "--runs", str(runs), "--results", str(results)]) == 0
    out = capsys.readouterr().out
    assert f"{wta} " in out and "recorded" in out and "not started" in out
    assert not any((runs / j[2]).with_suffix(".log").exists() for j in jobs)  # nothing started
    # a recording with no run of its own yet (chapter 9's arms, on the grid's config) is timed
    # by the recorded runs of the same config elsewhere: here the one wta run, 100 s an update
    ch09 = [rec._job(j, "ch09-mask") for j in rec.JOBS["ch09-mask"]]
    assert {j[4] for j in ch09} == {jobs[0][4]}
    left = rec.status("ch09-mask", runs, results, ROOT, parallel=2)[-1]
    assert left["state"] == f"about {len(ch09) * n * 100.0 / 3600 / 2:.1f} h at --parallel 2"
    left = rec.status("ch09-mask", runs, tmp_path / "none", ROOT)[-1]
    assert left["state"] == "no recorded run to time it by at --parallel 1"


def test_recorder_parks_and_restores_started_jobs(tmp_path, capsys):
    # a session on a machine that is not kept parks its started jobs in the repository
    # (checkpoints included); the next recorder resumes each from its parked copy when the
    # copy is ahead, and --status counts the parked updates
    rec = _recorder()
    runs, parked, results = tmp_path / "runs", tmp_path / "parked", tmp_path / "results"
    jobs = [rec._job(j, "grid-mask")[2] for j in rec.JOBS["grid-mask"]]
    started, finished, behind = jobs[-1], jobs[-2], jobs[-3]

    def run_dir(folder, updates, evaluated=False):
        (folder / "checkpoint").mkdir(parents=True)
        (folder / "config.json").write_text("{}")
        (folder / "checkpoint" / "state.json").write_text(json.dumps({"step": updates}))
        (folder / "checkpoint" / "adapters.bin").write_bytes(bytes(range(256)) * 4)
        rows = [{"update": u, "seconds": {"total": 10.0}} for u in range(1, updates + 1)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        if evaluated:
            (folder / "eval.json").write_text("{}")

    run_dir(runs / started, 7)
    run_dir(runs / finished, 32, evaluated=True)  # done: nothing to park
    run_dir(runs / behind, 3)
    run_dir(parked / behind, 5)  # an earlier session's copy is ahead: kept
    assert rec.park("grid-mask", runs, parked) == [(started, 7)]
    copy = parked / started / "checkpoint" / "adapters.bin"
    assert copy.read_bytes() == (runs / started / "checkpoint" / "adapters.bin").read_bytes()
    assert not (parked / finished).exists() and rec._updates_done(parked / behind) == 5
    assert not list(parked.rglob("*.tmp"))
    assert rec.park("grid-mask", runs, parked) == []  # nothing new
    # a new machine: no run directories; the recorder restores the parked ones
    fresh = tmp_path / "fresh"
    assert rec._restore(fresh / started, parked / started)
    assert rec._updates_done(fresh / started) == 7 and (fresh / started / "metrics.jsonl").exists()
    assert not rec._restore(runs / started, parked / started)  # the run directory is not behind
    assert rec._restore(runs / behind, parked / behind)  # it is
    rows = {r["job"]: r for r in rec.status("grid-mask", tmp_path / "empty", results, ROOT, parked=parked)}
    assert (rows[started]["state"], rows[started]["updates"]) == ("started", 7)
    assert (rows[behind]["state"], rows[behind]["updates"]) == ("started", 5)
    assert rows[jobs[0]]["state"] == "not started"
    # a checkpoint that no metrics reach is not a copy to resume from
    (runs / started / "checkpoint" / "state.json").write_text(json.dumps({"step": 9}))
    with pytest.raises(RuntimeError, match="kept changing"):
        rec.park("grid-mask", runs, parked)
    assert rec._updates_done(parked / started) == 7

# data/configs/ch08-*.json, the configs the recordings name, keep the key names they were recorded
# with: max_new_tokens resolves, with the FutureWarning that names max_completion_length
RECORDED_NAMES = pytest.mark.filterwarnings("ignore:config key 'max_new_tokens' is now:FutureWarning")


@RECORDED_NAMES
def test_recorder_jobs_name_configs_that_resolve():
    # every job of scripts/ch08_record.py reads data/configs/ch08-<config>.json; the stopped grid
    # is the grid with one key more, and lays out the grid's arms, seeds and controls
    rec = _recorder()
    configs = ROOT / "data" / "configs"
    for what, jobs in rec.JOBS.items():
        for job in jobs:
            signal, seed, rel, overrides, config = rec._job(job, what)
            spec = json.loads((configs / f"ch08-{config}.json").read_text())
            resolve_config({**spec, **overrides, "seed": seed})
    for name in ("grid", "grid-control"):
        old = json.loads((configs / f"ch08-{name}.json").read_text())
        new = json.loads((configs / f"ch08-{name.replace('grid', 'grid-stop')}.json").read_text())
        assert {k: v for k, v in new.items() if k not in ("name", "stop_at_answer")} == {
            k: v for k, v in old.items() if k != "name"}
        assert new["stop_at_answer"] is True
    grid = sorted(rec._job(j, "grid")[2].replace("grid/", "") for j in rec.JOBS["grid"])
    stop_jobs = [rec._job(j, "grid-stop") for j in rec.JOBS["grid-stop"]]
    stop = sorted(j[2].replace("grid-stop/", "") for j in stop_jobs)
    assert stop == grid and len(stop) == 3 + 12 + 2
    # the masked grid: the stop grid's jobs in its order, each with one key more; the
    # standardised seed-0 pair (chapter 8's probe) first
    mask_jobs = [rec._job(j, "grid-mask") for j in rec.JOBS["grid-mask"]]
    # (its first jobs; the ten-seed jobs follow, seeds 3 to 9 and the oracle's seeds 1 and 2)
    first = mask_jobs[: len(stop_jobs)]
    assert [(m[0], m[1], m[2].replace("grid-mask/", ""), m[4]) for m in first] == [
        (j[0], j[1], j[2].replace("grid-stop/", ""), j[4]) for j in stop_jobs]
    assert {m[1] for m in mask_jobs[len(stop_jobs):]} == set(range(1, 10))
    assert all(m[3] == {**j[3], "mask_truncated_completions": True} for m, j in zip(mask_jobs, stop_jobs))
    assert [m[2] for m in mask_jobs[:2]] == [f"ch08/grid-mask/{s}-group/seed0" for s in ("wta", "removal")]


def test_centred_recording_is_the_grids_centred_jobs_at_its_own_commit(tmp_path):
    # issue 61: the centred arm on seeds 3-9 and the centred oracle on seeds 1-2 are grid-mask's
    # own jobs (same folders, config and overrides), recorded at one commit of their own: the
    # grid's runs at dfdbc84 do not block it, a run of its own at another commit does
    rec = _recorder()
    centred = [rec._job(j, "grid-mask-centred") for j in rec.JOBS["grid-mask-centred"]]
    grid = {j[2]: j for j in (rec._job(j, "grid-mask") for j in rec.JOBS["grid-mask"])}
    assert [(j[0], j[1]) for j in centred[:14]] == [(s, k) for k in range(3, 10) for s in ("wta", "removal")]
    assert [(j[0], j[1]) for j in centred[14:]] == [("oracle", 1), ("oracle", 2)]
    for j in centred:
        assert j[3] == {"scale_rewards": "none", "mask_truncated_completions": True}
        assert grid.get(j[2], j)[3:] == j[3:]  # the grid's own job where it lists one
        assert j[2].startswith("ch08/grid-mask/") and "-none/" in j[2]

    def provenance(rel, commit):
        (tmp_path / rel).mkdir(parents=True)
        (tmp_path / rel / "PROVENANCE.json").write_text(json.dumps({"commit": commit}))

    provenance("ch08/grid-mask/wta-none/seed0", "dfdbc84")  # the grid's seed 0: not this recording's
    assert rec.recorded_commits("grid-mask-centred", tmp_path) == set()
    assert rec.recorded_commits("grid-mask", tmp_path) == {"dfdbc84"}
    provenance(centred[1][2], "abc1234")
    assert rec.recorded_commits("grid-mask-centred", tmp_path) == {"abc1234"}


def test_oracle_recording_is_the_grids_oracle_jobs_on_seeds_3_to_9_centred_first():
    # chapter 8's third box: the oracle on seeds 3-9 under both scalings, centred first, each the
    # grid of record's oracle job (config, overrides, folder) with only seed and scaling set
    rec = _recorder()
    jobs = [rec._job(j, "grid-mask-oracle") for j in rec.JOBS["grid-mask-oracle"]]
    assert [(j[0], j[1], j[3]["scale_rewards"]) for j in jobs] == [
        ("oracle", k, sc) for sc in ("none", "group") for k in range(3, 10)]
    seed0 = {j[2]: j for j in (rec._job(j, "grid-mask") for j in rec.JOBS["grid-mask"])}
    for j in jobs:
        sc = j[3]["scale_rewards"]
        assert j[2] == f"ch08/grid-mask/oracle-{sc}/seed{j[1]}"
        assert j[3:] == seed0[f"ch08/grid-mask/oracle-{sc}/seed0"][3:]
    assert rec.ONE_COMMIT["grid-mask-oracle"] is None

def test_recorder_shares_each_seeds_untrained_evaluation(tmp_path):
    # --share-initial: a seed's first arm evaluates the untrained pool; its other arms wait for
    # that file and take it (train --initial_eval), while other seeds' first arms use the cores
    rec = _recorder()
    jobs = [rec._job(j, "grid-mask-centred") for j in rec.JOBS["grid-mask-centred"]]
    runs, results = tmp_path / "runs", tmp_path / "results"
    wta3, rem3, wta4 = jobs[0], jobs[1], jobs[2]
    assert rec.donor(wta3, jobs) is None and rec.donor(rem3, jobs) == wta3
    assert rec._next(list(jobs), jobs, runs, results, share=False, busy=True) == (0, None)
    # seed 3's wta is running, its evaluation not written yet: removal waits, seed 4's wta starts
    assert rec._next(jobs[1:], jobs, runs, results, share=True, busy=True) == (1, None)
    (runs / wta3[2]).mkdir(parents=True)
    (runs / wta3[2] / "initial_eval.json").write_text("{}")
    assert rec._next(jobs[1:], jobs, runs, results, share=True, busy=True) == (0, runs / wta3[2])
    # recorded, the results' copy serves; a started job resumes with its own
    (results / wta3[2]).mkdir(parents=True)
    (results / wta3[2] / "initial_eval.json").write_text("{}")
    assert rec._next(jobs[1:], jobs, runs, results, share=True, busy=False) == (0, results / wta3[2])
    # its donor failed (not pending, nothing running, no file): removal computes its own
    (results / wta3[2] / "initial_eval.json").unlink()
    (runs / wta3[2] / "initial_eval.json").unlink()
    assert rec._next([rem3], jobs, runs, results, share=True, busy=False) == (0, None)
    assert rec._next([rem3], jobs, runs, results, share=True, busy=True) == (None, None)
    (runs / rem3[2]).mkdir(parents=True)
    (runs / rem3[2] / "config.json").write_text("{}")
    assert rec._next([rem3], jobs, runs, results, share=True, busy=True) == (0, None)
    assert rec.donor(wta4, jobs) is None
    # the batch recording (H5): every seed's removal takes its own seed's wta evaluation, and its
    # jobs differ from the grid of record's in the scaling only
    batch = [rec._job(j, "grid-mask-batch") for j in rec.JOBS["grid-mask-batch"]]
    assert [(j[0], j[1]) for j in batch] == [(s, k) for k in range(10) for s in ("wta", "removal")]
    for w, r in zip(batch[::2], batch[1::2]):
        assert rec.donor(w, batch) is None and rec.donor(r, batch) == w
        assert r[3] == {"scale_rewards": "batch", "mask_truncated_completions": True}
        assert r[2] == f"ch08/grid-mask/removal-batch/seed{r[1]}" and r[4] == "grid-stop"
    assert rec.ONE_COMMIT["grid-mask-batch"] is None


def test_cut_answers_are_sorted_by_kind():
    # scripts/ch08_cut_answers.py: a cut answer that finished its "#### n" line committed; one
    # whose marker line is unfinished, or that has no marker, did not finish a line

    cut = load_script("scripts/ch08_cut_answers.py")
    assert cut.kind_of("3 + 4 = 7.\n#### 7\n#### 7\n###") == "finished answer line"
    assert cut.kind_of("#### 1#####################") == "marker, line unfinished"
    assert cut.kind_of("First, 3 + 4 = 7 and then") == "no marker"
    rows = [{"agent": 0, "cut": True, "kind": "finished answer line"},
            {"agent": 0, "cut": False, "kind": None},
            {"agent": 1, "cut": True, "kind": "no marker"},
            {"agent": 1, "cut": True, "kind": "no marker"}]
    s = cut.summarise(rows, 2)
    assert s["all"]["cut"] == 0.75 and s["all"]["cut, no marker"] == 0.5
    assert [a["cut, finished answer line"] for a in s["per_agent"]] == [0.5, 0.0]
    for part in [s["all"], *s["per_agent"]]:  # the kinds split the cut answers
        assert part["cut"] == sum(part[f"cut, {k}"] for k in cut.KINDS)


@RECORDED_NAMES
@pytest.mark.parametrize("stop", [False, True])
def test_cut_answers_generate_as_the_run_evaluated(tmp_path, monkeypatch, stop):
    # the script regenerates a run's held-out answers with the run's own stop_at_answer, and
    # says whether they are the ones its eval.json graded (right where, and cut as often)
    from types import SimpleNamespace

    import mcpg.grpo.train as train

    cut = load_script("scripts/ch08_cut_answers.py")
    texts = ["2 + 3 = 5.\n#### 5\n", "#### 1####", "2 + 3 = 6.\n#### 6\n", "2 + 3 = 5 and"]
    seen = {}

    class Pool:
        def load_adapters(self, path):
            seen["adapters"] = path

        def generate(self, prompts, adapters, temps, max_new_tokens, **kw):
            seen.update(kw, max_new_tokens=max_new_tokens)
            return SimpleNamespace(texts=texts, truncated=[False, True, False, True])

    class FakeEngine:
        def __init__(self, cfg, signal, load_train=True):
            assert not load_train
            self.K, self.pool = 2, Pool()
            self.eval_set = [{"question": "q0", "gold": 5.0}, {"question": "q1", "gold": 6.0}]

        def prompt_rows(self, questions, m, with_base):
            return [q for q in questions for _ in range(self.K)], [0, 1] * 2, [0.5, 0.7] * 2, None

    monkeypatch.setattr(train, "Engine", FakeEngine)
    cfg = resolve_config(str(ROOT / "data" / "configs" / "ch08-grid.json"), stop_at_answer=stop)
    run = tmp_path / "run"
    (run / "adapters").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"config": dict(cfg), "signal": "wta"}))
    graded = {"agent_correct": [[1, 0], [1, 0]], "truncated": 0.5}
    (run / "eval.json").write_text(json.dumps(graded))
    assert cut.main([str(run), "--out", str(tmp_path / "out")]) == 0
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert seen["stop_at_answer"] is stop and seen["greedy"] is True
    assert seen["max_new_tokens"] == cfg["eval_max_new_tokens"]
    assert s["stop_at_answer"] is stop and s["reproduces_agent_correct"] and s["reproduces_truncated"]
    assert s["all"]["cut, marker, line unfinished"] == s["all"]["cut, no marker"] == 0.25
    # answers graded otherwise, or cut as often as the run never was, are flagged
    (run / "eval.json").write_text(json.dumps({"agent_correct": [[1, 0], [0, 0]], "truncated": 0.25}))
    cut.main([str(run), "--out", str(tmp_path / "out")])
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert not s["reproduces_agent_correct"] and not s["reproduces_truncated"]


def test_argument_errors_exit_2(capsys):
    for argv in (["evaluate", "--run", "x", "--threads", "0"],
                 ["evaluate", "--run", "x", "--threads", "two"]):
        with pytest.raises(SystemExit) as exit_:
            cli.main(argv)
        assert exit_.value.code == 2
        assert "error:" in capsys.readouterr().err


def test_threads_are_applied_and_recorded(tmp_path, no_training):
    torch.set_num_threads(2)
    assert cli.main(["train", "--config", "tiny-random", "--signal", "wta", "--output", str(tmp_path / "a"),
                     "--threads", "1", "--no-progress"]) == 0
    kind, config, signal, output, kwargs, threads = no_training[-1]
    assert (kind, config, signal, threads) == ("train", "tiny-random", "wta", 1)
    assert kwargs["threads"] == 1 and kwargs["progress"] is False  # written into the run's config.json
    # a config file's 'threads' applies when --threads is not given
    torch.set_num_threads(2)
    conf = tmp_path / "one.json"
    conf.write_text(json.dumps({"base": "tiny-random", "threads": 1}))
    argv = ["train", "--config", str(conf), "--signal", "removal", "--output", str(tmp_path / "b")]
    assert cli.main(argv) == 0
    assert no_training[-1][-1] == 1 and "threads" not in no_training[-1][4]
    # evaluate reads the run's config.json; --threads overrides it
    run = tmp_path / "run"
    run.mkdir()
    saved = {"config": {"base": "tiny-random", "threads": 1}, "signal": "wta"}
    (run / "config.json").write_text(json.dumps(saved))
    torch.set_num_threads(2)
    assert cli.main(["evaluate", "--run", str(run)]) == 0
    assert no_training[-1][-1] == 1
    assert cli.main(["evaluate", "--run", str(run), "--threads", "2"]) == 0
    assert no_training[-1][-1] == 2


def test_help_examples_parse(capsys):
    # the help shows a new run, its resumption and its evaluation, each a valid command line
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "examples:" in out
    commands = [line.strip() for line in out.splitlines() if line.strip().startswith("python -m mcpg.grpo ")]
    assert [c.split()[3] for c in commands] == ["train", "train", "evaluate"]
    assert "--resume" in commands[1] and "--config" not in commands[1]
    for c in commands:
        cli.build_parser().parse_args(c.split()[3:])


def test_only_the_known_warnings_are_hidden():
    known = [("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning,
              "transformers.modeling_utils"),
             ("Could not find a config file in tiny-random - will assume that the vocabulary was not "
              "modified.", UserWarning, "peft.utils.save_and_load")]
    other = [("`is_gradient_checkpointing` is deprecated and will be removed in v6.", FutureWarning, "mylib"),
             ("something else is deprecated", FutureWarning, "transformers.modeling_utils")]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        cli.filter_known_warnings()
        for message, category, module in known + other:
            warnings.warn_explicit(message, category, "f.py", 1, module=module)
    assert [str(w.message) for w in seen] == [m for m, _, _ in other]


def test_no_progress_hides_the_loading_bars(monkeypatch):
    gguf_utils = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    from transformers.utils import logging as hf_logging

    monkeypatch.setattr(gguf_utils, "tqdm", gguf_utils.tqdm)  # restored after the test
    enabled = hf_logging.is_progress_bar_enabled()
    try:
        cli.hide_loading_progress()
        cli.hide_loading_progress()  # idempotent
        bar = gguf_utils.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors...")
        assert bar.disable and list(bar) == [0, 1, 2]
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
        from huggingface_hub.utils import enable_progress_bars

        enable_progress_bars()


def test_python_m_prints_an_error_line_not_a_traceback(tmp_path):
    f = tmp_path / "taken"
    f.write_text("x")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "mcpg.grpo", *TRAIN, "--output", str(f)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    want = f"error: --output {f} is an existing file; give a directory (new, or a run to --resume)"
    assert proc.stderr.strip() == want


def test_exit_skips_teardown_only_under_a_distributed_launch(monkeypatch):
    # one process: an ordinary sys.exit with the code
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(SystemExit) as done:
        cli._exit(3)
    assert done.value.code == 3
    # a worker of accelerate launch / torchrun: os._exit with the same code, after flushing
    monkeypatch.setenv("WORLD_SIZE", "2")
    class HardExit(Exception):
        pass

    def hard_exit(code):
        raise HardExit(code)

    monkeypatch.setattr(cli.os, "_exit", hard_exit)
    with pytest.raises(HardExit) as done:
        cli._exit(0)
    assert done.value.args == (0,)


class _Stream:
    def __init__(self, tty: bool):
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_is_on_in_a_terminal_and_the_flags_choose(tmp_path, monkeypatch, no_training):
    assert cli.show_progress(None, _Stream(True)) is True
    assert cli.show_progress(None, _Stream(False)) is False
    assert cli.show_progress(True, _Stream(False)) is True
    assert cli.show_progress(False, _Stream(True)) is False
    monkeypatch.setattr(cli.sys, "stderr", _Stream(True))  # a terminal: bars by default
    monkeypatch.setattr(cli, "hide_loading_progress", lambda: None)
    for flags, want in (([], True), (["--no-progress"], False), (["--progress"], True)):
        assert cli.main([*TRAIN, "--output", str(tmp_path / "x"), *flags]) == 0
        assert no_training[-1][4]["progress"] is want, flags
    monkeypatch.setattr(cli.sys, "stderr", _Stream(False))  # a log file: none unless asked
    for flags, want in (([], False), (["--progress"], True)):
        assert cli.main([*TRAIN, "--output", str(tmp_path / "x"), *flags]) == 0
        assert no_training[-1][4]["progress"] is want, flags


EVAL = {"accuracy": 0.5, "initial_accuracy": 0.25, "base_accuracy": 0.125, "oracle": 0.75, "regret": 0.25,
        "agent_accuracy": [0.5, 0.25], "deployed_fraction": [0.75, 0.25], "n": 8, "signal": "removal",
        "updates": 3, "correct": [1, 0] * 4, "mu_hat": [[0.1, 0.9]] * 8}


def test_the_end_is_a_summary_and_json_on_request(tmp_path, monkeypatch, capsys):
    from mcpg.grpo import train as train_module

    monkeypatch.setattr(train_module, "train", lambda *a, **k: EVAL)
    out = tmp_path / "run"
    assert cli.main([*TRAIN, "--output", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.strip().splitlines()
    assert 3 <= len(lines) <= 5 and "{" not in text and "mu_hat" not in text
    assert f"removal run in {out}: 3 updates" in lines[0] and "8 held-out problems" in lines[0]
    assert "accuracy 0.500 (untrained pool 0.250), frozen base model 0.125" in lines[1]
    assert "0.500, 0.250; deployed 75%, 25%" in lines[2] and str(out / "eval.json") in lines[-1]
    assert cli.main([*TRAIN, "--output", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == EVAL
