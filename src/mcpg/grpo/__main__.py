"""Command line of the GRPO engine.

    python -m mcpg.grpo train --config NAME_OR_PATH --signal wta|removal|oracle --output DIR
                              [--updates N] [--threads N] [--progress | --no-progress] [--json]
    python -m mcpg.grpo train --signal wta|removal|oracle --output DIR --resume [--updates N] ...
    python -m mcpg.grpo evaluate --run DIR [--threads N] [--progress | --no-progress] [--json]

Named configs: tiny-random, cpu-smoke, colab, paper (see ``mcpg.grpo.configs``). Several
GPUs: ``accelerate launch --num_processes N -m mcpg.grpo train ...``; two CPU processes:
``accelerate launch --multi_gpu --num_processes 2 -m mcpg.grpo train --config tiny-random ...``.

A mistake in the command (a missing or malformed config file, an --output that is a file or
holds something else, a --run that is not a finished run directory, a config key out of
range, data that cannot be read, a model that is not there) ends with one ``error:`` line on
stderr, naming the key or file and how to fix it, and exit status 2, not a traceback; the
output directory is left as it was. Ctrl-C ends with one line saying how ``--resume``
continues the run (exit status 130).

Progress bars (tqdm) show while it runs when stderr is a terminal; ``--progress`` shows them
anywhere, ``--no-progress`` nowhere. At the end it prints a summary of a few lines (the full
evaluation is the run's eval.json; ``--json`` prints that instead).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
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


def build_parser() -> argparse.ArgumentParser:
    from .configs import CONFIGS
    from .objective import SIGNALS

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
    t = sub.add_parser("train", help="train K routed LoRA agents with one credit signal",
                       description="Train K routed LoRA agents with one credit signal; write a run folder.",
                       epilog=EXAMPLES, formatter_class=fmt)
    t.add_argument("--config", help=f"a named config {sorted(CONFIGS)} or a JSON file "
                   "(not needed with --resume, which continues with the run's own config.json)")
    t.add_argument("--signal", required=True, help=f"credit signal: one of {list(SIGNALS)}")
    t.add_argument("--output", required=True, help="run directory (new, or an interrupted run with --resume)")
    t.add_argument("--updates", type=int, default=None, help="total updates (overrides the config)")
    t.add_argument("--resume", action="store_true", help="continue the run in --output from its checkpoint")
    t.add_argument("--threads", type=_threads, default=None, metavar="N", help=threads_help)
    t.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help=progress_help)
    t.add_argument("--json", action="store_true", help=json_help)
    e = sub.add_parser("evaluate", help="evaluate a run directory's weights; rewrites eval.json",
                       description="Evaluate a finished run's final weights on its own held-out problems; "
                                   "rewrite eval.json.",
                       epilog=EXAMPLES, formatter_class=fmt)
    e.add_argument("--run", required=True, help="run directory written by train")
    e.add_argument("--threads", type=_threads, default=None, metavar="N", help=threads_help)
    e.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None, help=progress_help)
    e.add_argument("--json", action="store_true", help=json_help)
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
        return saved_config(saved["config"]) if isinstance(saved, dict) and "config" in saved else {}

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
        return saved_config(saved["config"]) if isinstance(saved, dict) and "config" in saved else {}
    if args.config is None:
        raise UsageError("the following arguments are required: --config (unless --resume)")
    if args.config in CONFIGS:
        return resolve_config(args.config)
    path = Path(args.config)
    if not path.exists():
        raise UsageError(f"--config {args.config!r} is neither a named config {sorted(CONFIGS)} nor a file")
    if not path.is_file():
        raise UsageError(f"--config {path} is a directory, not a JSON file")
    _read_json(path, "config file")
    try:
        return resolve_config(str(path))
    except ValueError as err:
        raise UsageError(f"config file {path}: {err}")


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
    agents = result.get("agent_accuracy") or []
    shares = result.get("deployed_fraction") or []
    if agents:
        lines.append("agents' accuracy " + ", ".join(num(a) for a in agents)
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
            f"python -m mcpg.grpo train --signal {args.signal} --output {out} --resume")


def _run(args) -> dict:
    cfg = _config_of_command(args)
    threads = args.threads or cfg.get("threads") or 0
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

    if args.command == "evaluate":
        return evaluate_run(args.run, progress=progress)
    overrides = {"threads": args.threads} if args.threads and not args.resume else {}
    return train(args.config, args.signal, args.output, updates=args.updates, resume=args.resume,
                 progress=progress, **overrides)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    ok = False
    try:
        result = _run(args)
        ok = True
    except (UsageError, ValueError) as err:
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
