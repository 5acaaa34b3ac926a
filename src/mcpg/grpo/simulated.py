"""A simulated routed pool trained by the multi-agent GRPO objective (paper §8; chapter 7).

No language model: the agents are softmax policies over a handful of candidate answers,
so one training run takes about a second on a CPU and a comparison can use many seeds.
Everything that is not the agents is the LLM engine's own code: the credit signals,
the per-agent group standardisation and the clipped loss come from
:mod:`mcpg.grpo.objective`, the router of Eq. (3), its leave-one-out propensities, its
draw and its inverse-propensity-weighted outcome loss from :mod:`mcpg.routing`. The loop
follows ``mcpg.grpo.train.Engine.update`` step by step.

The environment
---------------
- Questions have one of T types (by default the LLM engine's keyword specialties
  ``money``, ``time`` and ``geometry``). A question of type t has a hidden correct answer
  Z among M candidate answers, drawn from ``answer_probs[t]``: answer 0 is the most often
  correct, answer 1 the next, and so on. The reward is ``R = 1{A = Z}``: deterministic
  given the question and the candidate, as in GSM8K, so condition (17) of the paper holds.
- Agent k is a tabular softmax policy over the M answers of each type (logits
  ``theta[k, t, :]``). It sees the type, not Z, so no agent can be right on every question
  of a type; only different agents giving different answers can cover more of them.
  All agents start from one shared base policy (logits ``log answer_probs``: it samples
  each answer as often as it is right, and its greedy answer is the most common right
  one), as LoRA agents on one base model do. Agent k's keyword specialty is type
  ``k mod T``: its initial logits favour that type's most often correct answer by
  ``specialty_bonus`` (a weak head start, as a role prompt).
- The router reads each candidate. Its features are one-hots of (type, answer) and of
  (type, agent), a bias, and a noisy check of the candidate: ``C = 1{A = Z}`` flipped
  with probability ``check_flip`` (the same verdict for the same answer to the same
  question; a stand-in for what an outcome model can read in a solution). A linear model
  on these features gives the score ``s_j``; it is the router's score in Eq. (3) and the
  outcome model's logit, ``mu_hat_j = sigmoid(s_j)``, as in ``mcpg.grpo.router.Router``.
  It starts at zero (uniform routing) and learns only from the selected candidate's
  reward, by :func:`mcpg.routing.ipw_outcome_loss`, after each actor update.
  ``candidate_blind=True`` drops the answer and check features: the router then reads the
  type and the agent only (Theorem 1's case ``b_i = 0``).

One update (on-policy, as §8): draw ``prompts_per_update`` questions; every agent samples
m answers to each; the g-th answers form slate g; the router scores every slate, draws I
from Eq. (3) and only ``G = R^(I)`` is fed back; :func:`~mcpg.grpo.objective.credit`
scores every agent on every slate (``wta``, ``removal`` or ``oracle``);
:func:`~mcpg.grpo.objective.group_standardize` standardises each agent's m scores;
:func:`~mcpg.grpo.objective.clipped_grpo_loss` is applied per agent (Adam); then the
router takes ``router_steps`` steps on the rollout's selected feedback. The method
``frozen`` skips the actor update (agents stay at their initial policies, the router
still learns): the reference.

Evaluation, as ``mcpg.grpo.train.evaluate_pool``: on held-out questions each agent
gives its greedy answer, the router deploys the highest score; reported are accuracy,
routing entropy (of Eq. 3 on the greedy slate), the Brier score of the deployed candidate,
specialization (the fraction deployed to the agent whose specialty is the question's
type), oracle accuracy (some agent is right) and regret = oracle - accuracy. The mechanism
diagnostics ``overlap`` (how often two agents' sampled answers coincide) and ``coverage``
(the chance that some agent's sampled answer is right) are computed exactly from the
policies.

:func:`exact_pool` turns a trained pool into a :class:`mcpg.mechanisms.RoutedPool`
(one type at a time; prompts = Z and the check flips), on which
:func:`theorem1_diagnostics`, :func:`unilateral_deviations` and :func:`profile_table`
compute J_sys, the private utilities U_i and their gradients exactly (Theorem 1), and
:func:`advantage_probe` measures by Monte Carlo which way each signal pushes an agent.

Seeds are a leading batch axis: :func:`train_pool` trains several independent pools at
once, each with its own generators (``numpy.random.default_rng([seed, stream])``) and its
own slice of every parameter, so a seed's run depends on that seed only. Torch runs on one
thread inside these functions: the tensors are tiny and a thread pool only adds overhead.
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .. import routing
from ..mechanisms import RoutedPool, private_utilities, private_utility_gradients, system_gradient, system_value
from .objective import clipped_grpo_loss, credit, group_standardize

__all__ = [
    "METHODS",
    "EVAL_KEYS",
    "DIAGNOSTIC_KEYS",
    "SimConfig",
    "SimRun",
    "draw_questions",
    "candidate_features",
    "initial_logits",
    "evaluation_metrics",
    "policy_overlap",
    "policy_coverage",
    "train_pool",
    "compare_methods",
    "summary_table",
    "paired_difference",
    "plot_curves",
    "calibrated_router",
    "router_beliefs",
    "exact_pool",
    "unilateral_deviations",
    "theorem1_diagnostics",
    "theorem1_trajectory",
    "profile_values",
    "profile_table",
    "advantage_probe",
    "score_spread",
]

METHODS: tuple[str, ...] = ("frozen", "wta", "removal", "oracle")
"""The training methods, ``frozen`` (no actor update) and the three credit signals of §8."""

EVAL_KEYS: tuple[str, ...] = ("accuracy", "entropy", "brier", "specialization", "oracle", "regret")
"""The six held-out diagnostics of the paper's Table 1, in its order."""

DIAGNOSTIC_KEYS: tuple[str, ...] = ("overlap", "coverage")
"""Mechanism diagnostics computed exactly from the policies (see :func:`policy_overlap`)."""

DEFAULT_TYPES: tuple[str, ...] = ("money", "time", "geometry")
DEFAULT_ANSWER_PROBS: tuple[tuple[float, ...], ...] = (
    (0.35, 0.35, 0.30),  # money: no answer dominates
    (0.50, 0.25, 0.25),  # time: one answer is right half the time
    (0.60, 0.20, 0.20),  # geometry: one answer dominates more
)


