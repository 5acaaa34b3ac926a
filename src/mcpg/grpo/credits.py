"""The credit signals, registered: one function and one registration per signal (paper §8).

A credit signal scores each agent on each slate of a routed rollout. Its function takes
``(selected, reward, p, P, mu_hat, rewards_all)``: the deployed candidate I and its reward
``G = R^(I)`` (shape ``(...)``), the logged propensities ``p`` (Eq. 3, ``(..., K)``), the
leave-one-out propensities ``P`` (``(..., K, K)``), the outcome model ``mu_hat`` (``(..., K)``)
and every candidate's reward ``R^(j)`` (``(..., K)``); it returns agent i's score on each slate,
``(..., K)``. Its registration (:func:`register`) declares what the engine must know about it:

- ``all_rewards``: it reads every candidate's reward, which filtered feedback does not give
  (a full-feedback diagnostic); every other signal's function receives ``rewards_all=None``;
- ``exact_budget``: it is Eq. (19)'s estimate of the exact removal contribution, so exact
  evaluations on a budget correct it (config key ``exact_budget``; Eq. (21),
  :func:`mcpg.grpo.objective.budgeted_removal`); :func:`exact_budget` is the one rule that says
  when a run has one;
- ``before_draw``: its credit is fixed before the router's draw (it reads neither I nor G, only
  the completions); its function receives ``selected=None`` and ``reward=None``;
- ``paper``: one of the paper's three signals, which the book compares (:data:`SIGNALS`, and the
  simulated pool's arms).

:func:`mcpg.grpo.objective.credit` calls a signal by name, passing only what its registration
declares; the LLM engine (:mod:`mcpg.grpo.train`), the config check and the simulated pool of
chapter 7 (:mod:`mcpg.grpo.simulated`) read the flags here. Adding a signal is one function with
``@register`` in this module, and its tests.

This module depends on numpy (and torch, whose tensors it accepts), :mod:`mcpg.routing` and
:mod:`mcpg.allocation` only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .. import allocation, routing

__all__ = ["Signal", "register", "get", "names", "SIGNALS", "exact_budget", "check_exact_budget"]


@dataclass(frozen=True)
class Signal:
    """One registered credit signal: its function and the flags the engine reads (module docstring)."""

    name: str
    fn: Callable[..., np.ndarray]
    all_rewards: bool = False
    exact_budget: bool = False
    before_draw: bool = False
    paper: bool = False


_REGISTRY: dict[str, Signal] = {}


def register(name: str, *, all_rewards: bool = False, exact_budget: bool = False, before_draw: bool = False,
             paper: bool = False) -> Callable:
    """Register the decorated function as credit signal ``name`` with its flags (module docstring).

    A name registers once: a second registration is a ValueError (it would silently change the
    credit of every run that names it).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a signal's name must be a non-empty string, got {name!r}")

    def add(fn: Callable) -> Callable:
        if name in _REGISTRY:
            raise ValueError(f"credit signal {name!r} is registered already")
        _REGISTRY[name] = Signal(name, fn, all_rewards=all_rewards, exact_budget=exact_budget,
                                 before_draw=before_draw, paper=paper)
        return fn

    return add


def names() -> tuple[str, ...]:
    """Every registered signal's name, in the order of registration."""
    return tuple(_REGISTRY)


def get(name: str) -> Signal:
    """The registered signal ``name``; a ValueError naming the registered ones otherwise."""
    if not isinstance(name, str) or name not in _REGISTRY:
        raise ValueError(f"signal must be one of {names()}, got {name!r}")
    return _REGISTRY[name]


def exact_budget(signal: str, share: float, rule: str = "sqrt") -> allocation.ExactBudget | None:
    """The exact budget a run of ``signal`` trains with: the one exact-budget rule.

    An :class:`mcpg.allocation.ExactBudget` of ``share`` (the expected share of slates evaluated
    exactly) and allocation ``rule`` where the signal takes one (registered with
    ``exact_budget``) and ``share`` > 0; None otherwise: budget 0 is the signal itself, exactly,
    and a signal that takes no budget ignores it (the simulated pool's arms share one config;
    the LLM engine's config refuses it first, :func:`check_exact_budget`).
    """
    if not get(signal).exact_budget or not share:
        return None
    return allocation.ExactBudget(share, rule)


def check_exact_budget(signal: str | None, share: float, what: str = "config key 'exact_budget'") -> None:
    """A ValueError where a budget ``share`` > 0 is given to a signal that takes none (``signal``
    None: not chosen yet, nothing to check)."""
    if share and signal is not None and not get(signal).exact_budget:
        takers = " and ".join(s.name for s in _REGISTRY.values() if s.exact_budget)
        raise ValueError(f"{what} corrects the {takers} signal only, got signal {signal!r}")


def as_array(x, name: str) -> np.ndarray:
    """``x`` (numpy, torch or a sequence) as a numpy array; a ValueError if it holds NaN."""
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype.kind == "f" and np.isnan(arr).any():
        raise ValueError(f"{name} contains NaN")
    return arr


def _deployed_shape(reward: np.ndarray, p: np.ndarray) -> None:
    if reward.shape != p.shape[:-1]:
        raise ValueError(f"reward must have shape {p.shape[:-1]}, got {reward.shape}")


@register("wta", paper=True)
def winner_take_all(selected, reward, p, P, mu_hat, rewards_all) -> np.ndarray:
    """Winner-take-all: ``1{I = i} G``, the deployed agent takes the reward (Theorem 1: it ascends
    agent i's private utility, not the system objective)."""
    _deployed_shape(reward, p)
    return routing.winner_take_all_scores(selected, reward, p.shape[-1])


@register("removal", exact_budget=True, paper=True)
def removal(selected, reward, p, P, mu_hat, rewards_all) -> np.ndarray:
    """Eq. (19): the doubly robust removal contribution from the selected feedback alone, the logged
    propensities and the outcome model (Corollary 3: unbiased for the exact removal contribution).
    With an exact budget, Eq. (21) corrects it on the slates Eq. (22) draws (chapter 9)."""
    return routing.dr_removal_contributions(selected, reward, p, as_array(P, "P"), as_array(mu_hat, "mu_hat"))


@register("oracle", all_rewards=True, before_draw=True, paper=True)
def oracle(selected, reward, p, P, mu_hat, rewards_all) -> np.ndarray:
    """The exact removal contribution ``sum_j p_j R^(j) - sum_{j != i} p^{-i}_j R^(j)`` (paper §6.1),
    what Eq. (19) estimates (Corollary 3), from every candidate's reward: a full-feedback
    diagnostic, not available under filtered feedback."""
    return routing.removal_contributions(rewards_all, p, as_array(P, "P"))


@register("team")
def team(selected, reward, p, P, mu_hat, rewards_all) -> np.ndarray:
    """The shared team reward: every agent is credited with the deployed answer's reward
    ``R(S) = G = R^(I)``, the credit of MAGRPO-style multi-agent GRPO (most multi-agent LLM
    systems): no credit assignment at all, a baseline beside the removal contribution (Eq. 19)."""
    _deployed_shape(reward, p)
    return np.repeat(reward[..., None], p.shape[-1], axis=-1)


SIGNALS: tuple[str, ...] = tuple(s.name for s in _REGISTRY.values() if s.paper)
"""The paper's three signals (winner-take-all, Eq. (19)'s removal, the oracle), which the book compares;
:func:`names` lists every registered signal."""
