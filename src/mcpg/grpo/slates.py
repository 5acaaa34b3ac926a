"""The rollout's two layouts, and the one place that converts between them.

The engine generates completions row by row: problem b, then agent k, then completion g, i.e.
``(B, K, m)`` flattened (:meth:`mcpg.grpo.train.Engine.prompt_rows`). Slate g of problem b is the
g-th completion of each of the K agents, so every routing and credit quantity lives in the slate
layout ``(B, m, K)`` (paper §8; :mod:`mcpg.grpo.objective`), and the logged slates
(``slates.jsonl``) are ``(B*m, K)``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Slates"]


@dataclass(frozen=True)
class Slates:
    """B problems, m completions per agent, K agents: the reshapes between rows and slates.

    Works on numpy arrays and torch tensors alike; trailing axes (features) are carried along.
    """

    B: int
    m: int
    K: int

    def from_rows(self, x):
        """Rows ``(B*K*m, ...)`` -> slates ``(B, m, K, ...)`` (a view)."""
        x = x.reshape(self.B, self.K, self.m, *x.shape[1:])
        return x.transpose(1, 2) if hasattr(x, "contiguous") else x.swapaxes(1, 2)

    def to_rows(self, x):
        """Slates ``(B, m, K, ...)`` -> rows ``(B*K*m, ...)``."""
        x = x.transpose(1, 2) if hasattr(x, "contiguous") else x.swapaxes(1, 2)
        return x.reshape(self.B * self.K * self.m, *x.shape[3:])

    def logged(self, x):
        """Slates ``(B, m, K, ...)`` -> the logged layout ``(B*m, K, ...)``."""
        return x.reshape(self.B * self.m, self.K, *x.shape[3:])
