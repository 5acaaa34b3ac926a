"""The training loop (paper §8's update, step by step) and the held-out evaluation.

Part of :mod:`mcpg.grpo.simulated` (chapter 7).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from ... import allocation, routing
from .. import credits
from ..objective import clipped_grpo_loss, route_and_credit, zero_std_groups
from .pool import (
    DIAGNOSTIC_KEYS,
    EVAL_KEYS,
    SAMPLED_KEYS,
    SimConfig,
    _check_method,
    _check_seeds,
    _one_thread,
    _positive_int,
    candidate_features,
    draw_difficulty,
    draw_questions,
    initial_logits,
)

__all__ = ["SimRun", "evaluation_metrics", "policy_overlap", "policy_coverage", "train_pool", "evaluate_run"]


def evaluation_metrics(
    correct, scores, types, specialist, tau: float = 1.0, eps: float = 0.0
) -> dict[str, np.ndarray]:
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
    """The chance that some agent's sampled answer is right:
    ``sum_t w_t sum_a q_t(a) (1 - prod_k (1 - pi_k(a | t)))``. (With unsolvable questions,
    pass :meth:`SimConfig.solvable_answer_probs`, whose rows sum to less than 1.)

    The sampled-slate counterpart of oracle accuracy; shape (...,).
    """
    pi = np.asarray(policies, dtype=float)
    q = np.asarray(answer_probs, dtype=float)
    w = np.asarray(type_probs, dtype=float)
    if pi.shape[-2:] != q.shape:
        raise ValueError(f"policies must end in the (T, M) shape {q.shape} of answer_probs, got {pi.shape}")
    hit = 1.0 - np.prod(1.0 - pi, axis=-3)  # (..., T, M)
    return ((hit * q).sum(-1) * w).sum(-1)


@dataclass
class SimRun:
    """The record of :func:`train_pool`: several seeds of one method.

    Attributes:
        cfg, method, seeds: what was run.
        updates: the updates at which the pool was evaluated, shape (n_ckpt,).
        metrics: name -> array (n_seeds, n_ckpt), for ``EVAL_KEYS`` and
            ``SAMPLED_KEYS`` (each agent sampling its answer at evaluation),
            ``DIAGNOSTIC_KEYS``, ``zero_std`` (the share of (question, agent) groups of the
            rollout whose m credit scores had zero spread, so no gradient; NaN at the end),
            and ``train_reward`` (mean deployed reward of the
            rollout that followed each checkpoint; NaN at the end).
        by_type: per question type, arrays (n_seeds, n_ckpt, T): ``accuracy`` and
            ``oracle`` on the held-out questions of that type, and ``distinct``, the number
            of different greedy answers the K agents give to that type.
        logits: the agents' logits at each checkpoint, (n_seeds, n_ckpt, K, T, M).
        router: the router's weights at each checkpoint, (n_seeds, n_ckpt, F).
        seconds: wall-clock time of the whole run.
        exact: with ``cfg.exact_budget`` > 0 (method ``removal``), per seed, arrays (n_seeds,)
            summed over every rollout: ``slates``, ``evaluations`` (exact), ``cost`` (reward
            queries beyond the deployed ones), and the gradient error of the credit, in
            Theorem 2's units Σ a²(Δ̃ − Δ)² with a the allocation's leverage (that of
            :func:`~mcpg.grpo.objective.credit_leverage`; under ``allocation="leverage"`` the
            exact score norm ‖Ψ_i‖ of each sampled answer, ``loop.score_norms``) and
            η² = (Δ̂ − Δ)² the true error (the simulator knows every reward): ``risk`` of the
            allocation used, ``risk_uniform`` of the uniform one at the same expected cost,
            ``risk_bound`` the least risk at that cost knowing the true η² (Theorem 3's bound;
            under ``"leverage"``, where p = 0 is allowed and costs η², the least
            :func:`mcpg.allocation.predraw_risk`), ``risk_removal`` = Σ a²η², the error of
            Eq. (19) alone on the same slates, and ``loss`` the realised Σ a²(Δ̃ − Δ)² (its
            expectation is ``risk``). None otherwise.
        slates: with ``train_pool(..., keep_slates=n)``, the first n updates' slates, one dict
            per update with arrays whose first axis is the seed: ``R``, ``p``, ``mu_hat``,
            ``score`` (the credit trained on) ``(S, B*m, K)``, ``P`` ``(S, B*m, K, K)``, ``I``
            ``(S, B*m)`` and ``cut`` (None without a cut outcome), a prompt's m slates
            consecutive, as the LLM engine logs them. None otherwise.
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
    exact: dict[str, np.ndarray] | None = None
    slates: list[dict] | None = None

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


