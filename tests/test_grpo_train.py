"""mcpg.grpo end to end on a tiny random model on the CPU: train, evaluate, resume, bad input."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from mcpg.grpo.__main__ import main
from mcpg.grpo.configs import resolve_config
from mcpg.grpo.train import Engine, train
from mcpg.stats import EVAL_KEYS
from reference_runs import weight_files  # tests/reference_runs.py

warnings.filterwarnings("ignore", category=FutureWarning)
FIXTURE = Path(__file__).parent / "fixtures" / "gsm8k"
SRC = Path(__file__).resolve().parents[1] / "src"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(autouse=True)
def _fixture_data(monkeypatch):
    monkeypatch.setenv("MCPG_GSM8K_DIR", str(FIXTURE))


def _metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        r.pop("seconds")  # wall-clock time is the one thing allowed to differ
    return rows


def _subprocess_env() -> dict:
    """The environment of a training run in a fresh process: this checkout's source, one thread."""
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1", "MCPG_GSM8K_DIR": str(FIXTURE)}


def _train_in_subprocess(launcher: list[str], output: Path, *extra: str) -> subprocess.CompletedProcess:
    """``python <launcher> -m mcpg.grpo train`` of tiny-random with removal credit into ``output``,
    in a fresh process (:func:`_subprocess_env`); with ``--resume``, the run's own config."""
    config = [] if "--resume" in extra else ["--config", "tiny-random"]  # a resumed run has its own
    cmd = [sys.executable, *launcher, "-m", "mcpg.grpo", "train", *config,
           "--signal", "removal", "--output", str(output), *extra, "--no-progress"]
    # generous timeout: a loaded 2-core machine is many times slower than an idle one
    return subprocess.run(cmd, env=_subprocess_env(), capture_output=True, text=True, timeout=1800)


def _weights(run: Path) -> dict:
    files = weight_files(run)  # each agent's adapter (peft's format) and the router
    out = {f"adapters/{name}": load_file(str(f)) for name, f in files.items() if name != "router.safetensors"}
    out["router"] = load_file(str(files["router.safetensors"]))
    return out


