"""One actor update of a fixed rollout, in one process or as one of several data-parallel processes
(tests/test_grpo_train.py::test_data_parallel_update_equals_the_single_process_update).

    python tests/dp_actor_update.py OUT                                  # one process: every row
    accelerate launch --multi_gpu --num_processes 2 tests/dp_actor_update.py OUT   # two: a share each

Every process builds the same engine (tiny-random, K = 3 agents, m = 2, two problems), generates
the same rollout of the two problems under one seed, and keeps the rows of its own problems
(process r takes every world-th problem, as :meth:`mcpg.grpo.train.Engine._draw_problems` does);
the advantages are fixed numbers, one per row. It then runs one actor update
(:meth:`~mcpg.grpo.train.Engine._actor_update`: global normalisers, gradients summed across
processes, clipped per agent, one AdamW step) and one router update on the gathered slates.
The main process writes ``OUT/<world>.pt``: each agent's loss, every adapter parameter's gradient
and value after the step, and the router's loss and weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch


def main(out: str) -> None:
    from mcpg.grpo.configs import resolve_config
    from mcpg.grpo.slates import Slates
    from mcpg.grpo.train import Engine

    torch.set_num_threads(1)
    cfg = resolve_config("tiny-random", prompts_per_update=2, completions_per_agent=2,
                         max_completion_length=6, learning_rate=0.05)
    eng = Engine(cfg, "removal")
    K, m, world, rank = eng.K, cfg["completions_per_agent"], eng.dist.world, eng.dist.rank
    questions = [p["question"] for p in eng.train_set[:2]]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)  # the same rollout in every process
        roll = eng._rollout(questions, m, progress=False)
    n = len(roll)
    adv = torch.linspace(-1.5, 1.0, n)  # one fixed advantage per row, none zero
    adv[adv == 0] = 0.25
    mine = [b for b in range(len(questions))][rank::world]  # this process's problems
    rows = [b * K * m + j for b in mine for j in range(K * m)]
    losses, _, _ = eng._actor_update(roll.rows(rows), adv[rows])  # losses, clip fraction, diagnostics

    # the router: the same slates' features, deployed candidates, rewards and propensities
    slates = Slates(len(mine), m, K)
    feats = eng._slate_features([questions[b] for b in mine], roll.rows(rows), slates)
    rng = np.random.default_rng(7)
    I_all = rng.integers(0, K, size=(len(questions), m))  # noqa: N806 (the paper's name)
    G_all = rng.integers(0, 2, size=(len(questions), m)).astype(float)  # noqa: N806
    p_all = np.full((len(questions), m, K), 1.0 / K)
    router_loss = eng._router_update(slates.logged(feats), I_all[mine], G_all[mine], p_all[mine])

    if eng.dist.main:
        named = {n_: p for n_, p in eng.pool.model.named_parameters() if ".lora_" in n_}
        torch.save({"losses": losses,
                    "grads": {k: p.grad.detach().clone() for k, p in named.items()},
                    "weights": {k: p.detach().clone() for k, p in named.items()},
                    "router_loss": router_loss,
                    "router": {k: v.detach().clone() for k, v in eng.router.state_dict().items()}},
                   Path(out) / f"{world}.pt")
    eng.dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1])
    from mcpg.grpo._runtime import close_process_group

    close_process_group()
