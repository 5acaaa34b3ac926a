"""scripts/ch08_replay.py: a replay of a recorded run's first updates with the engine of a checkout,
compared row for row with the recording (chapter 8's H2 needs the candidates' cut flags)."""

import json
import shutil
import subprocess
import sys

import pytest

from repo_scripts import ROOT, load_script

TINY = {"base": "tiny-random", "task": "arithmetic", "updates": 3, "eval_problems": 4,
        "mask_truncated_completions": True, "seed": 5}


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """A 'recorded' run: tiny-random, arithmetic, three updates, laid out as the grid's
    removal-group seed 0 in a results folder, with the PROVENANCE.json of a recording."""
    root = tmp_path_factory.mktemp("replay")
    cfg = root / "cfg.json"
    cfg.write_text(json.dumps(TINY))
    run = root / "run"
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT / "src"),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "mcpg.grpo", "train", "--signal", "removal", "--config", str(cfg),
                    "--output", str(run), "--no-progress"], check=True, env=env, capture_output=True)
    results = root / "results"
    dest = results / "ch08" / "grid-mask" / "removal-group" / "seed0"
    dest.mkdir(parents=True)
    for name in ("config.json", "initial_eval.json", "metrics.jsonl", "slates.jsonl", "eval.json"):
        if (run / name).exists():
            shutil.copy2(run / name, dest / name)
    from mcpg.grpo.provenance import machine_info
    (dest / "PROVENANCE.json").write_text(json.dumps({"machine": machine_info()}))
    return root, results


def test_a_replay_reproduces_its_recording_and_records_the_cut_flags(recorded):
    rep = load_script("scripts/ch08_replay.py")
    root, results = recorded
    assert rep.main(["--code", str(ROOT), "--runs", str(root / "runs"), "--results", str(results),
                     "--only", "removal-group/seed0", "--updates", "2"]) == 0
    out = results / "ch08" / "replay" / "removal-group" / "seed0"
    check = json.loads((out / "REPLAY.json").read_text())
    assert check["rule"].startswith("bit for bit") and check["agree"] == 2 and not check["differences"]
    assert check["initial_eval_identical"]
    slates = [json.loads(x) for x in (out / "slates.jsonl").read_text().splitlines()]
    assert len(slates) == 2 and all("cut" in s and "tokens" in s for s in slates)
    assert json.loads((out / "PROVENANCE.json").read_text())["commit"]
    # the comparison sees a changed value, in the metrics and in the slates
    rec = results / "ch08" / "grid-mask" / "removal-group" / "seed0"
    run = root / "runs" / "removal-group" / "seed0"
    rows = [json.loads(x) for x in (rec / "metrics.jsonl").read_text().splitlines()]
    rows[1]["reward"] = rows[1]["reward"] + 1e-9
    bad = root / "bad"
    shutil.copytree(rec, bad)
    (bad / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = rep.compare(run, bad, 2)
    assert c["agree"] == 1 and c["differences"] == ["2: metrics reward"]
    assert rep.compare(run, bad, 2, rtol=1e-6)["agree"] == 2  # a cross-CPU tolerance accepts it
    s = [json.loads(x) for x in (rec / "slates.jsonl").read_text().splitlines()]
    s[0]["I"][0] = 1 - s[0]["I"][0]  # a different deployed candidate: never within a tolerance
    (bad / "slates.jsonl").write_text("".join(json.dumps(r) + "\n" for r in s))
    c = rep.compare(run, bad, 2, rtol=1e-3)
    assert c["agree"] == 0 and "1: slates I" in c["differences"]
    with pytest.raises(ValueError, match="updates logged"):
        rep.compare(run, rec, 5)


def test_replay_refuses_an_unknown_job(recorded, capsys):
    rep = load_script("scripts/ch08_replay.py")
    with pytest.raises(SystemExit):
        rep.main(["--results", str(recorded[1]), "--only", "removal-group/seed7"])
    assert "no recorded run" in capsys.readouterr().err
