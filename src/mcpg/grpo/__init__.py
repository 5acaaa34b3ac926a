"""Multi-agent GRPO for routed LLM agents (paper §8; DESIGN §6).

Light at import: only :mod:`mcpg.grpo.objective` (numpy + torch) and
:mod:`mcpg.grpo.gsm8k` (standard library) load eagerly; the LLM parts
(:mod:`~mcpg.grpo.agents`, :mod:`~mcpg.grpo.router`, :mod:`~mcpg.grpo.train`) import
transformers and peft when you import them.
"""

from .objective import LOSS_TYPES, SIGNALS, clipped_grpo_loss, credit, group_standardize

__all__ = ["SIGNALS", "LOSS_TYPES", "credit", "group_standardize", "clipped_grpo_loss"]
