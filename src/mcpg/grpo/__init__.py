"""Multi-agent GRPO for routed LLM agents under filtered feedback (paper §8).

K agents are LoRA adapters on one frozen base model. For each GSM8K problem every agent
writes m completions (all agents in one mixed-adapter batch); a learned router picks one
candidate per slate by Eq. (3); only that candidate's reward is observed. Each agent is
credited by a signal (winner-take-all, the doubly robust removal contribution of Eq. 19,
or a full-feedback oracle), standardised within its group and trained with the clipped
GRPO loss; the router/outcome model then learns from the selected feedback.

Read in this order (each file is one idea):

- :mod:`mcpg.grpo.gsm8k`: problems, gold answers, answer extraction, keyword specialties;
- :mod:`mcpg.grpo.objective`: ``credit``, ``group_standardize``, ``clipped_grpo_loss``
  (numpy + torch only; the simulated pool of chapter 7 uses it too);
- :mod:`mcpg.grpo.credits`: the credit signals, one function and one registration each, with the
  flags the engine reads (every candidate's reward, an exact budget, fixed before the draw);
- :mod:`mcpg.grpo.models`: base models (``tiny-random``, SmolLM2 online or from GGUF, hub ids);
- :mod:`mcpg.grpo.agents`: the K LoRA agents, mixed-adapter generation and log-probabilities;
- :mod:`mcpg.grpo.router`: features of (question, candidate) and the router/outcome MLP;
- :mod:`mcpg.grpo.configs`: ``tiny-random``, ``cpu-smoke``, ``colab``, ``paper``;
- :mod:`mcpg.grpo.train`: the loop, the evaluation, the run directory, ``--resume``;
- :mod:`mcpg.grpo.custom`: reward functions with TRL's signature and datasets of your own;
- :mod:`mcpg.grpo.pool`: a trained run's pool, routing a question and answering it;
- ``python -m mcpg.grpo``: the command line.

Command line::

    python -m mcpg.grpo train --config cpu-smoke --signal removal --output runs/removal
    python -m mcpg.grpo train --config cpu-smoke --signal removal --output runs/removal --resume
    python -m mcpg.grpo evaluate --run runs/removal
    accelerate launch --num_processes 4 -m mcpg.grpo train --config paper --signal removal --output runs/paper

Importing :mod:`mcpg.grpo` is light: only the objective (numpy, torch), :mod:`mcpg.grpo.pool`
(numpy until a pool is loaded) and the GSM8K module (standard library) load; transformers and
peft load when the LLM modules are imported.
"""

from .objective import LOSS_TYPES, SIGNALS, clipped_grpo_loss, credit, group_standardize
from .pool import RoutedAnswer, RoutedPool

__all__ = ["SIGNALS", "LOSS_TYPES", "credit", "group_standardize", "clipped_grpo_loss", "RoutedPool",
           "RoutedAnswer"]
