"""A small synthetic word-problem task in GSM8K's own format (chapter 8's CPU-size task).

GSM8K problems take a 3-billion-parameter model and hundreds of tokens per answer; a
135-million-parameter model on a CPU needs a task it can partly solve in a few dozen
tokens and can get better at. This module writes such a task: one- or two-step additions
and subtractions of small whole numbers, phrased as word problems about **money**
(dollars, prices), **time** (hours, minutes, ages) or **geometry** (lengths in meters or
feet), so that the keyword specialties of :data:`mcpg.grpo.gsm8k.SPECIALTY_KEYWORDS` mean
something and the specialization diagnostic of paper §8 is defined on every problem.

Each problem is a dict ``{"question", "answer"}`` whose answer is a GSM8K-style solution
ending in ``#### <number>`` (with GSM8K's ``<<a+b=c>>`` calculator annotation), so
:func:`mcpg.grpo.gsm8k.load_gsm8k` reads a folder written by :func:`write_task` through the
engine's ``data_dir`` config key, and :func:`mcpg.grpo.gsm8k.gold_answer` recovers the
number.

    python -m mcpg.grpo.arithmetic --output data/results/ch08/task --train 512 --test 128 --seed 0
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from ..stats import SPECIALTIES  # the one definition (money, time, geometry); re-exported here

__all__ = ["SPECIALTIES", "OPERATIONS", "make_problem", "generate_problems", "task_splits", "task_split",
           "write_task"]

OPERATIONS: tuple[str, ...] = ("add", "sub", "add_sub")
"""``add``: a + b; ``sub``: a - b (never negative); ``add_sub``: a + b - c (two steps)."""

HINT = "Answer in one short line: the calculation, then '#### ' and the result."
"""Appended to every question: a 135M model otherwise spends its few tokens on preamble."""

_NAMES = ("Ava", "Ben", "Cara", "Dan", "Eli", "Fay", "Gus", "Hana", "Ivan", "Jo", "Kim", "Leo", "Mia",
          "Noor", "Omar", "Pia", "Raj", "Sam", "Tia", "Uma")

# Per specialty: (setting with {a}, add phrase with {b}, subtract phrase with {b}, question, unit).
# Every template carries keywords of its own specialty only (see SPECIALTY_KEYWORDS).
_TEMPLATES: dict[str, list[tuple[str, str, str, str, str]]] = {
    "money": [
        ("{n} has ${a} in a wallet.", "{n} earns ${b} more for washing a car.", "{n} spends ${b} on a book.",
         "How many dollars does {n} have now?", "dollars"),
        ("A toy costs ${a}.", "The price goes up by ${b}.", "The shop gives a discount of ${b}.",
         "What is the price of the toy now, in dollars?", "dollars"),
        ("{n} saved ${a} last month.", "This month {n} saved ${b} more.", "Then {n} paid ${b} for a ticket.",
         "How much money, in dollars, does {n} have saved?", "dollars"),
    ],
    "time": [
        ("{n} planned to read for {a} minutes.", "{n} decided to read {b} minutes longer.",
         "{n} stopped {b} minutes early.", "How many minutes did {n} read?", "minutes"),
        ("{n} is {a} years old.", "How old will {n} be in {b} years?", "How old was {n} {b} years ago?",
         "", "years"),
        ("A trip takes {a} hours.", "A delay adds {b} hours.", "A faster train saves {b} hours.",
         "How many hours does the trip take now?", "hours"),
    ],
    "geometry": [
        ("A rope is {a} meters long.", "{n} ties on {b} more meters.", "{n} cuts off {b} meters.",
         "How long is the rope now, in meters?", "meters"),
        ("A rectangle has a length of {a} feet.", "The length is made {b} feet longer.",
         "The length is made {b} feet shorter.", "What is the new length of the rectangle, in feet?", "feet"),
        ("A fence has a side of {a} yards.", "{n} extends the side by {b} yards.",
         "{n} removes {b} yards from the side.", "How many yards long is the side now?", "yards"),
    ],
}


def _check_int(value, name: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def make_problem(rng: np.random.Generator, specialty: str, operation: str = "add",
                 max_value: int = 20, hint: str = HINT) -> dict:
    """One word problem of ``specialty`` and ``operation`` with operands in ``1..max_value``.

    Returns ``{"question", "answer", "specialty", "operation", "gold"}``; ``answer`` is a
    GSM8K solution ending in ``#### <gold>``. Subtractions never go below zero (the larger
    operand comes first).
    """
    if not isinstance(rng, np.random.Generator):
        raise ValueError("rng must be a numpy Generator (np.random.default_rng(seed))")
    if specialty not in SPECIALTIES:
        raise ValueError(f"specialty must be one of {SPECIALTIES}, got {specialty!r}")
    if operation not in OPERATIONS:
        raise ValueError(f"operation must be one of {OPERATIONS}, got {operation!r}")
    max_value = _check_int(max_value, "max_value", 2)
    templates = _TEMPLATES[specialty]
    setting, add, sub, ask, unit = templates[int(rng.integers(len(templates)))]
    name = _NAMES[int(rng.integers(len(_NAMES)))]
    a, b, c = (int(x) for x in rng.integers(1, max_value + 1, size=3))
    if operation == "sub" and b > a:
        a, b = b, a
    if operation == "sub" and a == b:
        a += 1
    if operation == "add":
        steps = [(add, "+", a, b, a + b)]
    elif operation == "sub":
        steps = [(sub, "-", a, b, a - b)]
    else:
        s = a + b
        c = min(c, s - 1)
        steps = [(add, "+", a, b, s), (sub, "-", s, c, s - c)]
    parts = [setting.format(n=name, a=a)]
    for phrase, _, _, rhs, _ in steps:
        parts.append(phrase.format(n=name, b=rhs))
    if ask:
        parts.append(ask.format(n=name))
    if hint:
        parts.append(hint)
    question = " ".join(parts)
    lines = [f"{x} {op} {y} = <<{x}{op}{y}={z}>>{z} {unit}." for _, op, x, y, z in steps]
    gold = steps[-1][4]
    return {"question": question, "answer": "\n".join(lines) + f"\n#### {gold}",
            "specialty": specialty, "operation": operation, "gold": float(gold)}


def generate_problems(n: int, seed: int = 0, operations: tuple[str, ...] = ("add", "sub"),
                      max_value: int = 20) -> list[dict]:
    """``n`` problems, specialties cycling money/time/geometry, operations drawn uniformly.

    Deterministic in ``seed``; specialties are balanced (they cycle) and shuffled.
    """
    n = _check_int(n, "n", 1)
    seed = _check_int(seed, "seed", 0)
    ops = tuple(operations)
    if not ops or any(o not in OPERATIONS for o in ops):
        raise ValueError(f"operations must be a non-empty tuple drawn from {OPERATIONS}, got {operations!r}")
    rng = np.random.default_rng(seed)
    specs = [SPECIALTIES[i % len(SPECIALTIES)] for i in range(n)]
    rng.shuffle(specs)
    return [make_problem(rng, s, ops[int(rng.integers(len(ops)))], max_value) for s in specs]


def write_task(folder: str | os.PathLike, n_train: int = 512, n_test: int = 128, seed: int = 0,
               operations: tuple[str, ...] = ("add", "sub"), max_value: int = 20) -> Path:
    """Write ``train.jsonl`` and ``test.jsonl`` (fields ``question`` and ``answer``) to ``folder``.

    The two splits come from different seeds' streams and share no question. The folder is
    what the engine's ``data_dir`` config key (or ``$MCPG_GSM8K_DIR``) expects. Returns the
    folder.
    """
    train, test = task_splits(n_train, n_test, seed, operations, max_value)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("test", test)):
        with open(out / f"{split}.jsonl", "w", encoding="utf-8") as fh:
            for r in rows:
                fh.write(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n")
    return out


def task_splits(n_train: int = 512, n_test: int = 128, seed: int = 0,
                operations: tuple[str, ...] = ("add", "sub"),
                max_value: int = 20) -> tuple[list[dict], list[dict]]:
    """The training and held-out problems that :func:`write_task` writes, in memory.

    The engine's config key ``task: "arithmetic"`` reads the task from here (no files needed).
    """
    n_train = _check_int(n_train, "n_train", 1)
    n_test = _check_int(n_test, "n_test", 1)
    seed = _check_int(seed, "seed", 0)
    train = generate_problems(n_train, seed=2 * seed, operations=operations, max_value=max_value)
    seen = {p["question"] for p in train}
    test: list[dict] = []
    k = 0
    while len(test) < n_test:  # draw held-out problems until n_test unseen ones
        for p in generate_problems(n_test, seed=2 * seed + 1 + 1000 * k, operations=operations,
                                   max_value=max_value):
            if p["question"] not in seen and len(test) < n_test:
                seen.add(p["question"])
                test.append(p)
        k += 1
        if k > 50:
            raise ValueError(f"could not draw {n_test} held-out problems unseen in training: "
                             f"increase max_value or reduce n_train/n_test")
    return train, test


def task_split(split: str) -> list[dict]:
    """Chapter 8's task, one split (``"train"``: 512 problems, ``"test"``: 128 held out), as
    :func:`task_splits` makes it with its defaults (seed 0): the problems the engine's config key
    ``task: "arithmetic"`` reads, and the only place that fixes them."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return task_splits()[0 if split == "train" else 1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mcpg.grpo.arithmetic", description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", required=True, help="folder for train.jsonl and test.jsonl")
    ap.add_argument("--train", type=int, default=512)
    ap.add_argument("--test", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--operations", default="add,sub", help=f"comma-separated, from {OPERATIONS}")
    ap.add_argument("--max-value", type=int, default=20)
    a = ap.parse_args(argv)
    out = write_task(a.output, a.train, a.test, a.seed, tuple(a.operations.split(",")), a.max_value)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