def _question_logits(theta: torch.Tensor, types: np.ndarray, difficulty: np.ndarray) -> torch.Tensor:
    """Each agent's logits on each question, (S, B, K, M), with the competence's difficulty
    ``d_q + e_qk`` (``difficulty``, (S, B, K)) subtracted from the right answer's (action 0);
    ``theta`` (S, K, T, M)."""
    S, B = types.shape
    s = torch.arange(S).view(S, 1)
    q = theta[s, :, torch.as_tensor(types)]  # (S, B, K, M)
    shift = torch.zeros(q.shape[-1], dtype=q.dtype)
    shift[0] = 1.0
    return q - torch.as_tensor(difficulty, dtype=q.dtype)[..., None] * shift


def _competence_logp(theta: torch.Tensor, types: np.ndarray, difficulty: np.ndarray,
                     actions: np.ndarray) -> torch.Tensor:
    """log pi_k(A | q) for actions (S, B, m, K) under :class:`Competence`."""
    logp = torch.log_softmax(_question_logits(theta, types, difficulty), -1)  # (S, B, K, M)
    a = torch.as_tensor(actions).permute(0, 1, 3, 2)  # (S, B, K, m)
    return torch.gather(logp, -1, a).permute(0, 1, 3, 2)


def _clip_grad(theta: torch.Tensor, max_norm: float) -> None:
    """Clip each (seed, agent) slice of ``theta.grad`` to ``max_norm``, as
    ``torch.nn.utils.clip_grad_norm_`` clips one adapter's gradient (factor
    ``max_norm / (norm + 1e-6)``, at most 1)."""
    g = theta.grad
    norm = g.flatten(2).norm(dim=-1)  # (S, K)
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    g.mul_(factor[:, :, None, None])


