"""Metrics where practitioners look for them: the ``report_to`` config key.

Every row the training loop writes to ``metrics.jsonl`` is also written, when ``report_to``
names ``"tensorboard"``, as TensorBoard scalars in ``<run>/tensorboard/`` (TRL's
``report_to``, for the one backend this engine supports). TensorBoard is an optional extra
(``pip install 'mcpg[tensorboard]'``); asking for it without it installed is an error that
says so (a ValueError naming the key), before the model loads.

A row becomes scalars by :func:`flatten_scalars`: nested dicts give ``outer/inner``, a
per-agent list (one entry per agent) gives ``name/<agent>``; per-problem lists (an
evaluation's ``correct``, ``agent_correct``) are records, not metrics, and stay in
metrics.jsonl only; None and text are skipped. The step is the row's ``update``.
"""

from __future__ import annotations

import math
from numbers import Real
from pathlib import Path

__all__ = ["REPORTERS", "flatten_scalars", "MetricsReport", "check_available"]

REPORTERS: tuple[str, ...] = ("tensorboard",)
"""The backends ``report_to`` may name."""


def flatten_scalars(row: dict, agents: list[str], prefix: str = "") -> dict[str, float]:
    """The scalars of one metrics row, keyed ``a/b`` for nested dicts and ``name/<agent>`` for
    per-agent lists (``len(list) == len(agents)``; an agent's None is skipped); other lists, None
    and text are skipped."""
    out: dict[str, float] = {}
    for key, value in row.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_scalars(value, agents, prefix=name + "/"))
        elif isinstance(value, (list, tuple)):
            if len(value) == len(agents) and all(v is None or _is_number(v) for v in value):
                for agent, v in zip(agents, value):
                    if v is not None:
                        out[f"{name}/{agent}"] = float(v)
        elif _is_number(value) and key != "update":
            out[name] = float(value)
    return out


def _is_number(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(float(v))


class MetricsReport:
    """Writes metrics rows to the backends of ``report_to`` (none: does nothing).

    ``folder``: the run directory; ``agents``: the agent names (per-agent lists);
    ``purge_step``: on resume, the first update to rewrite (TensorBoard drops the older
    session's events from there on, as the loop truncates metrics.jsonl).
    """

    def __init__(self, report_to, folder: str | Path, agents: list[str], purge_step: int | None = None):
        self.agents = list(agents)
        self.writer = None
        if "tensorboard" in (report_to or []):
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as err:  # torch's writer needs the tensorboard package
                raise ImportError(
                    "config key report_to names 'tensorboard', but the tensorboard package is not "
                    "installed: pip install 'mcpg[tensorboard]' (or pip install tensorboard)"
                ) from err
            self.writer = SummaryWriter(log_dir=str(Path(folder) / "tensorboard"), purge_step=purge_step)

    def write(self, row: dict) -> None:
        """Write one metrics row at step ``row["update"]``."""
        if self.writer is None:
            return
        step = int(row["update"])
        for tag, value in flatten_scalars(row, self.agents).items():
            self.writer.add_scalar(tag, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def check_available(report_to) -> None:
    """Refuse now (before a model loads), with a ValueError naming the config key, a requested
    backend that is not installed."""
    if "tensorboard" in (report_to or []):
        import importlib.util

        if importlib.util.find_spec("tensorboard") is None:
            raise ValueError(
                "config key 'report_to' names 'tensorboard', but the tensorboard package is not "
                "installed: pip install 'mcpg[tensorboard]' (or pip install tensorboard), or remove it "
                "from report_to"
            )
