"""One evaluation of the untrained pool per seed, shared by the seed's arms (train's
``initial_eval``): a run given another arm's evaluation writes the files it would have written
computing it, and a run whose untrained pool differs is refused before anything is written."""

import json

import pytest

from mcpg.grpo import __main__ as cli
from mcpg.grpo.train import TRAINING_ONLY_KEYS, initial_eval_key, train

pytestmark = pytest.mark.usefixtures("one_torch_thread", "gsm8k_fixture")


def _rows(path):
    """metrics.jsonl without the wall times (the one thing two identical runs differ in)."""
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


@pytest.fixture(scope="module")
def arms(tmp_path_factory):
    """wta and removal computing their own evaluation, and removal given wta's."""
    mp = pytest.MonkeyPatch()
    from conftest import GSM8K_FIXTURE

    mp.setenv("MCPG_GSM8K_DIR", str(GSM8K_FIXTURE))
    root = tmp_path_factory.mktemp("shared")
    train("tiny-random", "wta", root / "wta")
    train("tiny-random", "removal", root / "removal")
    train("tiny-random", "removal", root / "removal-shared", initial_eval=root / "wta")
    mp.undo()
    return root


def test_a_shared_evaluation_changes_no_file(arms):
    wta, own, shared = arms / "wta", arms / "removal", arms / "removal-shared"
    # the premise: the arms of a seed evaluate the untrained pool byte for byte alike
    assert (wta / "initial_eval.json").read_bytes() == (own / "initial_eval.json").read_bytes()
    for name in ("initial_eval.json", "eval.json", "slates.jsonl", "config.json"):
        assert (shared / name).read_bytes() == (own / name).read_bytes(), name
    assert _rows(shared / "metrics.jsonl") == _rows(own / "metrics.jsonl")
    prov = json.loads((shared / "PROVENANCE.json").read_text())
    assert prov["initial_eval_from"] == str(wta.resolve())
    assert prov["calls"][0]["initial_eval_from"] == str(wta.resolve())
    assert "initial_eval_from" not in json.loads((own / "PROVENANCE.json").read_text())


@pytest.mark.parametrize("change, named", [({"seed": 1}, "'seed'"), ({"eval_max_new_tokens": 4},
                                           "'eval_max_new_tokens'"), ({"eval_problems": 2}, "held out")])
def test_another_untrained_pool_is_refused_before_anything_is_written(arms, tmp_path, change, named):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=named):
        train("tiny-random", "removal", out, initial_eval=arms / "wta", **change)
    assert not out.exists() or not any(out.iterdir())


def test_training_keys_do_not_enter_the_key_and_the_rest_do():
    from mcpg.grpo.configs import resolve_config

    base = resolve_config("tiny-random", signal="wta").to_dict()
    key = initial_eval_key(base, {"eval_sha256": "x"}, "m", "c")
    assert not set(key["config"]) & set(TRAINING_ONLY_KEYS)
    assert set(key["config"]) | set(TRAINING_ONLY_KEYS) == set(base)
    other = dict(base, signal="removal", scale_rewards="none", learning_rate=0.5)
    assert initial_eval_key(other, {"eval_sha256": "x"}, "m", "c") == key
    assert initial_eval_key(dict(base, router_hidden=8), {"eval_sha256": "x"}, "m", "c") != key
    assert initial_eval_key(base, {"eval_sha256": "x"}, "m", "other code") != key


def test_bad_sources_and_resume_end_in_one_line(arms, tmp_path, capsys):
    out = tmp_path / "run"
    code = cli.main(["train", "--config", "tiny-random", "--signal", "removal", "--output", str(out),
                     "--initial_eval", str(tmp_path / "nowhere"), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no initial_eval.json" in err[0]
    with pytest.raises(ValueError, match="not with resume"):
        train(None, "removal", arms / "removal", resume=True, initial_eval=arms / "wta")
    with pytest.raises(ValueError, match="eval_initial"):
        train("tiny-random", "removal", out, initial_eval=arms / "wta", eval_initial=False)
