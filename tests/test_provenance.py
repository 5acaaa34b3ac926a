"""Provenance: one commit state, one writer, train() records its calls, the recorder adds its
timings (and still records code that writes no provenance), and one reader for every variant
committed under data/results."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mcpg.grpo import provenance as pv
from repo_scripts import load_script  # tests/repo_scripts.py

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "data" / "results"
FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"


def _git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True,
                          env=env).stdout.strip()


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    _git(path, "init", "-q")
    (path / "a.txt").write_text("a\n")
    _git(path, "add", "a.txt")
    _git(path, "commit", "-qm", "a")
    return path


def test_commit_state_is_dirty_for_tracked_changes_only(tmp_path):
    repo = _repo(tmp_path / "repo")
    head = _git(repo, "rev-parse", "HEAD")
    assert pv.commit_state(repo) == {"commit": head, "dirty": False}
    (repo / "new.txt").write_text("untracked\n")  # untracked: not dirty
    assert pv.commit_state(repo)["dirty"] is False
    (repo / "a.txt").write_text("changed\n")  # a tracked file changed: dirty
    assert pv.commit_state(repo) == {"commit": head, "dirty": True}
    _git(repo, "add", "a.txt")  # staged counts too
    assert pv.commit_state(repo)["dirty"] is True
    assert pv.commit_state(tmp_path / "nowhere-a-repo") == {"commit": None, "dirty": None}


# --- the reader, on the committed files themselves ---------------------------------------------

def _committed() -> list[Path]:
    files = sorted(RESULTS.rglob("PROVENANCE.json"))
    assert len(files) > 60
    return files


def test_read_provenance_reads_every_committed_variant():
    keys = {"commit", "dirty", "started", "finished", "commands", "machine", "seed", "wall_s",
            "user_s", "updates_s", "notes", "calls"}
    variants = set()
    for f in _committed():
        raw = json.loads(f.read_text())
        variants.add(tuple(sorted(raw)))
        got = pv.read_provenance(f)
        assert set(got) == keys, f
        assert isinstance(got["commit"], str) and len(got["commit"]) >= 7, f
        assert raw["commit"].startswith(got["commit"])
        assert got["dirty"] in (True, False, None) and got["dirty"] == raw.get("dirty"), f
        assert got["started"] and got["commands"] and isinstance(got["commands"][0], str), f
        assert isinstance(got["machine"]["nproc"], int) and got["machine"]["python"] == "3.11.7", f
        assert got["updates_s"] == raw.get("updates_s")
        assert all(isinstance(v, str) for v in got["notes"].values())
    assert len(variants) >= 5  # recorders' with and without updates_s/resume_note, hand-written ones
    # the three variants of the masked grid's recorder
    grid = [json.loads(f.read_text()) for f in RESULTS.glob("ch08/grid*/*/seed*/PROVENANCE.json")]
    assert any("resume_note" in g for g in grid) and any("updates_s" not in g for g in grid)
    hand = pv.read_provenance(RESULTS / "ch08" / "control")  # the hand-written schema
    raw = json.loads((RESULTS / "ch08/control/PROVENANCE.json").read_text())
    assert hand["user_s"] == raw["time"]["user_s"]
    two = pv.read_provenance(RESULTS / "ch08")  # one record of two runs
    assert len(two["commands"]) == 2 and two["dirty"] is None and set(two["wall_s"]) == {"wta", "removal"}


@pytest.mark.parametrize("name", ["ch07/grid.json", "ch07/reversal.json", "ch09/budget.json"])
def test_read_provenance_reads_the_results_files_one_line_machine(name):
    raw = json.loads((RESULTS / name).read_text())
    got = pv.read_provenance(raw)
    sha = raw["commit"].removesuffix("+dirty-src")
    assert got["commit"] == sha and len(sha) == 40
    assert got["dirty"] is (True if raw["commit"].endswith("+dirty-src") else raw.get("dirty"))
    assert got["machine"]["description"] == raw["machine"]
    assert pv.read_provenance({"commit": "abc+dirty-src"})["dirty"] is True  # the suffix is read


# --- train() writes its own provenance; a resumed run appends its call -------------------------

@pytest.mark.usefixtures("one_torch_thread")
def test_train_writes_provenance_and_a_resume_appends_its_call(tmp_path, monkeypatch):
    from mcpg.grpo.train import train

    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))
    run = tmp_path / "run"
    assert train("tiny-random", "wta", run, updates=2, stop_after=1) is None
    first = json.loads((run / "PROVENANCE.json").read_text())
    assert {k: first[k] for k in ("commit", "dirty")} == pv.commit_state(ROOT)
    assert first["machine"]["nproc"] and len(first["calls"]) == 1 and "resume_note" not in first
    train("tiny-random", "wta", run, resume=True)
    second = json.loads((run / "PROVENANCE.json").read_text())
    assert len(second["calls"]) == 2 and second["calls"][0] == first["calls"][0]
    assert second["started"] == first["started"] and second["commit"] == second["calls"][1]["commit"]
    assert pv.read_provenance(run)["calls"] == second["calls"]


# --- the recorder: old code (no provenance of its own) and new code ------------------------------

FAKE_TRAIN = '''
import json, sys
from pathlib import Path
a = sys.argv[1:]
out = Path(a[a.index("--output") + 1])
out.mkdir(parents=True, exist_ok=True)
cfg = json.loads(Path(a[a.index("--config") + 1]).read_text())
(out / "config.json").write_text(json.dumps({"config": cfg, "signal": a[a.index("--signal") + 1]}))
rows = [{"update": u, "seconds": {"total": 2.0}} for u in (1, 2)]
(out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\\n" for r in rows))
for f in ("slates.jsonl", "initial_eval.json"):
    (out / f).write_text("{}\\n")
(out / "eval.json").write_text(json.dumps({"accuracy": 0.5}))
OWN
'''
OWN = '''
import subprocess
head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
(out / "PROVENANCE.json").write_text(json.dumps({"commit": head, "dirty": False,
    "calls": [{"command": "x", "started": "2026-01-01T00:00:00+00:00", "commit": head,
               "dirty": False, "machine": {"nproc": 99}}]}))
'''


def _fake_code(path: Path, writes_own: bool) -> str:
    """A checkout whose ``python -m mcpg.grpo train`` writes a run directory in no time:
    without a PROVENANCE.json of its own (as dfdbc84's train) or with one."""
    repo = _repo(path)
    grpo = repo / "src" / "mcpg" / "grpo"
    grpo.mkdir(parents=True)
    (repo / "src" / "mcpg" / "__init__.py").write_text("")
    (grpo / "__init__.py").write_text("")
    (grpo / "__main__.py").write_text(textwrap.dedent(FAKE_TRAIN).replace("OWN", OWN if writes_own else ""))
    (repo / "data" / "configs").mkdir(parents=True)
    for name in ("ch08-grid-stop.json", "ch08-grid-stop-control.json"):
        (repo / "data" / "configs" / name).write_text((ROOT / "data" / "configs" / name).read_text())
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "fake train")
    return _git(repo, "rev-parse", "HEAD")


