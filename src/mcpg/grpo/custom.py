"""Your reward and your data: reward functions with TRL's signature, a dataset with a ``prompt`` column.

From Python (the argument names are ``GRPOTrainer``'s)::

    train("tiny-random", "removal", "runs/mine", reward_funcs=[my_reward],
          train_dataset=ds, eval_dataset=held_out)

From the command line: ``--reward_funcs module:function [module:function ...]`` (importable
from the working directory), ``--train_dataset PATH`` and ``--eval_dataset PATH`` (a folder
written by ``datasets.Dataset.save_to_disk``, or a JSON Lines file, one object per line).
Without them the run is the engine's own: its task's problems and
:func:`mcpg.grpo.gsm8k.reward`, exactly as before they existed.

**Reward functions** are called as TRL's ``GRPOTrainer`` calls a custom one, with keywords::

    f(prompts=..., completions=..., completion_ids=..., trainer_state=..., **columns) -> list

- ``prompts``: each completion's prompt, the dataset's ``prompt`` text (the user's message;
  the agent read it inside its chat template, after its role and the config's ``instruction``);
- ``completions``: the completions' texts; ``completion_ids``: their token ids (up to and
  including the end-of-sequence token, TRL's ``completion_ids``);
- ``trainer_state``: a ``transformers.TrainerState`` with ``global_step`` (the updates done)
  and ``max_steps`` (config key ``updates``), what a reward schedule reads of TRL's;
- every other column of the dataset, one value per completion, under its own name. Without a
  dataset the task's problems are the rows: columns ``answer`` (GSM8K's solution text) and
  ``gold`` (its number).

TRL's ``log_extra``, ``log_metric`` and ``environments`` are not passed (a TRL reward function
takes ``**kwargs`` and so runs here unchanged). A function returns one value per completion: a
number (a boolean counts as 0 or 1) or None, "no reward from this function for this
completion" (TRL's meaning: the other functions' weighted rewards are its reward). Several
functions are summed with ``reward_weights`` (config key, TRL's name; each 1 by default).

Refused before the model loads, with a one-line ValueError naming the function: one that cannot
take the keywords it will receive (:meth:`RewardScorer.check_signatures`; a function is never
called on made-up completions: a reward schedule or one reading ``completion_ids[i][-1]`` is
valid). Refused at its first call, on the first real rollout (the untrained pool's evaluation,
or the first update), each in one line naming the function: a list of the wrong length, a value
that is neither a number nor None, a completion that no function scores (TRL leaves such a
completion out of its group; here every candidate's reward is the router's feedback and enters
the removal credit), and a total reward outside [0, 1]: the router's outcome model ``mu_hat =
sigmoid(s)`` estimates the deployed candidate's expected reward, which needs rewards in [0, 1]
(rescale the reward or its weights). An exception a function raises is its own: raised as it
is, with its traceback, and a note naming the function (:func:`raised_by`; the command line
shows the traceback instead of one ``error:`` line).

**Correct**, in the evaluation (``accuracy``, ``agent_accuracy``, ``oracle``, ``regret``, the
router's AUC, the per-problem ``correct`` lists), means the full reward: a total reward of 1
(up to :data:`FULL_REWARD_TOL`), as the default reward gives a right answer. A graded reward's
partial credit is not counted right there; the training metrics (``reward``,
``agent_accuracy`` of metrics.jsonl) are means of the reward itself. ``strict_accuracy`` and
``flexible_accuracy`` read GSM8K's gold number and are None on a dataset of your own.

**Data**: ``train_dataset`` and ``eval_dataset`` are given together (the evaluation needs
held-out rows of the same kind), and only with ``reward_funcs`` (the default reward reads
GSM8K's gold answers). Each row's ``prompt`` is plain text; a conversational prompt (a list
of messages) is refused: each agent's role is its system message, so the prompt is the user's
message alone. Config keys ``train_problems`` and ``eval_problems`` draw subsets as they do of
GSM8K (None: every row). The router's features read the prompt's words and the candidate's
text, so any text works. Where the config keeps the book's GSM8K set-up (``instruction`` None,
the default ``agents``), a run on your data takes neutral defaults instead, records them and
says so in one line (:func:`mcpg.grpo.configs.dataset_defaults`); an agent's ``specialty`` is
any label (the specialization diagnostic reads GSM8K's keyword classes money, time, geometry).

**Recorded**: the functions' qualified names (``module:qualname``) in ``config.json``
(``reward_funcs``) and ``PROVENANCE.json`` (its ``data``), and the SHA-256 of each one's source
and module file (``reward_sources``, :func:`reward_source`); the datasets' sources and SHA-256
there too. ``--resume`` and ``evaluate`` refuse other functions, a function whose source or
module file changed (:func:`check_same_sources`; a run recorded before the hashes is not
checked) or other rows; given none, they import the recorded functions and read a dataset from
its recorded path.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .gsm8k import jsonl_objects

__all__ = ["FULL_REWARD_TOL", "RESERVED_COLUMNS", "reward_name", "import_reward", "reward_functions",
           "load_rows", "dataset_problems", "problems_sha256", "RewardScorer", "raised_by", "reward_source",
           "check_same_sources"]

FULL_REWARD_TOL = 1e-6
"""A total reward within this of 1 is the full reward, and the evaluation counts the answer correct."""

RESERVED_COLUMNS = ("prompts", "completions", "completion_ids", "trainer_state")
"""Keywords of the reward call that a dataset column may not be named."""


def reward_name(func: Callable) -> str:
    """A reward function's qualified name, ``module:qualname`` (what the run records)."""
    module = getattr(func, "__module__", None) or type(func).__module__
    qual = getattr(func, "__qualname__", None) or type(func).__qualname__
    return f"{module}:{qual}"


