"""mcpg: marginal-contribution policy gradients under filtered feedback.

The library behind the executable book on Ben-Gal and Tong (2026). One module per
idea of the paper:

- :mod:`mcpg.mechanisms` (§3): small systems whose expectations are computed exactly;
- :mod:`mcpg.fields` (§4): set functions, contribution fields, the Shapley value;
- :mod:`mcpg.signals` (§5): score-function estimators and baselines;
- :mod:`mcpg.critic` (§6): the masked critic;
- :mod:`mcpg.routing` (§3.1, §6.1): router propensities and removal contributions;
- :mod:`mcpg.allocation` (§7): allocating exact counterfactual evaluations;
- :mod:`mcpg.grpo` (§8): multi-agent GRPO for LLM agents (imported on demand).
"""

__version__ = "0.1.0"
