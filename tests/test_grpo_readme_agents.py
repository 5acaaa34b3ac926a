"""The README's "Train your own agents" example (issue 74), run as written in an empty folder: agents
with roles of their own on a dataset that is no arithmetic, a graded reward, and one agent's adapter
loaded with PEFT alone, which answers as the trained pool's agent does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Train your own agents", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return block


@pytest.mark.usefixtures("one_torch_thread")
def test_the_readme_trains_agents_of_your_own_and_loads_one_with_peft(tmp_path, monkeypatch, capsys):
    import torch

    from mcpg.grpo import RoutedPool

    monkeypatch.chdir(tmp_path)
    scope = {"__name__": "readme_example"}
    exec(compile(_example(), "README.md", "exec"), scope)
    reward, agents = capsys.readouterr().out.strip().split(" ", 1)
    assert 0 <= float(reward) <= 1 and len(json.loads(agents)) == 3
    run = tmp_path / "runs" / "mine"
    saved = json.loads((run / "config.json").read_text())
    assert [a["name"] for a in saved["config"]["agents"]] == ["poet", "terse", "teacher"]
    assert saved["config"]["instruction"] == "Answer briefly." and saved["reward_funcs"] == [
        "readme_example:says_answer"]
    assert "math" not in json.dumps(saved["config"]).lower()
    # the graded reward: its first letter earns half
    assert scope["says_answer"](completions=["b", "blue", "x"], answer=["blue"] * 3) == [0.5, 1.0, 0.0]
    card = (run / "adapters" / "poet" / "README.md").read_text()
    assert "You answer in rhyme. Answer briefly." in card and "base_model: tiny-random" in card
    # the adapter PEFT loaded answers as the trained pool's poet does
    poet, pool = scope["poet"], RoutedPool.load(run)
    question = "Sky colour?"
    prompt = pool.pool.prompt(question, pool.pool.agents[0])
    tok = pool.pool.tokenizer
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        out = poet.generate(**ids, max_new_tokens=pool.max_new_tokens, do_sample=False,
                            pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    text = tok.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text == pool.answers(question)["poet"]
