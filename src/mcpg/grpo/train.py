"""Multi-agent GRPO with a learned router under filtered feedback: the training loop (paper §8).

One update, top to bottom (:func:`train`):

1. **Rollout.** Draw ``prompts_per_update`` GSM8K problems. Every agent (a LoRA adapter)
   samples m completions of every problem, all agents in one mixed-adapter batch; the
   g-th completions of the K agents form slate g.
2. **Rewards.** ``R^(j) = 1`` when the answer candidate j commits to equals the gold answer:
   its ``#### <n>``, or its final number if it ended by itself; a completion cut at the
   token budget without a marker earns 0 (:func:`mcpg.grpo.gsm8k.reward`). Or your own reward
   functions, on your own data, as TRL calls them (:mod:`mcpg.grpo.custom`).
3. **Routing.** The current router scores every candidate (``s_j``), gives the propensities
   of Eq. (3) and the outcome estimates ``mu_hat_j = sigmoid(s_j)``; it draws the deployed
   candidate ``I ~ p`` and only ``G = R^(I)`` is fed back (filtered feedback).
4. **Credit.** The signal scores each agent on each slate (:func:`mcpg.grpo.objective.credit`;
   the signals are registered in :mod:`mcpg.grpo.credits`):
   ``wta`` = ``1{I=i} G``; ``removal`` = Eq. (19) with the logged propensities; ``oracle``
   (diagnostic) = exact removal contribution with every candidate's reward. With
   ``exact_budget`` > 0, removal evaluates a share of the slates exactly, chosen by Eq. (22)
   (``allocation``), and credits Eq. (21)'s corrected estimate
   (:func:`mcpg.grpo.objective.budgeted_removal`; chapter 9). Allocation ``leverage`` fixes
   the evaluation probabilities before the draw from each completion's gradient leverage,
   read off the rollout (:func:`leverage_proxy`).
5. **Advantages.** Each agent's scores are standardised within its group of m completions
   (or centred: ``scale_rewards``). The draw of I, the credit and the advantages are one call,
   :func:`mcpg.grpo.objective.route_and_credit`, the one the simulated pool makes too.
6. **Actor update.** The clipped GRPO loss (TRL's token-level convention, ``loss_type``
   ``dapo`` by default) on each agent's own adapter; gradients clipped per agent; AdamW (its
   learning rate constant, or scheduled: ``lr_scheduler_type``).
7. **Router update.** Only now the router learns, from this rollout's selected feedback, by
   inverse-propensity-weighted cross-entropy; it was fixed while the actors updated.

Evaluation (:func:`evaluate_pool`): each agent answers each held-out problem greedily,
the router deploys the highest-scoring candidate; we report accuracy, routing entropy
(nats, of Eq. 3's propensities), the Brier score of the deployed candidate's ``mu_hat``,
specialization (the fraction of keyword-matched problems deployed to the agent with that
specialty), oracle accuracy (some candidate is right), regret (oracle - accuracy), and
the frozen base model's greedy accuracy as the single-agent reference.

Run directory (its schema, file names and declared keys: :mod:`mcpg.grpo.rundir`)::

    config.json          the resolved config, the signal, where the model came from; the reward
                         functions and datasets of your own (mcpg.grpo.custom), when given
    PROVENANCE.json      commit, dirty, code origin, machine and library versions, command; the
                         problems read (source, SHA-256); one entry per call, evaluations too
                         (mcpg.grpo.provenance)
    initial_eval.json    the evaluation of the untrained pool (config key eval_initial)
    metrics.jsonl        one JSON row per update
    slates.jsonl         one JSON row per update: the logged slates (R, I, G, p, P, mu_hat, score,
                         and per candidate cut (at the token budget) and tokens (its length);
                         with an exact budget also exact_z, exact_p: evaluated, its probability;
                         under allocation "leverage" also exact_a: each completion's leverage)
    eval.json            accuracy, entropy, brier, specialization, oracle, regret, ...
    adapters/<agent>/, router.safetensors    the final weights (each agent in peft's format)
    checkpoint/          adapters, router, optimizer states (and the learning rate schedule's), router
                         replay, RNG states, update counter

Logged metrics (``metrics.jsonl``, one row per update; per-agent lists are in the config's
agent order). Like TRL's "logged metrics", every key is listed here:

=============================== ==================================================================
key                             meaning
=============================== ==================================================================
``update``                      the update's number (1, 2, ...)
``signal``                      ``wta``, ``removal``, ``oracle`` (or another registered signal)
``reward``                      mean deployed reward G = R^(I) of the rollout (what the system earned)
``agent_accuracy``              per agent: mean R^(i) of its sampled completions
``oracle``                      share of slates where some candidate is right
``entropy``                     mean routing entropy of Eq. (3)'s propensities (nats)
``brier``                       mean (mu_hat_I - G)^2 of the deployed candidate
``specialization``              share of keyword-matched slates deployed to the matching agent
``selected_fraction``           per agent: share of slates that deployed it (near 1 for one agent:
                                routing collapse)
``credit_mean``                 per agent: mean credit score before standardisation
``exact_evaluations``           slates evaluated exactly (every candidate's reward queried; config key
                                ``exact_budget``, removal only; 0 otherwise)
``feedback_cost``               reward queries beyond the deployed ones: K - 1 per exact evaluation
``exact_share``                 realised budget share: exact evaluations / slates of the rollout
``exact_share_expected``        mean evaluation probability of the rollout's slates (its expectation;
                                ``exact_budget`` whenever every slate has a positive predicted error;
                                under allocation ``leverage`` up to one slate's share below it)
``zero_std_fraction``           per agent: share of its groups (m completions of one prompt) whose
                                credit scores have zero spread: no learning signal there
``zero_std_reward_fraction``    per agent: share of its groups whose own rewards R^(i) are all equal
``clip_fraction``               share of completion tokens in the clipped region (TRL's
                                ``clip_ratio/region_mean``); 0 when ``num_iterations`` is 1
``loss``                        per agent: its clipped GRPO loss
``router_loss``                 the router's IPW cross-entropy after its update
``router_slates``               slates in the router's replay (what it was fitted on)
``completion_tokens``           mean completion length (tokens)
``truncated``                   share of completions cut at ``max_completion_length`` (not ended by EOS
                                nor, with ``stop_at_answer``, by a finished answer line)
``seconds``                     wall time of the rollout, the actor update and the whole update
``agent/...``                   per agent: the actor update's diagnostics (gradient norm, policy
                                entropy, advantage spread, clipped shares, approximate KL, KL to
                                the base), each declared with its meaning in
                                ``mcpg.grpo.rundir.AGENT_DIAGNOSTICS``
``eval``                        an evaluation (keys below), every ``eval_every`` updates
=============================== ==================================================================

Evaluation (``eval.json``, ``initial_eval.json`` and ``eval`` above):

=============================== ================================================================
key                             meaning
=============================== ================================================================
``accuracy``                    deployed greedy answer correct (router picks the top score)
``entropy``, ``brier``          as above, on the held-out problems
``specialization``              as above (None when no problem matches a specialty)
``oracle``, ``regret``          some agent right; oracle - accuracy
``base_accuracy``               the frozen base model with a neutral prompt
``agent_accuracy``              per agent: its greedy accuracy
``deployed_fraction``           per agent: share of problems the router deploys it on
``n``, ``n_specialty``          held-out problems; those some specialty matches
``correct``                     per problem: 1 if the deployed answer is right (paired tests)
``base_correct``                per problem: 1 if the frozen model is right
``agent_correct``               per problem: K ints, each agent's correctness
``best_of_k``                   some agent right (the same number as ``oracle``; read beside
                                ``agent_accuracy``: what the actors can do, apart from routing)
``uniform_accuracy``            deployed accuracy under a uniform router: mean of ``agent_accuracy``
``uniform_correct``             per problem: the share of agents right (its expectation per problem)
``router_auc``                  ROC AUC of ``mu_hat`` for the candidates' rewards, all held-out
                                candidates pooled (0.5: no information; None with one class)
``router_auc_within``           the same over pairs (right, wrong) of one problem's candidates:
                                what ranking within a slate, i.e. routing, needs
``mu_hat``                      per problem: K floats, the outcome model's estimates
``strict_accuracy``             deployed answer right by its ``#### n`` marker only (lm-eval's
                                strict-match)
``flexible_accuracy``           deployed answer right by markers, else its last number, cut or not
                                (lm-eval's flexible-extract); ``accuracy`` is the committed answer's
``truncated``                   share of the agents' held-out answers cut at ``eval_max_new_tokens``
``initial_accuracy``            ``accuracy`` of the untrained pool (eval.json only)
``initial_correct``             its per-problem list (paired with ``correct``)
``initial_agent_accuracy``      its per-agent accuracy
``initial_deployed_fraction``   its deployment shares
``reward``, ``agent_reward``    with reward functions of your own: the mean reward of the deployed
                                answers, of each agent's (accuracy counts only the full reward 1)
``base_reward``                 the same of the frozen base model
``initial_reward``              ``reward`` of the untrained pool (eval.json only)
``signal``, ``updates``         the run's signal and number of updates
=============================== ================================================================

``--resume`` continues from ``checkpoint/``; on a CPU with the same seed it ends with
the same metrics as a run that was never interrupted (tests/test_grpo_train.py).

A run directory belongs to one run: a new run goes into a new or empty directory; ``--resume``
continues with the run's own config.json (a config given with it must agree with it), on the
problems whose SHA-256 the run recorded, and never to fewer updates than its checkpoint holds;
``evaluate`` reads a finished run's final weights on the same problems. Each refusal is a
ValueError, raised before the directory is touched (tests/test_grpo_bad_input.py).

Several GPUs (data parallel): ``accelerate launch --num_processes N -m mcpg.grpo train ...``.
Each process takes every N-th problem of each rollout (``prompts_per_update`` must be a
multiple of N) and its own share of the evaluation problems; the actor loss is normalised
by the global token counts and the adapters' gradients are summed across processes
before the step, so the update equals the single-process one on the whole batch; the
router trains on the gathered selected feedback of all processes, identically in each.
Only the main process writes the run directory; after every update the processes check
that they hold identical adapters and router (a RuntimeError otherwise). On a CPU, two
processes (gloo) run with ``accelerate launch --multi_gpu --num_processes 2 -m mcpg.grpo
train --config tiny-random ...`` (``--multi_gpu`` only selects accelerate's torchrun
launcher; a config with ``device: cpu`` keeps every process on the CPU); the tests do this.
A resumed data-parallel run needs the same number of processes.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import shlex
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import routing
from ..stats import roc_auc, within_slate_auc
from . import credits, custom, rundir
from ._report import MetricsReport, check_available
from ._runtime import Dist, rng_state, set_rng_state, write_json
from .agents import BASE, AgentPool, AgentSpec, Rollout
from .configs import GRPOConfig, canonical_keys, check_config, dataset_defaults, resolve_config, saved_config
from .custom import RewardScorer
from .gsm8k import (
    GSM8K_DIR_ENV,
    gsm8k_source,
    is_correct,
    load_gsm8k,
    problems_sha256,
    question_specialty,
    reward,
)
from .models import base_model_id
from .objective import clipped_grpo_loss, route_and_credit, zero_std_groups
from .provenance import add_call, code_origin, start_run
from .router import CandidateFeatures, Router
from .rundir import RunWriter
from .slates import Slates

__all__ = ["train", "evaluate_run", "evaluate_pool", "Engine", "leverage_proxy", "CustomTask", "custom_task"]

log = logging.getLogger(__name__)


@dataclass
class CustomTask:
    """What a run was given beyond its config (:mod:`mcpg.grpo.custom`): reward functions and
    datasets. ``rewards`` None: the default reward (:func:`mcpg.grpo.gsm8k.reward`); ``train`` and
    ``eval`` None: the config's task's problems. Made by :func:`custom_task`."""

    rewards: RewardScorer | None = None
    train: list[dict] | None = None
    eval: list[dict] | None = None
    train_source: str | None = None
    eval_source: str | None = None

    @property
    def datasets(self) -> bool:
        return self.eval is not None

    def recorded(self) -> dict:
        """What config.json records beside the config (nothing for the default reward and data)."""
        out = {}
        if self.rewards is not None:
            out["reward_funcs"] = self.rewards.names
            out["reward_sources"] = self.rewards.sources
        if self.train_source is not None:
            out["train_dataset"] = self.train_source
        if self.eval_source is not None:
            out["eval_dataset"] = self.eval_source
        return out


def _recorded_rewards(names: list[str]) -> list:
    """The reward functions a run recorded, imported again (a ValueError saying to pass them)."""
    funcs = []
    for name in names:
        try:
            funcs.append(custom.import_reward(name))
        except ValueError as err:
            raise ValueError(f"the run was trained with reward function {name}, which does not import here "
                             f"({err}): pass the same function (reward_funcs, --reward_funcs)") from None
    return funcs


def _recorded_dataset(saved: dict, what: str, given):
    """A dataset given again, or the path the run recorded (in-memory data must be given again)."""
    recorded = saved.get(what)
    if given is not None or recorded is None:
        return given
    if not Path(recorded).is_absolute():
        raise ValueError(f"the run read {what} from a {recorded}: pass it again ({what}=...)")
    return recorded


def custom_task(cfg: GRPOConfig, reward_funcs=None, train_dataset=None, eval_dataset=None,
                saved: dict | None = None, load_train: bool = True) -> CustomTask:
    """Check and read the reward functions and datasets of a run (:mod:`mcpg.grpo.custom`), before
    any model loads. ``saved``: the run's config.json (resume, evaluate): functions given must be
    the ones it records, by name; none given, the recorded ones are imported and the recorded
    dataset paths read."""
    funcs = custom.reward_functions(reward_funcs)
    if saved is not None:
        recorded = saved.get("reward_funcs")
        given = None if funcs is None else [custom.reward_name(f) for f in funcs]
        if given is not None and given != recorded:
            was = f"reward functions {recorded}" if recorded else "the default reward"
            raise ValueError(f"reward_funcs {given} differ from the run's ({was}, config.json): pass the "
                             "run's own, or start a new run in a new output")
        if funcs is None and recorded:
            funcs = _recorded_rewards(recorded)
        if funcs is not None:
            custom.check_same_sources(saved.get("reward_sources"), funcs)
        if load_train:
            train_dataset = _recorded_dataset(saved, "train_dataset", train_dataset)
        eval_dataset = _recorded_dataset(saved, "eval_dataset", eval_dataset)
    if load_train and (train_dataset is None) != (eval_dataset is None):
        raise ValueError("give train_dataset and eval_dataset together (--train_dataset, --eval_dataset): "
                         "the evaluation needs held-out rows of the same kind")
    if eval_dataset is not None and funcs is None:
        raise ValueError("a dataset of your own needs reward_funcs (--reward_funcs module:function): the "
                         "default reward reads GSM8K's gold answers")
    if funcs is None and cfg.reward_weights is not None:
        raise ValueError("config key 'reward_weights' weighs reward_funcs, and none are given: give "
                         "reward_funcs or drop reward_weights")
    task = CustomTask(rewards=custom.RewardScorer(funcs, cfg.reward_weights) if funcs else None)
    if load_train and train_dataset is not None:
        rows, task.train_source = custom.load_rows(train_dataset, "train_dataset")
        task.train = custom.dataset_problems(rows, "train_dataset")
    if eval_dataset is not None:
        rows, task.eval_source = custom.load_rows(eval_dataset, "eval_dataset")
        task.eval = custom.dataset_problems(rows, "eval_dataset")
    return task


def _load_split(cfg: GRPOConfig, split: str, task: CustomTask | None = None) -> list[dict]:
    """The config's problems of ``split``: GSM8K (``task: gsm8k``, from ``data_dir``, ``$MCPG_GSM8K_DIR``
    or the hub), chapter 8's arithmetic task generated in memory (``task: arithmetic``), or the rows
    of a dataset of your own (``task``, :func:`custom_task`). A split too small for the config is a
    ValueError naming the config key and the data's source."""
    cfg = check_config(cfg)
    key = "train_problems" if split == "train" else "eval_problems"
    n = getattr(cfg, key)
    if task is not None and task.datasets:
        rows, what = (task.train, "train_dataset") if split == "train" else (task.eval, "eval_dataset")
        if n is not None:
            if n > len(rows):
                raise ValueError(f"config key {key!r} ({n}) exceeds the {len(rows)} rows of {what}: give "
                                 f"{key} at most {len(rows)}, or null for all")
            rows = [rows[i] for i in random.Random(cfg.data_seed).sample(range(len(rows)), int(n))]
        return list(rows)
    if cfg.task == "gsm8k":
        source = gsm8k_source(cfg.data_dir)
        if n is not None:
            whole = load_gsm8k(split, data_dir=cfg.data_dir)
            if n > len(whole):
                raise ValueError(f"config key {key!r} ({n}) exceeds the {len(whole)} problems of GSM8K's "
                                 f"{split} split in {source}: give {key} at most {len(whole)}, "
                                 "or null for all")
        return load_gsm8k(split, n=n, seed=cfg.data_seed, data_dir=cfg.data_dir)
    from .arithmetic import task_split

    rows = task_split("train" if split == "train" else "test")
    if n is not None:
        if n > len(rows):
            raise ValueError(f"config key {key!r} ({n}) exceeds the {len(rows)} problems of the arithmetic "
                             f"task's {split} split: give {key} at most {len(rows)}, or null for all")
        rows = [rows[i] for i in random.Random(cfg.data_seed).sample(range(len(rows)), int(n))]
    return [{"question": r["question"], "answer": r["answer"], "gold": r["gold"]} for r in rows]


