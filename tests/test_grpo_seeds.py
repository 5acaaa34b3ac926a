"""A run's randomness follows its config's ``seed``: the LoRA initialisation, the router's
initialisation, the problems drawn, the router's draws and the sampled completions.

Seeds are the unit of chapter 8's verdict (intervals over seeds), so two seeds must be two
independent training paths and one seed one path. TRL once initialised LoRA adapters without
regard to the seed it was given (every seed the same adapters); these tests fail on such a bug.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from mcpg.grpo.configs import resolve_config
from mcpg.grpo.train import Engine

FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _state(eng: Engine) -> dict[str, torch.Tensor]:
    """Every trainable tensor of the run: each adapter's LoRA weights and the router's."""
    out = {f"{n}/{k}": v.clone() for n in eng.pool.names for k, v in eng.pool.adapter_state(n).items()}
    out.update({f"router/{k}": v.clone() for k, v in eng.router.state_dict().items()})
    return out


def _first_update(eng: Engine) -> tuple[dict, dict]:
    """The initial state, then the first update's metrics row (less its timings) and its slates."""
    row = eng.update()
    row = {k: v for k, v in row.items() if k != "seconds"}
    return row, json.loads(json.dumps(eng.last_slates, default=lambda x: np.asarray(x).tolist()))


@pytest.fixture(scope="module")
def runs():
    """Three engines on the tiny random model: seed 0 twice and seed 1, each before and after one update."""
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MCPG_GSM8K_DIR", str(FIXTURE))
        for name, seed in (("a", 0), ("b", 0), ("c", 1)):
            eng = Engine(resolve_config("tiny-random", seed=seed), "removal")
            assert torch.initial_seed() == seed  # rank 0: the sampling generator is the config's seed
            out[name] = (_state(eng), *_first_update(eng))
    return out


def test_one_seed_gives_identical_adapters_router_and_first_update(runs):
    (sa, row_a, slates_a), (sb, row_b, slates_b) = runs["a"], runs["b"]
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    assert row_a == row_b
    assert slates_a == slates_b


def test_two_seeds_give_different_adapters_router_and_samples(runs):
    (sa, _, slates_a), (sc, _, slates_c) = runs["a"], runs["c"]
    lora_a = [k for k in sa if ".lora_A." in k or "lora_A" in k.split("/")[-1]]
    assert lora_a, "no LoRA A matrices found"
    for k in lora_a:  # B starts at 0 in every seed; A carries the seed
        assert not torch.equal(sa[k], sc[k]), f"{k} ignores the seed"
    for k in (k for k in sa if k.startswith("router/") and sa[k].numel() > 1):
        assert not torch.equal(sa[k], sc[k]), f"{k} ignores the seed"
    assert slates_a != slates_c


def test_agents_of_one_pool_start_from_different_adapters(runs):
    """Within a seed, each agent's LoRA A is its own draw (peft's add_adapter draws anew)."""
    state = runs["a"][0]
    names = sorted({k.split("/")[0] for k in state if not k.startswith("router/")})
    assert len(names) >= 2
    first = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith(names[0] + "/")}
    second = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith(names[1] + "/")}
    assert first.keys() == second.keys()
    assert any(not torch.equal(first[k], second[k]) for k in first if "lora_A" in k)
