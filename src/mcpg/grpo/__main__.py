"""Command line of the GRPO engine.

    python -m mcpg.grpo train --config NAME_OR_PATH --signal wta|removal|oracle --output DIR
                              [--updates N] [--threads N] [--progress | --no-progress] [--json]
                              [--KEY VALUE ...] [--reward_funcs MODULE:FUNCTION ...]
                              [--train_dataset PATH --eval_dataset PATH]
    python -m mcpg.grpo train --output DIR --resume [--updates N] ...
    python -m mcpg.grpo evaluate --run DIR [--threads N] [--progress | --no-progress] [--json]

Named configs: tiny-random, cpu-smoke, colab, paper (see ``mcpg.grpo.configs``). Every config
key is an option too (``--learning_rate 1e-4 --max_completion_length 16``; ``train --help``
lists them): a number, text, ``true``/``false`` (or ``--KEY`` / ``--no-KEY``), ``null`` where
a key may be null (``none`` too for a number), and JSON for ``agents``, ``report_to``,
``lora_target_modules`` and ``reward_weights``. An old key name (``--max_new_tokens``) still
works, with a FutureWarning. With ``--resume`` a key must equal the run's, as a ``--config``
must. ``--signal`` may be left out where the config (or, resumed, the run) has one. Reward
functions and datasets of your own: ``mcpg.grpo.custom``. Several
GPUs: ``accelerate launch --num_processes N -m mcpg.grpo train ...``; two CPU processes:
``accelerate launch --multi_gpu --num_processes 2 -m mcpg.grpo train --config tiny-random ...``.

A mistake in the command (a missing or malformed config file, an --output that is a file or
holds something else, a --run that is not a finished run directory, a config key out of range,
data that cannot be read, a model that is not there) ends with one ``error:`` line on stderr,
naming the key or file and how to fix it, and exit status 2, not a traceback; the output
directory is left as it was. An exception raised in a reward function of your own is not a
mistake in the command: it ends with its traceback and a note naming the function. Ctrl-C ends
with one line saying how ``--resume`` continues the run (exit status 130).

Progress bars (tqdm) show while it runs when stderr is a terminal; ``--progress`` shows them
anywhere, ``--no-progress`` nowhere. At the end it prints a summary of a few lines (the full
evaluation is the run's eval.json; ``--json`` prints that instead).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import shlex
import sys
import warnings
from pathlib import Path

EXAMPLES = """examples:
  # SmolLM2-135M on a CPU with one torch thread (best when other programs share the cores)
  python -m mcpg.grpo train --config cpu-smoke --signal removal --output runs/removal --threads 1
  # after an interruption, continue it from its checkpoint (its config is runs/removal/config.json)
  python -m mcpg.grpo train --signal removal --output runs/removal --resume --threads 1
  # re-evaluate that run's final weights on its held-out problems (rewrites eval.json)
  python -m mcpg.grpo evaluate --run runs/removal --threads 1
"""

# Third-party warnings that every run prints and that say nothing about the run; each is
# filtered by its exact message, category and module, so that any other warning still shows.
KNOWN_WARNINGS = [
    # peft 0.21 reads the deprecated alias `is_gradient_checkpointing` while wrapping the model
    # in LoRA (peft_model.py); transformers 5 warns about it. Nothing here uses the alias.
    dict(message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning,
         module=r"transformers\.modeling_utils"),
    # When saving adapters offline, peft cannot ask the hub whether the base model's config
    # exists (tiny-random and the GGUF model have no hub id) and assumes the vocabulary was
    # not modified. That is true: the LoRA adapters never touch the embeddings.
    dict(message=r"Could not find a config file in .* will assume that the vocabulary was not modified",
         category=UserWarning, module=r"peft\.utils\.save_and_load"),
]


def filter_known_warnings() -> None:
    """Hide the :data:`KNOWN_WARNINGS` (and only those)."""
    for spec in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", **spec)


def hide_loading_progress() -> None:
    """No progress bars while a model loads: transformers' and the hub's, and the GGUF one.

    ``transformers.utils.logging.disable_progress_bar()`` silences the "Loading weights" bar
    but not the "Converting and de-quantizing GGUF tensors" bar: transformers' GGUF loader
    calls tqdm itself, and the ``TQDM_DISABLE`` variable is read only when tqdm is first
    imported (torch imports it). The loader looks ``tqdm`` up in its module when it runs, so
    that one name is replaced by a tqdm that is disabled.
    """
    try:
        import transformers
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # no transformers, or one without GGUF support: no bars to hide
        return
    transformers.utils.logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:
        pass
    else:
        disable_progress_bars()
    if not isinstance(getattr(gguf_utils, "tqdm", None), functools.partial):
        gguf_utils.tqdm = functools.partial(gguf_utils.tqdm, disable=True)


class UsageError(Exception):
    """A mistake in the command line; reported as one ``error:`` line."""


def _threads(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value!r}")
    return n


OWN_OPTIONS = ("signal", "updates", "threads", "progress")
"""Config keys with an option of their own (``--signal``, ``--updates``, ``--threads``,
``--progress``/``--no-progress``), not generated from the config's fields."""