def _recorder():
    return load_script("scripts/ch08_record.py")


@pytest.mark.parametrize("writes_own", [False, True])
def test_recorder_writes_the_grids_schema_for_old_and_new_code(tmp_path, monkeypatch, writes_own):
    rec = _recorder()
    monkeypatch.setattr(rec, "PARKED", tmp_path / "parked")
    monkeypatch.setattr(rec.time, "sleep", lambda s: None)
    code, runs, results = tmp_path / "code", tmp_path / "runs", tmp_path / "results"
    head = _fake_code(code, writes_own)
    # the recording so far: one run of the grid, recorded at the fake code's commit
    grid = sorted(RESULTS.glob("ch08/grid-mask/*/seed*/PROVENANCE.json"))
    schema = json.loads(grid[0].read_text())
    done = results / "ch08/grid-mask/wta-group/seed0"
    done.mkdir(parents=True)
    (done / "PROVENANCE.json").write_text(json.dumps({**schema, "commit": head}))
    (done / "eval.json").write_text("{}")
    job = "ch08/grid-mask/removal-group/seed3"
    argv = ["grid-mask", "--only", job, "--code", str(code), "--runs", str(runs), "--results", str(results)]
    assert rec.main(argv) == 0
    prov = json.loads((results / job / "PROVENANCE.json").read_text())
    current = [json.loads(f.read_text()) for f in grid if "updates_s" in f.read_text()]
    # the grid's schema; runs recorded by code that writes its own record (the centred additions at
    # 95ffaa9) add the calls
    assert current and all(list(g) in (list(schema), list(schema) + ["calls"])
                           for g in current if "resume_note" not in g)
    if writes_own:  # the code's own record wins; the recorder adds its timings and the calls
        assert list(prov) == list(schema) + ["calls"]
        assert prov["commit"] == head and prov["machine"] == {"nproc": 99}
        assert prov["started"] == "2026-01-01T00:00:00+00:00"
    else:  # dfdbc84's train: the recorder's own commit state of --code, in the grid's schema
        assert list(prov) == list(schema)
        assert prov["commit"] == head and prov["dirty"] is False
        # the grid's machine fields, and the library versions recorded since (issue 60)
        assert set(schema["machine"]) <= set(prov["machine"])
        assert set(prov["machine"]) - set(schema["machine"]) <= set(pv.LIBRARIES)
    assert prov["updates_s"] == 4 and prov["seed"] == 3 and "--signal removal" in prov["command"]
    assert prov["overrides"] == {"scale_rewards": "group", "mask_truncated_completions": True}
    for f in rec.COPIED:
        assert (results / job / f).exists()
    # a second run of the recorder: the job is recorded, nothing starts
    assert rec.main(argv) == 0
    assert json.loads((results / job / "PROVENANCE.json").read_text())["finished"] == prov["finished"]
    # a checkout at another commit is refused: one recording, one commit
    (code / "a.txt").write_text("b\n")
    _git(code, "commit", "-qam", "another commit")
    with pytest.raises(SystemExit):
        rec.main(argv[:1] + ["--code", str(code), "--runs", str(runs), "--results", str(results)])