def reward_source(func: Callable) -> dict:
    """What a run records of a reward function besides its name: the SHA-256 of its source
    (``inspect.getsource``; of its class for a callable object) and of its module's file, each
    None where it cannot be read (a builtin, a function typed into a REPL)."""
    target = func if inspect.isfunction(func) or inspect.ismethod(func) else type(func)

    def sha(text: bytes | None) -> str | None:
        return None if text is None else hashlib.sha256(text).hexdigest()

    try:
        source = inspect.getsource(target).encode("utf-8")
    except (OSError, TypeError):
        source = None
    try:
        module = Path(inspect.getsourcefile(target)).read_bytes()
    except (OSError, TypeError):
        module = None
    return {"source_sha256": sha(source), "module_sha256": sha(module)}


def check_same_sources(recorded: list[dict] | None, funcs: list[Callable]) -> None:
    """Refuse reward functions whose source (or module file) differs from what a run recorded
    (``config.json``'s ``reward_sources``, in the order of ``reward_funcs``): a resumed run or a
    new evaluation would mix two functions' rewards under one name. A run recorded before the
    hashes existed (``recorded`` None), or a hash that could not be read either time, is not
    checked."""
    if not recorded:
        return
    for f, theirs in zip(funcs, recorded):
        ours = reward_source(f)
        for key, what in (("source_sha256", "source"), ("module_sha256", "module file")):
            if None not in (ours[key], theirs.get(key)) and ours[key] != theirs[key]:
                raise ValueError(f"reward function {reward_name(f)}: its {what} differs from the one the run "
                                 f"was trained with (SHA-256 {ours[key][:12]}... now, {theirs[key][:12]}... "
                                 "recorded), which would mix two rewards under one name: restore it, or "
                                 "start a new run in a new output")