@pytest.mark.parametrize("signal", ["wta", "removal", "oracle"])
def test_train_and_evaluate_end_to_end(tmp_path, capsys, signal):
    run = tmp_path / "run"
    rc = main(
        [
            "train",
            "--config",
            "tiny-random",
            "--signal",
            signal,
            "--output",
            str(run),
            "--updates",
            "2",
            "--no-progress",
        ]
    )
    assert rc == 0
    files = {str(p.relative_to(run)) for p in run.rglob("*") if p.is_file()}
    assert {
        "config.json",
        "metrics.jsonl",
        "eval.json",
        "router.safetensors",
        "adapters/money/adapter_model.safetensors",  # each agent in peft's format
        "adapters/money/adapter_config.json",
        "adapters/time/adapter_model.safetensors",
        "adapters/geometry/adapter_model.safetensors",
        "checkpoint/state.json",
        "checkpoint/optimizer.pt",
        "checkpoint/rng_rank0.pt",
    } <= files
    assert not any(f.endswith((".bin", ".pkl")) for f in files)
    saved = json.loads((run / "config.json").read_text())
    assert saved["signal"] == signal and saved["config"]["model"] == "tiny-random"
    rows = _metrics(run)
    assert [r["update"] for r in rows] == [1, 2]
    for r in rows:
        assert r["signal"] == signal and 0 <= r["reward"] <= r["oracle"] <= 1
        assert 0 <= r["entropy"] <= np.log(3) + 1e-9 and len(r["loss"]) == 3
        assert sum(r["selected_fraction"]) == pytest.approx(1.0)
    ev = json.loads((run / "eval.json").read_text())
    assert set(EVAL_KEYS) <= set(ev) and ev["n"] == 4 and ev["updates"] == 2
    assert ev["regret"] == pytest.approx(ev["oracle"] - ev["accuracy"])
    assert (
        0 <= ev["accuracy"] <= ev["oracle"] <= 1 and 0 <= ev["brier"] <= 1 and 0 <= ev["entropy"] <= np.log(3)
    )
    assert ev["specialization"] is None or 0 <= ev["specialization"] <= 1
    assert "base_accuracy" in ev and len(ev["agent_accuracy"]) == 3
    capsys.readouterr()
    # `evaluate --run` reloads the saved weights and reproduces the evaluation
    assert main(["evaluate", "--run", str(run), "--no-progress", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert {k: again[k] for k in EVAL_KEYS} == {k: ev[k] for k in EVAL_KEYS}


def test_removal_signal_moves_every_adapter(tmp_path):
    # All rewards are 0 for a random model, yet the removal signal is not (mu_hat != G), so
    # every agent gets non-zero advantages and its LoRA B matrices leave 0.
    run = tmp_path / "run"
    train("tiny-random", "removal", run, updates=1)
    for name, w in _weights(run).items():
        if name.startswith("adapters/"):
            assert max(float(v.abs().max()) for k, v in w.items() if "lora_B" in k) > 0, name


def test_resume_equals_uninterrupted(tmp_path):
    kw = dict(updates=3)
    full, cut = tmp_path / "full", tmp_path / "cut"
    ev_full = train("tiny-random", "removal", full, **kw)
    assert train("tiny-random", "removal", cut, stop_after=1, **kw) is None  # "crash" after update 1
    assert not (cut / "eval.json").exists() and len(_metrics(cut)) == 1
    # resume in a fresh process, as after a real interruption
    proc = _train_in_subprocess([], cut, "--resume")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _metrics(cut) == _metrics(full)
    ev_cut = json.loads((cut / "eval.json").read_text())
    assert ev_cut == json.loads((full / "eval.json").read_text()) == ev_full
    wf, wc = _weights(full), _weights(cut)
    assert wf.keys() == wc.keys()
    for name in wf:
        assert all(torch.equal(wf[name][k], wc[name][k]) for k in wf[name]), name


def test_resume_after_metrics_outran_the_checkpoint(tmp_path):
    # a crash between writing a metrics row and the checkpoint: resume drops the extra row
    full, cut = tmp_path / "full", tmp_path / "cut"
    train("tiny-random", "wta", full, updates=2, checkpoint_every=1)
    train("tiny-random", "wta", cut, updates=2, stop_after=1)
    with open(cut / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"update": 2, "stale": True}) + "\n")
    train("tiny-random", "wta", cut, resume=True)
    assert _metrics(cut) == _metrics(full)


def test_micro_batches_give_the_same_update():
    cfg = resolve_config("tiny-random")
    results = []
    for mb in (0, 5):
        eng = Engine(cfg.replace(train_micro_batch=mb), "removal")
        eng.update()
        results.append({n: eng.pool.adapter_state(n) for n in eng.pool.names})
    for n in results[0]:
        for k in results[0][n]:
            torch.testing.assert_close(
                results[0][n][k], results[1][n][k], rtol=1e-4, atol=1e-5
            )  # Adam steps are ~1e-2


def _one_agent_rollout(eng):
    """Two sampled completions of the pool's second agent to one prompt (6 tokens)."""
    agent = eng.agents[1]
    prompt = eng.pool.prompt("What is 2+3?", agent)
    torch.manual_seed(0)
    return eng.pool.generate([prompt] * 2, [agent.name] * 2, [agent.temperature] * 2, max_new_tokens=6)


def test_actor_update_ascends_the_advantage():
    """A positive advantage raises that completion's log-probability under its own adapter,
    a negative one lowers it, and other agents' adapters do not move."""
    cfg = resolve_config("tiny-random", learning_rate=1e-3, max_grad_norm=0)
    eng = Engine(cfg, "wta")
    agent = eng.agents[1]
    roll = _one_agent_rollout(eng)
    before = {n: eng.pool.adapter_state(n) for n in eng.pool.names}
    with torch.no_grad():
        lp0 = (eng.pool.token_logprobs(roll) * roll.completion_mask).sum(1)
    for _ in range(3):
        eng._actor_update(roll, torch.tensor([1.0, -1.0]))
    with torch.no_grad():
        lp1 = (eng.pool.token_logprobs(roll) * roll.completion_mask).sum(1)
    assert lp1[0] > lp0[0] and lp1[1] < lp0[1]
    for n in eng.pool.names:
        after = eng.pool.adapter_state(n)
        moved = any(not torch.equal(before[n][k], after[k]) for k in after)
        assert moved == (n == agent.name), n


