"""The router and outcome model: one small network on (question, candidate) features (paper §8).

Its output ``s_j = s(H, A^(j))`` is both

- the router's score in Eq. (3): ``p_j = (1 - eps) softmax_j(s / tau) + eps / K``
  (:func:`mcpg.routing.router_propensities`), and
- the outcome model's logit: ``mu_hat_j = sigmoid(s_j)``, the estimate of
  ``g_j = E[R^(j) | H, A^(j)]`` that the doubly robust removal contribution (Eq. 19) uses.

It learns only from filtered feedback: the selected candidate's reward, by
inverse-propensity-weighted cross-entropy (:func:`mcpg.routing.ipw_outcome_loss`), and the
trainer updates it only after the actors have been updated on the same rollout, so it is
held fixed while they update (the cross-fitting of §6).

Features (:class:`CandidateFeatures`) are cheap and need no model: hashed bags of words of
the question and of the candidate (words and word bigrams), flags of the parsed answer
(is there a number, an explicit final-answer marker, is the answer a number copied from
the question, its magnitude), the candidate's length and truncation, and a one-hot of the
agent that wrote it. Hashing uses CRC32, not Python's salted ``hash``, so features are the
same in every process.

With ``kind="calculation"`` (the default; ``"basic"`` is the set above alone, which earlier
recordings used) six flags read the candidate's *written calculation* against the question,
the correctness information a small model's answer exposes (:func:`calculation_flags`): does
every equation it writes hold, does its final answer equal its last equation's result, is
the final answer one operation away from two numbers of the question. They are still
functions of (H, A^(j)) alone, the form of Eq. (3): the router reads the question and one
candidate, never the reward.
"""

from __future__ import annotations

import math
import re
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import nn

from .. import routing
from .gsm8k import extract_answer

__all__ = ["CandidateFeatures", "Router", "FEATURE_KINDS", "calculation_flags"]

FEATURE_KINDS: tuple[str, ...] = ("calculation", "basic")
"""The feature sets of :class:`CandidateFeatures` (config key ``router_features``)."""

_WORD = re.compile(r"[a-z]+|\d+(?:\.\d+)?|[#$=+*/-]")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


# "a op b = c" with op in + - * x / (and the unicode times/minus signs), c possibly with "$"
_EQ = re.compile(
    r"(-?\$?\d+(?:,\d{3})*(?:\.\d+)?)\s*([-+*/x\u00d7\u2212])\s*(-?\$?\d+(?:,\d{3})*(?:\.\d+)?)"
    r"\s*=\s*(-?\$?\d+(?:,\d{3})*(?:\.\d+)?)"
)


def _num(t: str) -> float:
    return float(t.replace("$", "").replace(",", ""))


def _apply(a: float, op: str, b: float) -> float | None:
    if op == "+":
        return a + b
    if op in "-\u2212":
        return a - b
    if op in "*x\u00d7":
        return a * b
    return a / b if b != 0 else None


def calculation_flags(question: str, candidate: str, answer: float | None) -> np.ndarray:
    """Six flags of a candidate's written calculation (the ``calculation`` features).

    1. it writes at least one equation ``a op b = c``;
    2. the share of its equations that hold (0 without any);
    3. some equation is wrong;
    4. its final ``answer`` equals its last equation's stated result;
    5. ``answer`` is one operation (+, -, x, /) away from two numbers of the question;
    6. ``answer`` is a whole number.
    """
    eqs = [(_num(a), op, _num(b), _num(c)) for a, op, b, c in _EQ.findall(candidate)]
    ok = [(r := _apply(a, op, b)) is not None and math.isclose(r, c, rel_tol=1e-9, abs_tol=1e-9)
          for a, op, b, c in eqs]
    q = [float(x) for x in _NUMBER.findall(question.replace(",", ""))]
    one_step = False
    if answer is not None:
        for i, a in enumerate(q):
            for j, b in enumerate(q):
                results = (_apply(a, op, b) for op in "+-*/")
                if i != j and any(r is not None and math.isclose(r, answer, abs_tol=1e-9) for r in results):
                    one_step = True
                    break
            if one_step:
                break
    return np.array([
        float(bool(eqs)),
        float(np.mean(ok)) if ok else 0.0,
        float(bool(ok) and not all(ok)),
        float(bool(eqs) and answer is not None and math.isclose(eqs[-1][3], answer, abs_tol=1e-9)),
        float(one_step),
        float(answer is not None and float(answer).is_integer()),
    ], dtype=np.float32)


def _bucket(token: str, dim: int) -> int:
    return zlib.crc32(token.encode("utf-8")) % dim


