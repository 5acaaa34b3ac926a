"""A trained pool as other tools and a practitioner use it (issue 60, section 5).

A tiny-random run is trained for one update; then

- each agent is a PEFT adapter folder that ``peft.PeftModel.from_pretrained`` loads on a fresh
  base model, with the logits the engine's own mixed-adapter pass gives that agent;
- the layout of runs recorded before (``adapters/<name>.safetensors``, no adapter config)
  still loads, to the same logits;
- :class:`mcpg.grpo.RoutedPool` loaded from the run answers the held-out questions as the
  run's evaluation did: the same router estimates and the same deployed agent.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from mcpg.grpo import RoutedAnswer, RoutedPool

GSM8K_FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"
QUESTION = "Tom has 3 apples and buys 4 more. How many apples does he have?"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny-random run of one update (learning rate 0.1, so every adapter is well away from 0)."""
    from mcpg.grpo.train import train

    out = tmp_path_factory.mktemp("pool") / "run"
    before, threads = os.environ.get("MCPG_GSM8K_DIR"), torch.get_num_threads()
    os.environ["MCPG_GSM8K_DIR"] = str(GSM8K_FIXTURE)
    torch.set_num_threads(1)
    try:
        train("tiny-random", "removal", out, updates=1, learning_rate=0.1)
    finally:
        torch.set_num_threads(threads)
        if before is None:
            os.environ.pop("MCPG_GSM8K_DIR")
        else:
            os.environ["MCPG_GSM8K_DIR"] = before
    return out


@pytest.fixture(scope="module")
def routed(run):
    return RoutedPool.load(run)


def _inputs(pool, agent):
    enc = pool.tokenizer([pool.prompt(QUESTION, agent)], return_tensors="pt", add_special_tokens=False)
    return enc.input_ids, enc.attention_mask


def _engine_logits(pool, name, ids, mask):
    """The logits the engine computes for agent ``name``: its mixed-adapter pass (MultiLoRA)."""
    ctx, extra = pool._mixed([name] * ids.shape[0])
    with torch.no_grad(), ctx:
        return pool.model(input_ids=ids, attention_mask=mask, **extra).logits


@pytest.mark.usefixtures("one_torch_thread")
def test_each_agent_loads_with_peft_from_pretrained_with_equal_logits(run, routed):
    from peft import PeftModel

    from mcpg.grpo.models import load_base

    pool = routed.pool
    assert pool.multilora is not None  # the engine's own path, not peft's, is compared
    cfg = json.loads((run / "config.json").read_text())["config"]
    for agent in pool.agents:
        folder = run / "adapters" / agent.name
        assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in folder.iterdir()}
        base, _, _ = load_base("tiny-random", seed=cfg["seed"])  # a fresh, bare base model
        ids, mask = _inputs(pool, agent)
        with torch.no_grad():
            bare = base(input_ids=ids, attention_mask=mask).logits
        peft_model = PeftModel.from_pretrained(base, str(folder))
        peft_model.eval()
        with torch.no_grad():
            theirs = peft_model(input_ids=ids, attention_mask=mask).logits
        ours = _engine_logits(pool, agent.name, ids, mask)
        torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
        # the check can fail: the trained adapter moves the logits well beyond the tolerance
        assert (ours - bare).abs().max() > 1e-3, agent.name


@pytest.mark.usefixtures("one_torch_thread")
def test_adapters_in_the_layout_of_older_runs_still_load(run, routed, tmp_path):
    """``adapters/<name>.safetensors`` (the bare tensors, no adapter config) loads to the same
    logits as peft's format; a missing adapter and a rank other than the pool's are refused."""
    from safetensors.torch import save_file

    from mcpg.grpo.agents import AgentPool, AgentSpec
    from mcpg.grpo.models import load_base

    pool = routed.pool
    old = tmp_path / "adapters"
    old.mkdir()
    for name in pool.names:
        save_file(pool.adapter_state(name), str(old / f"{name}.safetensors"))
    cfg = json.loads((run / "config.json").read_text())["config"]

    def fresh(r=cfg["lora_r"]):
        base, tok, _ = load_base("tiny-random", seed=cfg["seed"])
        return AgentPool(base, tok, [AgentSpec(**a) for a in cfg["agents"]], lora_r=r,
                         lora_alpha=cfg["lora_alpha"], seed=cfg["seed"])

    again = fresh()
    again.load_adapters(old)
    for agent in pool.agents:
        ids, mask = _inputs(pool, agent)
        torch.testing.assert_close(_engine_logits(again, agent.name, ids, mask),
                                   _engine_logits(pool, agent.name, ids, mask), rtol=0, atol=0)
    (old / f"{pool.names[0]}.safetensors").unlink()
    with pytest.raises(ValueError, match=pool.names[0]):
        fresh().load_adapters(old)
    with pytest.raises(ValueError, match="has r 4, this pool 2"):
        fresh(r=2).load_adapters(run / "adapters")


@pytest.mark.usefixtures("one_torch_thread")
def test_routed_pool_answers_as_the_evaluation_deployed(run, routed):
    """On the run's held-out questions, the router's estimates equal eval.json's, and the agent
    deployed is the one the evaluation deployed (the top score); ``answers`` gives every agent's."""
    from mcpg.grpo.configs import saved_config
    from mcpg.grpo.train import _load_split

    ev = json.loads((run / "eval.json").read_text())
    cfg = saved_config(json.loads((run / "config.json").read_text())["config"])
    before = os.environ.get("MCPG_GSM8K_DIR")
    os.environ["MCPG_GSM8K_DIR"] = str(GSM8K_FIXTURE)
    try:
        questions = [p["question"] for p in _load_split(cfg, "test")]
    finally:
        if before is None:
            os.environ.pop("MCPG_GSM8K_DIR")
        else:
            os.environ["MCPG_GSM8K_DIR"] = before
    assert len(questions) == ev["n"] == len(ev["mu_hat"])
    got = routed.answer(questions)
    assert all(isinstance(r, RoutedAnswer) for r in got)
    for r, mu, correct in zip(got, ev["mu_hat"], ev["agent_correct"]):
        assert list(r.candidates) == routed.names
        assert [r.mu_hat[n] for n in routed.names] == pytest.approx(mu, rel=1e-6, abs=1e-9)
        assert r.agent == routed.names[max(range(len(mu)), key=mu.__getitem__)]
        assert r.text == r.candidates[r.agent]
        assert sum(r.p.values()) == pytest.approx(1.0)
    one = routed.answer(questions[0])
    assert one.agent == got[0].agent and one.candidates == got[0].candidates
    assert routed.answers(questions[0]) == got[0].candidates
    assert routed.answers(questions[:2]) == [g.candidates for g in got[:2]]
    assert routed.answer([]) == [] and routed.answers([]) == []


def test_routed_pool_reads_a_checkpoint_and_refuses_a_folder_without_weights(run, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(run, partial)
    shutil.rmtree(partial / "adapters")
    (partial / "router.safetensors").unlink()
    assert RoutedPool.load(partial).names == RoutedPool.load(run).names  # from checkpoint/
    shutil.rmtree(partial / "checkpoint")
    with pytest.raises(ValueError, match="neither final weights"):
        RoutedPool.load(partial)
    with pytest.raises(ValueError, match="not a run directory"):
        RoutedPool.load(tmp_path / "nothing")