def test_mask_truncated_completions_trains_only_on_the_finished_rows():
    """With the key set, a cut row leaves the loss and its normaliser: the update equals the one
    on the rollout without that row. Without it, the cut row is trained on."""
    cfg = resolve_config("tiny-random", learning_rate=1e-3, max_grad_norm=0)
    states = {}
    for name, masked, rows, adv in (("masked", True, [0, 1], [1.0, -1.0]),
                                    ("alone", False, [1], [-1.0]),
                                    ("unmasked", False, [0, 1], [1.0, -1.0])):
        eng = Engine(cfg.replace(mask_truncated_completions=masked), "wta")
        roll = _one_agent_rollout(eng)
        roll.truncated = torch.tensor([True, False])  # row 0 cut at the budget, row 1 finished
        eng._actor_update(roll.rows(rows), torch.tensor(adv))
        states[name] = eng.pool.adapter_state(eng.agents[1].name)

    def largest_difference(a, b):
        return max(float((states[a][k] - states[b][k]).abs().max()) for k in states[a])

    assert largest_difference("masked", "alone") < 1e-6  # float noise; Adam's steps are ~1e-3
    assert largest_difference("masked", "unmasked") > 1e-4


def test_mask_truncated_completions_leaves_an_all_cut_agent_still():
    cfg = resolve_config("tiny-random", learning_rate=1e-3, max_grad_norm=0,
                         mask_truncated_completions=True)
    eng = Engine(cfg, "wta")
    roll = _one_agent_rollout(eng)
    roll.truncated = torch.tensor([True, True])
    name = eng.agents[1].name
    before = eng.pool.adapter_state(name)
    eng._actor_update(roll, torch.tensor([1.0, -1.0]))
    after = eng.pool.adapter_state(name)
    assert all(torch.equal(before[k], after[k]) for k in after)


def test_bad_input(tmp_path, capsys):
    assert (
        main(["train", "--config", "tiny-random", "--signal", "shapley", "--output", str(tmp_path / "x")])
        == 2
    )
    assert "signal" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"base": "tiny-random", "lerning_rate": 0.1}))
    assert main(["train", "--config", str(bad), "--signal", "wta", "--output", str(tmp_path / "y")]) == 2
    assert "lerning_rate" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no run to resume"):
        train("tiny-random", "wta", tmp_path / "none", resume=True)
    run = tmp_path / "run"
    train("tiny-random", "wta", run, updates=1)
    with pytest.raises(ValueError, match="already holds a run"):
        train("tiny-random", "wta", run, updates=1)
    with pytest.raises(ValueError, match="signal"):
        train("tiny-random", "removal", run, resume=True)
    with pytest.raises(ValueError, match="prompts_per_update"):
        train("tiny-random", "wta", tmp_path / "z", prompts_per_update=50)
    assert main(["evaluate", "--run", str(tmp_path / "missing")]) == 2
    assert "no config.json" in capsys.readouterr().err


def test_two_cpu_processes_data_parallel(tmp_path):
    """`accelerate launch` with two CPU processes (gloo): the run completes, the evaluation
    covers every held-out problem, and the processes' weights stay identical (the engine
    checks after every update and raises otherwise)."""
    pytest.importorskip("accelerate")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    run = tmp_path / "ddp"
    proc = _train_in_subprocess(_launch_two(), run, "--updates", "2", "--json")
    # on failure: whether the run had finished (eval.json) and both ends of stderr, so that an
    # abort in a collective can be told from one at exit
    files = sorted(p.name for p in run.iterdir()) if run.is_dir() else []
    assert proc.returncode == 0, f"files: {files}\n{proc.stderr[:1500]}\n...\n{proc.stderr[-2500:]}"
    assert json.loads((run / "config.json").read_text())["processes"] == 2
    assert {p.name for p in (run / "checkpoint").glob("rng_rank*.pt")} == {"rng_rank0.pt", "rng_rank1.pt"}
    assert len(_metrics(run)) == 2
    ev = json.loads((run / "eval.json").read_text())
    assert ev["n"] == 4 and ev["updates"] == 2
    assert json.loads(proc.stdout)["n"] == 4  # one report, from the main process