def test_recorder_status_and_park_still_read_the_grid(tmp_path, capsys):
    rec = _recorder()
    assert rec.main(["grid-mask", "--status", "--runs", str(tmp_path), "--results", str(RESULTS)]) == 0
    out = capsys.readouterr().out
    assert "ch08/grid-mask/wta-group/seed0" in out and "recorded" in out and out.count("\n") == len(
        rec.JOBS["grid-mask"]) + 1
    assert rec.park("grid-mask", tmp_path / "none", tmp_path / "parked") == []


def test_scripts_use_the_library_provenance():
    scripts = ROOT / "scripts"
    assert not (scripts / "_provenance.py").exists()
    for f in scripts.glob("*.py"):
        text = f.read_text()
        assert '"rev-parse"' not in text and "from _provenance" not in text, f.name
    assert sys.modules.get("mcpg.grpo.provenance") is pv


# --- which code ran: the imported package's own origin, and the libraries' versions ------------

def test_code_origin_of_this_checkout_is_its_tree():
    origin = pv.code_origin()
    assert origin["source"] == "tree" and Path(origin["path"]) == ROOT
    assert {k: origin[k] for k in ("commit", "dirty")} == pv.commit_state(ROOT) == pv.commit_state()
    assert len(origin["sha256"]) == 64


ORIGIN = "import json; from mcpg.grpo.provenance import code_origin; print(json.dumps(code_origin()))"


@pytest.mark.parametrize("direct", [
    {"url": "git+https://example.invalid/mcpg.git", "vcs_info": {"vcs": "git", "commit_id": "78f6ab0" * 5}},
    {"url": "file:///somewhere/mcpg", "dir_info": {}},
])
def test_an_installed_copy_inside_a_checkout_records_its_own_origin(tmp_path, direct):
    # a virtual environment inside a checkout holds a non-editable install: the record is the
    # installer's (PEP 610 direct_url.json), not the HEAD of the checkout around it
    checkout = _repo(tmp_path / "checkout")
    head = _git(checkout, "rev-parse", "HEAD")
    (checkout / ".gitignore").write_text("venv/\n")
    site = checkout / "venv" / "site-packages"
    shutil.copytree(ROOT / "src" / "mcpg", site / "mcpg", ignore=shutil.ignore_patterns("__pycache__"))
    info = site / "mcpg-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mcpg\nVersion: 0.1.0\n")
    (info / "direct_url.json").write_text(json.dumps(direct))
    files = [p.relative_to(site).as_posix() for p in (site / "mcpg").rglob("*.py")]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site), "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", ORIGIN], cwd=checkout, env=env, capture_output=True,
                          text=True, check=True)
    origin = json.loads(done.stdout)
    assert origin["source"] == "installed" and origin["path"] == str(site / "mcpg")
    assert origin["commit"] != head and origin["url"] == direct["url"]
    if "vcs_info" in direct:
        assert origin["commit"] == direct["vcs_info"]["commit_id"] and origin["dirty"] is False
    else:  # installed from a folder: its commit is not known, and not guessed
        assert origin["commit"] is None and origin["dirty"] is None
    assert origin["sha256"] == pv.code_origin()["sha256"]  # the same files as this checkout's


def test_machine_info_records_the_libraries_versions(monkeypatch):
    from importlib import metadata

    info = pv.machine_info()
    assert set(pv.LIBRARIES) == {"torch", "transformers", "peft", "trl", "accelerate", "datasets"}
    for name in pv.LIBRARIES:
        assert name in info
    assert info["torch"] == metadata.version("torch") and info["peft"] == metadata.version("peft")
    real = metadata.version

    def version(name):
        if name == "trl":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(metadata, "version", version)
    assert pv.machine_info()["trl"] is None  # absent: None, not left out


@pytest.mark.usefixtures("one_torch_thread")
def test_a_run_records_its_problems_code_and_libraries(tmp_path, monkeypatch):
    from mcpg.grpo.gsm8k import load_gsm8k, problems_sha256
    from mcpg.grpo.train import train

    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))
    run = tmp_path / "run"
    train("tiny-random", "wta", run, updates=1, progress=False)
    prov = json.loads((run / "PROVENANCE.json").read_text())
    data = prov["data"]
    assert data["source"] == str(FIXTURE.resolve()) and data["task"] == "gsm8k"
    assert data["eval_sha256"] == problems_sha256(load_gsm8k("test", data_dir=FIXTURE))
    assert data["eval_n"] == 4
    assert data["train_sha256"] == problems_sha256(load_gsm8k("train", data_dir=FIXTURE))
    assert prov["calls"][0]["data"] == data and prov["calls"][0]["call"] == "train"
    assert prov["code"]["source"] == "tree" and prov["code"]["commit"] == prov["commit"]
    assert all(prov["machine"][name] for name in pv.LIBRARIES)  # all installed here
