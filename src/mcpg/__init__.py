"""mcpg: marginal-contribution policy gradients under filtered feedback.

The library behind the executable book on Ben-Gal and Tong (2026). One module per
idea of the paper:

- :mod:`mcpg.mechanisms` (§3): small systems whose expectations are computed exactly;
- :mod:`mcpg.systems` (§3-§5): ready-made small systems of the chapters and tests;
- :mod:`mcpg.fields` (§4): set functions, contribution fields, the Shapley value;
- :mod:`mcpg.signals` (§5): score-function estimators and baselines;
- :mod:`mcpg.critic` (§6): the masked critic;
- :mod:`mcpg.routing` (§3.1, §6.1): router propensities and removal contributions;
- :mod:`mcpg.outcome` (§6.1, §8): outcome models learned from filtered feedback, and the
  exact moments of the removal estimate;
- :mod:`mcpg.allocation` (§7): allocating exact counterfactual evaluations;
- :mod:`mcpg.grpo` (§8): multi-agent GRPO for LLM agents (imported on demand);
- :mod:`mcpg.stats`: intervals, paired differences and summary tables, as the book reports them;
- :mod:`mcpg.plotting`: the book's figure style and recurring figures;
- :mod:`mcpg.results`: where the recorded results of chapters 7-9 are, found or fetched;
- :mod:`mcpg.glue`: the numbers a chapter's prose quotes, from the cells that compute them,
  on the site and in Colab.
"""

__version__ = "0.1.0"