def data_source(cfg, task: CustomTask | None = None) -> str:
    """Where the config's problems come from: a GSM8K folder's absolute path, the hub dataset,
    the arithmetic task generated in memory, or the datasets of your own (``task``)."""
    if task is not None and task.datasets:
        if task.train_source in (None, task.eval_source):
            return task.eval_source
        return f"{task.train_source} (training), {task.eval_source} (held-out)"
    cfg = check_config(cfg)
    if cfg.task == "gsm8k":
        return gsm8k_source(cfg.data_dir)
    return "mcpg.grpo.arithmetic (generated in memory)"


def data_record(cfg, train_set: list[dict] | None, eval_set: list[dict],
                task: CustomTask | None = None) -> dict:
    """What a run records of its problems (``PROVENANCE.json``'s ``data``): the task (``dataset`` for
    datasets of your own), the source (:func:`data_source`), for each split the number of problems
    and their SHA-256 (:func:`mcpg.grpo.gsm8k.problems_sha256`, or
    :func:`mcpg.grpo.custom.problems_sha256` of a dataset's rows, in the order used), and the
    reward functions of your own by name. ``train_set`` None: not read."""
    mine = task is not None and task.datasets
    digest = custom.problems_sha256 if mine else problems_sha256
    rec = {"task": "dataset" if mine else check_config(cfg).task, "source": data_source(cfg, task)}
    if train_set is not None:
        rec.update(train_n=len(train_set), train_sha256=digest(train_set))
    rec.update(eval_n=len(eval_set), eval_sha256=digest(eval_set))
    if task is not None and task.rewards is not None:
        rec["reward_funcs"] = task.rewards.names
        rec["reward_sources"] = task.rewards.sources
    return rec