class CandidateFeatures:
    """Feature map of (question, candidate, agent id) -> vector of length ``dim``."""

    N_FLAGS = 8
    N_CALCULATION = 6

    def __init__(self, n_agents: int, question_dim: int = 128, candidate_dim: int = 256,
                 kind: str = "calculation"):
        if n_agents < 1 or question_dim < 1 or candidate_dim < 1:
            raise ValueError("n_agents, question_dim and candidate_dim must be positive")
        if kind not in FEATURE_KINDS:
            raise ValueError(f"kind must be one of {FEATURE_KINDS}, got {kind!r}")
        self.n_agents, self.question_dim, self.candidate_dim = n_agents, question_dim, candidate_dim
        self.kind = kind
        n_flags = self.N_FLAGS + (self.N_CALCULATION if kind == "calculation" else 0)
        self.dim = question_dim + candidate_dim + n_flags + n_agents

    def _bag(self, tokens: list[str], dim: int) -> np.ndarray:
        v = np.zeros(dim, dtype=np.float32)
        for t in tokens:
            v[_bucket(t, dim)] += 1.0
        n = np.linalg.norm(v)
        return v / n if n > 0 else v

    def one(self, question: str, candidate: str, agent: int, truncated: bool = False) -> np.ndarray:
        if not 0 <= agent < self.n_agents:
            raise ValueError(f"agent must lie in [0, {self.n_agents}), got {agent}")
        qw = _WORD.findall(question.lower())
        cw = _WORD.findall(candidate.lower())
        c_tokens = cw + [a + " " + b for a, b in zip(cw, cw[1:])]
        ans = extract_answer(candidate)
        q_numbers = {float(x) for x in _NUMBER.findall(question.replace(",", ""))}
        marker = ("####" in candidate) or ("answer" in candidate.lower()) or ("\\boxed" in candidate)
        flags = np.array([
            1.0,  # bias
            float(ans is not None),
            float(marker),
            float(ans is not None and ans in q_numbers),
            math.log1p(abs(ans)) / 10.0 if ans is not None else 0.0,
            min(len(_NUMBER.findall(candidate)), 50) / 10.0,
            math.log1p(len(candidate)) / 8.0,
            float(truncated),
        ], dtype=np.float32)
        if self.kind == "calculation":
            flags = np.concatenate([flags, calculation_flags(question, candidate, ans)])
        onehot = np.zeros(self.n_agents, dtype=np.float32)
        onehot[agent] = 1.0
        return np.concatenate(
            [self._bag(qw, self.question_dim), self._bag(c_tokens, self.candidate_dim), flags, onehot]
        )

    def __call__(
        self, questions: list[str], candidates: list[str], agents: list[int], truncated=None
    ) -> torch.Tensor:
        """Features of N (question, candidate, agent) triples, shape (N, dim)."""
        n = len(questions)
        if len(candidates) != n or len(agents) != n:
            raise ValueError("questions, candidates and agents must have the same length")
        truncated = [False] * n if truncated is None else [bool(t) for t in truncated]
        return torch.from_numpy(np.stack([self.one(q, c, a, t) for q, c, a, t in
                                          zip(questions, candidates, agents, truncated)]))


class Router(nn.Module):
    """MLP ``features -> s``: router score (Eq. 3) and outcome logit (``mu_hat = sigmoid(s)``).

    Args:
        in_dim: feature dimension.
        hidden: hidden width (one hidden layer, tanh).
        tau, eps: the temperature and uniform exploration of Eq. (3).
    """

    def __init__(self, in_dim: int, hidden: int = 64, tau: float = 1.0, eps: float = 0.1):
        super().__init__()
        if not tau > 0:
            raise ValueError(f"tau must be > 0, got {tau}")
        if not 0 <= eps <= 1:
            raise ValueError(f"eps must lie in [0, 1], got {eps}")
        self.tau, self.eps = float(tau), float(eps)
        self.net = nn.Sequential(nn.Linear(in_dim, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Scores s of shape ``features.shape[:-1]``."""
        return self.net(features).squeeze(-1)

    @torch.no_grad()
    def route(self, features: torch.Tensor) -> dict[str, np.ndarray]:
        """Scores and propensities of slates ``features`` of shape (..., K, dim).

        Returns numpy arrays: ``scores`` (..., K), ``p`` (..., K) (Eq. 3), ``P`` (..., K, K)
        (leave-one-out propensities) and ``mu_hat`` (..., K).
        """
        s = self(features).double().cpu().numpy()
        if s.shape[-1] == 1:  # one agent: it is always deployed; deleting it leaves no slate
            P = np.zeros(s.shape + (1,))
        else:
            P = routing.leave_one_out_propensities(s, tau=self.tau, eps=self.eps)
        return {
            "scores": s,
            "p": routing.router_propensities(s, tau=self.tau, eps=self.eps),
            "P": P,
            "mu_hat": 1.0 / (1.0 + np.exp(-s)),
        }

    def fit(self, features: torch.Tensor, selected, reward, p, optimizer: torch.optim.Optimizer,
            steps: int = 20) -> float:
        """Train on selected feedback only: ``steps`` full-batch steps of the IPW cross-entropy.

        Args:
            features: (N, K, dim) features of N slates.
            selected: (N,) selected index I per slate; reward: (N,) its reward G = R^(I).
            p: (N, K) the logged propensities that drew I.
        Returns the last loss.
        """
        feats = features.reshape(-1, features.shape[-2], features.shape[-1])
        sel = torch.as_tensor(np.asarray(selected).reshape(-1), dtype=torch.long)
        G = torch.as_tensor(np.asarray(reward, dtype=np.float32).reshape(-1))
        pp = torch.as_tensor(np.asarray(p, dtype=np.float32).reshape(feats.shape[0], -1))
        loss = torch.tensor(float("nan"))
        for _ in range(steps):
            optimizer.zero_grad()
            loss = routing.ipw_outcome_loss(self(feats), sel, G, pp)
            loss.backward()
            optimizer.step()
        return float(loss.detach())

    def save(self, path: str | Path) -> None:
        """Weights as safetensors (tau and eps come from the config)."""
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, str(path))

    def load(self, path: str | Path) -> None:
        from safetensors.torch import load_file

        self.load_state_dict(load_file(str(path)))
