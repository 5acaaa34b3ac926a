"""A frozen model's accuracy and its headroom for GRPO (paper §8's starting point).

GRPO learns only from groups whose m completions disagree: a group with no right answer
(or all right) gives every completion the same reward, hence zero advantage and no
gradient. So how much a frozen model can gain is read from how often it is right at all
when sampled, not only from its greedy accuracy. Three numbers say it:

- greedy accuracy, with its Wilson score interval (:func:`wilson_interval`);
- pass@k, the chance that at least one of k samples is right, estimated without bias from
  n >= k samples per problem (:func:`pass_at_k`, Chen et al. 2021, "Evaluating Large
  Language Models Trained on Code", Eq. 1);
- the share of groups of m completions with no right answer (:func:`no_right_share`),
  the groups in which GRPO learns nothing.

:func:`cut_completion` reads a greedy completion at a smaller token budget: greedy decoding
at budget b produces exactly the first b tokens of the greedy completion at any larger
budget (each step depends only on the tokens before it).
"""

from __future__ import annotations

from math import comb, sqrt
from statistics import NormalDist

import numpy as np

__all__ = ["wilson_interval", "pass_at_k", "no_right_share", "cut_completion"]


def wilson_interval(successes: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval ``(low, high)`` for a binomial proportion ``successes / n``.

    ``(p + z^2/2n ± z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)`` with ``z`` the normal
    quantile at ``(1 + level) / 2``: stays inside [0, 1] and keeps its coverage near 0 and 1,
    where the Wald interval ``p ± z sqrt(p(1-p)/n)`` fails.
    """
    if isinstance(n, bool) or int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if isinstance(successes, bool) or int(successes) != successes or not 0 <= successes <= n:
        raise ValueError(f"successes must be an integer in [0, n={n}], got {successes!r}")
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    z = NormalDist().inv_cdf((1 + level) / 2)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of pass@k from ``n`` samples of which ``c`` are right:
    ``1 - C(n-c, k) / C(n, k)`` (the chance that k of the n drawn without replacement
    include a right one). Needs ``1 <= k <= n``."""
    for name, v in (("n", n), ("c", c), ("k", k)):
        if isinstance(v, bool) or int(v) != v:
            raise ValueError(f"{name} must be an integer, got {v!r}")
    if not 1 <= k <= n:
        raise ValueError(f"k must lie in [1, n={n}], got {k}")
    if not 0 <= c <= n:
        raise ValueError(f"c must lie in [0, n={n}], got {c}")
    return 1.0 - comb(n - c, k) / comb(n, k)


def no_right_share(correct, m: int) -> float:
    """Share of groups of ``m`` completions with no right answer, estimated without bias from
    per-problem samples: ``mean over problems of C(n-c, m) / C(n, m)`` (= 1 - pass@m).

    ``correct``: one sequence of 0/1 per problem (its n >= m samples).
    """
    vals = [1.0 - pass_at_k(len(row), int(np.sum(row)), m) for row in correct]
    if not vals:
        raise ValueError("correct must hold at least one problem")
    return float(np.mean(vals))


def cut_completion(token_ids, n_tokens: int, truncated: bool, budget: int, eos_token_id: int | None = None):
    """``(ids, truncated)`` of a greedy completion read at a smaller token ``budget``.

    ``token_ids``: the completion's tokens (its EOS included when it ended by itself);
    ``n_tokens``: their number; ``truncated``: whether it was cut at its own budget. At
    ``budget`` it keeps the first ``budget`` tokens, and it is cut there unless it ended
    (emitted EOS) within them.
    """
    if isinstance(budget, bool) or int(budget) != budget or budget < 1:
        raise ValueError(f"budget must be a positive integer, got {budget!r}")
    ids = list(token_ids)[:budget]
    cut = bool(truncated) or n_tokens > budget
    if eos_token_id is not None and not cut and (not ids or ids[-1] != eos_token_id):
        raise ValueError("a completion that ended by itself must end with its EOS token")
    return ids, cut