def load_problems(cfg, load_train: bool = True, task: CustomTask | None = None
                  ) -> tuple[list[dict] | None, list[dict]]:
    """The config's problems (or ``task``'s datasets), ``(train, eval)`` (train None unless
    ``load_train``): what :class:`Engine` trains and evaluates on, read before any model loads."""
    return (_load_split(cfg, "train", task) if load_train else None), _load_split(cfg, "test", task)


TRAINING_ONLY_KEYS = (
    "name", "signal", "updates", "prompts_per_update", "completions_per_agent",
    "max_completion_length", "generation_batch_size", "train_micro_batch", "train_problems",
    "learning_rate", "lr_scheduler_type", "weight_decay", "max_grad_norm", "epsilon",
    "epsilon_high", "loss_type", "num_iterations", "advantage_eps", "scale_rewards", "beta",
    "router_lr", "router_steps", "router_replay", "mask_truncated_completions", "eval_every",
    "checkpoint_every", "progress", "threads", "gradient_checkpointing", "report_to")
"""Config keys that only the updates read; two runs that differ only in these (the arms of one
seed of a grid: their signal and scaling) evaluate the same untrained pool the same way. Every
other key, the held-out problems, the model file and the code enter :func:`initial_eval_key`;
a key left off this list can only refuse a sharing, never allow a wrong one."""


def initial_eval_key(config: dict, data: dict | None, model_source: str | None,
                     code_sha256: str | None) -> dict:
    """What the evaluation of the untrained pool (``initial_eval.json``) depends on: the config but
    :data:`TRAINING_ONLY_KEYS`, the held-out problems (their task, source, number and SHA-256), the
    model file the run loaded, and the SHA-256 of the engine's code
    (:func:`mcpg.grpo.provenance.code_origin`)."""
    cfg = saved_config(config).to_dict()  # a recorded config reads as it was written
    held_out = {k: (data or {}).get(k) for k in ("task", "source", "eval_n", "eval_sha256", "reward_funcs",
                                                 "reward_sources")}
    return {"config": {k: v for k, v in cfg.items() if k not in TRAINING_ONLY_KEYS}, "held_out": held_out,
            "model_source": model_source, "code_sha256": code_sha256}


def shared_initial_eval(source: str | os.PathLike, cfg, data: dict, model_source: str) -> Path:
    """The ``initial_eval.json`` of the run directory ``source``, checked to be the evaluation this
    run would compute: its :func:`initial_eval_key` (from its ``config.json`` and
    ``PROVENANCE.json``) must equal this run's; a ValueError naming what differs otherwise."""
    src = Path(source)
    files = [src / rundir.INITIAL_EVAL, src / rundir.CONFIG, src / "PROVENANCE.json"]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"initial_eval {src} is not a run directory with an untrained evaluation "
                         f"(no {', '.join(missing)})")
    saved, prov = (json.loads(f.read_text()) for f in files[1:])
    theirs = initial_eval_key(saved["config"], prov.get("data"), saved.get("model_source"),
                              (prov.get("code") or {}).get("sha256"))
    ours = initial_eval_key(cfg.to_dict(), data, model_source, code_origin()["sha256"])
    if theirs != ours:
        differ = [f"config key {k!r}" for k in sorted(set(ours["config"]) | set(theirs["config"]))
                  if ours["config"].get(k) != theirs["config"].get(k)]
        differ += [k.replace("_", " ") for k in ("held_out", "model_source", "code_sha256")
                   if ours[k] != theirs[k]]
        raise ValueError(f"initial_eval {src} evaluated another untrained pool ({', '.join(differ)} "
                         "differ): give a run of the same seed, config and code, or none to evaluate it here")
    return files[0]


def check_same_problems(recorded: dict | None, now: dict, run: Path, what: str) -> None:
    """Refuse ``now`` (a :func:`data_record`) when its problems differ from the ones ``recorded``
    in the run's ``PROVENANCE.json``. A run recorded before that record is checked on what it
    has: the number of held-out problems its evaluations (initial_eval.json, eval.json) hold."""
    if not recorded:
        for name in (rundir.INITIAL_EVAL, rundir.EVAL):
            path = run / name
            n = json.loads(path.read_text()).get("n") if path.is_file() else None
            if n is not None and n != now["eval_n"]:
                raise ValueError(f"{what}: {now['source']} gives {now['eval_n']} held-out problems, run "
                                 f"{run} was evaluated on {n} ({name}): read the problems the run used")
        return
    for split in ("train", "eval"):
        key = f"{split}_sha256"
        if key in recorded and key in now and recorded[key] != now[key]:
            words = "training" if split == "train" else "held-out"
            source = recorded.get("source")
            hint = (f"give the datasets the run read ({source})" if recorded.get("task") == "dataset"
                    else f"point config key data_dir or ${GSM8K_DIR_ENV} at {source}"
                    if str(source).startswith("/") else f"read them from {source}")
            raise ValueError(
                f"{what}: the {words} problems read from {now['source']} (SHA-256 {now[key][:12]}...) "
                f"differ from the ones run {run} used (SHA-256 {recorded[key][:12]}...): {hint}")


def check_model_spec(spec: str) -> None:
    """Refuse, before anything loads, a config key ``model`` that names a local path which is not
    a model folder: a missing folder (which the hub would read as a malformed repo id) or one
    without ``config.json`` (an empty folder). Hub ids (``org/name``) and the named models pass."""
    if spec in ("tiny-random", "smollm2-135m"):
        return
    path = Path(spec).expanduser()
    looks_local = path.is_absolute() or spec.startswith((".", "~")) or spec.count("/") != 1 or path.exists()
    if not looks_local:
        return  # a hub id, org/name
    if not path.exists():
        raise ValueError(f"config key 'model': {spec} does not exist; give a model folder (with "
                         "config.json), a hub id (org/name) or 'tiny-random'")
    if not path.is_dir() or not (path / "config.json").is_file():
        has_gguf = path.is_dir() and any(path.glob("*.gguf"))
        raise ValueError(f"config key 'model': {spec} is not a model folder (it has no config.json"
                         f"{'; a GGUF file needs the named model smollm2-135m' if has_gguf else ''}); "
                         "give a folder saved by save_pretrained, or a hub id")