KEY_DEST = "key:"  # argparse dest prefix of a config key's option


def _key_kind(name: str) -> str:
    """How a config key's option reads its value: bool, int, float, str (each possibly null), json."""
    from .configs import GRPOConfig

    t = {f.name: str(f.type) for f in dataclasses.fields(GRPOConfig)}[name].replace(" ", "")
    return {"bool": "bool", "int": "int", "int|None": "int?", "float": "float", "float|None": "float?",
            "str": "str", "str|None": "str?"}.get(t, "json")


def _help_line(doc: str) -> str:
    """The first line of a key's docstring, without a parenthesis it leaves open."""
    line = doc.splitlines()[0] if doc else ""
    if line.count("(") > line.count(")"):
        line = line[: line.rindex("(")]
    return line.rstrip(" ,;:—").replace("``", "").replace("%", "%%")


def _add_key_options(parser: argparse.ArgumentParser) -> None:
    """One option per config key (:class:`mcpg.grpo.configs.GRPOConfig`'s fields), its help the
    first line of the key's docstring; the old names (ALIASES) as hidden options."""
    from .configs import ALIASES, field_docs

    group = parser.add_argument_group(
        "config keys", "each sets one key of the config, over --config's value; with --resume it must equal\n"
                       "the run's. Each key's whole meaning: help(mcpg.grpo.configs.GRPOConfig)")
    metavars = {"int": "N", "int?": "N|null", "float": "X", "float?": "X|null", "str": "TEXT",
                "str?": "TEXT|null", "json": "JSON"}
    docs = field_docs()
    names = [(k, k) for k in docs if k not in OWN_OPTIONS] + [(old, new) for old, new in ALIASES.items()]
    for option, key in names:
        kind = _key_kind(key)
        hidden = option != key
        text = argparse.SUPPRESS if hidden else _help_line(docs[key])
        if kind == "bool":
            text = text if hidden else f"{text} (--no-{option}: false)"
            group.add_argument(f"--{option}", dest=KEY_DEST + option, nargs="?", const="true", default=None,
                               metavar="true|false", help=text)
            group.add_argument(f"--no-{option}", dest=KEY_DEST + option, action="store_const", const="false",
                               help=argparse.SUPPRESS)
        else:
            group.add_argument(f"--{option}", dest=KEY_DEST + option, default=None, metavar=metavars[kind],
                               help=text)


def key_overrides(args) -> dict:
    """The config keys the command line sets, each converted to its type; an old name
    (``--max_new_tokens``) sets its new key with a FutureWarning. A value that is not of its
    key's type, or a key given under both names, is a :class:`UsageError` naming the option."""
    from .configs import ALIASES

    out = {}
    for dest, raw in vars(args).items():
        if not dest.startswith(KEY_DEST) or raw is None:
            continue
        option = dest[len(KEY_DEST):]
        key = ALIASES.get(option, option)
        if option != key:
            if getattr(args, KEY_DEST + key, None) is not None:
                raise UsageError(f"--{option} and --{key} are one config key (--{option} is its old name): "
                                 f"give --{key} only")
            warnings.warn(f"--{option} is now --{key} (TRL's name for config key {key!r}); the old name will "
                          "be removed", FutureWarning, stacklevel=2)
        out[key] = _convert(option, key, raw)
    return out


