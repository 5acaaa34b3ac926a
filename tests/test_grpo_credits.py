"""mcpg.grpo.credits: the registry of credit signals, its flags, the one exact-budget rule."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcpg import routing
from mcpg.allocation import ExactBudget
from mcpg.grpo import credits, objective
from mcpg.grpo.objective import credit, route_and_credit
from mcpg.grpo.simulated.pool import METHODS


@pytest.fixture
def scratch_registry(monkeypatch):
    """A copy of the registry, so a test may register signals of its own without leaving them."""
    monkeypatch.setattr(credits, "_REGISTRY", dict(credits._REGISTRY))


@st.composite
def slates(draw, max_k=4):
    """A routed rollout ``(I, G, p, P, mu, R)`` of B prompts x m slates x K agents, random scores,
    outcome estimates, 0/1 rewards and draws I ~ p."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    B, m, K = draw(st.integers(1, 3)), draw(st.integers(2, 4)), draw(st.integers(1, max_k))
    tau, eps = draw(st.floats(0.2, 3.0)), draw(st.floats(0.01, 0.5))
    s = rng.normal(size=(B, m, K)) * 2
    p = routing.router_propensities(s, tau, eps)
    P = routing.leave_one_out_propensities(s, tau, eps)
    mu = 1 / (1 + np.exp(-rng.normal(size=(B, m, K))))
    R = (rng.random((B, m, K)) < draw(st.floats(0.1, 0.9))).astype(float)
    I = routing.sample_selection(p, rng)  # noqa: E741 (the paper's name)
    G = np.take_along_axis(R, I[..., None], -1)[..., 0]
    return I, G, p, P, mu, R


def test_the_paper_signals_are_registered_with_their_flags():
    assert credits.names()[:3] == ("wta", "removal", "oracle")
    assert credits.SIGNALS == objective.SIGNALS == ("wta", "removal", "oracle")
    assert METHODS == ("frozen", "wta", "removal", "oracle")  # the book's arms
    flags = {n: (s.all_rewards, s.exact_budget, s.before_draw, s.paper)
             for n in credits.SIGNALS for s in [credits.get(n)]}
    assert flags == {"wta": (False, False, False, True), "removal": (False, True, False, True),
                     "oracle": (True, False, True, True)}


def test_names_are_checked_and_register_once(scratch_registry):
    with pytest.raises(ValueError, match="signal must be one of .*'shapley'"):
        credits.get("shapley")
    with pytest.raises(ValueError, match="signal must be one of"):
        credit("shapley", [0], [1.0], [[1.0]], [[[0.0]]], [[0.5]])
    with pytest.raises(ValueError, match="registered already"):
        credits.register("wta")(lambda *a: None)
    with pytest.raises(ValueError, match="non-empty string"):
        credits.register("")


def test_a_signal_sees_only_what_its_registration_declares(scratch_registry):
    seen = {}

    def spy(name):
        def fn(selected, reward, p, P, mu_hat, rewards_all):
            seen[name] = (selected, reward, rewards_all)
            return np.zeros_like(p)
        return fn

    credits.register("filtered")(spy("filtered"))
    credits.register("full", all_rewards=True)(spy("full"))
    credits.register("fixed", all_rewards=True, before_draw=True)(spy("fixed"))
    assert credits.names()[-3:] == ("filtered", "full", "fixed")
    assert "filtered" not in credits.SIGNALS  # the paper's signals are a constant
    I, G, R = np.array([1]), np.array([1.0]), np.array([[0.0, 1.0]])  # noqa: E741 (the paper's name)
    p, P, mu = np.array([[0.5, 0.5]]), np.zeros((1, 2, 2)), np.array([[0.5, 0.5]])
    for name in ("filtered", "full", "fixed"):
        credit(name, I, G, p, P, mu, rewards_all=R)
    assert seen["filtered"][2] is None and seen["filtered"][0].tolist() == [1]  # no R under filtered feedback
    assert seen["full"][2].tolist() == R.tolist() and seen["full"][1].tolist() == [1.0]
    assert seen["fixed"][:2] == (None, None) and seen["fixed"][2].tolist() == R.tolist()
    with pytest.raises(ValueError, match="rewards_all is required by signal 'full'"):
        credit("full", I, G, p, P, mu)
    with pytest.raises(ValueError, match="G = R"):  # the deployed reward must be R^(I)
        credit("full", I, np.array([0.0]), p, P, mu, rewards_all=R)


@settings(max_examples=30, deadline=None)
@given(slates())
def test_a_signal_fixed_before_the_draw_does_not_read_it(rollout):
    """``before_draw`` is a claim about the function: every draw I gives the same credit."""
    _, _, p, P, mu, R = rollout
    K = p.shape[-1]
    for name in credits.names():
        if not credits.get(name).before_draw:
            continue
        by_draw = []
        for j in range(K):
            I = np.full(p.shape[:-1], j)  # noqa: E741
            by_draw.append(credit(name, I, R[..., j], p, P, mu, rewards_all=R))
        for c in by_draw[1:]:
            np.testing.assert_array_equal(c, by_draw[0])