@dataclass(frozen=True)
class SimConfig:
    """Configuration of the simulated pool; names follow ``mcpg.grpo.configs.DEFAULTS``.

    Attributes:
        n_agents: K.
        answer_probs: (T, M) table, row t the distribution of the correct answer Z of a
            type-t question over the M candidate answers.
        type_probs: (T,) frequencies of the types; None: uniform.
        type_names: T labels (figures and tables only).
        check_flip: probability that the router's check of a candidate is wrong, in [0, 0.5].
        candidate_blind: the router reads (type, agent) only, never the candidate.
        base_scale: every agent starts from the same base policy, with logits
            ``base_scale * log(answer_probs)``: at 1 it samples each answer as often as it is
            right, and its greedy answer is the most often right one, like one base model
            shared by all agents; at 0 it is uniform.
        specialty_bonus: agent k's initial logit bonus on answer 0 of type ``k mod T``.
        init_noise: standard deviation of the random initial logits.
        completions_per_agent: m, the GRPO group size (>= 2).
        prompts_per_update: questions per rollout.
        updates: actor updates (each on its own fresh rollout).
        learning_rate: Adam on the agents' logits.
        clip_eps: TRL's epsilon of the clipped loss.
        num_iterations: optimizer steps per rollout (TRL's mu; 1 = on-policy).
        loss_type: TRL's loss aggregation (see :func:`~mcpg.grpo.objective.clipped_grpo_loss`).
        advantage_eps: added to the group standard deviation.
        scale_advantages: True (the engine's choice): GRPO's group standardisation,
            :func:`~mcpg.grpo.objective.group_standardize`; False: subtract the group mean
            only (TRL's ``scale_rewards="none"``, Dr. GRPO), which keeps the signal's scale.
        router_tau, router_eps: temperature and uniform exploration of Eq. (3).
        router_lr, router_steps: Adam on the router after each actor update.
        eval_questions: held-out questions per seed.
        eval_every: evaluate every this many updates (and at 0 and at the end).
    """

    n_agents: int = 3
    answer_probs: tuple[tuple[float, ...], ...] = DEFAULT_ANSWER_PROBS
    type_probs: tuple[float, ...] | None = None
    type_names: tuple[str, ...] = DEFAULT_TYPES
    check_flip: float = 0.2
    candidate_blind: bool = False
    base_scale: float = 1.0
    specialty_bonus: float = 1.0
    init_noise: float = 0.1
    completions_per_agent: int = 4
    prompts_per_update: int = 32
    updates: int = 150
    learning_rate: float = 0.1
    clip_eps: float = 0.2
    num_iterations: int = 1
    loss_type: str = "dapo"
    advantage_eps: float = 1e-6
    scale_advantages: bool = True
    router_tau: float = 0.5
    router_eps: float = 0.1
    router_lr: float = 0.1
    router_steps: int = 5
    eval_questions: int = 500
    eval_every: int = 5

    def __post_init__(self) -> None:
        probs = np.asarray(self.answer_probs, dtype=float)
        if probs.ndim != 2 or probs.shape[0] < 1 or probs.shape[1] < 2:
            raise ValueError(f"answer_probs must be a (T, M) table with M >= 2, got shape {probs.shape}")
        if np.isnan(probs).any() or (probs < 0).any() or not np.allclose(probs.sum(1), 1.0):
            raise ValueError("answer_probs rows must be probability vectors (non-negative, summing to 1)")
        T = probs.shape[0]
        if self.type_probs is not None:
            tp = np.asarray(self.type_probs, dtype=float)
            if tp.shape != (T,) or np.isnan(tp).any() or (tp < 0).any() or not np.isclose(tp.sum(), 1.0):
                raise ValueError(f"type_probs must be a probability vector of length {T}")
        if len(self.type_names) != T:
            raise ValueError(f"type_names must name the {T} types of answer_probs, got {len(self.type_names)}")
        for key in ("n_agents", "prompts_per_update", "num_iterations", "router_steps", "eval_questions",
                    "eval_every"):
            _positive_int(getattr(self, key), key)
        _positive_int(self.updates, "updates", allow_zero=True)
        _positive_int(self.completions_per_agent, "completions_per_agent")
        if self.n_agents < 2:
            raise ValueError(f"n_agents must be at least 2 (a routed pool), got {self.n_agents}")
        if self.completions_per_agent < 2:
            raise ValueError(f"completions_per_agent must be at least 2 (a GRPO group), got {self.completions_per_agent}")
        if not 0.0 <= self.check_flip <= 0.5:
            raise ValueError(f"check_flip must lie in [0, 0.5], got {self.check_flip}")
        if not (np.isfinite(self.router_tau) and self.router_tau > 0):
            raise ValueError(f"router_tau must be a positive finite temperature, got {self.router_tau}")
        if not 0.0 < self.router_eps <= 1.0:
            raise ValueError(f"router_eps must lie in (0, 1] (Eq. 19 divides by the propensities), got {self.router_eps}")
        for key in ("learning_rate", "router_lr"):
            v = getattr(self, key)
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"{key} must be positive, got {v}")
        for key in ("base_scale", "specialty_bonus", "init_noise", "clip_eps", "advantage_eps"):
            v = getattr(self, key)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"{key} must be non-negative, got {v}")

    # -- derived sizes ---------------------------------------------------------------
    @property
    def n_types(self) -> int:
        return len(self.answer_probs)

    @property
    def n_answers(self) -> int:
        return len(self.answer_probs[0])

    @property
    def n_features(self) -> int:
        """The number F of router features, (type, answer) and (type, agent) one-hots, the check and a bias."""
        return self.n_types * self.n_answers + self.n_types * self.n_agents + 2

    def type_distribution(self) -> np.ndarray:
        T = self.n_types
        return np.full(T, 1.0 / T) if self.type_probs is None else np.asarray(self.type_probs, dtype=float)

    def specialties(self) -> np.ndarray:
        """Agent k's specialty type, ``k mod T``."""
        return np.arange(self.n_agents) % self.n_types

    def specialist(self) -> np.ndarray:
        """For each type, the first agent whose specialty it is (-1 where none), shape (T,)."""
        out = np.full(self.n_types, -1)
        for k in range(self.n_agents - 1, -1, -1):
            out[k % self.n_types] = k
        return out


@contextmanager
def _single_thread():
    """Run torch on one intra-op thread: these tensors are tiny, and on a busy CPU the
    thread pool's synchronisation costs far more than the arithmetic."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def _one_thread(fn):
    """Decorator: run ``fn`` under :func:`_single_thread`."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _single_thread():
            return fn(*args, **kwargs)

    return wrapper