def _convert(option: str, key: str, raw: str):
    kind = _key_kind(key)
    nullable = kind.endswith("?")
    base = kind.rstrip("?")
    said = f"--{option} {raw!r}"
    if nullable and (raw == "null" if base == "str" else raw.lower() in ("null", "none")):
        return None
    if base == "bool":
        if raw.lower() in ("true", "1", "yes"):
            return True
        if raw.lower() in ("false", "0", "no"):
            return False
        raise UsageError(f"{said}: config key {key!r} is true or false")
    if base == "int":
        try:
            return int(raw)
        except ValueError:
            raise UsageError(f"{said}: config key {key!r} is a whole number{' or null' if nullable else ''}")
    if base == "float":
        try:
            return float(raw)
        except ValueError:
            raise UsageError(f"{said}: config key {key!r} is a number{' or null' if nullable else ''}")
    if base == "str":
        return raw
    try:
        return json.loads(raw)
    except json.JSONDecodeError as err:
        if key == "lora_target_modules":  # a plain module name or "all-linear"
            return raw
        raise UsageError(f"{said}: config key {key!r} takes JSON ({err.msg} at column {err.colno}), e.g. "
                         + {"agents": "'[{\"name\": \"solver\", \"role\": \"You solve.\"}]'",
                            "report_to": "'[\"tensorboard\"]'"}.get(key, "'[1.0, 0.5]'"))


def build_parser() -> argparse.ArgumentParser:
    from .configs import CONFIGS
    from .credits import names

    fmt = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="python -m mcpg.grpo", description=__doc__.split("\n\n")[0],
                                     epilog=EXAMPLES, formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", required=True)
    threads_help = ("torch CPU threads (default: the config's 'threads', else torch's one per core); "
                    "1 is fastest when other programs share the cores, whose threads would otherwise "
                    "wait for one another at every operation")
    progress_help = ("progress bars (tqdm) on rollouts, updates and evaluation (default: when stderr is a "
                     "terminal); --no-progress: none, also none while the model loads")
    json_help = "print the whole evaluation (eval.json) as JSON at the end, instead of a summary"
    reward_help = ("reward functions of your own, TRL's signature (mcpg.grpo.custom), each importable from "
                   "the working directory; config key reward_weights weighs them (default: GSM8K's reward)")
    data_help = ("{} rows of your own: a folder saved by datasets' Dataset.save_to_disk or a JSON Lines "
                 "file, with a 'prompt' column (needs --reward_funcs, and both datasets)")
    t = sub.add_parser("train", help="train K routed LoRA agents with one credit signal",
                       description="Train K routed LoRA agents with one credit signal; write a run folder.",
                       epilog=EXAMPLES, formatter_class=fmt)
    t.add_argument("--config", help=f"a named config {sorted(CONFIGS)} or a JSON file "
                   "(not needed with --resume, which continues with the run's own config.json)")
    t.add_argument("--signal", help=f"credit signal: one of {list(names())} (config key signal; needed "
                   "unless the config or, with --resume, the run has one)")
    t.add_argument("--output", required=True, help="run directory (new, or an interrupted run with --resume)")
    t.add_argument("--updates", type=int, default=None, help="total updates (overrides the config)")
    t.add_argument("--resume", action="store_true", help="continue the run in --output from its checkpoint")
    t.add_argument("--threads", type=_threads, default=None, metavar="N", help=threads_help)
    t.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help=progress_help)
    t.add_argument("--json", action="store_true", help=json_help)
    t.add_argument("--reward_funcs", nargs="+", metavar="MODULE:FUNCTION", help=reward_help)
    t.add_argument("--train_dataset", metavar="PATH", help=data_help.format("training"))
    t.add_argument("--eval_dataset", metavar="PATH", help=data_help.format("held-out"))
    t.add_argument("--initial_eval", metavar="RUN",
                   help="take the untrained pool's evaluation from the run directory RUN (another arm of "
                   "the same seed) instead of computing it; refused unless RUN's seed, config (but the "
                   "keys only training reads), problems, model and code are this run's")
    _add_key_options(t)
    e = sub.add_parser("evaluate", help="evaluate a run directory's weights; rewrites eval.json",
                       description="Evaluate a finished run's final weights on its own held-out problems; "
                                   "rewrite eval.json.",
                       epilog=EXAMPLES, formatter_class=fmt)
    e.add_argument("--run", required=True, help="run directory written by train")
    e.add_argument("--threads", type=_threads, default=None, metavar="N", help=threads_help)
    e.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help=progress_help)
    e.add_argument("--json", action="store_true", help=json_help)
    e.add_argument("--reward_funcs", nargs="+", metavar="MODULE:FUNCTION",
                   help="the run's reward functions (default: the ones it recorded, imported by name)")
    e.add_argument("--eval_dataset", metavar="PATH",
                   help="the run's held-out dataset (default: its recorded path)")
    return parser