def test_the_exact_budget_rule():
    assert credits.exact_budget("removal", 0.0) is None  # budget 0 is removal itself
    b = credits.exact_budget("removal", 0.3, "leverage")
    assert isinstance(b, ExactBudget) and (b.share, b.rule) == (0.3, "leverage")
    for name in ("wta", "oracle"):
        assert credits.exact_budget(name, 0.5) is None  # a simulated arm that takes none ignores it
        with pytest.raises(ValueError, match="'exact_budget' corrects the removal signal only"):
            credits.check_exact_budget(name, 0.5)
        credits.check_exact_budget(name, 0.0)
    credits.check_exact_budget("removal", 0.5)
    credits.check_exact_budget(None, 0.5)  # the signal is chosen later
    mu, R = np.full((2, 3), 0.5), np.zeros((2, 3))
    p = routing.router_propensities(np.zeros((2, 3)), 1.0, 0.1)
    P = routing.leave_one_out_propensities(np.zeros((2, 3)), 1.0, 0.1)
    with pytest.raises(ValueError, match="an exact budget corrects the removal signal only"):
        route_and_credit("wta", p, P, mu, R, np.random.default_rng(0), budget=ExactBudget(0.5),
                         budget_rng=np.random.default_rng(1))


# team: the shared team reward, added by one registration (the registry's proof)
# -------------------------------------------------------------------------------
def test_team_is_registered_as_a_filtered_feedback_signal():
    s = credits.get("team")
    assert (s.all_rewards, s.exact_budget, s.before_draw, s.paper) == (False, False, False, False)
    assert "team" not in credits.SIGNALS and "team" not in METHODS  # the book's arms are unchanged


@settings(max_examples=60, deadline=None)
@given(slates())
def test_team_credits_every_agent_with_the_deployed_reward(rollout):
    """Its definition: every agent i gets R(S) = G = R^(I) on each slate."""
    I, G, p, P, mu, R = rollout  # noqa: E741 (the paper's name)
    got = credit("team", I, G, p, P, mu, rewards_all=R)
    np.testing.assert_array_equal(got, np.broadcast_to(G[..., None], p.shape))
    assert got.dtype == float and got.flags.writeable
    # the unselected rewards are never read (filtered feedback)
    np.testing.assert_array_equal(credit("team", I, G, p, P, mu, rewards_all=1 - R), got)


def test_team_trains_the_simulated_pool():
    from mcpg.grpo import simulated as sim

    cfg = sim.SimConfig(updates=4, prompts_per_update=8, eval_questions=50, eval_every=2)
    run = sim.train_pool(cfg, "team", seeds=(0, 1), keep_slates=2)
    assert run.method == "team"
    for sl in run.slates:  # the loop credits each agent with G on every slate
        G = np.take_along_axis(sl["R"], sl["I"][..., None], -1)
        np.testing.assert_array_equal(sl["score"], np.broadcast_to(G, sl["score"].shape))
    assert np.isfinite(run.logits).all()
    assert not np.allclose(run.logits[:, -1], run.logits[:, 0])  # the actors were updated
    wta = sim.train_pool(cfg, "wta", seeds=(0, 1))
    assert not np.array_equal(run.logits[:, -1], wta.logits[:, -1])  # a credit of its own


@pytest.fixture
def hashed_rewards(monkeypatch):
    """A random model is never right, so every credit would be 0: reward each completion by a
    hash of its text (deterministic, about half of them right), so the team reward varies."""
    import zlib

    import mcpg.grpo.train as train_module

    def hashed(text, gold, truncated=False):
        return float(zlib.crc32(text.encode()) % 2)

    monkeypatch.setattr(train_module, "reward", hashed)


def test_team_trains_the_llm_engine(tmp_path, monkeypatch, hashed_rewards, one_torch_thread):
    import json
    from pathlib import Path

    from safetensors.torch import load_file

    from mcpg.grpo.train import train

    monkeypatch.setenv("MCPG_GSM8K_DIR", str(Path(__file__).parent / "fixtures" / "gsm8k"))
    run = tmp_path / "team"
    train("tiny-random", "team", run, updates=2)
    assert json.loads((run / "config.json").read_text())["signal"] == "team"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["signal"] == "team" for r in rows)
    for r in rows:  # each agent's mean credit is the mean deployed reward
        np.testing.assert_allclose(r["credit_mean"], [r["reward"]] * len(r["credit_mean"]))
    slates_log = [json.loads(line) for line in (run / "slates.jsonl").read_text().splitlines()]
    assert any(0 < np.mean(s["G"]) < 1 for s in slates_log)  # the team reward varies
    for s in slates_log:
        np.testing.assert_array_equal(s["score"], [[g] * len(sc) for g, sc in zip(s["G"], s["score"])])
    trained = [load_file(str(f)) for f in sorted((run / "adapters").glob("*/adapter_model.safetensors"))]
    assert trained and any(t.abs().max() > 0 for w in trained for k, t in w.items() if "lora_B" in k)