def _scores(features: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Router scores: features (S, ..., K, F) times weights (S, F)."""
    S = weights.shape[0]
    flat = features.reshape(S, -1, features.shape[-1])
    return torch.einsum("snf,sf->sn", flat, weights).reshape(features.shape[:-1])


def _slate_metrics(cfg: SimConfig, answers, types, z, checks, weights):
    """Table 1's diagnostics of the slates ``answers`` (S, n, K), and the router scores."""
    correct = (answers == z[..., None]).astype(float)
    c = np.take_along_axis(checks, answers, axis=-1)
    with torch.no_grad():
        s = _scores(candidate_features(cfg, types, answers, c), weights).numpy()
    out = evaluation_metrics(correct, s, types, cfg.specialist(), tau=cfg.router_tau, eps=cfg.router_eps)
    return out, correct, s


def _evaluate(cfg: SimConfig, theta: torch.Tensor, weights: torch.Tensor, eval_set, eval_rngs,
              difficulty=None):
    types, z, checks = eval_set  # (S, n), (S, n), (S, n, M)
    if cfg.competence is not None:
        return _evaluate_competence(cfg, theta, weights, eval_set, eval_rngs, difficulty)
    with torch.no_grad():
        greedy = theta.argmax(-1).numpy()  # (S, K, T)
        pi = torch.softmax(theta, -1).numpy()
    S, n = types.shape
    answers = np.stack([greedy[s][:, types[s]].T for s in range(S)])  # (S, n, K)
    out, correct, s = _slate_metrics(cfg, answers, types, z, checks, weights)
    # the same questions, each agent sampling one answer from its policy (temperature 1)
    pi_q = np.stack([pi[si][:, types[si]].transpose(1, 0, 2) for si in range(S)])  # (S, n, K, M)
    u = np.stack([r.random((n, cfg.n_agents, 1)) for r in eval_rngs])
    sampled = np.minimum((u > np.cumsum(pi_q, -1)).sum(-1), cfg.n_answers - 1)
    out_s, _, _ = _slate_metrics(cfg, sampled, types, z, checks, weights)
    out.update({f"sampled_{k}": v for k, v in out_s.items()})
    out["overlap"] = policy_overlap(pi, cfg.type_distribution())
    out["coverage"] = policy_coverage(pi, cfg.solvable_answer_probs(), cfg.type_distribution())
    # per type: deployed accuracy, oracle accuracy, number of distinct greedy answers
    dep = np.argmax(s, -1)
    R_dep = np.take_along_axis(correct, dep[..., None], -1)[..., 0]
    onehot = types[..., None] == np.arange(cfg.n_types)  # (S, n, T)
    count = np.maximum(onehot.sum(1), 1)
    by_type = {
        "accuracy": (R_dep[..., None] * onehot).sum(1) / count,
        "oracle": (correct.max(-1)[..., None] * onehot).sum(1) / count,
        "distinct": np.array(
            [[len(set(greedy[si][:, t])) for t in range(cfg.n_types)] for si in range(S)], float
        ),
    }
    return out, by_type


def _evaluate_competence(cfg: SimConfig, theta, weights, eval_set, eval_rngs, difficulty):
    """:func:`_evaluate` under :class:`Competence`: greedy and sampled answers per question;
    the policy diagnostics (overlap, coverage, distinct greedy answers per type) are defined for
    the default pool only (NaN here)."""
    types, z, checks = eval_set
    S, n = types.shape
    with torch.no_grad():
        pi_q = torch.softmax(_question_logits(theta, types, difficulty), -1).numpy()  # (S, n, K, M)
    answers = pi_q.argmax(-1)  # (S, n, K)
    out, correct, s = _slate_metrics(cfg, answers, types, z, checks, weights)
    u = np.stack([r.random((n, cfg.n_agents, 1)) for r in eval_rngs])
    sampled = np.minimum((u > np.cumsum(pi_q, -1)).sum(-1), cfg.n_answers - 1)
    out_s, _, _ = _slate_metrics(cfg, sampled, types, z, checks, weights)
    out.update({f"sampled_{k}": v for k, v in out_s.items()})
    out["overlap"] = out["coverage"] = np.full(S, np.nan)
    dep = np.argmax(s, -1)
    R_dep = np.take_along_axis(correct, dep[..., None], -1)[..., 0]
    onehot = types[..., None] == np.arange(cfg.n_types)
    count = np.maximum(onehot.sum(1), 1)
    by_type = {"accuracy": (R_dep[..., None] * onehot).sum(1) / count,
               "oracle": (correct.max(-1)[..., None] * onehot).sum(1) / count,
               "distinct": np.full((S, cfg.n_types), np.nan)}
    return out, by_type


@_one_thread
def train_pool(cfg: SimConfig, method: str, seeds: Sequence[int] | int = (0,),
               keep_slates: int = 0) -> SimRun:
    """Train the simulated routed pool with one method, for each seed (paper §8's loop).

    Args:
        cfg: the environment and the training hyperparameters.
        method: ``"frozen"`` or a registered credit signal (:func:`mcpg.grpo.credits.names`:
            ``"wta"``, ``"removal"``, ``"oracle"``, ...).
        seeds: seeds of the independent runs, trained together as a batch.
        keep_slates: keep the slates of the first this many updates (``SimRun.slates``), as
            the LLM engine logs them, for :mod:`mcpg.grpo.slate_measures`.

    Each update: a rollout of ``prompts_per_update`` questions with m slates; routing by the
    current (fixed) router; draw, credit and per-agent group advantages by
    :func:`~mcpg.grpo.objective.route_and_credit` (the engine's function); the clipped GRPO
    loss per agent (one Adam step per iteration); then
    ``router_steps`` Adam steps of :func:`mcpg.routing.ipw_outcome_loss` on the selected
    feedback. Evaluations (held-out questions, greedy answers) at update 0, every
    ``eval_every`` updates and at the end.
    """
    if not isinstance(cfg, SimConfig):
        raise ValueError(f"cfg must be a SimConfig, got {type(cfg).__name__}")
    _check_method(method)
    seeds = _check_seeds(seeds)
    _positive_int(keep_slates, "keep_slates", allow_zero=True)
    return _train(cfg, method, seeds, keep_slates)


def _train(cfg: SimConfig, method: str, seeds: list[int], keep_slates: int = 0) -> SimRun:
    t0 = time.perf_counter()
    S, K, T, M = len(seeds), cfg.n_agents, cfg.n_types, cfg.n_answers
    B, m = cfg.prompts_per_update, cfg.completions_per_agent
    rngs = [np.random.default_rng([s, 0]) for s in seeds]  # init, rollouts and routing draws
    eval_sets = [draw_questions(cfg, cfg.eval_questions, np.random.default_rng([s, 1])) for s in seeds]
    eval_set = tuple(np.stack([e[i] for e in eval_sets]) for i in range(3))
    eval_rngs = [np.random.default_rng([s, 2]) for s in seeds]  # sampled answers at evaluation
    comp = cfg.competence
    # the questions' difficulty (competence only; own streams, so the default pool's are unchanged)
    eval_difficulty = (np.stack([draw_difficulty(cfg, cfg.eval_questions, np.random.default_rng([s, 5]))
                                 for s in seeds]) if comp is not None else None)
    difficulty_rngs = [np.random.default_rng([s, 6]) for s in seeds] if comp is not None else None
    cut = comp.cut_action if comp is not None else None
    slates: list[dict] = []

    theta = torch.tensor(
        np.stack([initial_logits(cfg, r) for r in rngs]), dtype=torch.float64, requires_grad=True
    )
    weights = torch.zeros((S, cfg.n_features), dtype=torch.float64, requires_grad=True)
    actor_opt = torch.optim.Adam([theta], lr=cfg.learning_rate)
    router_opt = torch.optim.Adam([weights], lr=cfg.router_lr)

    ckpts = sorted({0, cfg.updates, *range(0, cfg.updates, cfg.eval_every)})
    keys = EVAL_KEYS + SAMPLED_KEYS + DIAGNOSTIC_KEYS + ("train_reward", "zero_std")
    hist = {k: np.full((S, len(ckpts)), np.nan) for k in keys}
    by_type = {k: np.full((S, len(ckpts), T), np.nan) for k in ("accuracy", "oracle", "distinct")}
    logit_snap = np.zeros((S, len(ckpts), K, T, M))
    router_snap = np.zeros((S, len(ckpts), cfg.n_features))
    signal = "wta" if method == "frozen" else method  # frozen: routed alike, no actor update
    budgets = [credits.exact_budget(signal, cfg.exact_budget, cfg.allocation) for _ in seeds]  # the one rule
    budgeted = budgets[0] is not None
    budgets = budgets if budgeted else None
    budget_rngs = [np.random.default_rng([s, 4]) for s in seeds] if budgeted else None  # the draws Z
    exact_keys = ("slates", "evaluations", "cost", "risk", "risk_uniform", "risk_bound", "risk_removal",
                  "loss")
    exact = {k: np.zeros(S) for k in exact_keys} if budgeted else None
    ci = 0
    for u in range(cfg.updates + 1):
        if u in ckpts:
            ev, ev_type = _evaluate(cfg, theta, weights, eval_set, eval_rngs, eval_difficulty)
            for k, v in ev.items():
                hist[k][:, ci] = v
            for k, v in ev_type.items():
                by_type[k][:, ci] = v
            logit_snap[:, ci] = theta.detach().numpy()
            router_snap[:, ci] = weights.detach().numpy()
            ci += 1
        if u == cfg.updates:
            break
        # --- update begins (the steps of the algorithm in chapter 7) ---
        # 1. rollout: m answers per agent per question; the g-th answers form slate g
        qs = [draw_questions(cfg, B, r) for r in rngs]
        types = np.stack([q[0] for q in qs])  # (S, B)
        z = np.stack([q[1] for q in qs])  # (S, B)
        checks = np.stack([q[2] for q in qs])  # (S, B, M)
        if comp is not None:
            difficulty = np.stack([draw_difficulty(cfg, B, r) for r in difficulty_rngs])  # (S, B, K)
            with torch.no_grad():
                pi_q = torch.softmax(_question_logits(theta, types, difficulty), -1).numpy()  # (S, B, K, M)
        else:
            with torch.no_grad():
                pi = torch.softmax(theta, -1).numpy()  # (S, K, T, M)
            pi_q = np.stack([pi[s][:, types[s]] for s in range(S)]).transpose(0, 2, 1, 3)  # (S, B, K, M)
        uni = np.stack([r.random((B, m, K)) for r in rngs])
        cdf = np.cumsum(pi_q, -1)[:, :, None]  # (S, B, 1, K, M)
        actions = np.minimum((uni[..., None] > cdf).sum(-1), M - 1)  # (S, B, m, K)

        # 2. rewards R^(j) of every candidate (only R^(I) is fed back; all of R only to the oracle)
        R = (actions == z[:, :, None, None]).astype(float)
        c = np.take_along_axis(np.broadcast_to(checks[:, :, None, :], (S, B, m, M)), actions, -1)
        feats = candidate_features(cfg, np.broadcast_to(types[:, :, None], (S, B, m)), actions, c)

        # 3. router scores with the current (fixed) router: p (Eq. 3), leave-one-out P, mu_hat
        with torch.no_grad():
            s_np = _scores(feats, weights).numpy()
        p = routing.router_propensities(s_np, tau=cfg.router_tau, eps=cfg.router_eps)
        P = routing.leave_one_out_propensities(s_np, tau=cfg.router_tau, eps=cfg.router_eps)
        mu_hat = 1.0 / (1.0 + np.exp(-s_np))

        # 4. draw I ~ p, feed back G = R^(I), credit each agent, per-agent group advantages
        lev = score_norms(pi_q, actions) if budgeted and cfg.allocation == "leverage" else None
        step = route_and_credit(
            signal, p, P, mu_hat, R, rngs, scale_rewards=cfg.scale_rewards, advantage_eps=cfg.advantage_eps,
            budget=budgets, budget_rng=budget_rngs, leverage=lev,
        )
        I, G = step.I, step.G  # noqa: E741 (the paper's name)
        if budgeted:
            _exact_diagnostics(exact, step.exact, step.scores, R, p, P, cfg.exact_budget,
                               predraw=cfg.allocation == "leverage")
        if u < keep_slates:  # as the engine logs them: slates of one prompt consecutive
            slates.append({"update": u + 1, "R": R.reshape(S, B * m, K), "p": p.reshape(S, B * m, K),
                           "P": P.reshape(S, B * m, K, K), "mu_hat": mu_hat.reshape(S, B * m, K),
                           "I": I.reshape(S, B * m), "score": step.scores.reshape(S, B * m, K),
                           "cut": (actions == cut).reshape(S, B * m, K) if cut is not None else None})
        if u in ckpts:
            hist["train_reward"][:, ci - 1] = G.reshape(S, -1).mean(1)
            # per seed: the share of its (question, agent) groups whose m scores are all equal
            hist["zero_std"][:, ci - 1] = zero_std_groups(step.scores).reshape(S, -1).mean(1)

        # 5. actor update: the clipped GRPO loss per agent (Adam)
        if method != "frozen":
            adv = torch.as_tensor(step.advantages)

            def logp_of(th):
                if comp is not None:
                    return _competence_logp(th, types, difficulty, actions)
                return _gather_logp(torch.log_softmax(th, -1), types, actions)

            with torch.no_grad():
                logp_old = logp_of(theta)
            # The engine sums one clipped loss per agent, each averaged over that agent's
            # completions. Every (seed, agent) here has the same B * m one-token completions,
            # so S * K times the loss averaged over all of them is that same sum.
            ones = torch.ones(S * B * m * K, 1, dtype=torch.float64)
            if cut is not None:  # a cut answer enters no gradient (mask_truncated_completions)
                ones = torch.as_tensor(actions != cut, dtype=torch.float64).reshape(-1, 1)
            for _ in range(cfg.num_iterations):
                actor_opt.zero_grad()
                logp = logp_of(theta)
                loss = (
                    S
                    * K
                    * clipped_grpo_loss(
                        logp.reshape(-1, 1),
                        logp_old.reshape(-1, 1),
                        adv.reshape(-1),
                        ones,
                        clip_eps=cfg.clip_eps,
                        loss_type=cfg.loss_type,
                    )
                )
                loss.backward()
                if cfg.max_grad_norm > 0:
                    _clip_grad(theta, cfg.max_grad_norm)
                actor_opt.step()

        # 6. router update on this rollout's selected feedback (IPW cross-entropy)
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
        # --- update ends ---

    return SimRun(
        cfg=cfg,
        method=method,
        seeds=seeds,
        updates=np.array(ckpts),
        metrics=hist,
        by_type=by_type,
        logits=logit_snap,
        router=router_snap,
        seconds=time.perf_counter() - t0,
        exact=exact,
        slates=slates or None,
    )


def score_norms(pi_q: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """The exact gradient leverage ‖Ψ‖ of each sampled answer: Ψ = ∇_θ log π(a | t) = e_a − π.

    The agent's logits for the question's type are its only parameters the answer's score
    touches, so ‖Ψ‖² = (1 − π_a)² + Σ_{b ≠ a} π_b² = 1 − 2π_a + Σ_b π_b². ``pi_q`` (..., B, K,
    M) each agent's policy on each question, ``actions`` (..., B, m, K) the sampled answers;
    returns (..., B, m, K).
    """
    pi = np.broadcast_to(pi_q[..., None, :, :], actions.shape + pi_q.shape[-1:])
    pi_a = np.take_along_axis(pi, actions[..., None], -1)[..., 0]
    return np.sqrt(np.maximum(1.0 - 2.0 * pi_a + (pi**2).sum(-1), 0.0))


def _exact_diagnostics(acc: dict, ex, scores, R, p, P, share: float, predraw: bool = False) -> None:
    """Add one rollout's exact-budget accounting and gradient errors to ``acc`` (per seed).

    Diagnostics only: they read every candidate's reward (the exact Δ on every slate), as the
    oracle does; the credit itself never did.
    """
    S, K = R.shape[0], R.shape[-1]
    delta = routing.removal_contributions(R, p, P)  # exact Δ on every slate
    eta2 = (ex.delta_hat - delta) ** 2
    for s in range(S):
        a, e2 = ex.leverage[s].reshape(-1, K), eta2[s].reshape(-1, K)
        prob = ex.p[s].reshape(-1)
        cost = np.full(prob.shape, float(K - 1))
        C = share * cost.sum()
        one, s2, se2 = allocation.slate_entries(a, np.zeros_like(e2), e2)
        acc["slates"][s] += prob.size
        acc["evaluations"][s] += ex.z[s].sum()
        acc["cost"][s] += ex.cost[s].sum()
        uniform = allocation.uniform_allocation(cost, C)
        if predraw:  # p = 0 allowed: an unevaluated slate costs its η² (predraw_risk)
            acc["risk"][s] += allocation.predraw_risk(prob, se2)
            acc["risk_uniform"][s] += allocation.predraw_risk(uniform, se2)
            best = allocation.predraw_allocation(se2, cost, C)
            acc["risk_bound"][s] += allocation.predraw_risk(best, se2)
        else:
            acc["risk"][s] += allocation.allocation_risk(prob, one, s2, se2)
            acc["risk_uniform"][s] += allocation.allocation_risk(uniform, one, s2, se2)
            acc["risk_bound"][s] += allocation.risk_lower_bound(one, s2, se2, cost, C)
        acc["risk_removal"][s] += float(se2.sum())  # Eq. (19) alone: Σ a² η²
        acc["loss"][s] += float(np.sum(a**2 * (scores[s].reshape(-1, K) - delta[s].reshape(-1, K)) ** 2))


@_one_thread
def evaluate_run(run: SimRun, answer_noise: float = 0.0, checkpoint: int = -1) -> dict[str, np.ndarray]:
    """Table 1's diagnostics of a trained pool when each answer is replaced by noise at a rate.

    The pool at ``checkpoint`` (policies and router) answers each seed's held-out questions
    (the same ones as during training) greedily, but each agent's answer to each question is
    replaced, with probability ``answer_noise``, by a uniformly drawn answer (generator
    ``[seed, 3]``): per-question idiosyncratic answers, which agents that have crowded on one
    answer would otherwise never give. ``answer_noise = 0`` reproduces the run's own
    evaluation. Returns :func:`evaluation_metrics`' dict, arrays of shape (n_seeds,).
    """
    if not 0.0 <= answer_noise <= 1.0:
        raise ValueError(f"answer_noise must lie in [0, 1], got {answer_noise}")
    cfg = run.cfg
    out = []
    for si, seed in enumerate(run.seeds):
        types, z, checks = draw_questions(cfg, cfg.eval_questions, np.random.default_rng([seed, 1]))
        greedy = run.logits[si, checkpoint].argmax(-1)  # (K, T)
        answers = greedy[:, types].T  # (n, K)
        rng = np.random.default_rng([seed, 3])
        flip = rng.random(answers.shape) < answer_noise
        answers = np.where(flip, rng.integers(0, cfg.n_answers, size=answers.shape), answers)
        w = torch.as_tensor(run.router[si, checkpoint])[None]
        m, _, _ = _slate_metrics(cfg, answers[None], types[None], z[None], checks[None], w)
        out.append(m)
    return {k: np.concatenate([o[k] for o in out]) for k in out[0]}