def import_reward(spec: str) -> Callable:
    """The function named ``module:function`` (``function`` may be dotted: ``Class.method``).
    A ValueError of one line when it cannot be imported or is not callable."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"reward function {spec!r}: give it as module:function (a module importable "
                         "from the working directory)")
    module, qual = spec.split(":")
    try:
        obj = importlib.import_module(module)
    except Exception as err:  # the module's own error, whatever it is, on one line
        raise ValueError(f"reward function {spec!r}: module {module!r} does not import "
                         f"({type(err).__name__}: {' '.join(str(err).split())[:200]})") from None
    for part in qual.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"reward function {spec!r}: {getattr(obj, '__name__', module)!r} has no "
                             f"{part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"reward function {spec!r} is not callable (a {type(obj).__name__})")
    return obj


def reward_functions(funcs) -> list[Callable] | None:
    """``reward_funcs`` as a list of callables (None stays None): one function or a list of
    functions and ``module:function`` names."""
    if funcs is None:
        return None
    items = [funcs] if callable(funcs) or isinstance(funcs, str) else list(funcs)
    if not items:
        raise ValueError("reward_funcs is empty: give one reward function or more, or None for the default")
    out = []
    for f in items:
        f = import_reward(f) if isinstance(f, str) else f
        if not callable(f):
            raise ValueError(f"reward_funcs: {f!r} is not a function (give a callable or module:function)")
        out.append(f)
    return out


def load_rows(data, what: str) -> tuple[list[dict], str]:
    """The rows of ``data`` (a ``datasets.Dataset``, a folder saved by ``Dataset.save_to_disk``,
    or a JSON Lines file) as dicts, and where they came from (a path, or the Dataset's
    fingerprint). ``what`` names the argument in errors (``train_dataset``, ``eval_dataset``)."""
    if isinstance(data, (str, os.PathLike)):
        path = Path(data)
        source = str(path.resolve())
        if not path.exists():
            raise ValueError(f"{what} {path} does not exist: give a folder saved by Dataset.save_to_disk or "
                             "a JSON Lines file")
        if path.is_dir():
            import datasets

            try:
                ds = datasets.load_from_disk(str(path))
            except (FileNotFoundError, ValueError, OSError) as err:
                raise ValueError(f"{what} {path} is not a folder saved by Dataset.save_to_disk "
                                 f"({' '.join(str(err).split())[:160]})") from None
            except IndexError:  # datasets cannot concatenate the no tables of an empty Dataset
                raise ValueError(f"{what} {path} holds no rows (an empty Dataset was saved there)") from None
            if isinstance(ds, datasets.DatasetDict):
                raise ValueError(f"{what} {path} holds the splits {sorted(ds)}: give one split's folder")
            return _dataset_rows(ds, what), source
        return _jsonl_rows(path, what), source
    try:
        import datasets
    except ImportError:  # pragma: no cover - datasets is a dependency
        datasets = None
    if datasets is not None and isinstance(data, datasets.IterableDataset):
        raise ValueError(f"{what} is an IterableDataset: give a datasets.Dataset (its rows are drawn by "
                         "data_seed and hashed into the run's record)")
    if datasets is None or not isinstance(data, datasets.Dataset):
        raise ValueError(f"{what} must be a datasets.Dataset or a path (a folder saved by "
                         f"Dataset.save_to_disk, or a JSON Lines file), got {type(data).__name__}")
    return _dataset_rows(data, what), f"datasets.Dataset in memory (fingerprint {data._fingerprint})"


def _dataset_rows(ds, what: str) -> list[dict]:
    if "prompt" not in ds.column_names:
        raise ValueError(f"{what} has no 'prompt' column (its columns: {ds.column_names}): each row's prompt "
                         "is the question the agents answer")
    return [dict(r) for r in ds]


def _jsonl_rows(path: Path, what: str) -> list[dict]:
    rows = []
    for lineno, row in jsonl_objects(path, "; a JSON Lines file holds one JSON object per line", what):
        if not isinstance(row, dict):
            raise ValueError(f"{what} {path}, line {lineno}: not a JSON object")
        if "prompt" not in row:
            raise ValueError(f"{what} {path}, line {lineno}: no 'prompt' (each row's prompt is the "
                             "question the agents answer)")
        rows.append(row)
    return rows


def dataset_problems(rows: list[dict], what: str) -> list[dict]:
    """Rows with a ``prompt`` as the engine's problems: ``question`` (the prompt) and ``columns``
    (every other column, what the reward functions receive)."""
    if not rows:
        raise ValueError(f"{what} holds no rows")
    out = []
    for i, r in enumerate(rows):
        if "prompt" not in r:
            raise ValueError(f"{what}: row {i} has no 'prompt'")
        p = r["prompt"]
        if isinstance(p, list):
            raise ValueError(f"{what}: row {i}'s prompt is a conversation (a list of messages), which this "
                             "engine does not take: give the user's message as plain text (each agent's role "
                             "is its system message)")
        if not isinstance(p, str) or not p.strip():
            raise ValueError(f"{what}: row {i}'s prompt must be non-empty text, got {p!r}"[:300])
        reserved = sorted(set(r) & set(RESERVED_COLUMNS))
        if reserved:
            raise ValueError(f"{what}: the column{'s' if len(reserved) > 1 else ''} {reserved} would shadow "
                             "the reward functions' own keywords: rename it")
        out.append({"question": p, "columns": {k: v for k, v in r.items() if k != "prompt"}})
    return out


def problems_sha256(problems: list[dict]) -> str:
    """SHA-256 of dataset problems, in order: of the JSON list of ``[prompt, columns]`` (keys sorted,
    UTF-8, no spaces; a value JSON cannot write is written as its ``str``)."""
    text = json.dumps([[p["question"], p["columns"]] for p in problems], ensure_ascii=False,
                      separators=(",", ":"), sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _columns(problem: dict) -> dict:
    """The columns a reward function receives for a problem: a dataset row's own, or a task
    problem's ``answer`` and ``gold``."""
    if "columns" in problem:
        return problem["columns"]
    return {k: v for k, v in problem.items() if k != "question"}


_RAISED_BY = "mcpg_reward_function"


def raised_by(err: BaseException) -> str | None:
    """The reward function (``module:qualname``) whose own code raised ``err``, or None."""
    return getattr(err, _RAISED_BY, None)


