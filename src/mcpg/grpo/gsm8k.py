"""GSM8K: loading problems, reading gold answers, checking model answers (paper §8).

Each GSM8K problem is one history H; a candidate earns reward R^(j) = 1 when the answer it
*commits to* equals the gold answer and 0 otherwise, so mean deployed reward is accuracy.
A committed answer is the explicit ``#### <n>`` marker, or, for a completion that ended by
itself, the final number it gives (:func:`committed_answer`). A completion cut at the token
budget without a marker commits to nothing and earns 0: its last number is whatever it was
in the middle of writing, right only by luck.

Two accuracies are reported side by side, as lm-eval-harness does for GSM8K
(:func:`extract_answer`'s ``mode``): ``strict`` reads only the ``#### <n>`` marker;
``flexible`` reads markers first and falls back on the last number in the text.

Data source, in this order:

- the folder named by the environment variable ``MCPG_GSM8K_DIR`` when it is set: it
  holds ``train.jsonl`` and ``test.jsonl``, one JSON object per line with the fields
  ``question`` and ``answer`` (the GSM8K release format, whose answer ends in
  ``#### <number>``). CI sets it to ``../shared/data/gsm8k``; tests use
  ``tests/fixtures/gsm8k``;
- otherwise ``datasets.load_dataset("openai/gsm8k", "main")`` (needs the internet or the
  Hugging Face cache).

Importing this module is cheap: it needs only the standard library (``datasets`` is
imported when the hub is actually used).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
from pathlib import Path

__all__ = [
    "GSM8K_DIR_ENV",
    "SPECIALTY_KEYWORDS",
    "load_gsm8k",
    "gold_answer",
    "EXTRACT_MODES",
    "ANSWER_LINE",
    "extract_answer",
    "committed_answer",
    "is_correct",
    "reward",
    "question_specialty",
    "problems_sha256",
    "gsm8k_source",
]

GSM8K_DIR_ENV = "MCPG_GSM8K_DIR"
"""Environment variable naming a local folder with ``train.jsonl`` and ``test.jsonl``."""

SPLITS = ("train", "test")

# A number: optional sign, optional "$", digits with thousands separators or plain
# digits, optional decimals ("3.50", ".5"). The sign must not follow a word character or a
# closing bracket, so "5-3" reads as 5 and 3, not 5 and -3.
_NUM = r"(?:(?<![\w)\]])[-\u2212])?\$?\s?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
_NUM_RE = re.compile(_NUM)
_HASH_RE = re.compile(r"####\s*(" + _NUM + ")")
ANSWER_LINE = re.compile(r"####\s*" + _NUM + r"[^\n]*\n")
"""The pattern of a finished answer line (``#### <n>`` and the rest of its line, ended by a
newline). The instruction asks for the calculation, then ``#### `` and the result, so a
completion that holds this line has committed its answer; config key ``stop_at_answer`` stops
generation there."""

_BOXED_RE = re.compile(r"\\boxed\s*\{([^{}]*)\}")
_MARKER_RE = re.compile(
    r"(?:final answer|the answer|answer)\s*(?:is|=|:)?\s*[:=]?\s*\**\s*(" + _NUM + ")",
    flags=re.IGNORECASE,
)


def _to_float(text: str) -> float | None:
    t = text.replace("\u2212", "-").replace("$", "").replace(",", "").replace(" ", "")
    try:
        x = float(t)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


def gold_answer(answer_text: str) -> float:
    """The gold number of a GSM8K solution: what follows the last ``####``, commas removed."""
    if not isinstance(answer_text, str) or "####" not in answer_text:
        raise ValueError("answer_text must be a GSM8K solution ending in '#### <number>'")
    tail = answer_text.rsplit("####", 1)[1]
    m = _NUM_RE.search(tail)
    x = _to_float(m.group(0)) if m else None
    if x is None:
        raise ValueError(f"answer_text has no number after '####': {tail.strip()!r}")
    return x


EXTRACT_MODES: tuple[str, ...] = ("flexible", "strict")
"""How :func:`extract_answer` reads an answer: ``flexible`` (markers, else the last number)
or ``strict`` (the ``#### <n>`` marker only), lm-eval-harness's two GSM8K filters."""