def leverage_proxy(sampler_logprobs: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    """A cheap proxy of each completion's gradient leverage ‖Ψ‖ = ‖∇ Σ_t log π_T(y_t)‖ (Eq. 22).

    √Σ_t (1 − π_t)² over the completion's counted tokens (``mask``), π_t the sampler's own
    probability of token t (at the agent's temperature; ``generate(..., keep_logprobs=True)``):
    the norm of a token's score with respect to its logits is √((1 − π_t)² + Σ_{v≠y} π_v²),
    at least 1 − π_t. Its correlation with the exact norm over SmolLM2-135M's LoRA adapters
    is measured by ``scripts/ch09_leverage.py`` (``data/results/ch09/leverage.json``). A row
    the loss leaves out (mask all 0) gets 0. Returns (N,).
    """
    lp = sampler_logprobs.double()
    m = mask.to(lp.dtype)
    q = (1.0 - torch.exp(torch.where(m > 0, lp, torch.zeros_like(lp)))) * m
    return torch.sqrt((q**2).sum(1)).numpy()


def _mean(x) -> float | None:
    x = np.asarray(x, dtype=float)
    return float(x.mean()) if x.size else None


def _mean_known(x: list) -> float | None:
    """The mean, or None when some value is unknown (None)."""
    return None if any(v is None for v in x) else _mean(x)


# ------------------------------------------------------------------------------------------
# the engine: model, agents, router, optimizers, and one update
# ------------------------------------------------------------------------------------------
class Engine:
    """Everything a run holds: data, base model with K adapters, router, optimizers, RNGs.

    Built from a resolved config (:func:`mcpg.grpo.configs.resolve_config`) and a signal.
    :meth:`update` performs one update; :meth:`evaluate` the held-out evaluation.
    """

    def __init__(self, cfg: GRPOConfig | dict, signal: str | None = None, dist: Dist | None = None,
                 load_train: bool = True, data: tuple[list[dict] | None, list[dict]] | None = None,
                 rewards: RewardScorer | None = None):
        """``signal``: the config's signal where it has none
        (:meth:`mcpg.grpo.configs.GRPOConfig.with_signal`). ``data``: the problems, ``(train, eval)``,
        already read (:func:`load_problems`); by default the config's, read here, before the model
        loads. ``rewards``: reward functions of your own (:class:`mcpg.grpo.custom.RewardScorer`);
        None: :func:`mcpg.grpo.gsm8k.reward`."""
        from .models import load_base

        cfg = check_config(cfg).with_signal(signal)
        self.cfg, self.signal, self.rewards = cfg, cfg.signal, rewards
        signal = cfg.signal
        if cfg.threads:  # as the command line does: one thread avoids oversubscribed cores
            torch.set_num_threads(cfg.threads)
        device = cfg.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"config {cfg.name!r} needs a CUDA GPU (device='cuda'); none is available")
        self.dist = dist or Dist(device)
        if cfg.scale_rewards == "batch" and self.dist.world > 1:  # each process would see its own batch
            raise ValueError("config key 'scale_rewards': 'batch' needs one process (not data parallel)")
        seed = cfg.seed
        torch.manual_seed(seed + 100_003 * self.dist.rank)
        random.seed(seed + self.dist.rank)
        self.data_rng = np.random.default_rng([seed, 1])  # same in every process: which problems
        self.select_rng = np.random.default_rng([seed, 2, self.dist.rank])  # the router's draws I
        # exact evaluations on a budget (removal only; the registry's rule): their own draws Z
        self.budget = credits.exact_budget(signal, cfg.exact_budget, cfg.allocation)
        self.budget_rng = np.random.default_rng([seed, 3, self.dist.rank])
        # allocation "leverage" reads each completion's gradient leverage off the rollout
        self._leverage_rule = self.budget is not None and self.budget.rule == "leverage"

        if data is None:
            data = load_problems(cfg, load_train)
        self.train_set, self.eval_set = (data[0] if load_train else None) or [], data[1]
        if load_train and cfg.prompts_per_update > len(self.train_set):
            raise ValueError(
                f"config key 'prompts_per_update' ({cfg.prompts_per_update}) exceeds the "
                f"{len(self.train_set)} training problems"
            )
        if cfg.prompts_per_update % self.dist.world:
            raise ValueError(
                f"config key 'prompts_per_update' ({cfg.prompts_per_update}) must be a multiple "
                f"of the number of processes ({self.dist.world})"
            )

        check_model_spec(cfg.model)
        try:
            model, tok, self.model_source = load_base(
                cfg.model, dtype=cfg.dtype, device=str(self.dist.device), seed=seed
            )
        except (OSError, ValueError) as err:  # the hub's or a loader's words, on one line
            first = " ".join(str(err).split())[:300]
            raise ValueError(f"config key 'model' ({cfg.model!r}) could not be loaded: {first}") from err
        self.agents = [AgentSpec(**a) for a in cfg.agents]
        self.K = len(self.agents)
        self.pool = AgentPool(
            model,
            tok,
            self.agents,
            lora_r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            target_modules=cfg.lora_target_modules,
            seed=seed,
            instruction=cfg.instruction,
            gradient_checkpointing=cfg.gradient_checkpointing,
            logprob_chunk=cfg.logprob_chunk,
            share_prefill=cfg.shared_prefix,
        )
        self.features = CandidateFeatures(
            self.K, cfg.question_features, cfg.candidate_features, kind=cfg.router_features
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.router = Router(
                self.features.dim, cfg.router_hidden, cfg.router_tau, cfg.router_eps
            )
        self.optimizer = torch.optim.AdamW(
            [{"params": self.pool.adapter_params(a.name), "name": a.name} for a in self.agents],
            lr=cfg.learning_rate,
            weight_decay=cfg.weight_decay,
        )
        self.scheduler = None  # constant: the learning rate as it is (every recorded run)
        if cfg.lr_scheduler_type != "constant":
            from transformers import get_scheduler

            self.scheduler = get_scheduler(cfg.lr_scheduler_type, self.optimizer, num_warmup_steps=0,
                                           num_training_steps=cfg.updates * cfg.num_iterations)
        self.router_optimizer = torch.optim.Adam(self.router.parameters(), lr=cfg.router_lr)
        self.replay: list[
            dict[str, torch.Tensor]
        ] = []  # logged slates of earlier updates (the router's data)
        self.step = 0

    # -- rollout ---------------------------------------------------------------------------
    def prompt_rows(self, questions: list[str], m: int, with_base: bool = False):
        """The generation rows of ``questions``: for each question, each agent's prompt ``m`` times
        (the rows layout of :class:`mcpg.grpo.slates.Slates`), then, ``with_base``, the frozen
        model's neutral prompt once. Returns prompts, adapter names, temperatures and agent
        indices (-1: the frozen model)."""
        prompts, adapters, temps, agent_ids = [], [], [], []
        for q in questions:
            for k, a in enumerate(self.agents):
                for _ in range(m):
                    prompts.append(self.pool.prompt(q, a))
                    adapters.append(a.name)
                    temps.append(a.temperature)
                    agent_ids.append(k)
            if with_base:
                prompts.append(self.pool.prompt(q, None))
                adapters.append(BASE)
                temps.append(1.0)
                agent_ids.append(-1)
        return prompts, adapters, temps, agent_ids

    def _draw_problems(self) -> list[dict]:
        """This update's problems: ``prompts_per_update`` drawn without replacement (the same draw
        in every process); each process keeps every ``world``-th."""
        chosen = self.data_rng.choice(len(self.train_set), size=self.cfg.prompts_per_update, replace=False)
        return [self.train_set[i] for i in chosen[self.dist.rank :: self.dist.world]]

    def _rollout(self, questions: list[str], m: int, progress: bool) -> Rollout:
        """Every agent samples ``m`` completions of every question, all agents in one mixed-adapter batch."""
        from tqdm.auto import tqdm

        cfg = self.cfg
        prompts, adapters, temps, _ = self.prompt_rows(questions, m)
        bs = cfg.generation_batch_size or len(prompts)
        steps = -(-len(prompts) // bs) * cfg.max_completion_length
        with tqdm(total=steps, desc=f"rollout {self.step + 1} ({len(prompts)} completions)", unit="tok",
                  leave=False, disable=not (progress and self.dist.main)) as bar:
            return self.pool.generate(prompts, adapters, temps, cfg.max_completion_length,
                                      batch_size=cfg.generation_batch_size or None, progress=bar,
                                      stop_at_answer=cfg.stop_at_answer, keep_logprobs=self._leverage_rule)

    def _slate_features(self, questions: list[str], roll: Rollout, slates: Slates) -> torch.Tensor:
        """The router's features of the rollout's candidates, as slates (B, m, K, dim)."""
        qs = [q for q in questions for _ in range(self.K * slates.m)]
        ids = [k for _ in questions for k in range(self.K) for _ in range(slates.m)]
        return slates.from_rows(self.features(qs, roll.texts, ids, roll.truncated.tolist())).contiguous()

    # -- one update --------------------------------------------------------------------------
    def update(self, progress: bool = False) -> dict:
        """One update of paper §8, top to bottom; returns the metrics row (the rollout's logged
        slates are left in ``last_slates``, the rows of ``slates.jsonl``)."""
        cfg, K, m = self.cfg, self.K, self.cfg.completions_per_agent
        t0 = time.perf_counter()
        problems = self._draw_problems()
        questions = [p["question"] for p in problems]
        slates = Slates(len(problems), m, K)

        # 1. rollout: each agent samples m completions of each problem; slate g = the g-th of each
        roll = self._rollout(questions, m, progress)
        t_gen = time.perf_counter()
        # 2. every candidate's reward R^(j) (its committed answer against the gold one, or the
        #    reward functions of your own), (B, m, K)
        if self.rewards is None:
            golds = [p["gold"] for p in problems for _ in range(K * m)]
            R = slates.from_rows(np.array([reward(t, g, truncated=bool(c))
                                           for t, g, c in zip(roll.texts, golds, roll.truncated.tolist())]))
        else:
            R = slates.from_rows(self._custom_rewards([p for p in problems for _ in range(K * m)], roll))
        # 3. the current router, fixed during the update: propensities p (Eq. 3), leave-one-out
        #    propensities P and outcome estimates mu_hat = sigmoid(s)
        feats = self._slate_features(questions, roll, slates)
        route = self.router.route(feats)
        p, P, mu = route["p"], route["P"], route["mu_hat"]
        # 4-6. route_and_credit, the function the simulated pool of chapter 7 calls too:
        #    4. filtered feedback: draw the deployed candidate I ~ p; only G = R^(I) is fed back;
        #    5. credit (a signal of mcpg.grpo.credits): wta 1{I=i} G, removal Eq. (19), oracle
        #       (reads every R); removal on an
        #       exact budget evaluates the slates Eq. (22) draws and credits Eq. (21) (chapter 9);
        #    6. advantages: each agent's scores within its group of m completions of one problem
        lev = self._leverage(roll, slates) if self._leverage_rule else None
        step = route_and_credit(self.signal, p, P, mu, R, self.select_rng, cfg.scale_rewards,
                                cfg.advantage_eps, budget=self.budget,
                                budget_rng=self.budget_rng if self.budget is not None else None, leverage=lev)
        I, G, scores, A, exact = step.I, step.G, step.scores, step.advantages, step.exact  # noqa: E741
        # 7. actor update: the clipped GRPO loss on each agent's own adapter
        adv_rows = torch.as_tensor(slates.to_rows(A), dtype=torch.float32)
        losses, clip_fraction, diagnostics = self._actor_update(roll, adv_rows)
        t_actor = time.perf_counter()
        # 8. router update, only now, from the logged selected feedback of this and earlier rollouts
        router_loss = self._router_update(slates.logged(feats), I, G, p)
        self.step += 1
        self._check_in_sync()

        log = self._gather_log(questions, roll, slates, R, I, G, p, P, mu, scores, exact)
        self.last_slates = rundir.slates_row(log, budget=bool(cfg.exact_budget))
        return rundir.metrics_row(
            log, K, update=self.step, signal=self.signal, losses=losses, router_loss=router_loss,
            clip_fraction=clip_fraction, router_slates=int(sum(len(r["selected"]) for r in self.replay)),
            diagnostics=diagnostics,
            seconds={"rollout": t_gen - t0, "actor": t_actor - t_gen, "total": time.perf_counter() - t0})

    def _custom_rewards(self, row_problems: list[dict], roll: Rollout, correct: bool = False) -> np.ndarray:
        """The rollout's rewards by the reward functions of your own (``row_problems[r]``: row r's
        problem); ``correct``: 1 where a row earns the full reward, else 0 (the evaluation's)."""
        ids = [row[mask > 0].tolist() for row, mask in zip(roll.completion_ids, roll.completion_mask)]
        score = self.rewards.correct if correct else self.rewards
        return score(row_problems, roll.texts, ids, self.step, self.cfg.updates)

    def _leverage(self, roll: Rollout, slates: Slates) -> np.ndarray:
        """Each completion's gradient leverage, as slates (B, m, K): :func:`leverage_proxy` of its
        sampled tokens, in the loss's scaling (0 for a row the loss leaves out)."""
        agent_of_row = torch.tensor([self.pool.names.index(a) for a in roll.adapters])
        trained = self._trained_mask(roll)
        norm = self._loss_normalisers(agent_of_row, trained)
        scale = norm["tokens"] if norm["by_tokens"] else norm["seqs"]
        a = leverage_proxy(roll.sampler_logprobs, trained) / scale[agent_of_row].clamp(min=1.0).numpy()
        return slates.from_rows(a)

    def _trained_mask(self, roll: Rollout) -> torch.Tensor:
        """The completion tokens the loss counts: all, or (``mask_truncated_completions``) those
        of rows not cut at the token budget."""
        trained = roll.completion_mask
        if self.cfg.mask_truncated_completions:
            trained = trained * (~roll.truncated.bool())[:, None].to(trained.dtype)
        return trained

    def _router_update(self, feats: torch.Tensor, I, G, p) -> float:  # noqa: E741 (the paper's name)
        """Fit the router on the replay of logged slates (all processes' data): features, the
        deployed candidate, its reward and the logged propensities. Returns its loss."""
        cfg, K = self.cfg, self.K
        self.replay.append({
            "features": self._gather_tensor(feats),
            "selected": self._gather_tensor(torch.as_tensor(I.reshape(-1))),
            "reward": self._gather_tensor(torch.as_tensor(G.reshape(-1), dtype=torch.float32)),
            "p": self._gather_tensor(torch.as_tensor(p.reshape(-1, K), dtype=torch.float32)),
        })
        if cfg.router_replay:
            self.replay = self.replay[-cfg.router_replay :]
        logged = {k: torch.cat([r[k] for r in self.replay]) for k in self.replay[0]}
        return self.router.fit(logged["features"], logged["selected"].numpy(), logged["reward"].numpy(),
                               logged["p"].numpy(), self.router_optimizer, steps=cfg.router_steps)

    def _gather_log(self, questions, roll: Rollout, slates: Slates, R, I, G, p, P, mu, scores, exact) -> dict:  # noqa: E741
        """The rollout as per-slate and per-completion lists, gathered over processes: what
        :func:`mcpg.grpo.rundir.metrics_row` and :func:`mcpg.grpo.rundir.slates_row` read."""
        K = self.K
        spec_idx = {a.specialty: k for k, a in enumerate(self.agents) if a.specialty}
        matched = [spec_idx.get(question_specialty(q)) for q in questions]
        mask_len = roll.completion_mask.sum(1).double().numpy()
        exact_z = exact.z if exact is not None else np.zeros(I.shape, dtype=int)
        exact_p = exact.p if exact is not None else np.zeros(I.shape)
        local = {
            "R": R.reshape(-1, K).tolist(),
            "G": G.reshape(-1).tolist(),
            "I": I.reshape(-1).tolist(),
            "entropy": routing.routing_entropy(p).reshape(-1).tolist(),
            "brier": ((np.take_along_axis(mu, I[..., None], -1)[..., 0] - G) ** 2).reshape(-1).tolist(),
            "spec": [int(I[b, g] == matched[b]) for b in range(slates.B) for g in range(slates.m)
                     if matched[b] is not None],
            "len": mask_len.tolist(),
            "trunc": roll.truncated.double().tolist(),
            # per candidate, as slates: cut at the token budget, and its length
            "cut": slates.logged(slates.from_rows(roll.truncated.int().numpy())).tolist(),
            "tokens": slates.logged(slates.from_rows(mask_len)).tolist(),
            "score": scores.reshape(-1, K).tolist(),
            "zero_std": zero_std_groups(scores, axis=1).reshape(-1, K).tolist(),  # (B, K) groups
            "zero_std_reward": zero_std_groups(R, axis=1).reshape(-1, K).tolist(),
            "p": p.reshape(-1, K).tolist(),
            "P": P.reshape(-1, K, K).tolist(),
            "mu_hat": mu.reshape(-1, K).tolist(),
            "exact_z": exact_z.reshape(-1).tolist(),
            "exact_p": exact_p.reshape(-1).tolist(),
        }
        if self._leverage_rule:  # the leverage each slate's allocation used, per agent
            local["exact_a"] = exact.leverage.reshape(-1, K).tolist()
        gathered = self.dist.gather([local])
        return {k: sum((s[k] for s in gathered), []) for k in gathered[0]}

    def _check_in_sync(self) -> None:
        """Data parallel: every process must hold the same adapters and router after an update."""
        if self.dist.world == 1:
            return
        with torch.no_grad():
            sums = [p.double().sum() for g in self.optimizer.param_groups for p in g["params"]]
            sums += [p.double().sum() for p in self.router.parameters()]
            mine = torch.stack([s.cpu() for s in sums]).to(self.dist.device)
        everyone = self.dist.acc.gather(mine.unsqueeze(0)).cpu()
        if not torch.equal(everyone.min(0).values, everyone.max(0).values):
            raise RuntimeError(f"processes hold different weights after update {self.step}")

    def _gather_tensor(self, t: torch.Tensor) -> torch.Tensor:
        if self.dist.world == 1:
            return t
        return self.dist.acc.gather(t.to(self.dist.device)).cpu()

    # -- the actor update --------------------------------------------------------------------
    def _actor_update(self, roll: Rollout, adv_rows: torch.Tensor) -> tuple[list[float], float, dict]:
        """Clipped GRPO loss on each agent's adapter; returns each agent's loss, the clip fraction
        and the per-agent diagnostics (:data:`mcpg.grpo.rundir.AGENT_DIAGNOSTICS`).

        ``num_iterations`` optimizer steps (epochs) on the rollout, each over its micro-batches
        (``train_micro_batch`` rows): per micro-batch one log-probability pass
        (:meth:`_logprobs`), each agent's loss on its rows (:meth:`_micro_batch_loss`), backward;
        then one step (:meth:`_optimizer_step`). ``logp_old`` is the sampling policy's: the
        first pass's, detached, with one iteration; computed once before any step otherwise.

        The clip fraction is TRL's ``clip_ratio/region_mean``: the share of completion tokens whose
        probability ratio lies in the clipped region on the side its advantage pushes (ratio below
        1 - eps with a negative advantage, or above 1 + eps_high with a positive one), over all
        optimizer steps of the rollout. With ``num_iterations = 1`` the ratio is 1 and it is 0.

        ``mask_truncated_completions``: the rows cut at the token budget leave the loss (their
        tokens count neither in the loss nor in its normaliser), as TRL's key of that name does;
        their advantages were already computed with them in their groups.
        """
        cfg, K, n = self.cfg, self.K, len(roll)
        agent_of_row = torch.tensor([self.pool.names.index(a) for a in roll.adapters])
        trained = self._trained_mask(roll)
        norm = self._loss_normalisers(agent_of_row, trained)
        mb = cfg.train_micro_batch or n
        batches = [list(range(i, min(i + mb, n))) for i in range(0, n, mb)]
        old = None
        if cfg.num_iterations > 1:  # logp_old from the sampling policy, before any step
            with torch.no_grad():
                old = [self._logprobs(roll, rows).detach() for rows in batches]
        # beta: the KL term's reference policy, the frozen base model (AgentPool.reference_logprobs)
        ref = [self.pool.reference_logprobs(roll.rows(rows)) for rows in batches] if cfg.beta else None
        stats = torch.zeros(K, 5, dtype=torch.float64)  # per agent: LossStats' sums (_micro_batch_loss)
        entropy = torch.zeros(K, dtype=torch.float64)  # per agent: entropy summed over its trained tokens
        grad_norms = []
        agent_loss = [0.0] * K
        for epoch in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=False)
            agent_loss = [0.0] * K
            for b, rows in enumerate(batches):
                logp, ent = self._logprobs(roll, rows, with_entropy=True)
                if epoch == 0:  # the sampling policy's entropy
                    entropy.index_add_(0, agent_of_row[rows], (ent.cpu().double() * trained[rows]).sum(1))
                logp_old = logp.detach() if old is None else old[b]
                total = self._micro_batch_loss(logp, logp_old, adv_rows[rows], trained[rows],
                                               agent_of_row[rows], norm, agent_loss, stats,
                                               None if ref is None else ref[b])
                total.backward()
            grad_norms.append(self._optimizer_step())
        losses = self.dist.sum_(torch.tensor(agent_loss, dtype=torch.float64, device=self.dist.device)).cpu()
        stats = self.dist.sum_(stats.to(self.dist.device)).cpu()
        clip_fraction = float(stats[:, :2].sum() / stats[:, 4].sum().clamp(min=1.0))
        return losses.tolist(), clip_fraction, self._diagnostics(stats, entropy, grad_norms, adv_rows,
                                                                 agent_of_row, norm)

    def _diagnostics(self, stats, entropy, grad_norms, adv_rows, agent_of_row, norm) -> dict[str, list]:
        """The update's :data:`mcpg.grpo.rundir.AGENT_DIAGNOSTICS`, over all processes."""
        K, per_token = self.K, stats / stats[:, 4:].clamp(min=1.0)
        a = adv_rows.double()
        moments = torch.stack([torch.zeros(K, dtype=torch.float64).index_add_(0, agent_of_row, a ** q)
                               for q in (1, 2)])  # per agent: sums of its advantages and their squares
        moments = self.dist.sum_(moments.to(self.dist.device)).cpu() / norm["seqs"].clamp(min=1.0)
        entropy = self.dist.sum_(entropy.to(self.dist.device)).cpu() / norm["tokens"].clamp(min=1.0)
        out = {"agent/grad_norm": np.mean(grad_norms, axis=0).tolist(), "agent/entropy": entropy.tolist(),
               "agent/advantage_std": (moments[1] - moments[0] ** 2).clamp(min=0.0).sqrt().tolist(),
               "agent/clip_low": per_token[:, 0].tolist(), "agent/clip_high": per_token[:, 1].tolist(),
               "agent/approx_kl": per_token[:, 2].tolist(), "agent/kl": per_token[:, 3].tolist()}
        none = (norm["tokens"] == 0).tolist()  # no trained token: a mean over them is undefined, not 0
        for key in rundir.TOKEN_MEANS:
            out[key] = [None if empty else v for v, empty in zip(out[key], none)]
        return out

    def _logprobs(self, roll: Rollout, rows: list[int], with_entropy: bool = False):
        """Per-token log-probabilities of the completions ``rows`` under their agents' adapters
        (and, ``with_entropy``, their policies' entropies: :meth:`AgentPool.token_logprobs`)."""
        return self.pool.token_logprobs(roll.rows(rows), with_entropy=with_entropy)

    def _loss_normalisers(self, agent_of_row: torch.Tensor, trained: torch.Tensor) -> dict:
        """Each agent's loss normaliser over all processes (data parallel: global counts), so that
        micro-batching and sharding leave the loss unchanged: its trained tokens (``dapo``,
        ``bnpo``) or its sequences (otherwise)."""
        K = self.K
        tokens = torch.stack([trained[agent_of_row == k].sum() for k in range(K)]).double()
        seqs = torch.stack([(agent_of_row == k).sum() for k in range(K)]).double()
        return {"tokens": self.dist.sum_(tokens.to(self.dist.device)).cpu(),
                "seqs": self.dist.sum_(seqs.to(self.dist.device)).cpu(),
                "by_tokens": self.cfg.loss_type in ("dapo", "bnpo")}

    def _micro_batch_loss(self, logp, logp_old, adv, trained, agents, norm: dict, agent_loss: list[float],
                          stats: torch.Tensor, logp_ref: torch.Tensor | None = None) -> torch.Tensor:
        """The micro-batch's share of each agent's clipped GRPO loss (rescaled to the agent's
        global normaliser), summed over agents; adds each agent's share to ``agent_loss`` and its
        :class:`~mcpg.grpo.objective.LossStats` (clipped low, high, approx KL, KL, tokens) to
        ``stats[k]``."""
        cfg = self.cfg
        mask = trained.to(logp.device)
        total = logp.new_zeros(())
        for k in range(self.K):
            sel = (agents == k).nonzero().squeeze(1).to(logp.device)
            if sel.numel() == 0:
                continue
            mk = mask[sel]
            lk, st = clipped_grpo_loss(
                logp[sel], logp_old[sel], adv[agents == k].to(logp.device), mk, clip_eps=cfg.epsilon,
                clip_eps_high=cfg.epsilon_high, loss_type=cfg.loss_type,
                max_completion_length=cfg.max_completion_length, beta=cfg.beta,
                logp_ref=None if logp_ref is None else logp_ref[sel], return_stats=True)
            stats[k] += torch.stack([st.low_clipped, st.high_clipped, st.approx_kl, st.kl, st.tokens]).cpu()
            share = ((mk.sum().clamp(min=1.0) / norm["tokens"][k].clamp(min=1.0)) if norm["by_tokens"]
                     else (sel.numel() / norm["seqs"][k]))
            lk = lk * share.to(lk.dtype) if torch.is_tensor(share) else lk * float(share)
            total = total + lk
            agent_loss[k] += float(lk.detach())
        return total

    def _optimizer_step(self) -> list[float]:
        """Sum the processes' gradients (the losses use global normalisers), clip each agent's
        gradient norm (``max_grad_norm``), and step AdamW. Returns each agent's gradient norm
        before clipping."""
        for p_ in (p for g in self.optimizer.param_groups for p in g["params"]):
            if p_.grad is not None:
                self.dist.sum_(p_.grad)
        norms = []
        for a in self.agents:
            params = self.pool.adapter_params(a.name)
            if self.cfg.max_grad_norm:
                norms.append(float(torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm)))
            else:
                grads = [p.grad for p in params if p.grad is not None]
                norms.append(float(torch.nn.utils.get_total_norm(grads)))
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        return norms

    # -- evaluation --------------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, progress: bool = False, base: dict | None = None) -> dict:
        """Held-out evaluation of the current agents and router (see :func:`evaluate_pool`)."""
        return evaluate_pool(self, progress=progress, base=base)

    # -- checkpoints -------------------------------------------------------------------------
    def save_checkpoint(self, folder: Path) -> None:
        """Write adapters, router, optimizers, RNG states and the update counter to ``folder``
        atomically (a temporary folder renamed into place)."""
        rank_state = rng_state(self.data_rng, self.select_rng)
        tmp = folder.with_name(folder.name + ".tmp")
        if self.dist.main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            self.pool.save_adapters(tmp / "adapters")
            self.router.save(tmp / "router.safetensors")
            torch.save(self.optimizer.state_dict(), tmp / "optimizer.pt")
            if self.scheduler is not None:
                torch.save(self.scheduler.state_dict(), tmp / "scheduler.pt")
            torch.save(self.router_optimizer.state_dict(), tmp / "router_optimizer.pt")
            torch.save(self.replay, tmp / "router_replay.pt")
            write_json(
                tmp / "state.json", {"step": self.step, "signal": self.signal, "world": self.dist.world}
            )
        self.dist.barrier()
        torch.save(rank_state, tmp / f"rng_rank{self.dist.rank}.pt")
        if self.budget is not None:  # the exact budget's estimates and its draws Z (per process)
            write_json(tmp / f"budget_rank{self.dist.rank}.json",
                       {"budget": self.budget.state_dict(), "rng": self.budget_rng.bit_generator.state})
        self.dist.barrier()
        if self.dist.main:
            old = folder.with_name(folder.name + ".old")
            shutil.rmtree(old, ignore_errors=True)
            if folder.exists():
                os.replace(folder, old)
            os.replace(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        self.dist.barrier()

    def load_checkpoint(self, folder: Path) -> None:
        state = json.loads((folder / "state.json").read_text())
        if state["world"] != self.dist.world:
            raise ValueError(
                f"checkpoint {folder} was written by {state['world']} processes, "
                f"resume with the same number (now {self.dist.world})"
            )
        self.pool.load_adapters(folder / "adapters")
        self.router.load(folder / "router.safetensors")
        self.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True))
        if self.scheduler is not None and (folder / "scheduler.pt").exists():
            self.scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
        self.router_optimizer.load_state_dict(torch.load(folder / "router_optimizer.pt", weights_only=True))
        if (folder / "router_replay.pt").exists():
            self.replay = torch.load(folder / "router_replay.pt", weights_only=True)
        set_rng_state(
            torch.load(folder / f"rng_rank{self.dist.rank}.pt", weights_only=True),
            self.data_rng,
            self.select_rng,
        )
        budget_file = folder / f"budget_rank{self.dist.rank}.json"
        if self.budget is not None and budget_file.exists():
            saved = json.loads(budget_file.read_text())
            self.budget.load_state_dict(saved["budget"])
            self.budget_rng.bit_generator.state = saved["rng"]
        self.step = int(state["step"])


