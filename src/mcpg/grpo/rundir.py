"""A run directory's schema: its file names, every key it logs, the one writer of its rows, and
:func:`read_run`.

Files (written by :func:`mcpg.grpo.train.train` through :class:`RunWriter`; ``scripts/gpu_session.py``
writes through it too)::

    config.json          the resolved config, the signal, where the model came from, processes; the
                         reward functions and datasets of your own (mcpg.grpo.custom), when given
    PROVENANCE.json      commit, dirty, code origin, machine, command of each call; the problems read
                         (source, SHA-256) (mcpg.grpo.provenance)
    initial_eval.json    the evaluation of the untrained pool (config key eval_initial)
    metrics.jsonl        one row per update: METRICS_KEYS (meanings: mcpg.grpo.train's table)
    slates.jsonl         one row per update: "update" and SLATE_KEYS (+ SLATE_BUDGET_KEYS with an
                         exact budget), one entry per slate of the rollout
    eval.json            the final evaluation: EVAL_FILE_KEYS
    adapters/, router.safetensors, checkpoint/    weights and the resumable state

Every key the engine logs is declared here once; tests/test_grpo_rundir.py fails when the engine
logs a key these lists lack, or declares one it does not log.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ._runtime import json_default, write_json
from .objective import ADVANTAGE_EPS

__all__ = ["CONFIG", "PROVENANCE", "INITIAL_EVAL", "METRICS", "SLATES", "EVAL", "CHECKPOINT", "ADAPTERS",
           "ROUTER", "PER_AGENT_METRICS", "SCALAR_METRICS", "ROW_KEYS", "METRICS_KEYS", "AGENT_DIAGNOSTICS",
           "TOKEN_MEANS",
           "SLATE_KEYS", "SLATE_BUDGET_KEYS", "EVAL_FILE_KEYS", "REWARD_EVAL_KEYS", "metrics_row",
           "slates_row", "RunWriter", "Run", "read_run", "read_comparison", "read_json", "read_jsonl"]

CONFIG, PROVENANCE, INITIAL_EVAL = "config.json", "PROVENANCE.json", "initial_eval.json"
METRICS, SLATES, EVAL = "metrics.jsonl", "slates.jsonl", "eval.json"
CHECKPOINT, ADAPTERS, ROUTER = "checkpoint", "adapters", "router.safetensors"

PER_AGENT_METRICS = ("agent_accuracy", "selected_fraction", "credit_mean", "zero_std_fraction",
                     "zero_std_reward_fraction", "loss")
"""The metrics.jsonl keys that hold one value per agent (in the config's agent order)."""

SCALAR_METRICS = ("reward", "oracle", "entropy", "brier", "specialization", "truncated",
                  "completion_tokens", "clip_fraction", "router_loss", "router_slates",
                  "exact_evaluations", "feedback_cost", "exact_share", "exact_share_expected")
"""The metrics.jsonl keys that hold one value per update."""

ROW_KEYS = ("update", "signal", "seconds")
"""The metrics.jsonl keys that are not metrics (the update's number, the signal, wall times
``rollout``, ``actor``, ``total``), and ``eval`` (an evaluation, every ``eval_every`` updates)."""

METRICS_KEYS = ROW_KEYS + PER_AGENT_METRICS + SCALAR_METRICS
"""Every key of a metrics.jsonl row (``eval`` aside, which only some rows hold)."""

AGENT_DIAGNOSTICS: dict[str, str] = {
    "agent/grad_norm": "its adapter's gradient norm before clipping (clip_grad_norm_'s return, TRL's "
                       "grad_norm), mean over the rollout's optimizer steps",
    "agent/entropy": "mean entropy (nats) of its policy at its sampling temperature over its trained "
                     "tokens, before the first step (TRL's entropy)",
    "agent/advantage_std": "standard deviation of its advantages over the rollout's completions",
    "agent/clip_low": "share of its trained tokens with ratio below 1 - epsilon and a negative advantage "
                      "(TRL's clip_ratio/low_mean), over the rollout's steps",
    "agent/clip_high": "share with ratio above 1 + epsilon_high and a positive advantage "
                       "(TRL's clip_ratio/high_mean)",
    "agent/approx_kl": "mean (r - 1) - log r over its trained tokens and steps (CleanRL's approx_kl; "
                       "0 with num_iterations 1)",
    "agent/kl": "mean KL term to the frozen base model over its trained tokens (TRL's kl; 0 when beta is 0)",
}
"""The actor update's per-agent diagnostics, one value per agent (config order) under the ``agent/``
namespace, each with its meaning. Rows of runs recorded before they existed lack them."""

TOKEN_MEANS = ("agent/entropy", "agent/clip_low", "agent/clip_high", "agent/approx_kl", "agent/kl")
"""The :data:`AGENT_DIAGNOSTICS` that are means over an agent's trained tokens: null (None) for an
agent with none in the update (every completion of it cut at the token budget under
``mask_truncated_completions``), where a mean is undefined, not 0."""

SLATE_KEYS = ("R", "I", "G", "p", "P", "mu_hat", "score", "cut", "tokens")
"""The slates.jsonl keys, each one entry per slate (rewards (K), the deployed index, its reward, the
propensities (K), the leave-one-out propensities (K x K), the outcome estimates (K), the credit
scores (K), cut at the token budget (K), completion lengths (K))."""

SLATE_BUDGET_KEYS = ("exact_z", "exact_p")
"""The slates.jsonl keys with an exact budget (config key ``exact_budget`` > 0), evaluated
exactly and its probability; under ``allocation="leverage"`` also ``exact_a``, the gradient
leverage of each candidate (K) that the allocation used."""

EVAL_FILE_KEYS = ("accuracy", "entropy", "brier", "specialization", "oracle", "regret", "base_accuracy",
                  "agent_accuracy", "deployed_fraction", "n", "n_specialty", "correct", "base_correct",
                  "agent_correct", "best_of_k", "uniform_accuracy", "uniform_correct", "router_auc",
                  "router_auc_within", "mu_hat", "strict_accuracy", "flexible_accuracy", "truncated")
"""Keys of an evaluation (initial_eval.json; a metrics row's ``eval``), and :data:`REWARD_EVAL_KEYS`
with reward functions of your own; eval.json adds
``signal``, ``updates`` and, with an initial evaluation, ``initial_accuracy``, ``initial_correct``,
``initial_agent_accuracy`` and ``initial_deployed_fraction`` (and ``initial_reward``)."""

REWARD_EVAL_KEYS = ("reward", "agent_reward", "base_reward")
"""Keys of an evaluation with reward functions of your own (:mod:`mcpg.grpo.custom`): the mean
reward of the deployed answers, of each agent's, of the frozen model's, beside the accuracies,
which count only the full reward 1."""


def _mean(x) -> float | None:
    x = np.asarray(x, dtype=float)
    return float(x.mean()) if x.size else None


def metrics_row(log: dict, K: int, *, update: int, signal: str, losses: list[float], router_loss: float,
                clip_fraction: float, router_slates: int, seconds: dict,
                diagnostics: dict[str, list[float]] | None = None) -> dict:
    """One metrics.jsonl row (:data:`METRICS_KEYS`; meanings: :mod:`mcpg.grpo.train`'s table, and
    ``diagnostics``, the :data:`AGENT_DIAGNOSTICS` of the actor update, checked against them) from
    the rollout's log gathered over processes: per slate ``R`` (K), ``G``, ``I``, ``entropy``,
    ``brier``, ``score`` (K), ``zero_std`` and ``zero_std_reward`` (K, per group), ``exact_z``,
    ``exact_p``; per matched slate ``spec``; per completion ``len`` and ``trunc``."""
    R, I = np.array(log["R"]), np.array(log["I"])  # noqa: E741 (the paper's name)
    n_exact = int(np.sum(log["exact_z"]))
    return {
        "update": update,
        "signal": signal,
        "reward": _mean(log["G"]),
        "agent_accuracy": R.mean(0).tolist(),
        "oracle": _mean(R.max(1)),
        "entropy": _mean(log["entropy"]),
        "brier": _mean(log["brier"]),
        "specialization": _mean(log["spec"]),
        "selected_fraction": [float((I == k).mean()) for k in range(K)],
        "credit_mean": np.array(log["score"]).mean(0).tolist(),
        "exact_evaluations": n_exact,
        "feedback_cost": n_exact * (K - 1),
        "exact_share": n_exact / len(log["exact_z"]),
        "exact_share_expected": _mean(log["exact_p"]),
        "loss": losses,
        "router_loss": router_loss,
        "completion_tokens": _mean(log["len"]),
        "truncated": _mean(log["trunc"]),
        "zero_std_fraction": np.array(log["zero_std"], dtype=float).mean(0).tolist(),
        "zero_std_reward_fraction": np.array(log["zero_std_reward"], dtype=float).mean(0).tolist(),
        "clip_fraction": clip_fraction,
        "router_slates": router_slates,
        **_diagnostics(diagnostics or {}, K),
        "seconds": seconds,
    }


def _diagnostics(diagnostics: dict, K: int) -> dict:
    unknown = sorted(set(diagnostics) - set(AGENT_DIAGNOSTICS))
    if unknown or any(len(v) != K for v in diagnostics.values()):
        raise ValueError(f"diagnostics must be AGENT_DIAGNOSTICS keys with one value per agent, got "
                         f"{ {k: len(v) for k, v in diagnostics.items()} }")
    return {k: [None if x is None else float(x) for x in v] for k, v in diagnostics.items()}


def model_card(agent: dict, instruction: str, base_model: str, run: dict) -> str:
    """The ``README.md`` of an agent's adapter folder (a Hugging Face model card): the base model,
    the role it was trained with (the system message it reads), the run's provenance (``run``:
    ``folder``, ``signal``, ``updates``, ``agents``, ``commit``, ``dirty``, ``code_sha256``,
    ``reward``, ``data``) and how to load it with PEFT alone."""
    system = f"{agent['role']} {instruction}" if instruction else agent["role"]
    if base_model == "tiny-random":
        load = ("from mcpg.grpo.models import load_base  # tiny-random is built in code\n"
                "from peft import PeftModel\n\n"
                "base, tokenizer, _ = load_base(\"tiny-random\")\n"
                f"model = PeftModel.from_pretrained(base, {str(run['adapter'])!r})")
    else:
        load = ("from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer\n\n"
                f"model = AutoPeftModelForCausalLM.from_pretrained({str(run['adapter'])!r})\n"
                f"tokenizer = AutoTokenizer.from_pretrained({base_model!r})")
    lines = [
        "---", f"base_model: {base_model}", "library_name: peft", "tags: [lora, grpo, mcpg]", "---", "",
        f"# Agent `{agent['name']}` of a routed GRPO pool", "",
        f"One of {len(run['agents'])} LoRA agents ({', '.join(run['agents'])}) trained together by "
        f"`mcpg.grpo` with a learned router and {run['signal']} credit, {run['updates']} updates.", "",
        "## Role", "",
        "Its system message in training and evaluation (the role, then the config's instruction):",
        "", "```text", system, "```", "",
        f"Sampling temperature {agent.get('temperature', 1.0)}; specialty {agent.get('specialty')}.", "",
        "## Provenance", "",
        f"- run folder: `{run['folder']}` (config.json, PROVENANCE.json, metrics.jsonl, eval.json)",
        f"- code: commit {run['commit']} (dirty: {run['dirty']}), mcpg SHA-256 {run['code_sha256']}",
        f"- base model: {base_model}", f"- reward: {run['reward']}", f"- data: {run['data']}", "",
        "## Load it", "", "```python", load,
        "messages = [{\"role\": \"system\", \"content\": " + repr(system) + "},",
        "            {\"role\": \"user\", \"content\": \"...\"}]",
        "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\",",
        "                                       return_dict=True)",
        "answer = model.generate(**inputs, max_new_tokens=64, do_sample=False)", "```", "",
    ]
    return "\n".join(lines)


def slates_row(log: dict, budget: bool) -> dict:
    """The update's slates.jsonl entries (:data:`SLATE_KEYS`, and :data:`SLATE_BUDGET_KEYS` on an
    exact budget, with ``exact_a`` when the log holds it) from the same gathered log: every
    candidate's reward is known here, so Eq. (19) can be checked against the exact removal
    contribution on real LLM slates."""
    keys = SLATE_KEYS + (SLATE_BUDGET_KEYS if budget else ())
    if budget and "exact_a" in log:
        keys += ("exact_a",)
    return {k: log[k] for k in keys}


class RunWriter:
    """The one writer of a run directory's rows and files (call on the main process only)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)

    def config(self, cfg: dict, signal: str, model_source: str, processes: int, **recorded) -> None:
        """``config.json``: the config, the signal, the model's source, the processes, and
        ``recorded`` (the reward functions and datasets of your own, when given)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        write_json(self.folder / CONFIG, {"config": cfg, "signal": signal, "model_source": model_source,
                                          "processes": processes, **recorded})

    def model_cards(self, agents: list[dict], instruction: str, base_model: str, **run) -> None:
        """Each agent's ``model_card`` as ``adapters/<name>/README.md`` (replacing peft's
        template), with this run's provenance from ``PROVENANCE.json``."""
        path = self.folder / PROVENANCE
        prov = json.loads(path.read_text()) if path.is_file() else {}
        run = {"folder": str(self.folder.resolve()), "agents": [a["name"] for a in agents],
               "commit": prov.get("commit"), "dirty": prov.get("dirty"),
               "code_sha256": (prov.get("code") or {}).get("sha256"), **run}
        for a in agents:
            folder = self.folder / ADAPTERS / a["name"]
            text = model_card(a, instruction, base_model, {**run, "adapter": folder.resolve()})
            (folder / "README.md").write_text(text, encoding="utf-8")

    def json(self, name: str, value: dict) -> None:
        """``initial_eval.json`` or ``eval.json``."""
        write_json(self.folder / name, value)

    def update(self, row: dict, slates: dict | None = None) -> str:
        """Append a metrics row (and the update's slates); returns the row's JSON line."""
        line = json.dumps(row, default=json_default)
        with open(self.folder / METRICS, "a") as fh:
            fh.write(line + "\n")
        if slates is not None:
            with open(self.folder / SLATES, "a") as fh:
                fh.write(json.dumps({"update": row["update"], **slates}, default=json_default) + "\n")
        return line

    def truncate(self, step: int) -> None:
        """Drop the rows after update ``step`` (a resumed run continues from its checkpoint)."""
        for name in (METRICS, SLATES):
            path = self.folder / name
            if path.exists():
                rows = [ln for ln in path.read_text().splitlines()
                        if ln.strip() and json.loads(ln)["update"] <= step]
                path.write_text("".join(r + "\n" for r in rows))


@dataclass
class Run:
    """One recorded run directory.

    Attributes:
        path: the directory.
        config: the resolved config (``config.json``'s ``config``, as recorded: keys added since
            are absent; an old key name, :data:`mcpg.grpo.configs.ALIASES`, reads as its new one).
        signal: ``wta``, ``removal`` or ``oracle``.
        agents: the agents' names, in the config's order (the order of every per-agent list).
        metrics: ``metrics.jsonl`` as a frame, one row per update (lists kept as lists).
        eval: ``eval.json`` (None when the run has not finished).
        initial_eval: ``initial_eval.json`` (None when the config skipped it or the run predates it).
        slates: ``slates.jsonl`` rows (empty when absent).
        provenance: ``PROVENANCE.json`` of the directory (None when absent).
    """

    path: Path
    config: dict
    signal: str
    agents: list[str]
    metrics: pd.DataFrame
    eval: dict | None = None
    initial_eval: dict | None = None
    slates: list[dict] = field(default_factory=list)
    provenance: dict | None = None

    @property
    def label(self) -> str:
        """A run's name in tables, ``signal``, or ``<arm> seed<k>`` for a run of a comparison
        (a directory named ``seed<k>``) or with a seed other than 0.

        The arm (:attr:`arm`) is the signal in a comparison laid out by signal; in a grid it
        is the folder's name, so two arms of one signal and seed (``removal-group seed0`` and
        ``removal-b0.1-group seed0``) keep apart in :func:`~mcpg.grpo.health.health` and
        :func:`~mcpg.grpo.heldout.eval_table`.
        """
        seed = self.config.get("seed", 0)
        in_comparison = self.path.name.startswith("seed")
        return f"{self.arm} seed{seed}" if seed or in_comparison else self.signal

    @property
    def arm(self) -> str:
        """The name of the folder above ``seed<k>`` (the arm of a grid or comparison, such as
        ``removal-group`` or ``control``), or the signal for a run outside one."""
        return self.path.parent.name if self.path.name.startswith("seed") else self.signal

    @property
    def scale_rewards(self) -> str:
        """The run's advantage scaling (``"group"`` for a recording that predates the key: the
        engine's default)."""
        return self.config.get("scale_rewards", "group")

    @property
    def advantage_eps(self) -> float:
        """The ``eps`` of the run's standardised advantages (``ADVANTAGE_EPS``, 1e-4, for a
        recording that predates the key)."""
        return float(self.config.get("advantage_eps", ADVANTAGE_EPS))

    @property
    def slates_per_update(self) -> int:
        """Slates per rollout (prompts per update times m)."""
        return int(self.config["prompts_per_update"] * self.config["completions_per_agent"])


def read_json(path: Path):
    return json.loads(path.read_text()) if path.is_file() else None


def read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_run(path: str | os.PathLike) -> Run:
    """Read a run directory (``config.json`` and ``metrics.jsonl`` required; the rest optional)."""
    path = Path(path)
    saved = read_json(path / CONFIG)
    if saved is None:
        raise FileNotFoundError(f"{path} holds no config.json: not a run directory")
    rows = read_jsonl(path / METRICS)
    if not rows:
        raise FileNotFoundError(f"{path} holds no metrics.jsonl rows")
    from .configs import canonical_keys

    cfg = canonical_keys(saved["config"], warn=False)  # a recording's old key names as their new ones
    return Run(path=path, config=cfg, signal=saved["signal"], agents=[a["name"] for a in cfg["agents"]],
               metrics=pd.DataFrame(rows), eval=read_json(path / EVAL),
               initial_eval=read_json(path / INITIAL_EVAL), slates=read_jsonl(path / SLATES),
               provenance=read_json(path / PROVENANCE))


def read_comparison(folder: str | os.PathLike) -> list[Run]:
    """Every run of a comparison laid out as ``<folder>/<signal>/seed<k>/``, sorted by signal and seed.

    Folders without a ``config.json`` (a run still being written) are skipped.
    """
    folder = Path(folder)
    runs = [read_run(f.parent) for f in folder.glob("*/seed*/config.json")
            if (f.parent / "metrics.jsonl").is_file()]
    return sorted(runs, key=lambda r: (r.signal, r.config.get("seed", 0)))