def extract_answer(model_output: str, mode: str = "flexible") -> float | None:
    """The final number a model's output gives, or None when it gives none.

    ``mode="flexible"`` (default): an explicit final-answer marker wins, checked in this
    order: the last ``#### <n>``, the last ``\\boxed{...}`` holding a number, the last
    "answer is <n>" / "Answer: <n>"; otherwise the last number in the text.
    ``mode="strict"``: the last ``#### <n>`` only (None without one).
    Numbers may carry a sign, ``$``, thousands commas and decimals:
    ``"The answer is $1,234.50."`` gives 1234.5.
    """
    if mode not in EXTRACT_MODES:
        raise ValueError(f"mode must be one of {EXTRACT_MODES}, got {mode!r}")
    if model_output is None:
        return None
    if not isinstance(model_output, str):
        raise ValueError(f"model_output must be a string, got {type(model_output).__name__}")
    text = model_output
    hashes = _HASH_RE.findall(text)
    if hashes:
        return _to_float(hashes[-1])
    if mode == "strict":
        return None
    for inner in reversed(_BOXED_RE.findall(text)):
        nums = _NUM_RE.findall(inner)
        if nums:
            return _to_float(nums[-1])
    markers = _MARKER_RE.findall(text)
    if markers:
        return _to_float(markers[-1])
    nums = _NUM_RE.findall(text)
    return _to_float(nums[-1]) if nums else None


def committed_answer(model_output: str, truncated: bool = False) -> float | None:
    """The answer a completion commits to: its ``#### <n>``, or, when it ended by itself
    (``truncated`` False), its flexible answer (:func:`extract_answer`). A completion cut at
    the token budget without a marker commits to nothing (None)."""
    if extract_answer(model_output, mode="strict") is not None:
        return extract_answer(model_output, mode="strict")
    return None if truncated else extract_answer(model_output)


def is_correct(output, gold: float, rel_tol: float = 1e-6, abs_tol: float = 1e-6,
               mode: str = "flexible") -> bool:
    """Whether ``output`` (model text, or an already extracted number) equals ``gold``.

    Numeric equality up to the tolerances (``math.isclose``); an output with no number is
    wrong. ``mode``: how text is read (:data:`EXTRACT_MODES`).
    """
    if isinstance(output, str) or output is None:
        pred = extract_answer(output, mode=mode)
    else:
        pred = output
    if pred is None:
        return False
    return math.isclose(float(pred), float(gold), rel_tol=rel_tol, abs_tol=abs_tol)


def reward(output, gold: float, truncated: bool = False) -> float:
    """R^(j) in {0, 1}: the committed answer (:func:`committed_answer`) equals the gold
    answer (paper §8's exact numerical correctness). A completion cut at the token budget
    (``truncated``) earns 1 only through an explicit ``#### <n>``."""
    if output is not None and not isinstance(output, str):
        raise ValueError(f"output must be a string, got {type(output).__name__}")
    return 1.0 if is_correct(committed_answer(output, truncated), gold) else 0.0


def jsonl_objects(path: Path, hint: str, what: str = ""):
    """Each non-blank line of a JSON Lines file as ``(line number, value)``. Broken JSON is a
    ValueError naming the file (after ``what``), the line and the column, then ``hint`` (what a
    line should hold); a file that is not UTF-8 text is one too."""
    where = f"{what} {path}" if what else f"{path}"
    with open(path, encoding="utf-8") as fh:
        try:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ValueError(f"{where}, line {lineno}, column {err.colno}: not valid JSON "
                                     f"({err.msg}){hint}") from None
                yield lineno, value
        except UnicodeDecodeError:
            raise ValueError(f"{where} is not a UTF-8 text file (JSON Lines)") from None


def _read_jsonl(path: Path) -> list[dict]:
    """The problems of a GSM8K jsonl file; a line that is not a problem is a ValueError naming
    the file and the line (and, for broken JSON, the column)."""
    rows = []
    hint = ": each line must be one JSON object with 'question' and 'answer'"
    for lineno, row in jsonl_objects(path, hint):
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) \
                or not isinstance(row.get("answer"), str):
            raise ValueError(f"{path}, line {lineno}: needs the text fields 'question' and 'answer' "
                             "(the GSM8K release format)")
        try:
            gold_answer(row["answer"])
        except ValueError as err:
            raise ValueError(f"{path}, line {lineno}: {err}") from None
        rows.append({"question": row["question"], "answer": row["answer"]})
    if not rows:
        raise ValueError(f"{path} holds no problems: give one JSON object per line with 'question' and "
                         "'answer' (the GSM8K release format)")
    return rows


