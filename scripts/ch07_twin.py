"""Chapter 7's twin of chapter 8: fit it to chapter 8's slates, then predict, then ablate.

Two stages, each writing one JSON file under ``data/results/ch07/twin/`` with the command,
the commit, the date, the machine and the seeds:

- ``predict`` (``predictions.json``): the twin (:mod:`mcpg.grpo.simulated.twin`), fitted to
  chapter 8's recorded grid of record as it stands (its untrained pool's first rollout, pooled
  over the ten seeds, and winner-take-all's centred runs over training), its matched measures
  beside chapter 8's and chapter 7's default pool's, and its predictions: winner-take-all,
  removal (Eq. 19) and the oracle under both scalings on 30 seeds (400-429), each seed's final
  held-out deployed accuracy and agents' mean sampled accuracy;
- ``ablate`` (``ablations.json``): the twin with one variable at a time moved back to chapter
  7's default (:data:`mcpg.grpo.simulated.ABLATIONS`), the same signals, scalings and seeds.

The fit reads only runs committed under ``data/results/ch08/grid-mask``; the oracle's seeds 3
to 9 do not change it (every arm of a seed rolls out the same untrained pool, and the fit of
training measures reads winner-take-all). Run from the repository root (minutes on one core)::

    OMP_NUM_THREADS=1 python scripts/ch07_twin.py predict
    OMP_NUM_THREADS=1 python scripts/ch07_twin.py ablate
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from mcpg.grpo import rundir
from mcpg.grpo import simulated as sim
from mcpg.grpo.provenance import commit_state, machine_info
from mcpg.grpo.slate_measures import first_rollout

OUT = Path("data/results/ch07/twin")
GRID8 = Path("data/results/ch08/grid-mask")
SEEDS = list(range(400, 430))
SIGNALS = ("wta", "removal", "oracle")
SCALINGS = ("group", "none")
FIT_SEEDS = range(8)
"""Seeds of the calibration's short training runs (not the predictions' seeds)."""


def chapter8_targets() -> tuple[dict, dict]:
    """Chapter 8's first rollout (pooled over seeds; a centred run first, which logs the cut
    flags) and winner-take-all's centred runs' measures over training (mean over updates, then
    over seeds)."""
    from mcpg.grpo.slate_measures import grid_measures

    runs = [r for r in rundir.read_comparison(GRID8) if r.eval is not None and r.arm != "control"]
    order = {"wta-none": 0, "removal-none": 1, "oracle-none": 2}
    runs.sort(key=lambda r: (order.get(r.arm, 3), int(r.config.get("seed", 0))))
    first = first_rollout(runs)
    wta = grid_measures([r for r in runs if r.arm == "wta-none"], alignment=False)
    training = wta.xs("mean", level="when").mean(numeric_only=True).to_dict()
    return first, {k: float(v) for k, v in training.items()}


def fit_twin(first: dict, training: dict) -> tuple[sim.SimConfig, list[str]]:
    """The twin and the steps of its calibration, in order."""
    base = sim.SimConfig(prompts_per_update=8, updates=32, router_tau=1.0, router_eps=0.1,
                         max_grad_norm=1.0, specialty_bonus=0.0, scale_rewards="none")
    twin = sim.fit_competence(first, base)
    steps = ["competence and unsolvable share: least squares on the first rollout's "
             + ", ".join(sim.MATCHED)]
    twin = sim.fit_scalar(twin, "router_tau", training["exploration"], "exploration", "wta",
                          (0.05, 1.0), FIT_SEEDS, tol=0.005)
    steps.append(f"router_tau: winner-take-all's exploration over training ({training['exploration']:.3f})")
    twin = sim.fit_scalar(twin, "check_flip", training["auc"], "auc", "wta", (0.45, 0.0), FIT_SEEDS,
                          tol=0.005)
    steps.append(f"check_flip: winner-take-all's AUC over training ({training['auc']:.3f})")
    twin = sim.fit_scalar(twin, "learning_rate", training["accuracy"], "accuracy", "wta", (0.01, 1.0),
                          FIT_SEEDS, tol=0.005)
    steps.append("learning_rate: winner-take-all's sampled accuracy over training "
                 f"({training['accuracy']:.3f})")
    return twin, steps


def _config(cfg: sim.SimConfig) -> dict:
    d = dataclasses.asdict(cfg)
    return json.loads(json.dumps(d, default=list))


def _arms(cfg: sim.SimConfig) -> list[dict]:
    out = []
    for sc in SCALINGS:
        for sig in SIGNALS:
            run = sim.train_pool(dataclasses.replace(cfg, scale_rewards=sc), sig, SEEDS)
            out.append({"scale_rewards": sc, "signal": sig,
                        "accuracy": [float(v) for v in run.metrics["accuracy"][:, -1]],
                        "sampled_accuracy": [float(v) for v in run.metrics["sampled_accuracy"][:, -1]],
                        "initial_accuracy": [float(v) for v in run.metrics["accuracy"][:, 0]],
                        "seconds": round(run.seconds, 2)})
            print(f"  {sc} {sig}: deployed {np.mean(out[-1]['accuracy']):.3f}", flush=True)
    return out


def _header() -> dict:
    threads = os.environ.get("OMP_NUM_THREADS", "")
    return {"command": f"OMP_NUM_THREADS={threads} python " + " ".join(sys.argv),
            **commit_state(), "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "machine": machine_info(), "seeds": SEEDS}


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


def predict(out: Path) -> None:
    t0 = time.perf_counter()
    first, training = chapter8_targets()
    twin, steps = fit_twin(first, training)
    default = sim.SimConfig()
    measures = {
        "chapter 8": first,
        "twin": sim.untrained_measures(twin, seeds=range(4), prompts=500),
        "twin, exact": sim.competence_expectations(twin),
        "chapter 7's default pool": sim.untrained_measures(default, seeds=range(4), prompts=500),
    }
    over_training = {"chapter 8, winner-take-all centred": training,
                     "twin, winner-take-all centred": sim.training_measures(twin, "wta", FIT_SEEDS)}
    print("fitted; predicting", flush=True)
    data = {**_header(), "twin": _config(twin), "calibration": steps, "first_rollout": measures,
            "over_training": over_training, "arms": _arms(twin)}
    data["seconds"] = round(time.perf_counter() - t0, 1)
    _write(out / "predictions.json", data)


def ablate(out: Path) -> None:
    t0 = time.perf_counter()
    pred = json.loads((out / "predictions.json").read_text())
    twin_d = dict(pred["twin"])
    twin_d["competence"] = sim.Competence(**{k: (tuple(v) if isinstance(v, list) else v)
                                             for k, v in twin_d["competence"].items()})
    twin_d["answer_probs"] = tuple(tuple(r) for r in twin_d["answer_probs"])
    twin_d["type_names"] = tuple(twin_d["type_names"])
    twin = sim.SimConfig(**twin_d)
    data = {**_header(), "twin_commit": pred["commit"], "ablations": []}
    path = out / "ablations.json"
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("seeds") == SEEDS and old.get("twin_commit") == pred["commit"]:
            data["ablations"] = old["ablations"]
    done = {a["name"] for a in data["ablations"]}
    for name, what in sim.ABLATIONS.items():
        if name in done:
            continue
        print(f"ablation {name}: {what}", flush=True)
        cfg = sim.ablation(twin, name)
        data["ablations"].append({"name": name, "what": what, "config": _config(cfg), "arms": _arms(cfg)})
        _write(path, data)
    data["seconds"] = round(time.perf_counter() - t0, 1)
    _write(path, data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("stage", choices=("predict", "ablate"))
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args()
    (predict if a.stage == "predict" else ablate)(a.out)


if __name__ == "__main__":
    main()