def _launch_two() -> list[str]:
    return ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no"]


def test_data_parallel_update_equals_the_single_process_update(tmp_path):
    """The module's claim: with the loss normalised by global token counts and the gradients summed
    across processes, two processes that each hold half of a rollout make the same update as one
    process holding all of it: the same losses, gradients (after per-agent clipping), adapter
    weights after the AdamW step, and router (fitted on the gathered slates). Float sums differ in
    order only, so they agree to rounding (rtol 1e-5); a loss normalised by each process's own
    counts, or gradients not summed, would miss by far more (halved or doubled terms)."""
    pytest.importorskip("accelerate")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    script = str(Path(__file__).parent / "dp_actor_update.py")
    for launcher in ([], _launch_two()):
        proc = subprocess.run([sys.executable, *launcher, script, str(tmp_path)], env=_subprocess_env(),
                              capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-2500:]
    one, two = torch.load(tmp_path / "1.pt"), torch.load(tmp_path / "2.pt")
    np.testing.assert_allclose(two["losses"], one["losses"], rtol=1e-5, atol=1e-8)
    assert any(abs(x) > 1e-4 for x in one["losses"])  # the update did something
    assert one["grads"].keys() == two["grads"].keys() == one["weights"].keys() and len(one["grads"]) > 0
    for k in one["grads"]:  # the sums that make the update: to rounding
        torch.testing.assert_close(two["grads"][k], one["grads"][k], rtol=1e-5, atol=1e-8, msg=k)
    assert any(float(g.abs().max()) > 1e-4 for g in one["grads"].values())
    # AdamW's first step moves each weight by lr * g / (|g| + eps): where |g| is near eps (1e-8)
    # rounding in g shows in the step: the weights agree to 5e-6, a ten-thousandth of lr = 0.05
    for k in one["weights"]:
        torch.testing.assert_close(two["weights"][k], one["weights"][k], rtol=0, atol=5e-6, msg=k)
    assert two["router_loss"] == pytest.approx(one["router_loss"], rel=1e-5)
    for k in one["router"]:
        torch.testing.assert_close(two["router"][k], one["router"][k], rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------------
# the control (K = 1), health metrics, replay, initial evaluation, bounded evaluation batches
# ------------------------------------------------------------------------------------------
SOLO = [{"name": "solver", "role": "You are a helpful assistant.", "temperature": 0.7}]


def test_one_agent_control_runs_every_signal_as_plain_grpo(tmp_path):
    """K = 1: the agent is always deployed and removal (Eq. 19 with an empty leave-one-out slate)
    and the oracle both reduce to G, so every signal gives the same run."""
    runs = {}
    for signal in ("wta", "removal", "oracle"):
        runs[signal] = train({"base": "tiny-random", "agents": SOLO, "updates": 2}, signal, tmp_path / signal)
        rows = _metrics(tmp_path / signal)
        assert all(r["selected_fraction"] == [1.0] and r["entropy"] == 0.0 for r in rows)
        assert all(np.isclose(r["credit_mean"][0], r["reward"]) for r in rows)
    strip = [
        {k: v for k, v in r.items() if k not in ("signal", "router_loss", "brier")}
        for s in runs
        for r in _metrics(tmp_path / s)
    ]
    assert strip[:2] == strip[2:4] == strip[4:6]
    w = [load_file(str(tmp_path / s / "adapters" / "solver" / "adapter_model.safetensors")) for s in runs]
    for k in w[0]:
        torch.testing.assert_close(w[0][k], w[1][k])
        torch.testing.assert_close(w[0][k], w[2][k])


def test_health_metrics_and_initial_evaluation(tmp_path):
    ev = train({"base": "tiny-random", "updates": 2}, "removal", tmp_path / "run")
    rows = _metrics(tmp_path / "run")
    for r in rows:
        assert len(r["zero_std_fraction"]) == len(r["zero_std_reward_fraction"]) == 3
        assert all(0.0 <= x <= 1.0 for x in r["zero_std_fraction"] + r["zero_std_reward_fraction"])
        assert r["clip_fraction"] == 0.0  # one optimizer step per rollout: ratio 1, nothing clipped
    init = json.loads((tmp_path / "run" / "initial_eval.json").read_text())
    assert ev["initial_accuracy"] == init["accuracy"] and ev["initial_correct"] == init["correct"]
    assert ev["base_correct"] == init["base_correct"]  # the frozen model is evaluated once per run
    n = ev["n"]
    assert len(ev["correct"]) == len(ev["base_correct"]) == len(ev["initial_correct"]) == n
    assert np.mean(ev["correct"]) == ev["accuracy"] and np.mean(ev["base_correct"]) == ev["base_accuracy"]
    assert np.array(ev["agent_correct"]).shape == (n, 3)
    # agent-level keys: what the actors can do, read apart from the router
    agent = np.array(ev["agent_correct"], dtype=float)
    assert ev["agent_accuracy"] == pytest.approx(agent.mean(0).tolist())
    assert ev["best_of_k"] == ev["oracle"] == pytest.approx(agent.max(1).mean())
    assert ev["uniform_accuracy"] == pytest.approx(np.mean(ev["agent_accuracy"]))
    assert ev["uniform_correct"] == pytest.approx(agent.mean(1).tolist())
    mu = np.array(ev["mu_hat"])
    assert mu.shape == (n, 3) and ((mu > 0) & (mu < 1)).all()
    # the deployed candidate is the top score, and mu_hat = sigmoid(score) is monotone in it
    dep = np.array(ev["correct"]) == agent[np.arange(n), mu.argmax(1)]
    assert dep.all()
    for key in ("router_auc", "router_auc_within"):
        assert ev[key] is None or 0.0 <= ev[key] <= 1.0
    assert 0.0 <= ev["truncated"] <= 1.0 and ev["strict_accuracy"] <= ev["flexible_accuracy"] + 1e-12


def test_untrained_agent_with_the_reference_prompt_is_the_base_model():
    """LoRA's B starts at 0 and the control's role equals the reference prompt, so before any update
    its greedy answers are the frozen model's, token for token: initial_accuracy = base_accuracy."""
    cfg = resolve_config({"base": "tiny-random", "agents": SOLO, "eval_max_new_tokens": 12})
    eng = Engine(cfg, "wta")
    qs = [p["question"] for p in eng.eval_set]
    prompts, adapters, temps, _ = eng.prompt_rows(qs, 1, with_base=True)
    assert prompts[0::2] == prompts[1::2]
    roll = eng.pool.generate(prompts, adapters, temps, 12, greedy=True)
    assert roll.texts[0::2] == roll.texts[1::2]


def test_router_learns_from_a_replay_of_logged_slates(tmp_path):
    train({"base": "tiny-random", "updates": 3}, "removal", tmp_path / "all")
    train({"base": "tiny-random", "updates": 3, "router_replay": 1}, "removal", tmp_path / "one")
    per_update = 2 * 2  # prompts_per_update * completions_per_agent slates
    assert [r["router_slates"] for r in _metrics(tmp_path / "all")] == [
        per_update,
        2 * per_update,
        3 * per_update,
    ]
    assert [r["router_slates"] for r in _metrics(tmp_path / "one")] == [per_update] * 3


def test_evaluation_generates_in_bounded_batches(monkeypatch):
    cfg = resolve_config({"base": "tiny-random", "eval_batch_size": 3})
    eng = Engine(cfg, "wta")
    seen = []
    real = eng.pool.generate

    def spy(prompts, *a, batch_size=None, **kw):
        seen.append((len(prompts), batch_size))
        return real(prompts, *a, batch_size=batch_size, **kw)

    monkeypatch.setattr(eng.pool, "generate", spy)
    eng.evaluate()
    assert seen and all(bs == 3 for _, bs in seen)


@pytest.mark.parametrize("stop", [False, True])
def test_stop_at_answer_reaches_rollouts_and_evaluation(monkeypatch, stop):
    cfg = resolve_config({"base": "tiny-random", "stop_at_answer": stop, "updates": 1})
    eng = Engine(cfg, "removal")
    seen = []
    real = eng.pool.generate

    def spy(prompts, *a, **kw):
        seen.append((kw.get("greedy", False), kw["stop_at_answer"]))
        return real(prompts, *a, **kw)

    monkeypatch.setattr(eng.pool, "generate", spy)
    eng.update()
    eng.evaluate()
    assert {g for g, _ in seen} == {False, True}  # a rollout and an evaluation
    assert all(s is stop for _, s in seen)


@pytest.mark.parametrize("scale", ["group", "none"])
def test_advantages_scale_rewards(scale):
    from mcpg.grpo.objective import group_advantages

    rng = np.random.default_rng(0)
    scores = rng.normal(size=(4, 6, 3))
    scores[0, :, 1] = 0.0  # a group with no spread
    scores[1, :, 2] = 1e-5 * rng.normal(size=6)  # estimator noise of the size of mu_hat
    adv = group_advantages(scores, scale, 1e-4, axis=1)
    np.testing.assert_allclose(adv.mean(axis=1), 0.0, atol=1e-12)
    assert np.all(adv[0, :, 1] == 0.0)
    if scale == "none":
        np.testing.assert_allclose(adv, scores - scores.mean(1, keepdims=True))
    else:
        assert np.abs(adv[1, :, 2]).max() < 0.2  # eps = 1e-4 keeps noise small (1e-6 made it ~1)
        np.testing.assert_allclose(adv[2:].std(axis=1, ddof=1), 1.0, rtol=1e-3)  # TRL: unbiased std


def test_within_slate_auc_counts_pairs_of_one_problem():
    from mcpg.stats import within_slate_auc

    mu = [[0.9, 0.1, 0.5], [0.2, 0.3, 0.3], [0.4, 0.6, 0.5]]
    R = [[1, 0, 0], [0, 1, 0], [1, 1, 1]]  # the last slate has no wrong candidate: no pairs
    # pairs: (0>1 yes), (0>2 yes), (1 vs 0: 0.3>0.2 yes), (1 vs 2: tie, one half)
    assert within_slate_auc(mu, R) == pytest.approx(3.5 / 4)
    # pooled over problems the same scores rank differently: 0.4 (right) < 0.5 (wrong) etc.
    from mcpg.stats import roc_auc

    assert roc_auc(np.ravel(mu), np.ravel(R)) != pytest.approx(3.5 / 4)
    assert within_slate_auc([[0.1, 0.2]], [[1, 1]]) is None
    with pytest.raises(ValueError, match="shape"):
        within_slate_auc([0.1, 0.2], [1, 0])


def test_a_recorded_config_without_router_features_reads_as_basic():
    from mcpg.grpo.configs import resolve_config, saved_config

    old = resolve_config("tiny-random").to_dict()
    del old["router_features"]
    assert saved_config(old)["router_features"] == "basic"
    assert saved_config({**old, "router_features": "calculation"})["router_features"] == "calculation"
    assert resolve_config("tiny-random")["router_features"] == "calculation"
    with pytest.raises(ValueError, match="router_features"):
        resolve_config("tiny-random", router_features="judge")


# --- exact evaluations on a budget (config keys exact_budget, allocation; chapter 9) ----------

EXACT_KEYS = ("exact_evaluations", "feedback_cost", "exact_share", "exact_share_expected")


@pytest.fixture
def some_rewards(monkeypatch):
    """A random model is never right, so every credit would be 0: reward each completion by a
    hash of its text instead (deterministic, about half of them right), so the signals differ."""
    import zlib

    import mcpg.grpo.train as train_module

    def hashed(text, gold, truncated=False):
        return float(zlib.crc32(text.encode()) % 2)

    monkeypatch.setattr(train_module, "reward", hashed)


def _without(rows, keys):
    return [{k: v for k, v in r.items() if k not in keys} for r in rows]


def test_exact_budget_zero_is_removal_and_one_is_oracle(tmp_path, some_rewards):
    kw = dict(updates=3)
    runs = {name: tmp_path / name for name in ("removal", "oracle", "b0", "b1", "b05")}
    train("tiny-random", "removal", runs["removal"], **kw)
    train("tiny-random", "oracle", runs["oracle"], **kw)
    train("tiny-random", "removal", runs["b0"], exact_budget=0.0, **kw)
    train("tiny-random", "removal", runs["b1"], exact_budget=1.0, allocation="sqrt", **kw)
    train("tiny-random", "removal", runs["b05"], exact_budget=0.5, **kw)
    m = {k: _metrics(v) for k, v in runs.items()}
    assert any(r["reward"] > 0 for r in m["oracle"])  # the fixture's rewards are not all 0
    assert m["b0"] == m["removal"]  # bit for bit, every metric
    for r in m["b0"]:
        assert [r[k] for k in EXACT_KEYS] == [0, 0, 0.0, 0.0]
    assert _without(m["b1"], {"signal", *EXACT_KEYS}) == _without(m["oracle"], {"signal", *EXACT_KEYS})
    for r in m["b1"]:  # 2 prompts x 2 slates, each evaluated at K - 1 = 2 extra queries
        assert [r[k] for k in EXACT_KEYS] == [4, 8, 1.0, 1.0]
    assert _without(m["b05"], EXACT_KEYS) != _without(m["removal"], EXACT_KEYS)  # the check can fail
    for r in m["b05"]:
        assert r["feedback_cost"] == 2 * r["exact_evaluations"]
        assert r["exact_share"] == r["exact_evaluations"] / 4
        assert r["exact_share_expected"] == pytest.approx(0.5)
    for a, b in (("b0", "removal"), ("b1", "oracle")):
        wa, wb = _weights(runs[a]), _weights(runs[b])
        for name in wa:
            assert all(torch.equal(wa[name][k], wb[name][k]) for k in wa[name]), (a, name)
    slates = [json.loads(line) for line in (runs["b05"] / "slates.jsonl").read_text().splitlines()]
    assert all(len(s["exact_z"]) == len(s["exact_p"]) == 4 for s in slates)


def test_exact_budget_resumes_as_uninterrupted(tmp_path, some_rewards):
    kw = dict(updates=3, exact_budget=0.5)
    full, cut = tmp_path / "full", tmp_path / "cut"
    train("tiny-random", "removal", full, **kw)
    assert train("tiny-random", "removal", cut, stop_after=2, **kw) is None
    assert (cut / "checkpoint" / "budget_rank0.json").exists()
    train(None, "removal", cut, resume=True)  # the run's own config (exact_budget 0.5)
    assert _metrics(cut) == _metrics(full)


def test_exact_budget_config_is_checked():
    cfg = resolve_config("tiny-random")
    assert cfg["exact_budget"] == 0.0 and cfg["allocation"] == "sqrt"
    bads = ({"exact_budget": 1.5}, {"exact_budget": -0.1}, {"exact_budget": True}, {"allocation": "best"})
    for bad in bads:
        with pytest.raises(ValueError, match=next(iter(bad))):
            cfg.replace(**bad)
    with pytest.raises(ValueError, match="removal"):
        Engine(cfg.replace(exact_budget=0.1), "wta")


def test_close_process_group_stops_a_started_group(monkeypatch):
    """The CLI ends every run by destroying torch.distributed's group (a gloo worker left
    running at exit can abort the process after the run finished); with no group it is a no-op."""
    from mcpg.grpo._runtime import close_process_group

    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    close_process_group()  # nothing started: nothing happens
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29533")
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    assert torch.distributed.is_initialized()
    close_process_group()
    assert not torch.distributed.is_initialized()