def evaluate_pool(engine: Engine, progress: bool = False, base: dict | None = None) -> dict:
    """Each agent answers each held-out problem greedily; the router deploys the top score.

    Returns the six diagnostics of the paper's Table 1 (``accuracy``, ``entropy``, ``brier``,
    ``specialization``, ``oracle``, ``regret``) plus ``base_accuracy`` (the frozen base model
    with a neutral prompt: the single-agent reference), ``agent_accuracy``,
    ``deployed_fraction``, ``n`` and ``n_specialty`` (problems some agent's specialty matches).
    ``specialization`` is None when no held-out problem matches a specialty.
    ``base``: an earlier evaluation of the same problems; its ``base_accuracy`` and
    ``base_correct`` are reused (the frozen model does not change), so no base rows are generated.
    With reward functions of your own an answer is correct when it earns the full reward, 1
    (:mod:`mcpg.grpo.custom`), and the means of the reward itself are reported beside:
    ``reward`` (the deployed answers'), ``agent_reward`` (each agent's) and ``base_reward``
    (:data:`mcpg.grpo.rundir.REWARD_EVAL_KEYS`; with the default 0/1 reward they would repeat the
    accuracies); ``strict_accuracy`` and ``flexible_accuracy`` are None on a dataset of your own
    (they read GSM8K's gold number).
    """
    from tqdm.auto import tqdm

    cfg, K, dist = engine.cfg, engine.K, engine.dist
    problems = engine.eval_set[dist.rank :: dist.world]
    questions = [p["question"] for p in problems]
    with_base = base is None  # the frozen model never changes: an earlier evaluation's base is reused
    prompts, adapters, temps, agent_ids = engine.prompt_rows(questions, 1, with_base=with_base)
    bs = min(cfg.eval_batch_size, len(prompts))  # bounded: any split fits in memory
    steps = -(-len(prompts) // bs) * cfg.eval_max_new_tokens
    with tqdm(
        total=steps,
        desc=f"evaluate ({len(prompts)} greedy answers)",
        unit="tok",
        leave=False,
        disable=not (progress and dist.main),
    ) as bar:
        roll = engine.pool.generate(
            prompts, adapters, temps, cfg.eval_max_new_tokens, greedy=True, batch_size=bs, progress=bar,
            stop_at_answer=cfg.stop_at_answer,
        )
    spec_idx = {a.specialty: k for k, a in enumerate(engine.agents) if a.specialty}
    if engine.rewards is not None:  # yours: correct = the full reward (mcpg.grpo.custom)
        totals = engine._custom_rewards([p for p in problems for _ in range(K + with_base)], roll)
        mine = (totals >= 1.0 - custom.FULL_REWARD_TOL).astype(float)
    per_problem = []
    for b, prob in enumerate(problems):
        rows = range(b * (K + with_base), (b + 1) * (K + with_base))
        texts = [roll.texts[r] for r in rows]
        trunc = [bool(roll.truncated[r]) for r in rows]
        if engine.rewards is None:
            R = [reward(t, prob["gold"], truncated=c) for t, c in zip(texts, trunc)]
            total = R
        else:
            R, total = [float(mine[r]) for r in rows], [float(totals[r]) for r in rows]
        gold = prob.get("gold")  # GSM8K's and the arithmetic task's; a dataset of your own has none
        f = engine.features([prob["question"]] * K, texts[:K], list(range(K)), trunc[:K])
        rt = engine.router.route(f)
        d = int(np.argmax(rt["scores"]))
        per_problem.append(
            {
                "R": R[:K],
                "base": R[K] if with_base else None,
                "reward": total[:K],
                "base_reward": total[K] if with_base else None,
                "deployed": d,
                "entropy": float(routing.routing_entropy(rt["p"])),
                "brier": float((rt["mu_hat"][d] - R[d]) ** 2),
                "matched": spec_idx.get(question_specialty(prob["question"])),
                "mu_hat": [float(x) for x in rt["mu_hat"]],
                "truncated": trunc[:K],
                "strict": None if gold is None else is_correct(texts[d], gold, mode="strict"),
                "flexible": None if gold is None else is_correct(texts[d], gold, mode="flexible"),
            }
        )
    allp = dist.gather(per_problem)
    Rm = np.array([x["R"] for x in allp], dtype=float)
    dep = np.array([x["deployed"] for x in allp])
    acc = float(Rm[np.arange(len(allp)), dep].mean())
    oracle = float(Rm.max(1).mean())
    spec = [int(x["deployed"] == x["matched"]) for x in allp if x["matched"] is not None]
    mu = np.array([x["mu_hat"] for x in allp], dtype=float)
    graded = {}
    if engine.rewards is not None:  # a reward of your own: its means, beside the full reward's accuracy
        Rw = np.array([x["reward"] for x in allp], dtype=float)
        graded = {"reward": float(Rw[np.arange(len(allp)), dep].mean()), "agent_reward": Rw.mean(0).tolist(),
                  "base_reward": (_mean([x["base_reward"] for x in allp]) if with_base
                                  else base.get("base_reward"))}
    return {
        "accuracy": acc,
        "entropy": _mean([x["entropy"] for x in allp]),
        "brier": _mean([x["brier"] for x in allp]),
        "specialization": _mean(spec),
        "oracle": oracle,
        "regret": oracle - acc,
        "base_accuracy": _mean([x["base"] for x in allp]) if with_base else base["base_accuracy"],
        "agent_accuracy": Rm.mean(0).tolist(),
        "deployed_fraction": [float((dep == k).mean()) for k in range(K)],
        "n": len(allp),
        "n_specialty": len(spec),
        "correct": [int(r) for r in Rm[np.arange(len(allp)), dep]],
        "base_correct": [int(x["base"]) for x in allp] if with_base else base["base_correct"],
        "agent_correct": Rm.astype(int).tolist(),
        "best_of_k": oracle,
        "uniform_accuracy": float(Rm.mean()),
        "uniform_correct": Rm.mean(1).tolist(),
        "router_auc": roc_auc(mu, Rm),
        "router_auc_within": within_slate_auc(mu, Rm),
        "mu_hat": mu.tolist(),
        "strict_accuracy": _mean_known([x["strict"] for x in allp]),
        "flexible_accuracy": _mean_known([x["flexible"] for x in allp]),
        "truncated": _mean([t for x in allp for t in x["truncated"]]),
        **graded,
    }


# ------------------------------------------------------------------------------------------
# the loop and the run directory
# ------------------------------------------------------------------------------------------
RUN_FILES = (rundir.CONFIG, rundir.PROVENANCE, rundir.INITIAL_EVAL, rundir.METRICS, rundir.SLATES,
             rundir.EVAL, rundir.ADAPTERS, rundir.ROUTER, rundir.CHECKPOINT, rundir.CHECKPOINT + ".tmp",
             rundir.CHECKPOINT + ".old", "tensorboard")
"""What a run writes into its directory: a new run refuses a directory holding any of them."""

RUNTIME_KEYS = ("threads", "progress")
"""Config keys that change how a run is shown or scheduled, never its numbers: a config given
with ``resume`` may differ from the run's in these."""


def _check_new_output(out: Path) -> None:
    """A new run writes into a new or empty directory: one that holds anything (another run's
    files, or files of its own) is refused, naming what it holds."""
    if not out.exists():
        parent = next(p for p in out.parents if p.exists())
        if not os.access(parent, os.W_OK | os.X_OK):
            raise ValueError(f"output {out}: cannot write in {parent} (no permission) to make it; give an "
                             "output where you can write")
        return
    if not out.is_dir():
        raise ValueError(f"output {out} is an existing file; give a directory (new, or a run to resume)")
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"output {out}: cannot write in it (no permission); give an output where you can "
                         "write")
    held = sorted(p.name for p in out.iterdir())
    if not held:
        return
    shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
    if any(name in RUN_FILES for name in held):
        how = ("continue it with resume=True (--resume)" if (out / rundir.CONFIG).exists()
               else "remove what is left of it")
        if _updates_done(out) == 0 and not (out / rundir.METRICS).exists():
            how = (f"it stopped before its first update: continue it with resume=True (--resume), or start "
                   f"over by removing it (rm -r {shlex.quote(str(out))})")
        raise ValueError(f"output {out} already holds a run ({shown}): {how}, or write this run to a new "
                         "output directory")
    raise ValueError(f"output {out} is not empty ({shown}): write the run to a new or empty directory")


