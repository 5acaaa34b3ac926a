"""The frozen SmolLM2-135M-Instruct on GSM8K and on chapter 8's arithmetic task: accuracy
and headroom for GRPO, recorded with provenance under data/results/gsm8k/.

Four phases, each appended to its own jsonl file one batch at a time (a rerun with the same
arguments resumes where the last one stopped). By default (``--schedule interleave``) the
next batch always comes from the phase that has had the least CPU time so far, so that all
phases advance together and a recording cut short holds a prefix of every phase (the
sampled phases' problems are drawn at random, so their prefixes are random subsets);
``--schedule sequential`` runs them one after another in the order of ``--phases``. Each
batch is seeded by its phase and first problem, so rows do not depend on the schedule:

- ``greedy.jsonl``: greedy answers to GSM8K test problems (all 1,319 by default) at
  ``--max-new-tokens`` (256): text, token ids (EOS included when the answer ended by itself),
  token count, whether it was cut at the budget, and its strict / flexible / committed
  correctness (:mod:`mcpg.grpo.gsm8k`; committed is the engine's reward). The same answers
  read at the smaller budgets ``--budgets`` (greedy decoding at budget b gives exactly the
  first b tokens, :func:`mcpg.grpo.headroom.cut_completion`) are scored too.
- ``arith_greedy.jsonl`` and ``arith_samples.jsonl``: the same for chapter 8's arithmetic task
  (its 128 held-out problems, at ``--arith-max-new-tokens``, 32, the control's budget), greedy
  and ``--samples`` sampled answers each.
- ``samples.jsonl``: ``--samples`` (8) answers sampled at ``--temperature`` (0.7, the engine's)
  for each of ``--sample-problems`` (256) GSM8K test problems, drawn as the engine draws its
  held-out set (``load_gsm8k("test", n, seed=0)``: its first 128 are the engine's 128).

Every answer uses the engine's prompt for the frozen model (``AgentPool.prompt(q, None)``, the
reference the engine's evaluation reports as ``base_accuracy``) and its sampler
(``AgentPool.generate``: temperature, no top-k/top-p). ``summary.json`` is rewritten after
every batch from the jsonl files alone: accuracies with Wilson intervals, truncation,
pass@k for k = 1, 4, 8 (unbiased estimator) and the share of groups of m = 8 with no right
answer, plus provenance (command, commit, dates, machine, seeds, wall and CPU time; also in
``PROVENANCE.json``, written by :func:`mcpg.grpo.provenance.write_provenance`).

    nice -n 10 python scripts/gsm8k_measure.py --output data/results/gsm8k

``--max-batches`` stops after that many batches (a speed probe); ``--summarize`` only rewrites
summary.json; ``--report`` prints its numbers as the recording log's list (book/recording_log.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(ROOT / "src"))

from mcpg.grpo.gsm8k import is_correct, reward  # noqa: E402
from mcpg.grpo.headroom import cut_completion, no_right_share, pass_at_k, wilson_interval  # noqa: E402
from mcpg.grpo.provenance import FILE, code_origin, commit_state, machine_info, write_provenance  # noqa: E402

MODES = ("strict", "flexible", "committed")
PHASES = ("arith_greedy", "arith_samples", "greedy", "samples")
KS = (1, 4, 8)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def score(text: str, gold: float, truncated: bool) -> dict:
    """strict (``#### n`` only), flexible (markers, else the last number) and committed (the
    engine's reward: a cut answer counts only through ``#### n``) correctness, as 0/1."""
    return {
        "strict": int(is_correct(text, gold, mode="strict")),
        "flexible": int(is_correct(text, gold, mode="flexible")),
        "committed": int(reward(text, gold, truncated=truncated)),
    }


def read_rows(path: Path) -> list[dict]:
    """The complete rows of a jsonl file (a torn last line, from a killed run, is dropped)."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def _rewrite(path: Path, rows: list[dict]) -> None:
    """Replace ``path`` by ``rows`` atomically (a killed rewrite leaves the old file)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------
# generation
# ------------------------------------------------------------------------------------------
def _pool(model_spec: str, seed: int):
    from mcpg.grpo.agents import AgentPool, AgentSpec
    from mcpg.grpo.models import load_base

    model, tok, source = load_base(model_spec, dtype="float32", device="cpu", seed=seed)
    # one agent, never used: the frozen model answers through the BASE rows, as the engine's
    # base evaluation does
    pool = AgentPool(model, tok, [AgentSpec(name="solver", role="You are a helpful assistant.")], seed=seed)
    return pool, source


def _completion(roll, r: int) -> tuple[list[int], int, bool]:
    n = int(roll.completion_mask[r].sum())
    return roll.completion_ids[r, :n].tolist(), n, bool(roll.truncated[r])


def read_at_budgets(row: dict, budgets, max_new_tokens: int, tok) -> dict:
    """A greedy row's answer read at each budget below ``max_new_tokens``: cut to its first b
    tokens (:func:`mcpg.grpo.headroom.cut_completion`), decoded and scored."""
    out = {}
    for bud in budgets:
        if bud >= max_new_tokens:
            continue
        cids, ccut = cut_completion(row["ids"], row["n_tokens"], row["truncated"], bud)
        text = tok.decode(cids, skip_special_tokens=True)
        out[str(bud)] = {"truncated": ccut, **score(text, row["gold"], ccut)}
    return out


def backfill_budgets(path: Path, budgets, max_new_tokens: int, tok) -> int:
    """Score the greedy rows of ``path`` at the ``budgets`` they were not read at when recorded
    (a budget added later; the rows' token ids determine it). Rewrites the file; returns the
    number of rows changed."""
    rows, changed = read_rows(path), 0
    for row in rows:
        missing = [b for b in budgets if b < max_new_tokens and str(b) not in row["budgets"]]
        if missing:
            row["budgets"] = {**row["budgets"], **read_at_budgets(row, missing, max_new_tokens, tok)}
            row["budgets"] = dict(sorted(row["budgets"].items(), key=lambda kv: int(kv[0])))
            changed += 1
    if changed:
        _rewrite(path, rows)
    return changed


def run_phase(name, problems, pool, out: Path, args, greedy: bool, max_new_tokens: int,
              batch_limit: int | None = None) -> bool:
    """Answer ``problems`` in batches (at most ``batch_limit`` of them), appending one row per
    problem to ``<name>.jsonl``; True when the phase is complete."""
    import torch

    from mcpg.grpo.agents import BASE

    path = out / f"{name}.jsonl"
    done = read_rows(path)
    if path.exists():
        _rewrite(path, done)  # drop a torn last line
    per_batch = args.batch if greedy else max(1, args.batch // args.samples)
    n_rows = 1 if greedy else args.samples
    tok = pool.tokenizer
    start = len(done)
    batches = 0
    while start < len(problems):
        if args.max_batches is not None and args.batches_run >= args.max_batches:
            return False
        if batch_limit is not None and batches >= batch_limit:
            return False
        chunk = problems[start:start + per_batch]
        prompts = [pool.prompt(p["question"], None) for p in chunk for _ in range(n_rows)]
        t0, c0 = time.perf_counter(), time.process_time()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(args.seed * 1_000_003 + 7919 * start + PHASES.index(name))
            roll = pool.generate(prompts, [BASE] * len(prompts), [args.temperature] * len(prompts),
                                 max_new_tokens, greedy=greedy)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        rows = []
        for b, p in enumerate(chunk):
            row = {"i": p["i"], "gold": p["gold"]}
            if greedy:
                ids, n, cut = _completion(roll, b)
                text = roll.texts[b]
                row.update(text=text, ids=ids, n_tokens=n, truncated=cut, **score(text, p["gold"], cut))
                row["budgets"] = read_at_budgets(row, args.budgets, max_new_tokens, tok)
            else:
                samples, marks = [], {m: [] for m in MODES}
                for g in range(n_rows):
                    r = b * n_rows + g
                    _, n, cut = _completion(roll, r)
                    samples.append({"text": roll.texts[r], "n_tokens": n, "truncated": cut})
                    for m, v in score(roll.texts[r], p["gold"], cut).items():
                        marks[m].append(v)
                row.update(samples=samples, **marks)
            rows.append(row)
        with open(path, "a") as fh:  # one write per batch: a killed run loses at most one batch
            fh.write("".join(json.dumps(r) + "\n" for r in rows))
        with open(out / "timing.jsonl", "a") as fh:
            fh.write(json.dumps({"phase": name, "start": start, "problems": len(chunk),
                                 "rows": len(prompts), "wall_s": round(wall, 3), "cpu_s": round(cpu, 3),
                                 "steps": int(roll.completion_ids.shape[1]), "at": _now()}) + "\n")
        start += len(chunk)
        batches += 1
        args.batches_run += 1
        print(f"{name}: {start}/{len(problems)} problems, batch {wall:.1f} s wall, {cpu:.1f} s CPU",
              flush=True)
        summarize(out, args)
    return True


# ------------------------------------------------------------------------------------------
# the summary
# ------------------------------------------------------------------------------------------
def _accuracy(marks) -> dict:
    k, n = int(np.sum(marks)), len(marks)
    lo, hi = wilson_interval(k, n)
    return {"correct": k, "n": n, "accuracy": k / n, "wilson95": [lo, hi]}


def greedy_summary(rows: list[dict], max_new_tokens: int) -> dict | None:
    if not rows:
        return None
    out = {"n": len(rows), "max_new_tokens": max_new_tokens,
           "truncation": float(np.mean([r["truncated"] for r in rows])),
           "mean_tokens": float(np.mean([r["n_tokens"] for r in rows])),
           "accuracy": {m: _accuracy([r[m] for r in rows]) for m in MODES}, "budgets": {}}
    for bud in sorted({b for r in rows for b in r["budgets"]}, key=int):
        sub = [r["budgets"][bud] for r in rows]
        out["budgets"][bud] = {"truncation": float(np.mean([s["truncated"] for s in sub])),
                               "accuracy": {m: _accuracy([s[m] for s in sub]) for m in MODES}}
    out["budgets"][str(max_new_tokens)] = {"truncation": out["truncation"], "accuracy": out["accuracy"]}
    return out


def samples_summary(rows: list[dict], n_samples: int, temperature: float, max_new_tokens: int) -> dict | None:
    from mcpg.stats import mean_ci

    if not rows:
        return None
    out = {"problems": len(rows), "samples_per_problem": n_samples, "temperature": temperature,
           "max_new_tokens": max_new_tokens,
           "truncation": float(np.mean([s["truncated"] for r in rows for s in r["samples"]])),
           "pass_at_k": {}, "no_right_share_m8": {}}
    for m in MODES:
        out["pass_at_k"][m] = {}
        for k in KS:
            if k > n_samples:
                continue
            vals = np.array([pass_at_k(len(r[m]), int(sum(r[m])), k) for r in rows])
            if len(vals) > 1:
                mean, hw = mean_ci(vals)
                ci = [float(mean - hw), float(mean + hw)]
            else:
                ci = None
            out["pass_at_k"][m][str(k)] = {"estimate": float(vals.mean()), "t95": ci}
        if n_samples >= 8:
            out["no_right_share_m8"][m] = no_right_share([r[m] for r in rows], 8)
    return out


LEGACY_FILE = "provenance.json"
"""The name this script wrote its provenance under before it went through the library's writer."""


def read_prov(out: Path) -> dict:
    """The recording's ``PROVENANCE.json`` (or, from a recording made before, its
    ``provenance.json``); {} when there is none yet."""
    for name in (FILE, LEGACY_FILE):
        if (out / name).is_file():
            return json.loads((out / name).read_text())
    return {}


def write_prov(out: Path, prov: dict) -> None:
    """Write the recording's provenance through the one writer, as ``PROVENANCE.json`` (a
    ``provenance.json`` of an earlier recording is replaced by it)."""
    write_provenance(out / FILE, prov)
    if (out / LEGACY_FILE).is_file():
        (out / LEGACY_FILE).unlink()


def summarize(out: Path, args) -> dict:
    """Rewrite ``summary.json`` from the jsonl files (and the provenance file)."""
    rows = {p: read_rows(out / f"{p}.jsonl") for p in PHASES}
    timing = read_rows(out / "timing.jsonl")
    prov = read_prov(out)
    per_phase = {p: {"wall_s": round(sum(t["wall_s"] for t in timing if t["phase"] == p), 1),
                     "cpu_s": round(sum(t["cpu_s"] for t in timing if t["phase"] == p), 1),
                     "batches": sum(t["phase"] == p for t in timing)} for p in PHASES}
    targets = prov.get("targets", {})
    mt = prov.get("max_new_tokens", args.max_new_tokens)
    amt = prov.get("arith_max_new_tokens", args.arith_max_new_tokens)
    ns, temp = prov.get("samples_per_problem", args.samples), prov.get("temperature", args.temperature)
    summary = {
        "provenance": {**prov, "generation_time": per_phase,
                       "complete": {p: len(rows[p]) >= targets.get(p, float("inf")) for p in PHASES},
                       "summarized": _now()},
        "gsm8k": {
            "greedy": greedy_summary(rows["greedy"], mt),
            "samples": samples_summary(rows["samples"], ns, temp, mt),
        },
        "arithmetic": {
            "greedy": greedy_summary(rows["arith_greedy"], amt),
            "samples": samples_summary(rows["arith_samples"], ns, temp, amt),
        },
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def _acc(a: dict) -> str:
    lo, hi = a["wilson95"]
    return f"{a['correct']}/{a['n']} = {a['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]"


def _headroom(s: dict) -> str:
    p = s["pass_at_k"]
    ks = " / ".join(f"{p['committed'][k]['estimate']:.3f}" for k in ("1", "4", "8"))
    kf = " / ".join(f"{p['flexible'][k]['estimate']:.3f}" for k in ("1", "4", "8"))
    nr = s["no_right_share_m8"]
    return (f"pass@1/4/8 = {ks} committed ({kf} flexible); groups of 8 with no right answer "
            f"{nr['committed']:.2f} committed, {nr['flexible']:.2f} flexible; "
            f"{s['truncation']:.0%} of the samples cut at {s['max_new_tokens']} tokens")


def report(summary: dict) -> str:
    """The recorded numbers as a Markdown list (``--report`` prints it; a test checks that the
    book's recording log, ``book/recording_log.md``, holds exactly this for the committed
    summary.json)."""
    prov = summary["provenance"]
    targets, done = prov.get("targets", {}), prov["complete"]
    g, gs = summary["gsm8k"]["greedy"], summary["gsm8k"]["samples"]
    a, as_ = summary["arithmetic"]["greedy"], summary["arithmetic"]["samples"]
    state = ("complete" if all(done.values()) else
             f"in progress: GSM8K greedy on {g['n'] if g else 0} of {targets.get('greedy')} problems, "
             f"sampled on {gs['problems'] if gs else 0} of {targets.get('samples')}")
    commit = prov.get("commit", "?")[:7]
    lines = [f"Recorded ({state}; summarized {prov['summarized']}, commit {commit}):", ""]
    if a:
        b = str(a["max_new_tokens"])
        lines.append(
            f"- **Arithmetic task**, {a['n']} held-out problems, {b} tokens (the control's budget): greedy "
            f"committed accuracy {_acc(a['accuracy']['committed'])} (95 % Wilson), flexible "
            f"{_acc(a['accuracy']['flexible'])}, strict {_acc(a['accuracy']['strict'])}; "
            f"{a['truncation']:.0%} of the greedy answers cut at {b} tokens."
            + (f" Sampled (8 per problem, T = {as_['temperature']:g}, {as_['problems']} problems): "
               f"{_headroom(as_)}." if as_ else ""))
    if g:
        small = ", ".join(
            f"{v['accuracy']['committed']['accuracy']:.3f} at {b} ({v['truncation']:.1%} cut)"
            for b, v in sorted(g["budgets"].items(), key=lambda kv: -int(kv[0]))
            if int(b) < g["max_new_tokens"])
        lines.append(
            f"- **GSM8K**, greedy at {g['max_new_tokens']} tokens on {g['n']} test problems: committed "
            f"accuracy {_acc(g['accuracy']['committed'])}, strict {_acc(g['accuracy']['strict'])}, "
            f"flexible {_acc(g['accuracy']['flexible'])}; {g['truncation']:.0%} of the answers cut at "
            f"{g['max_new_tokens']} tokens (mean {g['mean_tokens']:.0f} tokens). The same answers read at "
            f"smaller budgets, committed accuracy: {small}.")
    if gs:
        lines.append(
            f"- **GSM8K**, sampled (8 per problem, T = {gs['temperature']:g}, {gs['max_new_tokens']} tokens) "
            f"on {gs['problems']} test problems: {_headroom(gs)}.")
    return "\n".join(lines) + "\n"


REPORT_MARKERS = ("<!-- gsm8k-report: written by scripts/gsm8k_measure.py --report -->",
                  "<!-- /gsm8k-report -->")


def replace_report(text: str, report_text: str) -> str:
    """``text`` with the part between :data:`REPORT_MARKERS` replaced by ``report_text``."""
    start, end = REPORT_MARKERS
    if start not in text or end not in text:
        raise ValueError(f"no {start} ... {end} block to replace")
    head, rest = text.split(start, 1)
    return head + start + "\n" + report_text + end + rest.split(end, 1)[1]


# ------------------------------------------------------------------------------------------
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--output", default="data/results/gsm8k")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data-dir", default=None, help="GSM8K folder (default: $MCPG_GSM8K_DIR)")
    ap.add_argument("--greedy-problems", type=int, default=None, help="first n test problems (default all)")
    ap.add_argument("--sample-problems", type=int, default=256)
    ap.add_argument("--arith-problems", type=int, default=128)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--arith-max-new-tokens", type=int, default=32)
    ap.add_argument("--budgets", default="24,32,40,48,96,128",
                    help="smaller budgets read off the greedy answers")
    ap.add_argument("--batch", type=int, default=32, help="rows per generate call")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--phases", default="arith_greedy,greedy,arith_samples,samples",
                    help="phases to run, in this order")
    ap.add_argument("--schedule", choices=("interleave", "sequential"), default="interleave",
                    help="interleave: next batch from the phase with the least CPU time so far "
                         "(all phases advance together); sequential: one after another")
    ap.add_argument("--max-batches", type=int, default=None)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--summarize", action="store_true")
    ap.add_argument("--report", action="store_true",
                    help="print summary.json's numbers as the recording log's Markdown list, and stop")
    ap.add_argument("--readme", default=None, metavar="PATH",
                    help="with --report: write the list into PATH between its gsm8k-report markers")
    args = ap.parse_args(argv)
    args.budgets = [int(b) for b in args.budgets.split(",") if b]
    args.phases = [p for p in args.phases.split(",") if p]
    unknown = set(args.phases) - set(PHASES)
    if unknown:
        ap.error(f"unknown phases {sorted(unknown)}; known: {PHASES}")
    args.batches_run = 0
    return args


def main(argv=None) -> dict:
    import torch

    from mcpg.grpo.arithmetic import task_split
    from mcpg.grpo.gsm8k import load_gsm8k

    args = parse_args(argv)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        return summarize(out, args)
    if args.report:
        text = report(json.loads((out / "summary.json").read_text()))
        if args.readme:
            readme = Path(args.readme)
            readme.write_text(replace_report(readme.read_text(), text))
        else:
            print(text, end="")
        return {}
    torch.set_num_threads(args.threads)
    t0, c0 = time.perf_counter(), time.process_time()
    gsm = load_gsm8k("test", data_dir=args.data_dir)
    for i, p in enumerate(gsm):
        p["i"] = i
    greedy_set = gsm if args.greedy_problems is None else gsm[:args.greedy_problems]
    n_s = min(args.sample_problems, len(gsm))
    sample_set = load_gsm8k("test", n=n_s, seed=0, data_dir=args.data_dir)
    index = {p["question"]: p["i"] for p in gsm}
    for p in sample_set:
        p["i"] = index[p["question"]]
    arith = task_split("test")[:args.arith_problems]
    arith = [{"i": i, "question": p["question"], "gold": p["gold"]} for i, p in enumerate(arith)]
    pool, source = _pool(args.model, args.seed)
    load_s = time.perf_counter() - t0
    prov = read_prov(out)
    prov.update({
        "what": "frozen model, greedy accuracy and sampled headroom (pass@k) on GSM8K test and on "
                "chapter 8's arithmetic task (mcpg.grpo.arithmetic.task_splits(512, 128, seed=0) held-out)",
        "command": " ".join([Path(sys.executable).name, *sys.argv]) if argv is None
        else "gsm8k_measure.main(" + repr(argv) + ")",
        **commit_state(),  # of the code imported (mcpg.grpo.provenance.code_origin)
        "code": code_origin(),
        "model": args.model, "model_source": str(source), "dtype": "float32",
        "prompt": "AgentPool.prompt(question, None): the engine's frozen reference (base_accuracy)",
        "example_prompt": pool.prompt("<question>", None),
        "seed": args.seed, "sample_problem_seed": 0, "temperature": args.temperature,
        "samples_per_problem": args.samples, "batch_rows": args.batch,
        "max_new_tokens": args.max_new_tokens, "arith_max_new_tokens": args.arith_max_new_tokens,
        "budgets": args.budgets, "threads": args.threads,
        "targets": {"greedy": len(greedy_set), "arith_greedy": len(arith), "arith_samples": len(arith),
                    "samples": len(sample_set)},
        "machine": machine_info(),
    })
    for name, budget in (("greedy", args.max_new_tokens), ("arith_greedy", args.arith_max_new_tokens)):
        filled = backfill_budgets(out / f"{name}.jsonl", args.budgets, budget, pool.tokenizer)
        if filled:
            print(f"{name}: {filled} recorded rows read at the added budgets", flush=True)
    prov.setdefault("started", _now())
    prov.setdefault("sessions", []).append({"started": _now(), "model_load_s": round(load_s, 1)})
    write_prov(out, prov)
    plan = {"greedy": (greedy_set, True, args.max_new_tokens),
            "arith_greedy": (arith, True, args.arith_max_new_tokens),
            "arith_samples": (arith, False, args.arith_max_new_tokens),
            "samples": (sample_set, False, args.max_new_tokens)}
    if args.schedule == "sequential":
        for name in args.phases:  # in the order given
            probs, greedy, budget = plan[name]
            run_phase(name, probs, pool, out, args, greedy, budget)
    else:  # one batch at a time of the phase that has had the least CPU time so far
        pending = list(args.phases)
        while pending and (args.max_batches is None or args.batches_run < args.max_batches):
            cpu = {p: 0.0 for p in pending}
            for t in read_rows(out / "timing.jsonl"):
                if t["phase"] in cpu:
                    cpu[t["phase"]] += t["cpu_s"]
            name = min(pending, key=lambda p: (cpu[p], pending.index(p)))
            probs, greedy, budget = plan[name]
            if run_phase(name, probs, pool, out, args, greedy, budget, batch_limit=1):
                if len(read_rows(out / f"{name}.jsonl")) >= len(probs):
                    pending.remove(name)
    prov = read_prov(out)
    prov["sessions"][-1].update(ended=_now(), wall_s=round(time.perf_counter() - t0, 1),
                                cpu_s=round(time.process_time() - c0, 1))
    write_prov(out, prov)
    summary = summarize(out, args)
    g = summary["gsm8k"]["greedy"]
    if g:
        a = g["accuracy"]["committed"]
        print(f"gsm8k greedy: {a['correct']}/{a['n']} = {a['accuracy']:.3f}, truncated {g['truncation']:.3f}")
    return summary


if __name__ == "__main__":
    main()
