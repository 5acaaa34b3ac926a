"""Use a trained pool: load a run's agents and router, route a question, answer it.

A run directory of ``python -m mcpg.grpo train`` holds each agent as a PEFT adapter
(``adapters/<name>/``, which ``peft.PeftModel.from_pretrained`` also loads alone) and the
router (``router.safetensors``). :class:`RoutedPool` puts them back on the base model and
deploys them as the held-out evaluation does (:func:`mcpg.grpo.train.evaluate_pool`): every
agent answers greedily, the router scores each (question, answer) pair (Eq. 3's ``s_j``), and
the answer of the top score is deployed::

    from mcpg.grpo import RoutedPool

    pool = RoutedPool.load("runs/removal")
    routed = pool.answer("Natalia sold clips to 48 of her friends in April, ...")
    routed.agent, routed.text, routed.answer   # the deployed agent, its answer, the number it gives
    pool.answers("...")                        # every agent's answer, by name

Both calls take one question or a list (one generate call for all of them).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["RoutedAnswer", "RoutedPool"]


@dataclass(frozen=True)
class RoutedAnswer:
    """One question, routed.

    Attributes:
        question: the question.
        agent: the deployed agent's name (the top router score).
        text: its answer.
        answer: the number its answer commits to (:func:`mcpg.grpo.gsm8k.extract_answer`), or None.
        candidates: every agent's answer, by name, in the config's order.
        p: the router's propensities over the agents (Eq. 3), by name.
        mu_hat: the outcome model's estimate that each answer is right (``sigmoid(s_j)``), by name.
    """

    question: str
    agent: str
    text: str
    answer: float | None
    candidates: dict[str, str]
    p: dict[str, float]
    mu_hat: dict[str, float]


class RoutedPool:
    """K trained agents on one base model and the router that deploys one answer of theirs.

    Args:
        pool: the agents (:class:`mcpg.grpo.agents.AgentPool`), their adapters loaded.
        router: the trained :class:`mcpg.grpo.router.Router`.
        features: its :class:`mcpg.grpo.router.CandidateFeatures`.
        max_new_tokens: the answers' token budget (the run's ``eval_max_new_tokens``).
        stop_at_answer: end an answer at its first answer line (the run's key of that name).
        batch_size: rows per generate call (the run's ``eval_batch_size``).

    Build it with :meth:`load` from a run directory.
    """

    def __init__(self, pool, router, features, max_new_tokens: int = 256, stop_at_answer: bool = False,
                 batch_size: int = 64):
        self.pool, self.router, self.features = pool, router, features
        self.max_new_tokens, self.stop_at_answer = int(max_new_tokens), bool(stop_at_answer)
        self.batch_size = int(batch_size)

    @property
    def names(self) -> list[str]:
        """The agents' names, in the config's order."""
        return self.pool.names

    @classmethod
    def load(cls, run: str | os.PathLike, device: str | None = None) -> "RoutedPool":
        """The pool of a run directory: its config (``config.json``), base model, agents and router.

        Reads the final weights (``adapters/``, ``router.safetensors``), or the checkpoint's of a
        run that has not finished; adapters in peft's format or in the bare layout of older runs.
        ``device``: ``"cpu"`` or ``"cuda"``; None: the run's own (``auto``: cuda when available).
        """
        import torch

        from .agents import AgentPool, AgentSpec
        from .configs import saved_config
        from .models import load_base
        from .router import CandidateFeatures, Router
        from .rundir import ADAPTERS, CHECKPOINT, CONFIG, ROUTER

        run = Path(run)
        if not (run / CONFIG).is_file():
            raise ValueError(f"{run} holds no {CONFIG}: not a run directory")
        cfg = saved_config(json.loads((run / CONFIG).read_text()))
        found = [w for w in (run, run / CHECKPOINT) if (w / ADAPTERS).is_dir() and (w / ROUTER).is_file()]
        weights = found[0] if found else None
        if weights is None:
            raise ValueError(f"run {run} has neither final weights ({ADAPTERS}/, {ROUTER}) nor a checkpoint")
        device = device or cfg.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        model, tok, _ = load_base(cfg.model, dtype=cfg.dtype, device=device, seed=cfg.seed)
        agents = [AgentSpec(**a) for a in cfg.agents]
        pool = AgentPool(model, tok, agents, lora_r=cfg.lora_r, lora_alpha=cfg.lora_alpha,
                         target_modules=cfg.lora_target_modules, seed=cfg.seed,
                         instruction=cfg.instruction, share_prefill=cfg.shared_prefix,
                         logprob_chunk=cfg.logprob_chunk)
        pool.load_adapters(weights / ADAPTERS)
        features = CandidateFeatures(len(agents), cfg.question_features, cfg.candidate_features,
                                     kind=cfg.router_features)
        router = Router(features.dim, cfg.router_hidden, cfg.router_tau, cfg.router_eps)
        router.load(weights / ROUTER)
        return cls(pool, router, features, cfg.eval_max_new_tokens, cfg.stop_at_answer,
                   cfg.eval_batch_size)

    def _generate(self, questions: list[str]):
        """Every agent's greedy answer to every question: texts and truncation flags, (Q, K)."""
        import torch

        agents, K = self.pool.agents, len(self.pool.agents)
        if not questions:
            return [], []
        prompts = [self.pool.prompt(q, a) for q in questions for a in agents]
        with torch.no_grad():
            roll = self.pool.generate(prompts, [a.name for _ in questions for a in agents],
                                      [a.temperature for _ in questions for a in agents], self.max_new_tokens,
                                      greedy=True, batch_size=min(self.batch_size, len(prompts)),
                                      stop_at_answer=self.stop_at_answer)
        texts = [roll.texts[i * K:(i + 1) * K] for i in range(len(questions))]
        cut = [[bool(c) for c in roll.truncated[i * K:(i + 1) * K]] for i in range(len(questions))]
        return texts, cut

    def answers(self, question: str | list[str]) -> dict[str, str] | list[dict[str, str]]:
        """Every agent's greedy answer to ``question`` (or to each of a list), by agent name."""
        one = isinstance(question, str)
        texts, _ = self._generate([question] if one else list(question))
        out = [dict(zip(self.names, t)) for t in texts]
        return out[0] if one else out

    def answer(self, question: str | list[str]) -> RoutedAnswer | list[RoutedAnswer]:
        """Route ``question`` (or each of a list) and answer it with the deployed agent.

        Every agent answers greedily; the router scores each answer with the question
        (:meth:`mcpg.grpo.router.Router.route`) and the top score is deployed, as in the
        held-out evaluation.
        """
        from .gsm8k import extract_answer

        one = isinstance(question, str)
        questions = [question] if one else list(question)
        texts, cut = self._generate(questions)
        K, out = len(self.names), []
        for q, t, c in zip(questions, texts, cut):
            rt = self.router.route(self.features([q] * K, t, list(range(K)), c))
            d = int(np.argmax(rt["scores"]))
            out.append(RoutedAnswer(
                question=q, agent=self.names[d], text=t[d], answer=extract_answer(t[d]),
                candidates=dict(zip(self.names, t)),
                p={n: float(x) for n, x in zip(self.names, rt["p"])},
                mu_hat={n: float(x) for n, x in zip(self.names, rt["mu_hat"])},
            ))
        return out[0] if one else out
