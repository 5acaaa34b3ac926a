"""benchmarks/bench_trl.py: our update against TRL's GRPOTrainer at the tiny random model (it
runs every arm and writes a JSON whose numbers hang together), and TRL's generate with the
engine's answer-line stop (a stopped completion ends in EOS right after its answer line)."""

import json
import statistics
from pathlib import Path

import pytest
import torch

from repo_scripts import load_script  # tests/repo_scripts.py

pytest.importorskip("trl")

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _bench():
    return load_script("benchmarks/bench_trl.py")


def test_bench_trl_tiny_random(tmp_path):
    bench = _bench()
    out = tmp_path / "r.json"
    # two timed steps: 6 problems, which a shuffled dataset would not keep in the engine's order
    # (4 problems under TRL's seed-0 shuffle stay in their two steps' sets)
    res = bench.main(["--tiny-random", "--repeats", "1", "--steps", "2", "--out", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(res))
    assert res["command"].startswith("python benchmarks/bench_trl.py --tiny-random")
    assert len(res["commit"]) == 40 and res["date"] and res["machine"]["nproc"] >= 1
    assert res["torch_threads"] == 1 and set(res["versions"]) == {"torch", "transformers", "trl", "peft"}
    s = res["setting"]
    assert s["mask_truncated_completions"] and s["stop_at_answer"] and s["model"] == "tiny-random"
    rows = s["prompts_per_update"] * s["completions_per_agent"]
    assert set(res["arms"]) == set(bench.ARMS)
    for arm, r in res["arms"].items():
        assert all(len(v) == res["repeats"] * res["steps"] for v in r["seconds"].values()), arm
        for p, v in r["seconds"].items():
            assert r["median_s"][p] == statistics.median(v) and min(v) > 0, (arm, p)
        # generation is part of the rollout, the rollout part of the step
        for st, ro, ge in zip(*(r["seconds"][p] for p in ("step", "rollout", "generate"))):
            assert ge <= ro <= st, arm
        assert 0 < r["rss_after_setup_bytes"] <= r["peak_bytes"] <= 1.01 * r["peak_bytes_process"], arm
        assert r["torch_threads"] == 1
        assert [w["warmup"] for w in r["work"]] == [True] + [False] * res["steps"]
        for w in r["work"]:  # each step's work by its own count
            assert w["rows"] == rows and 0 < w["prompt_tokens"]
            assert 0 <= w["trained_tokens"] <= w["completion_tokens"] <= rows * (w["decode_steps"] + 1)
            assert w["decode_steps"] <= s["max_completion_length"] and w["truncated"] + w["stopped"] <= rows
    # one round: the ratio against TRL is the quotient of the two arms' median steps
    for arm in ("ours/shared", "ours/unshared"):
        q, ours, theirs = res["ratio_to_trl"][arm], res["arms"][arm], res["arms"]["trl"]
        for p in bench.PHASES:
            assert q[p] == pytest.approx(statistics.median(ours["seconds"][p])
                                         / statistics.median(theirs["seconds"][p]))
        assert q["peak_bytes"] == pytest.approx(ours["peak_bytes"] / theirs["peak_bytes"])
    # the same problems and chat prompts on every side, step by step (TRL's dataset in the engine's
    # draw order)
    assert res["same_work"] == {"questions": True, "prompt_tokens": True, "rows": True}
    assert len(res["problems"]) == 1 + res["steps"]
    assert all(len(set(q)) == s["prompts_per_update"] for q in res["problems"])


def test_trl_generate_stops_at_the_answer_line():
    """A stand-in for ``generate`` that samples fixed texts and consults its stopping criteria
    step by step, as transformers does (a finished row is padded): the stopped row gets EOS right
    after its answer line, so TRL reads it as ended (not cut) and trains its answer and that EOS."""
    from mcpg.grpo.models import byte_tokenizer

    bench = _bench()
    tok = byte_tokenizer()
    texts = ["1 + 2 = 3\n#### 3\nmore", "1 + 2 = 3 and so on, on"]
    T = max(len(t) for t in texts)
    completions = torch.tensor([tok(t.ljust(T), add_special_tokens=False)["input_ids"] for t in texts])
    prompt = torch.tensor(tok(["Q?", "Q?"], add_special_tokens=False)["input_ids"])

    class Model:
        def generate(self, input_ids, attention_mask, stopping_criteria=None, max_new_tokens=T):
            out, done = input_ids, torch.zeros(len(input_ids), dtype=torch.bool)
            for t in range(max_new_tokens):
                nxt = torch.where(done, torch.tensor(tok.pad_token_id), completions[:, t])
                out = torch.cat([out, nxt[:, None]], 1)
                done |= stopping_criteria[0](out, None)
                if bool(done.all()):
                    break
            return out

    model, record = Model(), []
    bench._trl_generate(model, tok, record, stop_at_answer=True)
    out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt))
    answer = len("1 + 2 = 3\n#### 3\n")
    comp = out[:, prompt.shape[1]:]
    assert tok.decode(comp[0, :answer]) == "1 + 2 = 3\n#### 3\n" and int(comp[0, answer]) == tok.eos_token_id
    assert tok.eos_token_id not in comp[1].tolist()  # ran to the budget: cut
    rec = record[0]
    assert rec["stopped"] == 1 and rec["cut"] == 1 and rec["rows"] == 2 and rec["width"] == T
    assert rec["tokens"] == (answer + 1) + T  # TRL's convention: up to and with the first EOS