def _read_json(path: Path, what: str) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        where = f"line {err.lineno}, column {err.colno}"
        raise UsageError(f"{what} {path} is not valid JSON: {err.msg} ({where})")
    except UnicodeDecodeError:
        raise UsageError(f"{what} {path} is not a UTF-8 text file")


def _config_of_command(args) -> dict:
    """Check the paths of the command and return the config it will run with (for ``threads``)."""
    from .configs import CONFIGS, resolve_config, saved_config

    if args.command == "evaluate":
        run = Path(args.run)
        if not run.is_dir():
            raise UsageError(f"--run {run} does not exist (no config.json to read)" if not run.exists()
                             else f"--run {run} is a file, not a run directory")
        if not (run / "config.json").is_file():
            raise UsageError(f"--run {run} is not a run directory (it has no config.json)")
        saved = _read_json(run / "config.json", "run config")
        return saved_config(saved) if isinstance(saved, dict) and "config" in saved else {}

    out = Path(args.output)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--output {out} is an existing file; give a directory (new, or a run to --resume)")
    existing = next((p for p in out.parents if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise UsageError(f"--output {out}: {existing} is a file, so the directory cannot be made")
    if args.resume:
        if not (out / "config.json").is_file():
            raise UsageError(f"--output {out} holds no run to resume (no config.json)")
        saved = _read_json(out / "config.json", "run config")
        return saved_config(saved) if isinstance(saved, dict) and "config" in saved else {}
    if args.config is None:
        raise UsageError("the following arguments are required: --config (unless --resume)")
    keys = key_overrides(args)
    with warnings.catch_warnings():  # an old key name warns once, when train resolves the config
        warnings.simplefilter("ignore", FutureWarning)
        if args.config in CONFIGS:
            return resolve_config(args.config, **keys)
        path = Path(args.config)
        if not path.exists():
            raise UsageError(f"--config {args.config!r} is neither a named config {sorted(CONFIGS)} nor a "
                             "file")
        if not path.is_file():
            raise UsageError(f"--config {path} is a directory, not a JSON file")
        _read_json(path, "config file")
        try:
            resolve_config(str(path))
        except ValueError as err:
            raise UsageError(f"config file {path}: {err}")
        return resolve_config(str(path), **keys)


def show_progress(flag: bool | None, stream=None) -> bool:
    """Progress bars: ``--progress`` / ``--no-progress`` when given, else whether ``stream``
    (stderr, where tqdm writes) is a terminal."""
    if flag is not None:
        return flag
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def summary(result: dict, args) -> str:
    """A few lines on the finished run or evaluation (the whole of it is in eval.json)."""
    folder = args.output if args.command == "train" else args.run
    lines = [f"{result.get('signal')} run in {folder}: {result.get('updates')} updates, evaluated on "
             f"{result.get('n')} held-out problems"]

    def num(x):
        return "n/a" if x is None else f"{x:.3f}"

    initial = result.get("initial_accuracy")
    lines.append(f"accuracy {num(result.get('accuracy'))}"
                 + (f" (untrained pool {num(initial)})" if initial is not None else "")
                 + f", frozen base model {num(result.get('base_accuracy'))}; oracle (some agent right) "
                 f"{num(result.get('oracle'))}, regret {num(result.get('regret'))}")
    if result.get("reward") is not None:  # a reward of your own: accuracy counts only the full reward
        initial = result.get("initial_reward")
        lines.append(f"mean reward {num(result['reward'])}"
                     + (f" (untrained pool {num(initial)})" if initial is not None else "")
                     + f", frozen base model {num(result.get('base_reward'))}; accuracy counts answers "
                     "earning the full reward 1")
    agents = result.get("agent_accuracy") or []
    shares = result.get("deployed_fraction") or []
    if agents:
        lines.append("agents' accuracy " + ", ".join(num(a) for a in agents)
                     + (f", mean reward {', '.join(num(a) for a in result['agent_reward'])}"
                        if result.get("agent_reward") else "")
                     + "; deployed " + ", ".join(f"{s:.0%}" for s in shares))
    lines.append(f"every measure: {Path(folder) / 'eval.json'} (--json prints it)")
    return "\n".join(lines)


def interrupted(args) -> str:
    """The one line after Ctrl-C: how the run continues."""
    if args.command == "evaluate":
        return f"interrupted: {Path(args.run) / 'eval.json'} was not rewritten; run the command again"
    out = Path(args.output)
    if not (out / "config.json").is_file():
        return f"interrupted before the run started; nothing was written to {out}"
    from .train import _updates_done

    return (f"interrupted; {out} keeps its checkpoint at update {_updates_done(out)}: continue the run with "
            f"python -m mcpg.grpo train --signal {_signal_of(args)} --output {shlex.quote(str(out))} "
            "--resume")


def _signal_of(args) -> str | None:
    """The run's signal: --signal, else the one its config.json records."""
    if args.signal is not None:
        return args.signal
    try:
        return json.loads((Path(args.output) / "config.json").read_text())["signal"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _run(args) -> dict:
    cfg = _config_of_command(args)
    threads = args.threads or getattr(cfg, "threads", 0) or 0
    if threads:
        import torch

        # torch starts one thread per core. When other programs use the cores too, those
        # threads wait for one another at the end of every operation, and the small matrix
        # products of a 135M model slow down many times over; fewer threads avoid that.
        torch.set_num_threads(threads)
    progress = show_progress(args.progress)
    if not progress:
        hide_loading_progress()
    filter_known_warnings()
    from .train import evaluate_run, train

    mine = {k: v for k, v in (("reward_funcs", args.reward_funcs), ("eval_dataset", args.eval_dataset),
                              ("train_dataset", getattr(args, "train_dataset", None))) if v is not None}
    if args.command == "evaluate":
        return evaluate_run(args.run, progress=progress, **mine)
    overrides = {"threads": args.threads} if args.threads and not args.resume else {}
    if args.initial_eval is not None:
        overrides["initial_eval"] = args.initial_eval
    return train(args.config, args.signal, args.output, updates=args.updates, resume=args.resume,
                 progress=progress, **mine, **key_overrides(args), **overrides)


def _parse(argv: list[str] | None):
    """The parsed command line; an option that is TRL's name for a key here (``--num_generations``)
    is a :class:`UsageError` naming the key to use and how it differs (any other unknown option:
    argparse's own error)."""
    from .configs import trl_equivalent

    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    for option in extra:
        said = trl_equivalent(option.lstrip("-").split("=")[0]) if option.startswith("--") else None
        if said:
            raise UsageError(f"{option.split('=')[0]}: {said}")
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parse(argv)
    except UsageError as err:
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    ok = False
    try:
        result = _run(args)
        ok = True
    except (UsageError, ValueError) as err:
        from .custom import raised_by

        if raised_by(err):  # the user's own code failed: its traceback, with a note naming the function
            raise
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except OSError as err:  # e.g. a directory without write permission
        where = f"{err.filename}: " if err.filename else ""
        print(f"error: {where}{_one_line(err.strerror or err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"error: {interrupted(args)}", file=sys.stderr)
        return 130
    finally:
        if "torch" in sys.modules:  # a run started: stop its process group before exiting
            from ._runtime import close_process_group

            close_process_group(wait=ok)
    if int(os.environ.get("RANK", "0")) == 0:  # under accelerate launch / torchrun: the main process reports
        print(json.dumps(result, indent=2) if args.json else summary(result, args))
    return 0


def _one_line(err) -> str:
    """An error's message on one line (a library's message may hold several)."""
    return " ".join(str(err).split())


def _exit(code: int) -> None:
    """Leave with ``code``. Under ``accelerate launch`` / torchrun (WORLD_SIZE > 1) the process
    group is closed by :func:`main`, and the interpreter's own teardown is skipped: destroying
    torch.distributed's C++ objects there (a store or transport thread still joinable) can abort
    a worker with "terminate called without an active exception" after its run has finished,
    turning a finished run into a failed launch."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    _exit(main())
