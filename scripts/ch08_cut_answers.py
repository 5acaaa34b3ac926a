"""What a trained run's cut answers are: the held-out greedy answers of its final agents, read.

Chapter 8's health bar counts the completions cut at the token budget. A cut answer may still
have committed: written ``#### <n>`` and finished that line, then gone on (repeating the marker
line, say) until the budget ran out. Or it may never have committed. This script loads a run
directory's final adapters (``adapters/``, kept by ``python -m mcpg.grpo train``; the recorded
copies under ``data/results`` hold no weights), lets every agent answer every held-out problem
greedily as the engine's evaluation does, and sorts the cut answers into those that hold a
finished answer line (:data:`mcpg.grpo.gsm8k.ANSWER_LINE`, where config key ``stop_at_answer``
would have ended them), those that hold a ``#### <n>`` without finishing its line, and those
with no marker at all.

    python scripts/ch08_cut_answers.py runs/ch08/grid/wta-none/seed2 \\
        --out data/results/ch08/grid/probe/cut-answers/wta-none-seed2

It writes ``samples.jsonl`` (agent, text, cut) and ``summary.json`` (the shares per agent and
overall, the run, the command, the commit of the code imported, the machine and the date).
The answers are generated as the engine's evaluation generates them, with the run's own
``stop_at_answer``. ``reproduces_agent_correct`` says whether every agent is right on exactly the
problems the run's own ``eval.json`` says (``agent_correct``), and ``reproduces_truncated``
whether the share cut is the one it recorded (``truncated``): whether these are the answers it
was graded on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from mcpg.grpo.provenance import commit_state, machine_info

KINDS = ("finished answer line", "marker, line unfinished", "no marker")


def kind_of(text: str) -> str:
    """Which of :data:`KINDS` a cut answer is."""
    from mcpg.grpo.gsm8k import ANSWER_LINE, extract_answer

    if ANSWER_LINE.search(text):
        return KINDS[0]
    return KINDS[1] if extract_answer(text, mode="strict") is not None else KINDS[2]


def summarise(rows: list[dict], K: int) -> dict:
    """Shares of all answers, overall (``all``) and per agent (``per_agent``): cut, and cut of
    each kind."""

    def shares(sub):
        n = len(sub)
        out = {"answers": n, "cut": sum(r["cut"] for r in sub) / n}
        for k in KINDS:
            out[f"cut, {k}"] = sum(r["cut"] and r["kind"] == k for r in sub) / n
        return out

    per_agent = [shares([r for r in rows if r["agent"] == k]) for k in range(K)]
    return {"all": shares(rows), "per_agent": per_agent}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", help="a run directory with config.json and adapters/")
    ap.add_argument("--out", required=True, help="folder for samples.jsonl and summary.json")
    a = ap.parse_args(argv)
    run, out = Path(a.run), Path(a.out)
    if not (run / "config.json").exists() or not (run / "adapters").is_dir():
        ap.error(f"{run} needs config.json and adapters/ (a finished run directory, not a recorded copy)")
    torch.set_num_threads(1)
    import mcpg
    from mcpg.grpo.configs import saved_config
    from mcpg.grpo.train import Engine

    saved = json.loads((run / "config.json").read_text())
    cfg = saved_config(saved["config"])
    engine = Engine(cfg, saved["signal"], load_train=False)
    engine.pool.load_adapters(run / "adapters")
    questions = [p["question"] for p in engine.eval_set]
    prompts, adapters, temps, _ = engine.prompt_rows(questions, 1, with_base=False)
    t0 = time.time()
    # exactly as the engine's evaluation generates them, with the run's own stop
    roll = engine.pool.generate(prompts, adapters, temps, cfg["eval_max_new_tokens"], greedy=True,
                                batch_size=cfg["eval_batch_size"], stop_at_answer=cfg["stop_at_answer"])
    rows = []
    for r, text in enumerate(roll.texts):
        cut = bool(roll.truncated[r])
        rows.append({"problem": r // engine.K, "agent": r % engine.K, "cut": cut, "text": text,
                     "kind": kind_of(text) if cut else None})
    from mcpg.grpo.gsm8k import reward

    golds = [p["gold"] for p in engine.eval_set]
    K = engine.K
    correct = [[int(reward(rows[b * K + k]["text"], golds[b], truncated=rows[b * K + k]["cut"]))
                for k in range(K)] for b in range(len(golds))]
    recorded = json.loads((run / "eval.json").read_text()) if (run / "eval.json").exists() else {}
    code = Path(mcpg.__file__).resolve().parents[2]
    state = commit_state(code)
    shares = summarise(rows, engine.K)
    summary = {
        "what": "the held-out greedy answers of a finished run's agents, cut ones sorted by kind",
        "run": str(run),
        "run_eval_truncated": recorded.get("truncated"),
        # the answers are the run's own evaluation's: every agent right on the same problems
        "reproduces_agent_correct": correct == recorded.get("agent_correct"),
        # and cut where they were: the share cut is the one eval.json recorded
        "reproduces_truncated": recorded.get("truncated") is not None
        and abs(shares["all"]["cut"] - recorded["truncated"]) < 1e-9,
        "stop_at_answer": cfg["stop_at_answer"],
        "agent_names": [a["name"] for a in cfg["agents"]],
        "eval_max_new_tokens": cfg["eval_max_new_tokens"],
        **shares,
        "command": "OMP_NUM_THREADS=1 python " + " ".join(["scripts/ch08_cut_answers.py", *sys.argv[1:]]),
        # the code imported (PYTHONPATH), not necessarily this script's
        "commit": state["commit"], "dirty": state["dirty"],
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.time() - t0),
        "machine": machine_info(),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({k: summary[k] for k in ("run", "all")}, indent=1))
    print("per agent cut:", [round(x["cut"], 3) for x in summary["per_agent"]],
          "reproduces eval.json:", summary["reproduces_agent_correct"] and summary["reproduces_truncated"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