def _positive_int(v, name: str, allow_zero: bool = False) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be a {'non-negative' if allow_zero else 'positive'} integer, got {v!r}")


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def _check_seeds(seeds) -> list[int]:
    if isinstance(seeds, (int, np.integer)):
        seeds = [seeds]
    seeds = list(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of non-negative integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError("seeds must be distinct")
    return [int(s) for s in seeds]


# ------------------------------------------------------------------------------------------
# the environment
# ------------------------------------------------------------------------------------------
def draw_questions(cfg: SimConfig, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw n questions: types (n,), hidden correct answers Z (n,), and checks (n, M).

    ``checks[q, a] = 1{a = Z_q}`` flipped with probability ``cfg.check_flip``, independently
    for each (question, answer): what the router's check would say of answer a.
    """
    _positive_int(n, "n")
    T, M = cfg.n_types, cfg.n_answers
    types = rng.choice(T, size=n, p=cfg.type_distribution())
    cdf = np.cumsum(np.asarray(cfg.answer_probs, dtype=float), axis=1)
    z = np.minimum((rng.random(n)[:, None] > cdf[types]).sum(1), M - 1)
    flips = rng.random((n, M)) < cfg.check_flip
    checks = ((np.arange(M)[None, :] == z[:, None]) ^ flips).astype(float)
    return types, z, checks


def candidate_features(cfg: SimConfig, types, answers, checks) -> torch.Tensor:
    """The router's features of every candidate, shape ``answers.shape + (F,)``.

    Args:
        types: question types, shape (...,) (leading axes of ``answers`` without the last).
        answers: candidate answers, shape (..., K): K candidates per slate, agent j's in column j.
        checks: the check of each candidate in {0, 1}, shape of ``answers``.

    Layout of F = T*M + T*K + 2: one-hot of (type, answer), one-hot of (type, agent), the
    check coded as +-1, a bias. With ``cfg.candidate_blind`` the (type, answer) and check
    entries are zero: the score then depends on the type and the agent only.
    """
    types = np.asarray(types)
    answers = np.asarray(answers)
    checks = np.asarray(checks, dtype=float)
    T, M, K = cfg.n_types, cfg.n_answers, cfg.n_agents
    if answers.shape[-1:] != (K,) or types.shape != answers.shape[:-1]:
        raise ValueError(f"answers must have shape types.shape + ({K},), got {answers.shape} for types {types.shape}")
    if checks.shape != answers.shape:
        raise ValueError(f"checks must have the shape of answers {answers.shape}, got {checks.shape}")
    if ((types < 0) | (types >= T)).any():
        raise ValueError(f"types must lie in [0, {T})")
    if ((answers < 0) | (answers >= M)).any():
        raise ValueError(f"answers must lie in [0, {M})")
    t = np.broadcast_to(types[..., None], answers.shape)
    agent = np.broadcast_to(np.arange(K), answers.shape)
    F = cfg.n_features
    out = np.zeros(answers.shape + (F,))
    idx = np.indices(answers.shape)
    if not cfg.candidate_blind:
        out[(*idx, t * M + answers)] = 1.0
        out[..., F - 2] = 2.0 * checks - 1.0
    out[(*idx, T * M + t * K + agent)] = 1.0
    out[..., F - 1] = 1.0
    return torch.as_tensor(out, dtype=torch.float64)


def initial_logits(cfg: SimConfig, rng: np.random.Generator) -> np.ndarray:
    """Agents' initial logits (K, T, M): the shared base policy ``base_scale * log(answer_probs)``
    (probabilities floored at 1e-3), noise of scale ``init_noise``, and the specialty bonus on
    answer 0 of each agent's specialty type."""
    K, T, M = cfg.n_agents, cfg.n_types, cfg.n_answers
    base = cfg.base_scale * np.log(np.maximum(np.asarray(cfg.answer_probs, dtype=float), 1e-3))
    theta = base[None] + cfg.init_noise * rng.normal(size=(K, T, M))
    theta[np.arange(K), cfg.specialties(), 0] += cfg.specialty_bonus
    return theta


# ------------------------------------------------------------------------------------------
# evaluation
# ------------------------------------------------------------------------------------------
def evaluation_metrics(correct, scores, types, specialist, tau: float = 1.0, eps: float = 0.0) -> dict[str, np.ndarray]:
    """The six diagnostics of the paper's Table 1 from greedy slates (as the LLM engine's evaluation).

    Args:
        correct: R^(j) in {0, 1} of each agent's greedy candidate, shape (..., n, K).
        scores: the router's scores s_j of those candidates, shape (..., n, K).
        types: each question's type, shape (..., n).
        specialist: the agent whose specialty is each type, shape (T,) (-1: none).
        tau, eps: Eq. (3), for the routing entropy.

    The router deploys ``argmax_j s_j`` (the first on ties). Returns, each of shape (...,):
    ``accuracy`` (mean R of the deployed candidate), ``entropy`` (mean entropy in nats of
    Eq. 3's propensities), ``brier`` (mean ``(sigmoid(s_I) - R^(I))^2``), ``specialization``
    (fraction deployed to the question type's specialist, over questions whose type has
    one; NaN if none has), ``oracle`` (fraction where some candidate is right) and
    ``regret`` (oracle - accuracy).
    """
    R = np.asarray(correct, dtype=float)
    s = np.asarray(scores, dtype=float)
    types = np.asarray(types)
    specialist = np.asarray(specialist)
    if R.ndim < 2:
        raise ValueError(f"correct must have shape (..., n, K), got {R.shape}")
    if s.shape != R.shape:
        raise ValueError(f"scores must have the shape of correct {R.shape}, got {s.shape}")
    if types.shape != R.shape[:-1]:
        raise ValueError(f"types must have shape {R.shape[:-1]}, got {types.shape}")
    if np.isnan(R).any() or ((R != 0) & (R != 1)).any():
        raise ValueError("correct must hold 0/1 rewards")
    if np.isnan(s).any():
        raise ValueError("scores contains NaN")
    if specialist.ndim != 1 or ((types < 0) | (types >= len(specialist))).any():
        raise ValueError("specialist must have one entry per type, and types must index it")
    dep = np.argmax(s, axis=-1)
    R_dep = np.take_along_axis(R, dep[..., None], -1)[..., 0]
    mu_dep = 1.0 / (1.0 + np.exp(-np.take_along_axis(s, dep[..., None], -1)[..., 0]))
    p = routing.router_propensities(s, tau=tau, eps=eps)
    matched = specialist[types]
    has = matched >= 0
    with np.errstate(invalid="ignore", divide="ignore"):
        spec = ((dep == matched) & has).sum(-1) / has.sum(-1)
    acc = R_dep.mean(-1)
    oracle = R.max(-1).mean(-1)
    return {
        "accuracy": acc,
        "entropy": routing.routing_entropy(p).mean(-1),
        "brier": ((mu_dep - R_dep) ** 2).mean(-1),
        "specialization": np.where(has.sum(-1) > 0, spec, np.nan),
        "oracle": oracle,
        "regret": oracle - acc,
    }


def policy_overlap(policies, type_probs) -> np.ndarray:
    """How often two agents give the same answer: the mean over agent pairs and types of
    ``sum_a pi_i(a | t) pi_j(a | t)``, weighted by the type frequencies.

    Args:
        policies: (..., K, T, M) answer distributions.
        type_probs: (T,).

    Returns shape (...,). 1 when all agents give the same deterministic answer (crowding);
    1/M for independent uniform agents; 0 when no two agents can ever agree.
    """
    pi = np.asarray(policies, dtype=float)
    w = np.asarray(type_probs, dtype=float)
    if pi.ndim < 3 or pi.shape[-2] != w.shape[0]:
        raise ValueError(f"policies must have shape (..., K, T, M) with T = {w.shape[0]}, got {pi.shape}")
    K = pi.shape[-3]
    if K < 2:
        raise ValueError("policies needs at least two agents")
    agree = np.einsum("...itm,...jtm->...ijt", pi, pi)
    iu = np.triu_indices(K, 1)
    return (agree[..., iu[0], iu[1], :].mean(-2) * w).sum(-1)


def policy_coverage(policies, answer_probs, type_probs) -> np.ndarray:
    """The chance that some agent's sampled answer is right: ``sum_t w_t sum_a q_t(a) (1 - prod_k (1 - pi_k(a | t)))``.

    The sampled-slate counterpart of oracle accuracy; shape (...,).
    """
    pi = np.asarray(policies, dtype=float)
    q = np.asarray(answer_probs, dtype=float)
    w = np.asarray(type_probs, dtype=float)
    if pi.shape[-2:] != q.shape:
        raise ValueError(f"policies must end in the (T, M) shape {q.shape} of answer_probs, got {pi.shape}")
    hit = 1.0 - np.prod(1.0 - pi, axis=-3)  # (..., T, M)
    return ((hit * q).sum(-1) * w).sum(-1)


# ------------------------------------------------------------------------------------------
# training
# ------------------------------------------------------------------------------------------
@dataclass
class SimRun:
    """The record of :func:`train_pool`: several seeds of one method.

    Attributes:
        cfg, method, seeds: what was run.
        updates: the updates at which the pool was evaluated, shape (n_ckpt,).
        metrics: name -> array (n_seeds, n_ckpt), for :data:`EVAL_KEYS` and
            :data:`DIAGNOSTIC_KEYS`, plus ``train_reward`` (mean deployed reward of the
            rollout that followed each checkpoint; NaN at the end).
        by_type: per question type, arrays (n_seeds, n_ckpt, T): ``accuracy`` and
            ``oracle`` on the held-out questions of that type, and ``distinct``, the number
            of different greedy answers the K agents give to that type.
        logits: the agents' logits at each checkpoint, (n_seeds, n_ckpt, K, T, M).
        router: the router's weights at each checkpoint, (n_seeds, n_ckpt, F).
        seconds: wall-clock time of the whole run.
    """

    cfg: SimConfig
    method: str
    seeds: list[int]
    updates: np.ndarray
    metrics: dict[str, np.ndarray]
    by_type: dict[str, np.ndarray]
    logits: np.ndarray
    router: np.ndarray
    seconds: float = 0.0

    def frame(self):
        """Long pandas DataFrame: one row per (seed, checkpoint), a column per metric."""
        import pandas as pd

        S, n = len(self.seeds), len(self.updates)
        data = {"method": self.method, "seed": np.repeat(self.seeds, n), "update": np.tile(self.updates, S)}
        data.update({k: v.reshape(-1) for k, v in self.metrics.items()})
        return pd.DataFrame(data)


def _gather_logp(logp_table: torch.Tensor, types: np.ndarray, actions: np.ndarray) -> torch.Tensor:
    """log pi_k(A | t) for actions (S, B, m, K) of questions with types (S, B); table (S, K, T, M)."""
    S, B, m, K = actions.shape
    s = torch.arange(S).view(S, 1, 1, 1)
    k = torch.arange(K).view(1, 1, 1, K)
    t = torch.as_tensor(types).view(S, B, 1, 1)
    return logp_table[s, k, t, torch.as_tensor(actions)]


def _scores(features: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Router scores: features (S, ..., K, F) times weights (S, F)."""
    S = weights.shape[0]
    flat = features.reshape(S, -1, features.shape[-1])
    return torch.einsum("snf,sf->sn", flat, weights).reshape(features.shape[:-1])


def _evaluate(cfg: SimConfig, theta: torch.Tensor, weights: torch.Tensor, eval_set) -> dict[str, np.ndarray]:
    types, z, checks = eval_set  # (S, n), (S, n), (S, n, M)
    with torch.no_grad():
        greedy = theta.argmax(-1).numpy()  # (S, K, T)
        pi = torch.softmax(theta, -1).numpy()
        S, n = types.shape
        answers = np.stack([greedy[s][:, types[s]].T for s in range(S)])  # (S, n, K)
        correct = (answers == z[..., None]).astype(float)
        c = np.take_along_axis(checks, answers, axis=-1)
        s = _scores(candidate_features(cfg, types, answers, c), weights).numpy()
    out = evaluation_metrics(correct, s, types, cfg.specialist(), tau=cfg.router_tau, eps=cfg.router_eps)
    out["overlap"] = policy_overlap(pi, cfg.type_distribution())
    out["coverage"] = policy_coverage(pi, cfg.answer_probs, cfg.type_distribution())
    # per type: deployed accuracy, oracle accuracy, number of distinct greedy answers
    dep = np.argmax(s, -1)
    R_dep = np.take_along_axis(correct, dep[..., None], -1)[..., 0]
    onehot = types[..., None] == np.arange(cfg.n_types)  # (S, n, T)
    count = np.maximum(onehot.sum(1), 1)
    by_type = {
        "accuracy": (R_dep[..., None] * onehot).sum(1) / count,
        "oracle": (correct.max(-1)[..., None] * onehot).sum(1) / count,
        "distinct": np.array([[len(set(greedy[si][:, t])) for t in range(cfg.n_types)] for si in range(S)], float),
    }
    return out, by_type


@_one_thread
def train_pool(cfg: SimConfig, method: str, seeds: Sequence[int] | int = (0,)) -> SimRun:
    """Train the simulated routed pool with one method, for each seed (paper §8's loop).

    Args:
        cfg: the environment and the training hyperparameters.
        method: ``"frozen"``, ``"wta"``, ``"removal"`` or ``"oracle"`` (:data:`METHODS`).
        seeds: seeds of the independent runs, trained together as a batch.

    Each update: a rollout of ``prompts_per_update`` questions with m slates; routing by the
    current (fixed) router; credit by :func:`~mcpg.grpo.objective.credit`; per-agent group
    standardisation; the clipped GRPO loss per agent (one Adam step per iteration); then
    ``router_steps`` Adam steps of :func:`mcpg.routing.ipw_outcome_loss` on the selected
    feedback. Evaluations (held-out questions, greedy answers) at update 0, every
    ``eval_every`` updates and at the end.
    """
    if not isinstance(cfg, SimConfig):
        raise ValueError(f"cfg must be a SimConfig, got {type(cfg).__name__}")
    _check_method(method)
    seeds = _check_seeds(seeds)
    return _train(cfg, method, seeds)


def _train(cfg: SimConfig, method: str, seeds: list[int]) -> SimRun:
    t0 = time.perf_counter()
    S, K, T, M = len(seeds), cfg.n_agents, cfg.n_types, cfg.n_answers
    B, m = cfg.prompts_per_update, cfg.completions_per_agent
    rngs = [np.random.default_rng([s, 0]) for s in seeds]  # init, rollouts and routing draws
    eval_sets = [draw_questions(cfg, cfg.eval_questions, np.random.default_rng([s, 1])) for s in seeds]
    eval_set = tuple(np.stack([e[i] for e in eval_sets]) for i in range(3))

    theta = torch.tensor(np.stack([initial_logits(cfg, r) for r in rngs]), dtype=torch.float64, requires_grad=True)
    weights = torch.zeros((S, cfg.n_features), dtype=torch.float64, requires_grad=True)
    actor_opt = torch.optim.Adam([theta], lr=cfg.learning_rate)
    router_opt = torch.optim.Adam([weights], lr=cfg.router_lr)

    ckpts = sorted({0, cfg.updates, *range(0, cfg.updates, cfg.eval_every)})
    keys = EVAL_KEYS + DIAGNOSTIC_KEYS + ("train_reward",)
    hist = {k: np.full((S, len(ckpts)), np.nan) for k in keys}
    by_type = {k: np.full((S, len(ckpts), T), np.nan) for k in ("accuracy", "oracle", "distinct")}
    logit_snap = np.zeros((S, len(ckpts), K, T, M))
    router_snap = np.zeros((S, len(ckpts), cfg.n_features))
    ci = 0
    for u in range(cfg.updates + 1):
        if u in ckpts:
            ev, ev_type = _evaluate(cfg, theta, weights, eval_set)
            for k, v in ev.items():
                hist[k][:, ci] = v
            for k, v in ev_type.items():
                by_type[k][:, ci] = v
            logit_snap[:, ci] = theta.detach().numpy()
            router_snap[:, ci] = weights.detach().numpy()
            ci += 1
        if u == cfg.updates:
            break

        # 1. rollout: m answers per agent per question; the g-th answers form slate g
        qs = [draw_questions(cfg, B, r) for r in rngs]
        types = np.stack([q[0] for q in qs])            # (S, B)
        z = np.stack([q[1] for q in qs])                # (S, B)
        checks = np.stack([q[2] for q in qs])           # (S, B, M)
        with torch.no_grad():
            pi = torch.softmax(theta, -1).numpy()       # (S, K, T, M)
        pi_q = np.stack([pi[s][:, types[s]] for s in range(S)]).transpose(0, 2, 1, 3)  # (S, B, K, M)
        uni = np.stack([r.random((B, m, K)) for r in rngs])
        cdf = np.cumsum(pi_q, -1)[:, :, None]           # (S, B, 1, K, M)
        actions = np.minimum((uni[..., None] > cdf).sum(-1), M - 1)  # (S, B, m, K)

        # 2. rewards R^(j) of every candidate (only R^(I) is fed back; all of R only to the oracle)
        R = (actions == z[:, :, None, None]).astype(float)
        c = np.take_along_axis(np.broadcast_to(checks[:, :, None, :], (S, B, m, M)), actions, -1)
        t_slate = np.broadcast_to(types[:, :, None], (S, B, m))

        # 3. routing with the current router (held fixed); only G = R^(I) is fed back
        feats = candidate_features(cfg, t_slate, actions, c)
        with torch.no_grad():
            s_np = _scores(feats, weights).numpy()
        p = routing.router_propensities(s_np, tau=cfg.router_tau, eps=cfg.router_eps)
        P = routing.leave_one_out_propensities(s_np, tau=cfg.router_tau, eps=cfg.router_eps)
        mu_hat = 1.0 / (1.0 + np.exp(-s_np))
        I = np.stack([routing.sample_selection(p[s], rngs[s]) for s in range(S)])  # (S, B, m)
        G = np.take_along_axis(R, I[..., None], -1)[..., 0]
        if u in ckpts:
            hist["train_reward"][:, ci - 1] = G.reshape(S, -1).mean(1)

        # 4-6. credit, per-agent group standardisation, clipped GRPO loss per agent
        if method != "frozen":
            full = R if method == "oracle" else None  # filtered feedback for wta and removal
            scores = credit(method, I, G, p, P, mu_hat, rewards_all=full)          # (S, B, m, K)
            if cfg.scale_advantages:
                adv = torch.as_tensor(group_standardize(scores, eps=cfg.advantage_eps, axis=-2))
            else:
                adv = torch.as_tensor(scores - scores.mean(axis=-2, keepdims=True))
            with torch.no_grad():
                logp_old = _gather_logp(torch.log_softmax(theta, -1), types, actions)
            # The engine sums one clipped loss per agent, each averaged over that agent's
            # completions. Every (seed, agent) here has the same B * m one-token completions,
            # so S * K times the loss averaged over all of them is that same sum.
            ones = torch.ones(S * B * m * K, 1, dtype=torch.float64)
            for _ in range(cfg.num_iterations):
                actor_opt.zero_grad()
                logp = _gather_logp(torch.log_softmax(theta, -1), types, actions)
                loss = S * K * clipped_grpo_loss(logp.reshape(-1, 1), logp_old.reshape(-1, 1), adv.reshape(-1), ones,
                                                 clip_eps=cfg.clip_eps, loss_type=cfg.loss_type)
                loss.backward()
                actor_opt.step()

        # 7. router update on this rollout's selected feedback (IPW cross-entropy)
        #    (each seed's router has its own weights and the same number of slates, so S times
        #    the loss over all slates is the sum of the seeds' losses)
        sel = torch.as_tensor(I.reshape(-1))
        G_t = torch.as_tensor(G.reshape(-1))
        p_t = torch.as_tensor(p.reshape(-1, K))
        for _ in range(cfg.router_steps):
            router_opt.zero_grad()
            loss = S * routing.ipw_outcome_loss(_scores(feats, weights).reshape(-1, K), sel, G_t, p_t)
            loss.backward()
            router_opt.step()

    return SimRun(cfg=cfg, method=method, seeds=seeds, updates=np.array(ckpts), metrics=hist, by_type=by_type,
                  logits=logit_snap, router=router_snap, seconds=time.perf_counter() - t0)


def compare_methods(cfg: SimConfig, methods: Sequence[str] = METHODS, seeds: Sequence[int] = range(10)):
    """Train every method on the same seeds; returns ``(frame, runs)``.

    ``frame`` is the long DataFrame of all runs (:meth:`SimRun.frame`, concatenated) and
    ``runs`` maps each method to its :class:`SimRun`. A seed fixes the initial policies,
    the held-out questions and the first rollouts, so the methods are compared on common
    random numbers and differences can be paired by seed.
    """
    import pandas as pd

    methods = list(methods)
    if not methods:
        raise ValueError("methods must name at least one method")
    for m_ in methods:
        _check_method(m_)
    seeds = _check_seeds(seeds)
    runs = {m_: train_pool(cfg, m_, seeds) for m_ in methods}
    return pd.concat([r.frame() for r in runs.values()], ignore_index=True), runs


def summary_table(frame, keys: Sequence[str] = EVAL_KEYS, level: float = 0.95, update: int | None = None,
                  formatted: bool = False, digits: int = 3):
    """Mean and confidence half-width of each metric per method, at one update (default: the last).

    Returns a DataFrame indexed by method with, for each key, the columns ``key`` (mean)
    and ``key ±`` (half-width of the normal-approximation interval over seeds,
    :func:`mcpg.plotting.mean_ci`), and ``seeds``. With ``formatted=True``, one text column
    per key instead, ``"mean ± half-width"`` with ``digits`` decimals.
    """
    import pandas as pd

    from ..plotting import mean_ci

    missing = [k for k in keys if k not in frame.columns]
    if missing:
        raise ValueError(f"keys not in frame: {missing}")
    u = frame["update"].max() if update is None else update
    at = frame[frame["update"] == u]
    if at.empty:
        raise ValueError(f"no rows at update {u}")
    rows = {}
    for method, g in at.groupby("method", sort=False):
        row = {}
        for k in keys:
            x = g[k].dropna().to_numpy()
            mean, hw = mean_ci(x, level=level) if len(x) >= 2 else (x.mean() if len(x) else np.nan, np.nan)
            row[k], row[k + " ±"] = float(mean), float(hw)
        row["seeds"] = int(g["seed"].nunique())
        rows[method] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    if not formatted:
        return table
    return pd.DataFrame({k: [f"{m:.{digits}f} ± {h:.{digits}f}" for m, h in zip(table[k], table[k + " ±"])]
                         for k in keys}, index=table.index)


def paired_difference(runs: dict, a: str, b: str, key: str = "accuracy", level: float = 0.95) -> tuple[float, float, int]:
    """Mean over seeds of ``key`` under method a minus under method b at the last update,
    its confidence half-width, and the number of seeds (runs on the same seeds)."""
    from ..plotting import mean_ci

    if a not in runs or b not in runs:
        raise ValueError(f"runs must hold both {a!r} and {b!r}")
    if runs[a].seeds != runs[b].seeds:
        raise ValueError("the two runs must use the same seeds to be paired")
    if key not in runs[a].metrics:
        raise ValueError(f"unknown key {key!r}")
    d = runs[a].metrics[key][:, -1] - runs[b].metrics[key][:, -1]
    mean, hw = mean_ci(d, level=level)
    return float(mean), float(hw), len(d)


def plot_curves(frame, keys: Sequence[str], axes=None, level: float = 0.95, labels: dict | None = None):
    """One panel per metric: the mean over seeds against updates, with a shaded confidence band.

    Colours are :data:`mcpg.plotting.METHOD_COLORS`. Returns the axes.
    """
    import matplotlib.pyplot as plt

    from ..plotting import METHOD_COLORS, mean_ci

    keys = list(keys)
    if axes is None:
        _, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), squeeze=False)
        axes = axes[0]
    axes = np.atleast_1d(axes).ravel()
    if len(axes) < len(keys):
        raise ValueError(f"axes must hold at least {len(keys)} panels")
    labels = labels or {}
    for ax, key in zip(axes, keys):
        if key not in frame.columns:
            raise ValueError(f"key {key!r} not in frame")
        for method, g in frame.groupby("method", sort=False):
            wide = g.pivot(index="seed", columns="update", values=key)
            mean, hw = mean_ci(wide.to_numpy(), axis=0, level=level)
            x = wide.columns.to_numpy()
            color = METHOD_COLORS.get(method)
            ax.plot(x, mean, color=color, label=f"{method} ({len(wide)} seeds)")
            ax.fill_between(x, mean - hw, mean + hw, color=color, alpha=0.2, linewidth=0)
        ax.set_xlabel("update")
        ax.set_ylabel(labels.get(key, key))
    return axes


# ------------------------------------------------------------------------------------------
# exact analysis (Theorem 1) on the enumerated pool
# ------------------------------------------------------------------------------------------
def calibrated_router(cfg: SimConfig) -> np.ndarray:
    """The outcome model that is exactly right for this environment, as router weights (F,).

    Since the check flips independently of everything else, ``P(R = 1 | t, a, C) =
    sigmoid(logit q_t(a) + (2C - 1) log((1 - f) / f))``: weight ``logit q_t(a)`` on the
    (type, answer) one-hot (probabilities clipped to [1e-3, 1 - 1e-3]), ``log((1 - f)/f)``
    on the +-1 check (0 when f = 0.5; capped at log(999) when f = 0), and 0 on the agents
    and the bias. With ``cfg.candidate_blind`` only the type enters: ``logit`` of the
    type's mean accuracy is not identifiable per candidate, so the weights are all zero.
    """
    T, M = cfg.n_types, cfg.n_answers
    w = np.zeros(cfg.n_features)
    if cfg.candidate_blind:
        return w
    q = np.clip(np.asarray(cfg.answer_probs, dtype=float), 1e-3, 1 - 1e-3)
    w[: T * M] = np.log(q / (1 - q)).ravel()
    f = min(max(cfg.check_flip, 1e-3), 0.5)
    w[-2] = np.log((1 - f) / f)
    return w


def router_beliefs(cfg: SimConfig, weights) -> np.ndarray:
    """The outcome model's mu_hat for every (type, answer, check), averaged over the agents.

    Args:
        weights: router weights of shape (..., F) (e.g. a run's ``router`` array).

    Returns shape (..., T, M, 2): ``[..., t, a, c]`` is the mean over agents k of
    ``sigmoid(s)`` for agent k answering a to a type-t question with check c. Compare with
    :func:`calibrated_router`'s values, the exact ``P(R = 1 | t, a, c)``.
    """
    w = np.asarray(weights, dtype=float)
    if w.shape[-1:] != (cfg.n_features,) or np.isnan(w).any():
        raise ValueError(f"weights must have shape (..., {cfg.n_features}) without NaN, got {w.shape}")
    T, M, K = cfg.n_types, cfg.n_answers, cfg.n_agents
    t = np.repeat(np.arange(T), M * 2)
    a = np.tile(np.repeat(np.arange(M), 2), T)
    c = np.tile(np.arange(2), T * M)
    x = candidate_features(cfg, t, np.repeat(a[:, None], K, 1), np.repeat(c[:, None], K, 1)).numpy()  # (T*M*2, K, F)
    mu = 1.0 / (1.0 + np.exp(-np.einsum("nkf,...f->...nk", x, w)))
    return mu.mean(-1).reshape(w.shape[:-1] + (T, M, 2))

def exact_pool(cfg: SimConfig, logits, weights, type_index: int) -> tuple[RoutedPool, np.ndarray]:
    """The questions of one type as an exactly enumerated :class:`~mcpg.mechanisms.RoutedPool`.

    A prompt is ``H = (Z, flips)``: the hidden correct answer and the M check flips, with
    probability ``q_t(Z) f^{#flips} (1 - f)^{M - #flips}`` (answers with ``q_t(Z) = 0`` are
    left out). Agent k's logits are ``logits[k, type_index]`` at every prompt (agents see
    only the type); ``g_j(H, a) = 1{a = Z}``; the router's score of agent k answering a is
    ``weights . candidate_features(t, a, k, check(H, a))``, with ``cfg``'s tau and eps.

    Args:
        logits: (K, T, M) agents' logits.
        weights: (F,) router weights (e.g. a :class:`SimRun`'s ``router[s, c]`` or
            :func:`calibrated_router`).
        type_index: t.

    Returns:
        the pool and the prompts' correct answers Z, shape (n_H,).
    """
    K, T, M = cfg.n_agents, cfg.n_types, cfg.n_answers
    theta = np.asarray(logits, dtype=float)
    w = np.asarray(weights, dtype=float)
    if theta.shape != (K, T, M):
        raise ValueError(f"logits must have shape ({K}, {T}, {M}), got {theta.shape}")
    if w.shape != (cfg.n_features,):
        raise ValueError(f"weights must have shape ({cfg.n_features},), got {w.shape}")
    if np.isnan(theta).any() or np.isnan(w).any():
        raise ValueError("logits and weights must not contain NaN")
    if isinstance(type_index, bool) or not isinstance(type_index, (int, np.integer)) or not 0 <= type_index < T:
        raise ValueError(f"type_index must be an integer in [0, {T}), got {type_index!r}")
    q = np.asarray(cfg.answer_probs[type_index], dtype=float)
    f = cfg.check_flip
    flips = (np.arange(2**M)[:, None] >> np.arange(M)) & 1  # (2^M, M)
    p_flip = np.prod(np.where(flips == 1, f, 1 - f), axis=1)
    zs = np.flatnonzero(q > 0)
    z = np.repeat(zs, 2**M)
    fl = np.tile(flips, (len(zs), 1))
    probs = q[z] * np.tile(p_flip, len(zs))
    g = (np.arange(M)[None, :] == z[:, None]).astype(float)  # (n_H, M)
    checks = np.logical_xor(g == 1, fl == 1).astype(float)
    n_H = len(z)
    answers = np.broadcast_to(np.arange(M)[None, :, None], (n_H, M, K))
    feats = candidate_features(cfg, np.full((n_H, M), type_index), answers,
                               np.broadcast_to(checks[:, :, None], (n_H, M, K)))
    scores = (feats.numpy() @ w).transpose(2, 0, 1)  # (K, n_H, M)
    pool = RoutedPool(np.broadcast_to(theta[:, type_index][:, None, :], (K, n_H, M)), g, scores,
                      tau=cfg.router_tau, eps=cfg.router_eps, prompt_probs=probs / probs.sum(), noise="fixed")
    return pool, z


def _given_agent_action(pool: RoutedPool, X: torch.Tensor, i: int) -> torch.Tensor:
    """``sum_H P(H) E[X | H, A^(i) = a]`` for every action a of agent i, shape (M,): the
    others drawn from their policies, agent i's action fixed to a."""
    K = pool.n_agents
    w = torch.as_tensor(pool.prompt_probs, dtype=X.dtype).reshape((-1,) + (1,) * K)
    for k, pi in enumerate(pool.policies()):
        if k != i:
            shape = [pi.shape[0]] + [1] * K
            shape[k + 1] = pi.shape[1]
            w = w * pi.detach().reshape(shape)
    dims = [d for d in range(K + 1) if d != i + 1]
    return (w * X.detach()).sum(dim=dims)


@_one_thread
def unilateral_deviations(cfg: SimConfig, logits, weights) -> dict[str, np.ndarray]:
    """What each agent would get, and what the system would get, if that agent alone
    switched its answer to one type (exact, on :func:`exact_pool`).

    Returns:
        ``J``: J_sys (scalar array), the expected deployed reward under the current
        policies and Eq. (3) routing; ``U``: (K,) private utilities ``U_i = E[1{I=i} G]``
        (``sum_i U_i = J``); ``J_dev[i, t, a]``: J_sys if agent i always answered a on type
        t (everything else unchanged); ``U_dev[i, t, a]``: agent i's own U_i in that case.
    """
    K, T, M = cfg.n_agents, cfg.n_types, cfg.n_answers
    wt = cfg.type_distribution()
    J_t = np.zeros(T)
    U_t = np.zeros((T, K))
    Jd = np.zeros((K, T, M))
    Ud = np.zeros((K, T, M))
    for t in range(T):
        pool, _ = exact_pool(cfg, logits, weights, t)
        with torch.no_grad():
            J_t[t] = float(system_value(pool))
            U_t[t] = private_utilities(pool).numpy()
            G = pool.reward_mean()
            for i in range(K):
                Jd[i, t] = _given_agent_action(pool, G, i).numpy()
                Ud[i, t] = _given_agent_action(pool, pool.winner_return(i), i).numpy()
    J = float(wt @ J_t)
    U = wt @ U_t
    # switching on type t changes only that type's term
    J_dev = J + wt[None, :, None] * (Jd - J_t[None, :, None])
    U_dev = U[:, None, None] + wt[None, :, None] * (Ud - U_t.T[:, :, None])
    return {"J": np.asarray(J), "U": U, "J_dev": J_dev, "U_dev": U_dev}


@_one_thread
def theorem1_diagnostics(cfg: SimConfig, logits, weights) -> dict[str, np.ndarray]:
    """Theorem 1 on a (trained) pool, exactly.

    Returns, per agent i (arrays of shape (K,), gradients taken with respect to agent i's
    per-type logits, weighted by the type frequencies):

    - ``grad_J``, ``grad_U``, ``bias``: the norms of ``nabla_i J_sys``, ``nabla_i U_i`` and
      of ``b_i = E[Psi_i D_i]`` (the displaced competitor return, :func:`~mcpg.mechanisms.winner_take_all_bias`);
    - ``identity_error``: ``max |nabla_i J_sys - nabla_i U_i - b_i|`` (Theorem 1 says 0);
    - ``cosine``: the cosine between ``nabla_i U_i`` (what winner-take-all ascends) and
      ``nabla_i J_sys``;
    - ``private_gain``: ``max_{t, a} U_dev - U_i``, what agent i could still gain for itself
      by switching its answer to one type (0 at an equilibrium of private utilities);
    - ``system_gain``: ``max_{t, a} J_dev - J_sys``, what the system would gain if agent i
      made the switch that is best for the system.
    """
    from ..mechanisms import winner_take_all_bias

    K, T, M = cfg.n_agents, cfg.n_types, cfg.n_answers
    wt = cfg.type_distribution()
    gJ = np.zeros((K, T, M))
    gU = np.zeros((K, T, M))
    b = np.zeros((K, T, M))
    for t in range(T):
        pool, _ = exact_pool(cfg, logits, weights, t)
        # each per-prompt copy of the type's logits gets its share: sum over prompts
        gJ[:, t] = wt[t] * np.stack([x.sum(0) for x in system_gradient(pool)])
        gU[:, t] = wt[t] * np.stack([x.sum(0) for x in private_utility_gradients(pool)])
        b[:, t] = wt[t] * np.stack([x.sum(0) for x in winner_take_all_bias(pool)])
    dev = unilateral_deviations(cfg, logits, weights)
    flat = lambda x: x.reshape(K, -1)  # noqa: E731
    nJ, nU = np.linalg.norm(flat(gJ), axis=1), np.linalg.norm(flat(gU), axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = (flat(gJ) * flat(gU)).sum(1) / (nJ * nU)
    return {
        "grad_J": nJ,
        "grad_U": nU,
        "bias": np.linalg.norm(flat(b), axis=1),
        "identity_error": np.abs(flat(gJ - gU - b)).max(1),
        "cosine": cos,
        "private_gain": flat(dev["U_dev"]).max(1) - dev["U"],
        "system_gain": flat(dev["J_dev"]).max(1) - dev["J"],
    }


@_one_thread
def profile_values(cfg: SimConfig, profiles, weights, type_index: int, sharpness: float = 40.0) -> tuple[np.ndarray, np.ndarray]:
    """J_t and every U_i when the agents answer type ``type_index`` deterministically.

    Args:
        profiles: answer profiles, shape (n, K): row r gives agent k the answer
            ``profiles[r, k]`` on type t (logits ``sharpness * onehot``).
        weights: router weights, shape (F,) for all profiles or (n, F), one per profile.

    Returns ``J`` of shape (n,) (expected deployed reward on type-t questions) and ``U`` of
    shape (n, K) (private utilities ``E[1{I = i} G | type t]``; each row sums to J).
    """
    K, T, M = cfg.n_agents, cfg.n_types, cfg.n_answers
    prof = np.asarray(profiles)
    if prof.ndim != 2 or prof.shape[1] != K or ((prof < 0) | (prof >= M)).any():
        raise ValueError(f"profiles must have shape (n, {K}) with answers in [0, {M})")
    if not (np.isfinite(sharpness) and sharpness > 0):
        raise ValueError(f"sharpness must be positive, got {sharpness}")
    w = np.asarray(weights, dtype=float)
    if w.shape == (cfg.n_features,):
        w = np.broadcast_to(w, (len(prof), cfg.n_features))
    if w.shape != (len(prof), cfg.n_features):
        raise ValueError(f"weights must have shape ({cfg.n_features},) or ({len(prof)}, {cfg.n_features})")
    J = np.zeros(len(prof))
    U = np.zeros((len(prof), K))
    for r, (p_, w_) in enumerate(zip(prof, w)):
        theta = np.zeros((K, T, M))
        theta[np.arange(K), type_index, p_] = sharpness
        pool, _ = exact_pool(cfg, theta, w_, type_index)
        with torch.no_grad():
            J[r] = float(system_value(pool))
            U[r] = private_utilities(pool).numpy()
    return J, U


def profile_table(cfg: SimConfig, type_index: int, weights=None, sharpness: float = 40.0):
    """Every way the K agents can each give one answer to one type, exactly (Theorem 1's game).

    For each profile (a_1, ..., a_K) (agents deterministic on type ``type_index``),
    :func:`profile_values` gives J_t = E[G | type t] and each agent's private utility
    U_i = E[1{I=i} G | type t]. A profile is an equilibrium of private utilities when no
    agent can raise its own U_i by changing its answer alone (where winner-take-all
    training can come to rest), and best for the system when it maximises J_t.

    Args:
        weights: router weights (F,); default :func:`calibrated_router`.
        sharpness: deterministic policies are logits ``sharpness * onehot(a)``.

    Returns a DataFrame, one row per profile, sorted by J_t (descending): ``profile``,
    ``distinct`` answers, ``J``, ``U_1..U_K``, ``equilibrium``, ``best``.
    """
    import itertools

    import pandas as pd

    K, M = cfg.n_agents, cfg.n_answers
    w = calibrated_router(cfg) if weights is None else np.asarray(weights, dtype=float)
    profs = list(itertools.product(range(M), repeat=K))
    J, U = profile_values(cfg, np.array(profs), w, type_index, sharpness)
    values = {p_: (J[r], U[r]) for r, p_ in enumerate(profs)}
    best = J.max()
    rows = []
    for prof, (Jp, Up) in values.items():
        eq = all(values[prof[:i] + (a,) + prof[i + 1:]][1][i] <= Up[i] + 1e-12
                 for i in range(K) for a in range(M) if a != prof[i])
        rows.append({"profile": prof, "distinct": len(set(prof)), "J": Jp,
                     **{f"U_{i + 1}": Up[i] for i in range(K)}, "equilibrium": eq, "best": Jp >= best - 1e-12})
    return pd.DataFrame(rows).sort_values("J", ascending=False, ignore_index=True)

def _probe(cfg: SimConfig, type_index: int, others, n: int, rng: np.random.Generator, weights, agent: int):
    """One routed rollout of n groups: agent ``agent`` samples m answers uniformly, the
    others always give ``others``; returns (its answers (n, m), Z (n,), signal -> scores (n, m, K))."""
    _positive_int(n, "n")
    K, M, m = cfg.n_agents, cfg.n_answers, cfg.completions_per_agent
    others = np.asarray(others)
    if others.shape != (K,) or ((others < 0) | (others >= M)).any():
        raise ValueError(f"others must hold one answer in [0, {M}) per agent, shape ({K},)")
    if isinstance(agent, bool) or not isinstance(agent, (int, np.integer)) or not 0 <= agent < K:
        raise ValueError(f"agent must lie in [0, {K})")
    if isinstance(type_index, bool) or not isinstance(type_index, (int, np.integer)) or not 0 <= type_index < cfg.n_types:
        raise ValueError(f"type_index must be an integer in [0, {cfg.n_types})")
    w = calibrated_router(cfg) if weights is None else np.asarray(weights, dtype=float)
    if w.shape != (cfg.n_features,) or np.isnan(w).any():
        raise ValueError(f"weights must be {cfg.n_features} numbers")
    q = np.asarray(cfg.answer_probs[type_index], dtype=float)
    z = rng.choice(M, size=n, p=q)
    checks = (np.arange(M)[None, :] == z[:, None]) ^ (rng.random((n, M)) < cfg.check_flip)
    actions = np.broadcast_to(others, (n, m, K)).copy()
    actions[..., agent] = rng.integers(0, M, size=(n, m))
    R = (actions == z[:, None, None]).astype(float)
    c = np.take_along_axis(np.broadcast_to(checks[:, None, :], (n, m, M)), actions, -1).astype(float)
    s = (candidate_features(cfg, np.full((n, m), type_index), actions, c) @ torch.as_tensor(w)).numpy()
    p = routing.router_propensities(s, tau=cfg.router_tau, eps=cfg.router_eps)
    P = routing.leave_one_out_propensities(s, tau=cfg.router_tau, eps=cfg.router_eps)
    mu = 1.0 / (1.0 + np.exp(-s))
    I = routing.sample_selection(p, rng)
    G = np.take_along_axis(R, I[..., None], -1)[..., 0]
    scores = {signal: credit(signal, I, G, p, P, mu, rewards_all=R) for signal in ("wta", "removal", "oracle")}
    return actions[..., agent], z, scores


def _mean_hw(x: np.ndarray) -> tuple[float, float]:
    x = np.asarray(x, dtype=float)
    hw = 1.959963984540054 * x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else np.nan
    return float(x.mean()) if len(x) else np.nan, float(hw)


@_one_thread
def advantage_probe(cfg: SimConfig, type_index: int, others, n: int, rng: np.random.Generator,
                    weights=None, agent: int = 0):
    """Monte Carlo: the mean GRPO advantage of each answer of one agent, the others fixed.

    Agent ``agent`` samples its m answers uniformly; every other agent k always answers
    ``others[k]`` (the entry for ``agent`` is ignored). n questions of type ``type_index``
    are drawn, routed with ``weights`` (default :func:`calibrated_router`) by Eq. (3), and
    scored by each signal of :func:`~mcpg.grpo.objective.credit`; advantages are formed
    both as the engine does (:func:`~mcpg.grpo.objective.group_standardize`) and centred
    only (group mean subtracted). A positive mean advantage for answer a means the update
    moves the agent toward a.

    Returns a DataFrame with columns ``signal``, ``advantages`` ("standardised" or
    "centred"), ``answer``, ``mean``, ``±`` (95% half-width over the groups in which the
    agent gave that answer; one value per group) and ``n`` (those groups).
    """
    import pandas as pd

    mine, _, scores = _probe(cfg, type_index, others, n, rng, weights, agent)
    rows = []
    for signal, sc in scores.items():
        forms = {"standardised": group_standardize(sc, eps=cfg.advantage_eps, axis=-2)[..., agent],
                 "centred": (sc - sc.mean(axis=-2, keepdims=True))[..., agent]}
        for form, adv in forms.items():
            for a in range(cfg.n_answers):
                hit = mine == a
                per_group = np.where(hit, adv, 0.0).sum(1) / np.maximum(hit.sum(1), 1)
                x = per_group[hit.any(1)]
                mean, hw = _mean_hw(x)
                rows.append({"signal": signal, "advantages": form, "answer": a, "mean": mean, "±": hw, "n": len(x)})
    return pd.DataFrame(rows)


@_one_thread
def score_spread(cfg: SimConfig, type_index: int, others, n: int, rng: np.random.Generator,
                 weights=None, agent: int = 0):
    """Monte Carlo: how spread out one agent's m scores are within a group, by case.

    Same rollout as :func:`advantage_probe`. For each signal, the mean over groups of the
    standard deviation of the agent's m raw scores (what
    :func:`~mcpg.grpo.objective.group_standardize` divides by), separately for questions
    where some other agent's fixed answer is right ("others right") and where none is
    ("others wrong"). Returns a DataFrame: ``signal``, ``case``, ``mean``, ``±``, ``n``.
    """
    import pandas as pd

    _, z, scores = _probe(cfg, type_index, others, n, rng, weights, agent)
    others = np.asarray(others)
    right = np.isin(z, np.delete(others, agent))
    rows = []
    for signal, sc in scores.items():
        sd = sc[..., agent].std(axis=1, ddof=1)
        for case, sel in (("others right", right), ("others wrong", ~right)):
            mean, hw = _mean_hw(sd[sel])
            rows.append({"signal": signal, "case": case, "mean": mean, "±": hw, "n": int(sel.sum())})
    return pd.DataFrame(rows)

def theorem1_trajectory(run: SimRun, every: int = 1, seeds: Sequence[int] | None = None):
    """:func:`theorem1_diagnostics` at the checkpoints of a run, as a long DataFrame.

    Args:
        run: a :class:`SimRun` (its logits and router weights at each checkpoint are used).
        every: use every this many checkpoints (the last is always included).
        seeds: a subset of the run's seeds (default all).

    Returns one row per (seed, update, agent) with the columns of
    :func:`theorem1_diagnostics` and ``method``.
    """
    import pandas as pd

    _positive_int(every, "every")
    seeds = run.seeds if seeds is None else _check_seeds(seeds)
    unknown = set(seeds) - set(run.seeds)
    if unknown:
        raise ValueError(f"seeds {sorted(unknown)} are not in the run")
    n = len(run.updates)
    cks = sorted(set(range(0, n, every)) | {n - 1})
    rows = []
    for seed in seeds:
        si = run.seeds.index(seed)
        for c in cks:
            d = theorem1_diagnostics(run.cfg, run.logits[si, c], run.router[si, c])
            for i in range(run.cfg.n_agents):
                rows.append({"method": run.method, "seed": seed, "update": int(run.updates[c]), "agent": i,
                             **{k: float(v[i]) for k, v in d.items()}})
    return pd.DataFrame(rows)