def _updates_done(out: Path) -> int:
    """Updates in a run directory's checkpoint (0 without one): what resuming continues from."""
    for name in (rundir.CHECKPOINT, rundir.CHECKPOINT + ".old"):
        state = out / name / "state.json"
        if state.is_file():
            return int(json.loads(state.read_text())["step"])
    return 0


def _check_resumed_config(given: GRPOConfig, saved_raw: dict, saved: GRPOConfig, updates: int | None) -> None:
    """A config given with ``resume`` (a config, or keys to override) must be the run's own: every
    key the run's config.json holds (``saved_raw``, old key names read as their new ones) must
    agree, apart from :data:`RUNTIME_KEYS`, ``updates`` when ``updates`` is given, and a
    ``signal`` the given config leaves unchosen (the signal is checked on its own)."""
    saved_raw = canonical_keys(saved_raw, warn=False)
    differ = []
    for key in saved:
        if key in RUNTIME_KEYS or key not in saved_raw or (key == "updates" and updates is not None):
            continue
        if key == "signal" and given.signal is None:
            continue
        mine, theirs = getattr(saved, key), getattr(given, key)
        if theirs != mine:
            differ.append(f"{key} ({mine!r} in the run, {theirs!r} given)")
    if differ:
        more = any(d.startswith("updates ") for d in differ)
        hint = "; to run more updates pass updates (--updates)" if more else ""
        raise ValueError(f"the config (or keys) given with resume differs from the run's config.json in "
                         f"{'; '.join(differ[:4])}{' and more' if len(differ) > 4 else ''}: resume without "
                         f"them (the run's own config is used), or start a new run in a new output{hint}")