@dataclass
class RewardScorer:
    """Reward functions and their weights (``reward_weights``; None: each 1), called as TRL calls them."""

    funcs: list[Callable]
    weights: list[float] | None = None

    def __post_init__(self):
        if self.weights is not None and len(self.weights) != len(self.funcs):
            raise ValueError(f"config key 'reward_weights' has {len(self.weights)} weights for "
                             f"{len(self.funcs)} reward functions: give one weight per function")

    @property
    def names(self) -> list[str]:
        return [reward_name(f) for f in self.funcs]

    @property
    def sources(self) -> list[dict]:
        """Each function's :func:`reward_source` (what ``config.json`` records as ``reward_sources``)."""
        return [reward_source(f) for f in self.funcs]

    def _values(self, f: Callable, problems: list[dict], completions: list[str],
                completion_ids: list[list[int]], step: int, max_steps: int) -> list[float | None]:
        """One function's rewards, called as TRL calls it, checked: one number or None per completion."""
        n, name = len(completions), reward_name(f)
        cols: dict[str, list] = {}
        for r, p in enumerate(problems):
            for k, v in _columns(p).items():
                cols.setdefault(k, [None] * n)[r] = v
        from transformers import TrainerState

        state = TrainerState(global_step=step, max_steps=max_steps)
        try:
            out = f(prompts=[p["question"] for p in problems], completions=list(completions),
                    completion_ids=completion_ids, trainer_state=state, **cols)
        except Exception as err:  # the user's own error: raised as it is, naming the function
            err.add_note(f"raised by reward function {name}, called as TRL's GRPOTrainer calls it "
                         "(mcpg.grpo.custom)")
            setattr(err, _RAISED_BY, name)
            raise
        try:
            values = list(out)
        except TypeError:
            raise ValueError(f"reward function {name} returned a {type(out).__name__}, not a list of "
                             f"{n} rewards (one per completion)") from None
        if len(values) != n:
            raise ValueError(f"reward function {name} returned {len(values)} rewards for {n} "
                             "completions: return one per completion")
        for r, v in enumerate(values):
            if v is None:
                continue
            if isinstance(v, (bool, np.bool_)):
                v = float(v)
            if not isinstance(v, (int, float, np.integer, np.floating)) or not math.isfinite(float(v)):
                raise ValueError(f"reward function {name} returned {v!r} for completion {r}: a reward is "
                                 "a finite number (or None: no reward from this function)"[:300])
            values[r] = float(v)
        return values

    def check_signatures(self, problems: list[dict]) -> None:
        """Refuse, before any model loads, a function that cannot take the keywords it will receive
        (``prompts``, ``completions``, ``completion_ids``, ``trainer_state`` and the columns of
        ``problems``): a parameter that none of them fills, without ``**kwargs`` to take the rest.
        Nothing is called: what a function returns is checked at its first call, on real
        completions and a real ``trainer_state``."""
        columns = sorted({k for p in problems for k in _columns(p)})
        keywords = dict.fromkeys([*RESERVED_COLUMNS, *columns])
        for f in self.funcs:
            try:
                sig = inspect.signature(f)
            except (TypeError, ValueError):  # no signature to read (a builtin): its first call tells
                continue
            try:
                sig.bind(**keywords)
            except TypeError as err:
                raise ValueError(f"reward function {reward_name(f)} cannot be called with the keywords a "
                                 f"reward receives ({err}): they are {list(RESERVED_COLUMNS)} and the data's "
                                 f"columns {columns}; take what it uses by name and the rest with **kwargs"
                                 ) from None

    def __call__(self, problems: list[dict], completions: list[str], completion_ids: list[list[int]],
                 step: int, max_steps: int) -> np.ndarray:
        """The total reward of each completion, ``problems[r]`` being row r's problem, (N,)."""
        n = len(completions)
        weights = self.weights or [1.0] * len(self.funcs)
        total = np.zeros(n)
        scored = np.zeros(n, dtype=bool)
        for f, w in zip(self.funcs, weights):
            for r, v in enumerate(self._values(f, problems, completions, completion_ids, step, max_steps)):
                if v is not None:
                    total[r] += float(w) * v
                    scored[r] = True
        if not scored.all():
            r = int(np.flatnonzero(~scored)[0])
            raise ValueError(f"no reward function scored completion {r} (every one returned None): each "
                             "candidate's reward is the router's feedback, so some function must score it")
        bad = np.flatnonzero((total < 0) | (total > 1))
        if bad.size:
            r = int(bad[0])
            raise ValueError(f"the reward of completion {r} is {total[r]:g}, outside [0, 1]: the router's "
                             "outcome model (mu_hat = sigmoid(s)) estimates rewards in [0, 1]; rescale the "
                             "reward functions or reward_weights")
        return total

    def correct(self, *args, **kwargs) -> np.ndarray:
        """1.0 where a completion earns the full reward 1 (within :data:`FULL_REWARD_TOL`), else 0.0:
        what the evaluation counts correct."""
        return (self(*args, **kwargs) >= 1.0 - FULL_REWARD_TOL).astype(float)
