"""The simulated pool: its configuration, questions, agents' initial policies and router features.

Part of :mod:`mcpg.grpo.simulated` (chapter 7); see the package docstring for the environment.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from ...stats import EVAL_KEYS, SPECIALTIES
from .. import credits
from ..objective import SCALE_REWARDS

__all__ = [
    "METHODS",
    "EVAL_KEYS",
    "SAMPLED_KEYS",
    "DIAGNOSTIC_KEYS",
    "SimConfig",
    "Competence",
    "draw_questions",
    "draw_difficulty",
    "candidate_features",
    "initial_logits",
    "calibrated_router",
    "router_beliefs",
]

METHODS: tuple[str, ...] = ("frozen",) + credits.SIGNALS
"""The arms the book compares: ``frozen`` (no actor update) and the paper's three credit signals of §8
(read from the registry, :data:`mcpg.grpo.credits.SIGNALS`). :func:`~mcpg.grpo.simulated.train_pool`
trains any registered signal (:func:`mcpg.grpo.credits.names`)."""

SAMPLED_KEYS: tuple[str, ...] = tuple(f"sampled_{k}" for k in EVAL_KEYS)
"""The same six diagnostics when each agent *samples* its answer at evaluation (``sampled_accuracy``, ...)."""

DIAGNOSTIC_KEYS: tuple[str, ...] = ("overlap", "coverage")
"""Mechanism diagnostics computed exactly from the policies (see :func:`policy_overlap`)."""
DEFAULT_TYPES: tuple[str, ...] = SPECIALTIES
DEFAULT_ANSWER_PROBS: tuple[tuple[float, ...], ...] = (
    (0.35, 0.35, 0.30),  # money: no answer dominates
    (0.50, 0.25, 0.25),  # time: one answer is right half the time
    (0.60, 0.20, 0.20),  # geometry: one answer dominates more
)


@dataclass(frozen=True)
class Competence:
    """How an LLM agent comes to be right: by competence, not by picking (chapter 7's twin).

    In chapter 7's default pool an agent sees a question's type and picks one of its candidate
    answers, so a team covers a type's questions only through agents that pick differently. An
    LLM agent works a question out: it is right when its skill suffices for that question, the
    question has one right answer, and a hard question is hard for every agent, so the agents'
    rightness is correlated by the question's difficulty. With ``SimConfig.competence`` set,
    agent k's policy on a question q of type t is a softmax over its outcomes,

    - action 0, the right answer, with logit ``theta[k, t, 0] − d_q − e_qk``;
    - actions 1 to ``wrong_answers``, wrong answers, with logits ``theta[k, t, a]``;
    - with ``cut_logit`` set, a last action: an answer cut at the token budget, which earns 0
      and, as under ``mask_truncated_completions``, enters no gradient;

    where ``d_q ~ N(0, difficulty_sd²)`` is the question's difficulty, drawn once and shared by
    every agent, and ``e_qk ~ N(0, idiosyncratic_sd²)`` is how much harder it is for agent k in
    particular (shared by that agent's m completions of it, not by the other agents). The
    initial logits are ``skill[k]`` on the right answer (plus the specialty
    bonus on the agent's type), 0 on each wrong answer and ``cut_logit`` on the cut one, plus
    ``init_noise``. The router reads the (type, agent) one-hot, the check of the candidate and a
    bias; not the action's index, which would tell it which answer is right.

    Attributes:
        skill: per agent, its right answer's initial logit at difficulty 0 (against 0 for a
            wrong answer).
        difficulty_sd: the spread of the questions' difficulty (0: every question alike, so
            the agents' rightness is independent given their policies).
        idiosyncratic_sd: the spread of each agent's own difficulty on a question.
        wrong_answers: the number of wrong outcomes (>= 1).
        cut_logit: the cut outcome's initial logit; None: no cut answers.
    """

    skill: tuple[float, ...]
    difficulty_sd: float = 1.0
    idiosyncratic_sd: float = 0.0
    wrong_answers: int = 1
    cut_logit: float | None = None

    def __post_init__(self) -> None:
        if len(self.skill) < 1 or not np.all(np.isfinite(self.skill)):
            raise ValueError(f"skill must give each agent a finite logit, got {self.skill}")
        for key in ("difficulty_sd", "idiosyncratic_sd"):
            v = getattr(self, key)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"{key} must be non-negative, got {v}")
        _positive_int(self.wrong_answers, "wrong_answers")
        if self.cut_logit is not None and not np.isfinite(self.cut_logit):
            raise ValueError(f"cut_logit must be finite or None, got {self.cut_logit}")

    @property
    def n_actions(self) -> int:
        return 1 + self.wrong_answers + (self.cut_logit is not None)

    @property
    def cut_action(self) -> int | None:
        """The index of the cut outcome (None without one)."""
        return None if self.cut_logit is None else self.n_actions - 1


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
        unsolvable: share of questions, in [0, 1), whose correct answer is none of the M
            candidates (``Z = M``): every agent is wrong on them, every check is pure noise,
            and nothing the router reads tells them apart (a harder task, or weaker agents,
            with the LLM's share of groups that hold no right candidate). 0: every question
            has its answer among the candidates (the default; the draws are then unchanged).
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
        advantage_eps: added to the group standard deviation (TRL's 1e-4).
        scale_rewards: TRL's ``scale_rewards``: ``"group"`` (the engine's default): GRPO's
            group standardisation, :func:`~mcpg.grpo.objective.group_standardize`; ``"none"``:
            subtract the group mean only (Dr. GRPO), which keeps the signal's scale.
        router_tau, router_eps: temperature and uniform exploration of Eq. (3).
        router_lr, router_steps: Adam on the router after each actor update.
        eval_questions: held-out questions per seed.
        eval_every: evaluate every this many updates (and at 0 and at the end).
        exact_budget: the signals that take one only (``removal``, by
            :func:`mcpg.grpo.credits.exact_budget`; the other arms ignore it): the expected share
            of slates evaluated exactly and credited by Eq. (21)
            (:func:`~mcpg.grpo.objective.budgeted_removal`; chapter 9); 0 (the default) is Eq. (19) alone.
        allocation: which slates get the budget: ``"sqrt"`` (Eq. 22), ``"uniform"``,
            ``"proportional"`` or ``"leverage"`` (Eq. 22 before the draw, on the exact score
            norms, p = 0 allowed) (:data:`mcpg.allocation.ALLOCATIONS`).
        competence: None (the default): agents are right by picking a type's answer, as above.
            A :class:`Competence`: agents are right by competence on questions of shared
            difficulty (chapter 7's twin of chapter 8); ``answer_probs`` then only gives the
            number of types, and the agents' actions are the competence's outcomes.
        max_grad_norm: the gradient of each agent's logits (per seed) is clipped to this norm
            before Adam's step, as the LLM engine clips each adapter's (TRL's
            ``max_grad_norm``); 0 (the default): no clipping.
    """

    n_agents: int = 3
    answer_probs: tuple[tuple[float, ...], ...] = DEFAULT_ANSWER_PROBS
    type_probs: tuple[float, ...] | None = None
    type_names: tuple[str, ...] = DEFAULT_TYPES
    check_flip: float = 0.2
    unsolvable: float = 0.0
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
    advantage_eps: float = 1e-4
    scale_rewards: str = "group"
    router_tau: float = 0.5
    router_eps: float = 0.1
    router_lr: float = 0.1
    router_steps: int = 5
    eval_questions: int = 500
    eval_every: int = 5
    exact_budget: float = 0.0
    allocation: str = "sqrt"
    competence: Competence | None = None
    max_grad_norm: float = 0.0

    def __post_init__(self) -> None:
        from ...allocation import ALLOCATIONS

        if not 0.0 <= self.exact_budget <= 1.0:
            raise ValueError(f"exact_budget must lie in [0, 1], got {self.exact_budget}")
        if self.allocation not in ALLOCATIONS:
            raise ValueError(f"allocation must be one of {ALLOCATIONS}, got {self.allocation!r}")
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
            raise ValueError(
                f"type_names must name the {T} types of answer_probs, got {len(self.type_names)}"
            )
        for key in (
            "n_agents",
            "prompts_per_update",
            "num_iterations",
            "router_steps",
            "eval_questions",
            "eval_every",
        ):
            _positive_int(getattr(self, key), key)
        _positive_int(self.updates, "updates", allow_zero=True)
        _positive_int(self.completions_per_agent, "completions_per_agent")
        if self.n_agents < 2:
            raise ValueError(f"n_agents must be at least 2 (a routed pool), got {self.n_agents}")
        if self.completions_per_agent < 2:
            raise ValueError(
                f"completions_per_agent must be at least 2 (a GRPO group), got {self.completions_per_agent}"
            )
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {self.scale_rewards!r}")
        if not 0.0 <= self.check_flip <= 0.5:
            raise ValueError(f"check_flip must lie in [0, 0.5], got {self.check_flip}")
        if not (np.isfinite(self.unsolvable) and 0.0 <= self.unsolvable < 1.0):
            raise ValueError(f"unsolvable must lie in [0, 1), got {self.unsolvable}")
        if not (np.isfinite(self.router_tau) and self.router_tau > 0):
            raise ValueError(f"router_tau must be a positive finite temperature, got {self.router_tau}")
        if not 0.0 < self.router_eps <= 1.0:
            raise ValueError(
                f"router_eps must lie in (0, 1] (Eq. 19 divides by the propensities), got {self.router_eps}"
            )
        for key in ("learning_rate", "router_lr"):
            v = getattr(self, key)
            if not (np.isfinite(v) and v > 0):
                raise ValueError(f"{key} must be positive, got {v}")
        if self.competence is not None:
            if not isinstance(self.competence, Competence):
                raise ValueError("competence must be a Competence or None, "
                                 f"got {type(self.competence).__name__}")
            if len(self.competence.skill) != self.n_agents:
                raise ValueError(f"competence.skill must give each of the {self.n_agents} agents a logit, "
                                 f"got {len(self.competence.skill)}")
            if self.exact_budget > 0:
                raise ValueError("exact_budget is defined on the default pool only, not with competence")
        for key in ("base_scale", "specialty_bonus", "init_noise", "clip_eps", "advantage_eps",
                    "max_grad_norm"):
            v = getattr(self, key)
            if not (np.isfinite(v) and v >= 0):
                raise ValueError(f"{key} must be non-negative, got {v}")

    # -- derived sizes ---------------------------------------------------------------
    @property
    def n_types(self) -> int:
        return len(self.answer_probs)

    @property
    def n_answers(self) -> int:
        """The number M of the agents' actions (the candidate answers, or the competence's outcomes)."""
        return self.competence.n_actions if self.competence is not None else len(self.answer_probs[0])

    @property
    def n_features(self) -> int:
        """The number F of router features, (type, answer) and (type, agent) one-hots, check, bias."""
        return self.n_types * self.n_answers + self.n_types * self.n_agents + 2

    def solvable_answer_probs(self) -> np.ndarray:
        """``P(Z = a | t)`` for the M candidate answers, (T, M): ``(1 - unsolvable) * answer_probs``
        (rows sum to ``1 - unsolvable``; the rest is ``Z = M``, no candidate right)."""
        return (1.0 - self.unsolvable) * np.asarray(self.answer_probs, dtype=float)

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
        raise ValueError(
            f"{name} must be a {'non-negative' if allow_zero else 'positive'} integer, got {v!r}"
        )


def _check_method(method: str) -> None:
    if method != "frozen" and method not in credits.names():
        raise ValueError(f"method must be 'frozen' or a registered signal {credits.names()}, got {method!r}")


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
def draw_questions(
    cfg: SimConfig, n: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw n questions: types (n,), hidden correct answers Z (n,), and checks (n, M).

    ``checks[q, a] = 1{a = Z_q}`` flipped with probability ``cfg.check_flip``, independently
    for each (question, answer): what the router's check would say of answer a. With
    ``cfg.unsolvable > 0`` each question is, with that probability, unsolvable: ``Z = M``
    (no candidate is right) and its checks are flips of 0 (drawn after the other draws, so
    ``unsolvable = 0`` leaves the generator's stream as it was). With ``cfg.competence`` the
    right answer is action 0 (``Z = 0``) on every solvable question.
    """
    _positive_int(n, "n")
    T, M = cfg.n_types, cfg.n_answers
    types = rng.choice(T, size=n, p=cfg.type_distribution())
    if cfg.competence is not None:  # the right answer is action 0 (:class:`Competence`)
        z = np.zeros(n, dtype=int)
    else:
        cdf = np.cumsum(np.asarray(cfg.answer_probs, dtype=float), axis=1)
        z = np.minimum((rng.random(n)[:, None] > cdf[types]).sum(1), M - 1)
    flips = rng.random((n, M)) < cfg.check_flip
    if cfg.unsolvable > 0:
        z = np.where(rng.random(n) < cfg.unsolvable, M, z)
    checks = ((np.arange(M)[None, :] == z[:, None]) ^ flips).astype(float)
    return types, z, checks


def draw_difficulty(cfg: SimConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """How hard each of n questions is for each agent, ``d_q + e_qk`` with ``cfg.competence``
    (:class:`Competence`), shape (n, K); zeros in the default pool (no draw is made)."""
    _positive_int(n, "n")
    K = cfg.n_agents
    if cfg.competence is None:
        return np.zeros((n, K))
    c = cfg.competence
    return c.difficulty_sd * rng.normal(size=(n, 1)) + c.idiosyncratic_sd * rng.normal(size=(n, K))


def candidate_features(cfg: SimConfig, types, answers, checks) -> torch.Tensor:
    """The router's features of every candidate, shape ``answers.shape + (F,)``.

    Args:
        types: question types, shape (...,) (leading axes of ``answers`` without the last).
        answers: candidate answers, shape (..., K): K candidates per slate, agent j's in column j.
        checks: the check of each candidate in {0, 1}, shape of ``answers``.

    Layout of F = T*M + T*K + 2: one-hot of (type, answer), one-hot of (type, agent), the
    check coded as +-1, a bias. With ``cfg.candidate_blind`` the (type, answer) and check
    entries are zero: the score then depends on the type and the agent only. With
    ``cfg.competence`` the (type, answer) entries are zero too (an action's index would say
    whether it is right); the check stays.
    """
    types = np.asarray(types)
    answers = np.asarray(answers)
    checks = np.asarray(checks, dtype=float)
    T, M, K = cfg.n_types, cfg.n_answers, cfg.n_agents
    if answers.shape[-1:] != (K,) or types.shape != answers.shape[:-1]:
        raise ValueError(
            f"answers must have shape types.shape + ({K},), got {answers.shape} for types {types.shape}"
        )
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
        if cfg.competence is None:
            out[(*idx, t * M + answers)] = 1.0
        out[..., F - 2] = 2.0 * checks - 1.0
    out[(*idx, T * M + t * K + agent)] = 1.0
    out[..., F - 1] = 1.0
    return torch.as_tensor(out, dtype=torch.float64)


def initial_logits(cfg: SimConfig, rng: np.random.Generator) -> np.ndarray:
    """Agents' initial logits (K, T, M): the shared base policy ``base_scale * log(answer_probs)``
    (probabilities floored at 1e-3), noise of scale ``init_noise``, and the specialty bonus on
    answer 0 of each agent's specialty type. With ``cfg.competence``, the competence's
    logits (:class:`Competence`) with the same noise and bonus."""
    K, T, M = cfg.n_agents, cfg.n_types, cfg.n_answers
    if cfg.competence is not None:  # right, wrong, (cut): see :class:`Competence`
        c = cfg.competence
        base = np.zeros((K, T, M))
        base[:, :, 0] = np.asarray(c.skill, dtype=float)[:, None]
        if c.cut_action is not None:
            base[:, :, c.cut_action] = c.cut_logit
        theta = base + cfg.init_noise * rng.normal(size=(K, T, M))
        theta[np.arange(K), cfg.specialties(), 0] += cfg.specialty_bonus
        return theta
    base = cfg.base_scale * np.log(np.maximum(np.asarray(cfg.answer_probs, dtype=float), 1e-3))
    theta = base[None] + cfg.init_noise * rng.normal(size=(K, T, M))
    theta[np.arange(K), cfg.specialties(), 0] += cfg.specialty_bonus
    return theta


# ------------------------------------------------------------------------------------------
# exact analysis (Theorem 1) on the enumerated pool
# ------------------------------------------------------------------------------------------
def calibrated_router(cfg: SimConfig) -> np.ndarray:
    """The outcome model that is exactly right for this environment, as router weights (F,).

    Since the check flips independently of everything else, ``P(R = 1 | t, a, C) =
    sigmoid(logit q_t(a) + (2C - 1) log((1 - f) / f))``: weight ``logit q_t(a)`` on the
    (type, answer) one-hot (probabilities clipped to [1e-3, 1 - 1e-3]), ``log((1 - f)/f)``
    on the +-1 check (0 when f = 0.5; capped at log(999) when f = 0), and 0 on the agents
    and the bias, where ``q_t(a)`` is ``(1 - unsolvable)`` times ``answer_probs`` (an
    unsolvable question's checks are flips of 0, as a wrong answer's are, so the check's
    likelihood ratio is unchanged). With ``cfg.candidate_blind`` only the type enters: ``logit`` of the
    type's mean accuracy is not identifiable per candidate, so the weights are all zero.
    """
    if cfg.competence is not None:
        raise ValueError("calibrated_router is defined on the default pool, not with competence")
    T, M = cfg.n_types, cfg.n_answers
    w = np.zeros(cfg.n_features)
    if cfg.candidate_blind:
        return w
    q = np.clip(cfg.solvable_answer_probs(), 1e-3, 1 - 1e-3)
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
    x = candidate_features(
        cfg, t, np.repeat(a[:, None], K, 1), np.repeat(c[:, None], K, 1)
    ).numpy()  # (T*M*2, K, F)
    mu = 1.0 / (1.0 + np.exp(-np.einsum("nkf,...f->...nk", x, w)))
    return mu.mean(-1).reshape(w.shape[:-1] + (T, M, 2))
