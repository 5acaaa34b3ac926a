"""The book's figure style and the figures that recur across chapters."""

from __future__ import annotations

import numpy as np

from .stats import mean_ci  # re-exported: the book's intervals live in mcpg.stats (Student t)

__all__ = ["set_theme", "METHOD_COLORS", "mean_ci", "field_heatmap"]

#: One colour per training signal, used by every chapter that compares them.
METHOD_COLORS = {
    "frozen": "#7f7f7f",
    "wta": "#d62728",
    "removal": "#1f77b4",
    "oracle": "#2ca02c",
    "exact": "#000000",
}


def set_theme() -> None:
    """Apply the book's seaborn theme (white grid, colour-blind palette, readable sizes)."""
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    mpl.rcParams.update({"figure.figsize": (6.4, 3.8), "figure.dpi": 110, "axes.titlesize": "medium",
                         "savefig.bbox": "tight"})


def field_heatmap(field: np.ndarray, ax=None, agent_names=None, cmap: str = "vlag", annot: bool = True):
    """Draw a contribution field (agents x backgrounds) as a heatmap; NaN cells (i in S) are blank.

    Columns are labelled by the background group S, written as a set of agent names.
    """
    import matplotlib.pyplot as plt
    import seaborn as sns

    n, m = field.shape
    names = agent_names or [str(i + 1) for i in range(n)]
    labels = ["{" + ",".join(names[k] for k in range(n) if (S >> k) & 1) + "}" if S else "∅" for S in range(m)]
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4, 0.7 * m), 0.6 * n + 1.2))
    lim = np.nanmax(np.abs(field)) or 1.0
    sns.heatmap(field, ax=ax, cmap=cmap, center=0, vmin=-lim, vmax=lim, annot=annot, fmt=".2f",
                xticklabels=labels, yticklabels=names, cbar_kws={"label": r"$\Delta_{i\mid S}$"})
    ax.set_xlabel("background group S")
    ax.set_ylabel("agent i")
    return ax