def _recorded_data(run: Path) -> dict | None:
    path = run / rundir.PROVENANCE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text()).get("data")
    except (json.JSONDecodeError, AttributeError):
        return None


def train(
    config: str | dict | GRPOConfig | None,
    signal: str | None,
    output: str | os.PathLike,
    updates: int | None = None,
    resume: bool = False,
    stop_after: int | None = None,
    progress: bool | None = None,
    reward_funcs=None,
    train_dataset=None,
    eval_dataset=None,
    initial_eval: str | os.PathLike | None = None,
    **overrides,
) -> dict | None:
    """Train K routed agents with one credit signal; write the run directory; return eval.json.

    Args:
        config: a named config (``tiny-random``, ``cpu-smoke``, ``colab``, ``paper``), a JSON
            file, a dict or a :class:`~mcpg.grpo.configs.GRPOConfig` (see :mod:`mcpg.grpo.configs`).
            On ``resume`` it may be None (the run's ``config.json`` is used); one that is given is
            checked against it.
        signal: a registered signal (:mod:`mcpg.grpo.credits`: ``wta``, ``removal``, ``oracle``, ...);
            None: the config's key ``signal``. A config
            that has a signal must agree with this one (:meth:`mcpg.grpo.configs.GRPOConfig.with_signal`); on
            ``resume`` it must be the run's.
        output: the run directory: new or empty, or a run to resume.
        updates: total number of updates (overrides the config; on resume, extends or shortens
            the run, never below the updates its checkpoint holds).
        resume: continue from ``output/checkpoint``, on the problems the run recorded.
        stop_after: stop after this many updates of this call, before evaluating (simulates an
            interruption; the checkpoint is left as a crash would leave it). Returns None then.
        progress: tqdm bars (default: the config's ``progress``).
        reward_funcs: reward functions of your own, with TRL's signature (a function, or a list
            of functions and ``module:function`` names; :mod:`mcpg.grpo.custom` says what they
            receive and return); None: :func:`mcpg.grpo.gsm8k.reward` on the config's task.
        train_dataset, eval_dataset: datasets of your own (a ``datasets.Dataset`` with a
            ``prompt`` column, or a path), given together and with ``reward_funcs``; None: the
            config's task's problems.
        initial_eval: a run directory whose evaluation of the untrained pool this new run takes
            instead of computing it (another arm of the same seed): refused unless it is the one
            this run would compute (``shared_initial_eval``); the run's files are then the
            same as if it had computed it, and its ``PROVENANCE.json`` names the source.
        **overrides: further config keys (on resume, only ones equal to the run's).

    Every mistake in the arguments, the config, the data or the output directory is a ValueError
    raised before the directory is touched (and, where it can be told without it, before the
    model loads).
    """
    out = Path(output)
    cfg_path, ckpt = out / rundir.CONFIG, out / rundir.CHECKPOINT
    recorded = None
    if resume:
        if not cfg_path.exists():
            raise ValueError(f"output {out} holds no run to resume (no config.json)")
        saved = json.loads(cfg_path.read_text())
        if signal is not None and saved["signal"] != signal:
            raise ValueError(f"signal {signal!r} differs from the run's signal {saved['signal']!r}")
        cfg = saved_config(saved)
        if config is not None or overrides:
            given = resolve_config(cfg if config is None else config, **overrides)
            if saved.get("eval_dataset") is not None:  # the run's own data: its defaults too
                given = dataset_defaults(given)[0]
            _check_resumed_config(given, saved["config"], cfg, updates)
        done = _updates_done(out)
        if updates is not None:
            if int(updates) < done:
                raise ValueError(f"updates={updates} is below the {done} updates run {out} has done: give "
                                 f"{done} or more (--updates), or none to keep its {cfg.updates}")
            cfg = cfg.replace(updates=int(updates))
        recorded = _recorded_data(out)
        task = custom_task(cfg, reward_funcs, train_dataset, eval_dataset, saved=saved)
    else:
        if config is None:
            raise ValueError("a new run needs a config (--config): a named config or a JSON file")
        _check_new_output(out)
        cfg = resolve_config(config, **overrides)
        if updates is not None:
            cfg = cfg.replace(updates=int(updates))
        cfg = cfg.with_signal(signal)
        task = custom_task(cfg, reward_funcs, train_dataset, eval_dataset)
        if task.datasets:  # your data: neutral agents and no instruction where the config keeps GSM8K's
            cfg, changed = dataset_defaults(cfg)
            if changed:
                _say_dataset_defaults(changed)
    signal = cfg.signal
    if initial_eval is not None and (resume or not cfg.eval_initial):
        raise ValueError("initial_eval is for a new run that evaluates its untrained pool "
                         f"({'not with resume' if resume else 'config key eval_initial is false'})")
    show = cfg.progress if progress is None else progress
    check_available(cfg.report_to)  # before the model loads
    check_model_spec(cfg.model)
    problems = load_problems(cfg, task=task)
    data = data_record(cfg, *problems, task=task)
    check_same_problems(recorded, data, out, "resume")
    if task.rewards is not None:  # their keywords, checked before the model loads
        task.rewards.check_signatures([*(problems[0] or []), *problems[1]])

    engine = Engine(cfg, signal, data=problems, rewards=task.rewards)
    dist = engine.dist
    shared = (None if initial_eval is None
              else shared_initial_eval(initial_eval, cfg, data, engine.model_source))
    writer = RunWriter(out)
    if resume:
        if not ckpt.exists() and (out / "checkpoint.old").exists():
            ckpt = out / "checkpoint.old"  # interrupted while swapping checkpoints
        if ckpt.exists():
            engine.load_checkpoint(ckpt)
        if dist.main:
            writer.truncate(engine.step)
    with _unstarted_run_removed(out, new_run=not resume, engine=engine):
        if dist.main:
            writer.config(cfg.to_dict(), signal, engine.model_source, dist.world, **task.recorded())
            # PROVENANCE.json: commit, dirty, machine, command, the problems (per call)
            start_run(out, resume=resume, data=data,
                      initial_eval=None if shared is None else str(shared.parent.resolve()))
        dist.barrier()

        from tqdm.auto import tqdm

        initial = None
        init_path = out / "initial_eval.json"
        if cfg.eval_initial:
            if engine.step == 0 and not init_path.exists() and shared is not None:
                initial = json.loads(shared.read_text())  # the same evaluation, made by another arm
                if dist.main:
                    shutil.copyfile(shared, init_path)
            elif engine.step == 0 and not init_path.exists():
                # the untrained pool: separates routing from training
                initial = engine.evaluate(progress=show)
                if dist.main:
                    writer.json(rundir.INITIAL_EVAL, initial)
            elif init_path.exists():
                initial = json.loads(init_path.read_text())
            dist.barrier()

        start = engine.step
        report = MetricsReport(cfg.report_to if dist.main else [], out, engine.pool.names,
                               purge_step=start + 1 if resume else None)
        with tqdm(
            total=cfg.updates,
            initial=start,
            desc=f"GRPO {signal}",
            unit="update",
            disable=not (show and dist.main),
        ) as bar:
            while engine.step < cfg.updates:
                if stop_after is not None and engine.step - start >= stop_after:
                    report.close()
                    return None
                row = engine.update(progress=show)
                if cfg.eval_every and engine.step % cfg.eval_every == 0 and engine.step < cfg.updates:
                    row["eval"] = engine.evaluate(progress=show, base=initial)
                if dist.main:
                    line = writer.update(row, engine.last_slates)
                    report.write(json.loads(line))  # the row as written
                if engine.step % cfg.checkpoint_every == 0 or engine.step == cfg.updates:
                    engine.save_checkpoint(out / "checkpoint")
                bar.update(1)
                bar.set_postfix(reward=f"{row['reward']:.3f}", oracle=f"{row['oracle']:.3f}")
        report.close()

        result = {
            **engine.evaluate(progress=show, base=initial),
            **_initial_keys(initial),
            "signal": signal,
            "updates": engine.step,
        }
        if dist.main:
            base = base_model_id(cfg.model)
            engine.pool.save_adapters(out / rundir.ADAPTERS, base_model=base)
            writer.model_cards(cfg.agents, engine.pool.instruction, base, signal=signal, updates=engine.step,
                               reward=", ".join(task.rewards.names) if task.rewards else
                               "mcpg.grpo.gsm8k.reward (the answer against the gold one)",
                               data=data_source(cfg, task))
            engine.router.save(out / "router.safetensors")
            writer.json(rundir.EVAL, result)
        dist.barrier()
        return result


