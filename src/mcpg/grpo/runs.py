"""Recorded GRPO runs as tidy tables: one import for the chapters, by concern underneath.

This module is the re-export layer over four modules, one concern each (each name is
documented in its own module):

- :mod:`mcpg.grpo.rundir`: reading a run directory (``Run``, ``read_run``,
  ``read_comparison``) and the keys it holds (``PER_AGENT_METRICS``, ``SCALAR_METRICS``);
- :mod:`mcpg.grpo.heldout`: held-out comparisons, per problem (``eval_table``, ``eval_gains``,
  ``compare_runs``, ``per_problem``; paired intervals from :func:`mcpg.stats.paired_difference`,
  re-exported here as ``paired_difference``) and over seeds (``signals_over_seeds``,
  ``compare_signals``, ``verdict_table``, ``t_interval``);
- :mod:`mcpg.grpo.slate_diagnostics`: Eq. (19) and the advantages on the logged slates
  (``slate_credit``, ``group_signal``, ``expected_advantage``, ``advantage_bias``,
  ``advantage_alignment``, ``advantage_by_outcome``, ``slate_groups``, ``allocation_risks``,
  ``advantage_distance``);
- :mod:`mcpg.grpo.health`: ``learning_curve``, ``health``, ``health_table`` with chapter 8's
  bars (``HEALTH_BARS``), ``feedback_table``, ``recording_summary``.

:func:`probe_answers`, which reads ``scripts/ch08_cut_answers.py``'s output, lives here.

Only numpy, pandas, :mod:`mcpg.stats` and :mod:`mcpg.grpo.objective` are imported (no transformers).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd

from ..stats import EVAL_KEYS, paired_difference
from .health import HEALTH_BARS, feedback_table, health, health_table, learning_curve, recording_summary
from .heldout import (
    MEASURES,
    NoPairedSeeds,
    compare_runs,
    compare_signals,
    eval_gains,
    eval_table,
    paired_row,
    per_problem,
    signals_over_seeds,
    t_interval,
    verdict_table,
)
from .rundir import PER_AGENT_METRICS, SCALAR_METRICS, Run, read_comparison, read_json, read_jsonl, read_run
from .slate_diagnostics import (
    advantage_alignment,
    advantage_bias,
    advantage_by_outcome,
    advantage_distance,
    allocation_risks,
    expected_advantage,
    group_signal,
    slate_credit,
    slate_groups,
)

__all__ = ["Run", "read_run", "read_comparison", "t_interval", "paired_difference", "paired_row",
           "learning_curve", "health", "eval_table", "eval_gains", "compare_runs", "signals_over_seeds",
           "slate_credit", "group_signal", "expected_advantage", "advantage_bias", "advantage_alignment",
           "advantage_by_outcome", "recording_summary", "slate_groups", "health_table",
           "compare_signals", "verdict_table", "probe_answers", "feedback_table", "allocation_risks",
           "advantage_distance", "NoPairedSeeds", "HEALTH_BARS", "per_problem", "MEASURES",
           "PER_AGENT_METRICS", "SCALAR_METRICS", "EVAL_KEYS"]


def probe_answers(probe: str | os.PathLike, run: Run | None = None) -> pd.DataFrame:
    """A probe's regenerated held-out answers, one row per (problem, agent), with the run's grades.

    ``probe`` is a folder written by ``scripts/ch08_cut_answers.py`` (``samples.jsonl``: problem,
    agent, text, cut and the cut's kind; ``summary.json``); ``run`` the run whose final agents it
    regenerated. With a run, adds ``right`` (``agent_correct`` of its eval.json) and ``mu_hat``
    (the outcome model's estimate that the answer is right, eval.json's ``mu_hat``). Refuses a
    probe whose summary does not say that the regenerated answers reproduce the run's grades (so
    they are the answers the run was graded on), and rows that do not fit the run's problems and
    agents.
    """
    probe = Path(probe)
    summary = read_json(probe / "summary.json")
    if summary is None:
        raise FileNotFoundError(f"{probe} holds no summary.json: not a probe folder")
    if not summary.get("reproduces_agent_correct"):
        raise ValueError(f"{probe}: the regenerated answers do not reproduce the run's grades")
    answers = pd.DataFrame(read_jsonl(probe / "samples.jsonl"))
    if answers.empty:
        raise ValueError(f"{probe}: samples.jsonl holds no answers")
    if run is None:
        return answers
    if run.eval is None or "mu_hat" not in run.eval:
        raise ValueError(f"{run.path}: eval.json has no mu_hat (unfinished or an older recording)")
    right = np.asarray(run.eval["agent_correct"])
    if answers["problem"].max() >= right.shape[0] or answers["agent"].max() >= right.shape[1]:
        raise ValueError(f"{probe}: its answers do not fit {run.path}'s {right.shape} held-out grades")
    at = answers["problem"].to_numpy(), answers["agent"].to_numpy()
    answers["right"] = right[at].astype(int)
    answers["mu_hat"] = np.asarray(run.eval["mu_hat"], dtype=float)[at]
    return answers
