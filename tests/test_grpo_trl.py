"""Our clipped GRPO loss, advantages and token log-probabilities against TRL's GRPOTrainer.

TRL's ``GRPOTrainer._compute_loss`` is called directly on a hand-made batch (prompt and
completion ids, masks, advantages, old and reference log-probabilities), for each token
aggregation (``loss_type``) that :func:`mcpg.grpo.objective.clipped_grpo_loss` implements (the
default is TRL's default, ``"dapo"``), with and without the KL term (``beta``). TRL's
``_generate_and_score_completions`` turns given rewards into advantages for each
``scale_rewards``, against :func:`mcpg.grpo.objective.group_advantages`.
"""

import inspect
import warnings

import pytest
import torch

pytest.importorskip("trl")

from mcpg.grpo.agents import AgentPool, AgentSpec, Rollout  # noqa: E402
from mcpg.grpo.models import load_base  # noqa: E402
from mcpg.grpo.objective import SCALE_REWARDS, clipped_grpo_loss, group_advantages  # noqa: E402

TEMPERATURE = 0.7
REWARDS: list[float] = []
"""What the trainer's reward function returns (empty: zeros)."""


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tok, _ = load_base("tiny-random", seed=3)
    ds = Dataset.from_list([{"prompt": "What is 2+3?"}, {"prompt": "Add 4 and 5."}] * 2)
    args = GRPOConfig(output_dir=str(tmp_path_factory.mktemp("trl")), per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=6, report_to="none", use_cpu=True,
                      save_strategy="no", bf16=False, fp16=False, max_steps=1, temperature=TEMPERATURE)
    def rewards(completions, **kw):  # the rewards a test puts in REWARDS, else 0
        return list(REWARDS) or [0.0] * len(completions)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tr = GRPOTrainer(model=model, reward_funcs=rewards, args=args, train_dataset=ds, processing_class=tok)
    tr.current_gradient_accumulation_steps = 1  # set by the training loop; one batch, no accumulation
    return tr


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    N, P, T = 4, 5, 6
    prompt_ids = torch.randint(0, 250, (N, P), generator=g)
    completion_ids = torch.randint(0, 250, (N, T), generator=g)
    completion_mask = torch.ones(N, T, dtype=torch.long)
    completion_mask[0, 4:] = 0
    completion_mask[2, 2:] = 0
    return dict(prompt_ids=prompt_ids, prompt_mask=torch.ones(N, P, dtype=torch.long),
                completion_ids=completion_ids, completion_mask=completion_mask,
                advantages=torch.tensor([1.0, -0.5, 0.3, -0.8]),
                num_items_in_batch=completion_mask.sum())


def _trl_logps(tr, b):
    ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
    mask = torch.cat([b["prompt_mask"], b["completion_mask"]], 1)
    logps, _, _ = tr._get_per_token_logps_and_entropies(tr.model, ids, mask, b["completion_ids"].shape[1])
    return logps


def _both_losses(trainer, b, old, loss_type, **extra):
    """TRL's ``_compute_loss`` on batch ``b`` and ours (:func:`clipped_grpo_loss` with its
    statistics) on the same log-probs, each with its gradient: (loss, grads, ours, stats,
    grads_ours, kw)."""
    trainer.model.zero_grad()
    loss_trl = trainer._compute_loss(trainer.model, b)
    loss_trl.backward()
    grads_trl = [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]
    trainer.model.zero_grad()
    kw = dict(clip_eps=trainer.epsilon_low, clip_eps_high=trainer.epsilon_high, loss_type=loss_type,
              max_completion_length=trainer.max_completion_length)
    ours, stats = clipped_grpo_loss(_trl_logps(trainer, b), old, b["advantages"], b["completion_mask"],
                                    return_stats=True, **kw, **extra)
    ours.backward()
    grads_ours = [p.grad.clone() for p in trainer.model.parameters() if p.grad is not None]
    return loss_trl, grads_trl, ours, stats, grads_ours, kw


