"""Peak resident memory of a training run, phase by phase (issue 10's CPU memory target).

Runs :func:`mcpg.grpo.train.train` in this process while a thread samples the resident set
size (``psutil``, every 5 ms) and attributes each sample to the phase running then: loading
(``Engine`` construction), each evaluation, each update's rollout generation, and each
micro-batch's scoring forward pass and backward pass. Prints and writes (JSON) the peak of each
phase and the process's ``VmHWM``, which is what ``/usr/bin/time -v`` reports as "Maximum
resident set size" (a high-water mark the kernel updates lazily, so a sample may pass it by
a few pages). The issue's run, the default here, is 1 update of 2 prompts x 3 agents
x 4 completions of 128 new tokens, micro-batch 8, ``cpu-smoke`` otherwise::

    OMP_NUM_THREADS=1 python benchmarks/bench_memory.py [--config cpu-smoke] [--set key=value ...]
        [--out benchmarks/results/cpu-memory.json]

The same run measured from outside (the figure of the target)::

    /usr/bin/time -v python -m mcpg.grpo train --config run.json --signal removal \\
        --output /tmp/run --threads 1 --no-progress

with ``run.json`` = ``{"base": "cpu-smoke", "updates": 1, "max_completion_length": 128,
"train_micro_batch": 8}``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

ISSUE_RUN = {"updates": 1, "prompts_per_update": 2, "completions_per_agent": 4, "max_completion_length": 128,
             "train_micro_batch": 8, "threads": 1, "progress": False}


class PhasePeaks:
    """Peak RSS per phase, sampled by a daemon thread; phases nest (``evaluate/generate``)."""

    def __init__(self, interval: float = 0.005):
        import psutil

        self._proc, self._interval = psutil.Process(), interval
        self._stack: list[str] = []
        self.peaks: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        rss, phase = self._proc.memory_info().rss, "/".join(self._stack) or "between phases"
        if rss > self.peaks.get(phase, 0):
            self.peaks[phase] = rss

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            time.sleep(self._interval)

    @contextlib.contextmanager
    def phase(self, name: str):
        """Run the body as phase ``name``, sampled also on entry and exit (a phase shorter than
        the sampling interval still gets a peak)."""
        self._stack.append(name)
        self.sample()
        try:
            yield
        finally:
            self.sample()
            self._stack.pop()

    def wrap(self, owner, attr: str, name: str):
        """Replace ``owner.attr`` by a wrapper running it as phase ``name``; returns an undo."""
        inner = getattr(owner, attr)

        @functools.wraps(inner)
        def wrapped(*args, **kwargs):
            with self.phase(name):
                return inner(*args, **kwargs)

        setattr(owner, attr, wrapped)
        return lambda: setattr(owner, attr, inner)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        time.sleep(2 * self._interval)
        self._stop.set()
        self._thread.join()


def _vm_hwm() -> int | None:
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def measure(config: str | dict, overrides: dict, signal: str = "removal") -> dict:
    """Train in this process with RSS sampled per phase; returns the peaks (bytes)."""
    from mcpg.grpo import agents, train

    undo = []
    with PhasePeaks() as peaks, tempfile.TemporaryDirectory() as out:
        undo.append(peaks.wrap(train.Engine, "__init__", "load"))
        undo.append(peaks.wrap(train.Engine, "evaluate", "evaluate"))
        undo.append(peaks.wrap(train.Engine, "update", "update"))
        undo.append(peaks.wrap(agents.AgentPool, "generate", "generate"))
        undo.append(peaks.wrap(agents.AgentPool, "token_logprobs", "score"))
        undo.append(peaks.wrap(torch.Tensor, "backward", "backward"))
        try:
            t0 = time.perf_counter()
            train.train(config, signal, Path(out) / "run", **overrides)
            wall = time.perf_counter() - t0
        finally:
            for f in reversed(undo):
                f()
    return {"phases_peak_rss_bytes": dict(sorted(peaks.peaks.items(), key=lambda kv: -kv[1])),
            "vm_hwm_bytes": _vm_hwm(), "wall_s": wall}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="cpu-smoke")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="a config override on top of the issue's run (value as JSON), e.g. "
                         "eval_batch_size=16")
    ap.add_argument("--out", default=None, help="JSON path (default: print only)")
    args = ap.parse_args(argv)
    overrides = dict(ISSUE_RUN)
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = json.loads(value)
    torch.set_num_threads(overrides.get("threads") or torch.get_num_threads())
    result = {"config": args.config, "overrides": overrides, **measure(args.config, overrides)}
    for phase, b in result["phases_peak_rss_bytes"].items():
        print(f"{b / 2**30:7.3f} GiB  {phase}")
    print(f"{result['vm_hwm_bytes'] / 2**30:7.3f} GiB  VmHWM (the run's peak)")
    if args.out:
        from mcpg.grpo._runtime import write_json
        write_json(Path(args.out), result)
        print(f"written to {args.out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
