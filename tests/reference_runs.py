"""Reference runs for the bit-for-bit test of the engine (tests/test_grpo_reference.py).

Each case is a recorded configuration (chapter 8's ``data/configs/ch08-grid-stop.json``, with
the flags its grid was run with) or the tiny config, on the tiny random model, for two
updates, on one torch thread. A random model is never right, so every credit would be 0:
the rewards are a hash of each completion's text (about half right), as in
tests/test_grpo_train.py, so that credit, advantages and the actor update all do something.

``python tests/reference_runs.py OUT`` records every case into ``OUT/<case>/``: the run
directory's JSON files (metrics, slates, evaluations, config) and ``weights.json``, the
SHA-256 of every final adapter and router tensor. The committed fixture
``tests/fixtures/reference/`` was recorded so at commit a1a7339, before the engine's
refactor (issue 47), with that commit's source on ``PYTHONPATH``.
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "data" / "configs" / "ch08-grid-stop.json"
FILES = ("config.json", "initial_eval.json", "metrics.jsonl", "slates.jsonl", "eval.json")

# name: (config, signal, overrides); every case on the tiny random model for two updates
CASES: dict[str, tuple[str, str, dict]] = {
    # the masked grid's configuration (chapter 8), removal and oracle credit
    "grid-mask-removal": (str(GRID), "removal", dict(scale_rewards="group", mask_truncated_completions=True,
                                                      eval_every=1, eval_problems=16)),
    "grid-mask-oracle": (str(GRID), "oracle", dict(scale_rewards="none", mask_truncated_completions=True,
                                                    eval_every=1, eval_problems=16)),
    # chapter 9's budgeted branch, with several optimizer steps per rollout (clip fraction > 0)
    # and micro-batches
    "budget-iterations": ("tiny-random", "removal", dict(exact_budget=0.5, num_iterations=2,
                                                         clip_eps_high=0.28, train_micro_batch=3,
                                                         learning_rate=0.2, prompts_per_update=4,
                                                         eval_initial=True)),
    # winner-take-all with the sequence-normalised loss and unscaled advantages
    "wta-grpo-none": ("tiny-random", "wta", dict(loss_type="grpo", scale_rewards="none",
                                                  prompts_per_update=4, train_micro_batch=5)),
}


# SmolLM2-135M (the grid's model) for one update with its real rewards; slow (minutes), so
# recorded and compared only when asked (``MCPG_SMOLLM2_REFERENCE=1``)
SMOL_CASES: dict[str, tuple[str, str, dict]] = {
    "smollm2-grid-mask-removal": (str(GRID), "removal", dict(scale_rewards="group",
                                                              mask_truncated_completions=True,
                                                              eval_initial=False, eval_problems=8)),
}


def hashed_reward(text, gold, truncated=False):
    """A deterministic stand-in for the reward: about half the completions are right."""
    return float(zlib.crc32(text.encode()) % 2)


def weight_files(run: Path) -> dict[str, Path]:
    """Every final weight file of a run directory, by the name the fixture gives it: each agent's
    adapter as ``<name>.safetensors`` (peft's ``adapters/<name>/adapter_model.safetensors``, or the
    bare ``adapters/<name>.safetensors`` of runs recorded before it), and ``router.safetensors``."""
    files = {}
    for f in sorted((run / "adapters").iterdir()):
        if f.is_dir():
            files[f"{f.name}.safetensors"] = f / "adapter_model.safetensors"
        elif f.suffix == ".safetensors":
            files[f.name] = f
    files["router.safetensors"] = run / "router.safetensors"
    return files


def weight_digests(run: Path) -> dict[str, str]:
    """SHA-256 of every final adapter and router tensor of a run directory."""
    from safetensors.torch import load_file

    out = {}
    for name, f in weight_files(run).items():
        for k, t in sorted(load_file(str(f)).items()):
            out[f"{name}:{k}"] = hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()
    return out


def run_case(name: str, out: Path) -> Path:
    """Train case ``name`` into ``out/name`` (the caller sets one torch thread and the reward)."""
    from mcpg.grpo.train import train

    smol = name in SMOL_CASES
    config, signal, overrides = (SMOL_CASES if smol else CASES)[name]
    run = out / name
    kw = dict(overrides)
    if config != "tiny-random" and not smol:
        kw["model"] = "tiny-random"
    with warnings.catch_warnings():  # the cases name keys as a1a7339 did (clip_eps_high: epsilon_high now)
        warnings.filterwarnings("ignore", r"config key '\w+' is now '\w+' \(TRL's name\)", FutureWarning)
        train(config, signal, run, updates=1 if smol else 2, progress=False, **kw)
    (run / "weights.json").write_text(json.dumps(weight_digests(run), indent=1, sort_keys=True) + "\n")
    return run


def read_case(run: Path) -> dict:
    """Every recorded value of a case, ``seconds`` (wall time) and the per-agent diagnostics added
    after the recording (:data:`mcpg.grpo.rundir.AGENT_DIAGNOSTICS`) removed; ``config.json``'s
    config as :func:`mcpg.grpo.configs.saved_config` reads it (so a config key added after the recording,
    such as ``beta`` or ``signal``, compares at the value that reproduces the recorded run, and a key
    renamed since, such as ``clip_eps_high``, under its new name)."""
    from mcpg.grpo.rundir import AGENT_DIAGNOSTICS

    got = {}
    for f in FILES + ("weights.json",):
        p = run / f
        if not p.exists():
            got[f] = None
        elif f.endswith(".jsonl"):
            rows = [json.loads(line) for line in p.read_text().splitlines() if line.strip()]
            for r in rows:
                r.pop("seconds", None)
                for k in AGENT_DIAGNOSTICS:  # logged since issue 60, after the recording
                    r.pop(k, None)
            got[f] = rows
        else:
            got[f] = json.loads(p.read_text())
    if got["config.json"] is not None:  # the config as the engine reads it back: a key added since
        from mcpg.grpo.configs import saved_config  # the recording takes the value that reproduces it

        saved = got["config.json"]  # (the signal recorded beside the config, an old name as its new one)
        got["config.json"] = {**saved, "config": saved_config(saved).to_dict()}
    return got


def main(out: str, smol: bool = False) -> None:
    import torch

    import mcpg.grpo.train as train_module

    torch.set_num_threads(1)
    if not smol:
        train_module.reward = hashed_reward
    for name in SMOL_CASES if smol else CASES:
        run = run_case(name, Path(out))
        for sub in ("adapters", "checkpoint"):
            import shutil

            shutil.rmtree(run / sub, ignore_errors=True)
        (run / "router.safetensors").unlink()
        print(name, "recorded")


if __name__ == "__main__":
    main(sys.argv[1], smol="--smollm2" in sys.argv[2:])