@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo", "dr_grpo"])
def test_clipped_loss_equals_trl(trainer, loss_type):
    b = _batch()
    trainer.model.train()
    with torch.no_grad():
        ref = _trl_logps(trainer, b)
    # old log-probs off by up to ~0.3 nats so that some ratios leave [1 - eps, 1 + eps] and clip
    old = ref + 0.3 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(1))
    b["old_per_token_logps"] = old
    trainer.loss_type = loss_type
    try:
        loss_trl, grads_trl, ours, stats, grads_ours, _ = _both_losses(trainer, b, old, loss_type)
    finally:
        trainer.loss_type = "dapo"
        trainer.model.zero_grad()
    ratio = torch.exp(ref - old)[b["completion_mask"].bool()]
    assert ((ratio < 0.8) | (ratio > 1.2)).any(), "the batch should exercise clipping"
    torch.testing.assert_close(ours.detach(), loss_trl.detach(), rtol=1e-6, atol=1e-7)
    # the statistics beside the loss: TRL's logged clip ratios of this very call
    logged = {k: v[-1] for k, v in trainer._metrics["train"].items() if k.startswith("clip_ratio/")}
    means = stats.means()
    assert means["clip_ratio/low_mean"] > 0 and means["clip_ratio/high_mean"] > 0  # both sides clip
    for k in ("clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean"):
        assert means[k] == pytest.approx(logged[k], abs=1e-7), k
    # CleanRL's approx_kl: the mean of (r - 1) - log r over the counted tokens
    m = b["completion_mask"].bool()
    lr = (ref - old)[m].double()
    assert means["approx_kl"] == pytest.approx(float((lr.exp() - 1 - lr).mean()), rel=1e-5)
    assert int(stats.tokens) == int(m.sum()) and means["kl"] == 0.0
    assert len(grads_ours) == len(grads_trl) > 0
    for a, c in zip(grads_ours, grads_trl):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-7)


def test_trl_default_loss_type_is_what_we_default_to(trainer):
    from trl import GRPOConfig

    assert GRPOConfig.__dataclass_fields__["loss_type"].default == "dapo"
    assert clipped_grpo_loss.__defaults__[2] == "dapo"


def test_agent_logprobs_equal_trl(trainer):
    """One agent's token log-probabilities and its policy's entropies (sampling temperature
    included) equal TRL's."""
    b = _batch(seed=2)
    base = trainer.model
    tok = trainer.processing_class
    pool = AgentPool(base, tok, [AgentSpec("alpha", "r", TEMPERATURE), AgentSpec("beta", "r", 1.3)], lora_r=2)
    try:
        n = b["prompt_ids"].shape[0]
        roll = Rollout(b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"], [""] * n,
                       ["alpha"] * n, torch.full((n,), TEMPERATURE))
        with torch.no_grad():
            ours = pool.token_logprobs(roll)
            ours_again, entropy = pool.token_logprobs(roll, with_entropy=True)
            pool.model.eval()
            with pool.model.disable_adapter():  # LoRA B = 0 at init anyway; compare against the bare base
                ref = _trl_logps(trainer, b)
                ids = torch.cat([b["prompt_ids"], b["completion_ids"]], 1)
                mask = torch.cat([b["prompt_mask"], b["completion_mask"]], 1)
                _, ref_entropy, _ = trainer._get_per_token_logps_and_entropies(
                    trainer.model, ids, mask, b["completion_ids"].shape[1], compute_entropy=True)
        m = b["completion_mask"].bool()
        torch.testing.assert_close(ours[m], ref[m], rtol=1e-5, atol=1e-5)
        assert torch.equal(ours_again, ours)  # asking for the entropy leaves the log-probabilities alone
        torch.testing.assert_close(entropy[m], ref_entropy[m], rtol=1e-5, atol=1e-5)  # TRL's entropies
    finally:
        pool.model.unload()  # take the adapters off the shared module-scoped model
        for p in base.parameters():  # and give it back trainable, as the pool found it
            p.requires_grad_(True)