@contextlib.contextmanager
def _unstarted_run_removed(out: Path, new_run: bool, engine: Engine):
    """A new run that fails before its first update (an error in a reward function of your own at
    its first call, say) leaves its output as it found it, new or empty (:func:`_check_new_output`):
    the files it wrote are removed, so that the same command runs again once the cause is fixed.
    A run with an update done keeps its folder (resume continues it), and so does one stopped by
    Ctrl-C."""
    existed = out.exists()
    try:
        yield
    except Exception:
        if new_run and engine.step == 0 and engine.dist.main and not (out / rundir.METRICS).exists():
            for name in RUN_FILES:
                path = out / name
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
            if not existed and out.is_dir() and not any(out.iterdir()):
                out.rmdir()
        raise


def _say_dataset_defaults(changed: dict) -> None:
    """The one line that says which defaults a run on a dataset of your own took."""
    said = []
    if "agents" in changed:
        agents = changed["agents"]
        said.append(f"agents {', '.join(a['name'] for a in agents)} ({agents[0]['role']!r}, no specialty)")
    if "instruction" in changed:
        said.append("no instruction after the role")
    log.warning("a dataset of your own with the config's defaults: %s; set config keys agents and "
                "instruction (--agents, --instruction) to choose them", " and ".join(said))


def _initial_keys(initial: dict | None) -> dict:
    """eval.json's keys from the evaluation of the untrained pool (None when it was not run)."""
    if initial is None:
        return {}
    return {
        "initial_accuracy": initial["accuracy"],
        "initial_correct": initial["correct"],
        "initial_agent_accuracy": initial["agent_accuracy"],
        "initial_deployed_fraction": initial["deployed_fraction"],
        **({"initial_reward": initial["reward"]} if "reward" in initial else {}),
    }


def evaluate_run(run: str | os.PathLike, progress: bool | None = None, reward_funcs=None,
                 eval_dataset=None) -> dict:
    """Re-evaluate a finished run directory's final weights on its own held-out problems and
    rewrite eval.json; the call is added to its ``PROVENANCE.json``.

    A run trained with reward functions or datasets of your own is evaluated with the same
    (:func:`custom_task`): ``reward_funcs`` and ``eval_dataset`` given again, or, when not
    given, the functions it recorded imported by name and its held-out dataset read from the
    recorded path.

    Refused, before the model loads and with the directory untouched: a run that has not
    finished (no final weights: ``train --resume`` finishes it), other reward functions than the
    run's, and held-out problems whose SHA-256 differs from the ones the run recorded (another
    ``data_dir`` or ``$MCPG_GSM8K_DIR``, another dataset), which would break eval.json's pairing
    with ``initial_correct``.
    """
    run = Path(run)
    if not (run / rundir.CONFIG).exists():
        raise ValueError(f"run {run} has no config.json")
    saved = json.loads((run / rundir.CONFIG).read_text())
    cfg = saved_config(saved)
    if not ((run / rundir.ADAPTERS).is_dir() and (run / rundir.ROUTER).exists()):
        done = _updates_done(run)
        raise ValueError(f"run {run} has not finished ({done} of {cfg.updates} updates, no final "
                         f"weights): finish it with python -m mcpg.grpo train --signal {saved['signal']} "
                         f"--output {shlex.quote(str(run))} --resume, then evaluate it")
    check_model_spec(cfg.model)
    task = custom_task(cfg, reward_funcs, None, eval_dataset, saved=saved, load_train=False)
    problems = load_problems(cfg, load_train=False, task=task)
    data = data_record(cfg, None, problems[1], task=task)
    check_same_problems(_recorded_data(run), data, run, "evaluate")
    if task.rewards is not None:
        task.rewards.check_signatures(problems[1])
    engine = Engine(cfg, saved["signal"], load_train=False, data=problems, rewards=task.rewards)
    engine.pool.load_adapters(run / rundir.ADAPTERS)
    engine.router.load(run / rundir.ROUTER)
    show = cfg.progress if progress is None else progress
    result = engine.evaluate(progress=show)
    old = json.loads((run / rundir.EVAL).read_text()) if (run / rundir.EVAL).exists() else {}
    steps = old.get("updates", _updates_done(run) or None)
    init_path = run / rundir.INITIAL_EVAL
    initial = json.loads(init_path.read_text()) if init_path.exists() else None
    result = {**result, **_initial_keys(initial), "signal": saved["signal"], "updates": steps}
    if engine.dist.main:
        write_json(run / rundir.EVAL, result)
        add_call(run, "evaluate", wrote=rundir.EVAL, data=data)
    return result