def problems_sha256(rows: list[dict]) -> str:
    """SHA-256 of a list of problems, in order: of the JSON list of their ``[question, answer]``
    (UTF-8, no spaces). Two runs read the same problems exactly when their digests agree."""
    text = json.dumps([[r["question"], r["answer"]] for r in rows], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def gsm8k_source(data_dir: str | os.PathLike | None = None) -> str:
    """Where :func:`load_gsm8k` reads from: the absolute path of the local folder (``data_dir``,
    else ``$MCPG_GSM8K_DIR``), or ``hub:openai/gsm8k/main``."""
    folder = data_dir if data_dir is not None else os.environ.get(GSM8K_DIR_ENV)
    return str(Path(folder).resolve()) if folder else "hub:openai/gsm8k/main"


def load_gsm8k(
    split: str, n: int | None = None, seed: int = 0, data_dir: str | os.PathLike | None = None
) -> list[dict]:
    """GSM8K problems of ``split`` ("train" or "test") as dicts with question, answer, gold.

    Args:
        split: ``"train"`` or ``"test"``.
        n: keep a random subset of ``n`` problems (drawn with ``seed``, in a fixed order);
            ``None`` keeps all, in file order.
        seed: seed of the subset.
        data_dir: local folder with ``train.jsonl``/``test.jsonl``; defaults to the
            environment variable ``MCPG_GSM8K_DIR``, and when that is unset too, the hub
            dataset ``openai/gsm8k`` (config ``main``) is loaded with ``datasets``.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if n is not None and (int(n) != n or n < 1):
        raise ValueError(f"n must be a positive integer or None, got {n!r}")
    folder = data_dir if data_dir is not None else os.environ.get(GSM8K_DIR_ENV)
    if folder:
        path = Path(folder) / f"{split}.jsonl"
        if not path.is_file():
            raise ValueError(f"data_dir (or ${GSM8K_DIR_ENV}) {folder!s} has no {split}.jsonl")
        rows = _read_jsonl(path)
    else:
        import datasets  # heavy; only when the hub is used

        ds = datasets.load_dataset("openai/gsm8k", "main", split=split)
        rows = [{"question": r["question"], "answer": r["answer"]} for r in ds]
    if n is not None:
        if n > len(rows):
            raise ValueError(f"n={n} exceeds the {len(rows)} problems of split {split!r}")
        idx = random.Random(seed).sample(range(len(rows)), int(n))
        rows = [rows[i] for i in idx]
    for r in rows:
        r["gold"] = gold_answer(r["answer"])
    return rows


SPECIALTY_KEYWORDS: dict[str, tuple[str, ...]] = {
    "money": ("$", "dollar", "dollars", "cent", "cents", "price", "cost", "costs", "pay", "paid", "sell",
              "sells", "sold", "buy", "buys", "bought", "earn", "earns", "earned", "profit", "spend",
              "spent", "money", "save", "saved", "wage", "salary", "discount", "tax"),
    "time": ("hour", "hours", "minute", "minutes", "day", "days", "week", "weeks", "month", "months",
             "year", "years", "time", "clock", "morning", "evening", "daily", "weekly", "old", "age"),
    "geometry": ("area", "perimeter", "length", "width", "square", "rectangle", "rectangular", "circle",
                 "triangle", "meter", "meters", "feet", "foot", "inch", "inches", "mile", "miles",
                 "distance", "side", "sides", "tall", "long", "wide", "yard", "yards", "volume"),
}
"""Keyword lists that assign a question to a specialty. In paper §8 a keyword-assigned
specialty defines the specialization diagnostic. Keyed in the order of
:data:`mcpg.stats.SPECIALTIES` (money, time, geometry), so agent k's specialty is the k-th key."""

_WORD_RE = re.compile(r"[a-z]+|\$")


def question_specialty(question: str, keywords: dict[str, tuple[str, ...]] | None = None) -> str | None:
    """The specialty whose keywords occur most often in ``question`` (ties: the first listed);
    None when no keyword occurs."""
    keywords = SPECIALTY_KEYWORDS if keywords is None else keywords
    words = _WORD_RE.findall(question.lower())
    best, best_count = None, 0
    for name, kws in keywords.items():
        kw = set(kws)
        count = sum(w in kw for w in words)
        if count > best_count:
            best, best_count = name, count
    return best