@pytest.mark.parametrize("bias_correction", [True, False])
@pytest.mark.parametrize("loss_type", ["dapo", "bnpo", "grpo", "dr_grpo"])
def test_kl_term_equals_trl(trainer, loss_type, bias_correction):
    """``beta`` > 0: the loss with TRL's k3 KL term to a reference policy, and its gradient, equal
    TRL's, with and without TRL's ``use_bias_correction_kl`` (its default: on)."""
    from trl import GRPOConfig

    assert GRPOConfig.__dataclass_fields__["use_bias_correction_kl"].default is True
    assert inspect.signature(clipped_grpo_loss).parameters["use_bias_correction_kl"].default is True
    b = _batch(seed=4)
    trainer.model.train()
    with torch.no_grad():
        cur = _trl_logps(trainer, b)
    g = torch.Generator().manual_seed(5)
    old = cur + 0.3 * torch.randn(cur.shape, generator=g)
    ref = cur + 0.5 * torch.randn(cur.shape, generator=g)  # a reference policy some way off
    b["old_per_token_logps"], b["ref_per_token_logps"] = old, ref
    beta = 0.3
    trainer.loss_type, trainer.beta = loss_type, beta
    trainer.args.use_bias_correction_kl = bias_correction
    try:
        loss_trl, grads_trl, ours, stats, grads_ours, kw = _both_losses(
            trainer, b, old, loss_type, beta=beta, logp_ref=ref, use_bias_correction_kl=bias_correction)
        trainer.model.zero_grad()
        without = clipped_grpo_loss(cur, old, b["advantages"], b["completion_mask"], **kw)
    finally:
        trainer.loss_type, trainer.beta = "dapo", 0.0
        trainer.args.use_bias_correction_kl = True
        trainer.model.zero_grad()
    assert abs(float(ours.detach()) - float(without)) > 1e-3, "the KL term should move the loss"
    torch.testing.assert_close(ours.detach(), loss_trl.detach(), rtol=1e-6, atol=1e-7)
    assert stats.means()["kl"] == pytest.approx(trainer._metrics["train"]["kl"][-1], rel=1e-5)  # TRL's "kl"
    assert len(grads_ours) == len(grads_trl) > 0
    for a, c in zip(grads_ours, grads_trl):
        torch.testing.assert_close(a, c, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("scale_rewards", SCALE_REWARDS)
def test_advantages_equal_trl(trainer, scale_rewards):
    """Each agent's advantages (K = 2 agents, B = 3 prompts, m = 4 completions) equal those TRL's
    ``GRPOTrainer`` computes from the same rewards with the same ``scale_rewards``: each agent is
    one GRPO problem whose batch is its own B x m scores."""
    assert set(SCALE_REWARDS) == {"group", "batch", "none"}  # TRL's three values
    B, m = 3, 4
    agent0 = torch.tensor([[0.0, 1, 1, 0], [3, 3, 5, 9], [2, 2, 2, 2]])  # its last group has no spread
    agent1 = torch.tensor([[1.0, 0, 0, 0], [0, 0, 0, 1], [1, 1, 0, 1]])
    scores = torch.stack([agent0, agent1], -1)  # (B, m, K)
    ours = group_advantages(scores.double(), scale_rewards, batch_axis=0)
    questions = ["What is 2+3?", "Add 4 and 5.", "Hi"]
    inputs = [{"prompt": q} for q in questions for _ in range(m)]  # TRL's layout: each prompt m times
    trainer.model.train()
    trainer.scale_rewards = scale_rewards
    try:
        for k in range(2):
            REWARDS[:] = scores[..., k].reshape(-1).tolist()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out = trainer._generate_and_score_completions(inputs)
            trl = out["advantages"].reshape(B, m).double()
            torch.testing.assert_close(ours[..., k], trl, rtol=1e-6, atol=1e-6)
    finally:
        REWARDS.clear()
        trainer.scale_rewards = "group"
    if scale_rewards == "batch":  # the check can fail: the batch's std is not the group's
        assert not torch.allclose(ours, group_advantages(scores.double(), "group"), atol=1e-3)
