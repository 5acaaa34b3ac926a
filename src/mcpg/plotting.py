"""The book's figure style and the figures that recur across chapters."""

from __future__ import annotations

import numpy as np

from .stats import mean_ci  # re-exported: the book's intervals live in mcpg.stats (Student t)

__all__ = ["set_theme", "METHOD_COLORS", "mean_ci", "field_heatmap", "slate_diagram"]

#: One colour per training signal, used by every chapter that compares them.
METHOD_COLORS = {
    "frozen": "#7f7f7f",
    "wta": "#d62728",
    "removal": "#1f77b4",
    "oracle": "#2ca02c",
    "exact": "#000000",
}


def set_theme() -> None:
    """Apply the book's seaborn theme (white grid, colour-blind palette, readable sizes).

    Text is a quarter larger than seaborn's notebook context: a figure 7 inches wide is shown
    about 350 pixels wide on a phone, where the default 10-point labels would be about 6
    pixels high."""
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind", font_scale=1.25)
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
    labels = [
        "{" + ",".join(names[k] for k in range(n) if (S >> k) & 1) + "}" if S else "∅" for S in range(m)
    ]
    if ax is None:
        _, ax = plt.subplots(figsize=(max(4, 0.7 * m), 0.6 * n + 1.2))
    lim = np.nanmax(np.abs(field)) or 1.0
    sns.heatmap(field, ax=ax, cmap=cmap, center=0, vmin=-lim, vmax=lim, annot=annot, fmt=".2f",
                xticklabels=labels, yticklabels=names, cbar_kws={"label": r"$\Delta_{i\mid S}$"})
    ax.set_xlabel("background group S")
    ax.set_ylabel("agent i")
    return ax


def slate_diagram(p, selected: int, rewards, ax=None, names=None):
    """Draw one routed slate: K candidates -> the router (propensities p_j) -> one deployed candidate.

    Only the deployed candidate's reward ``G = R^(I)`` is shown as observed; the others are
    drawn as "?" (filtered feedback, paper §3.1 and §6.1). ``rewards`` are every candidate's
    R^(j) (the unobserved ones are printed small, in grey, as what an oracle would see).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    p = np.asarray(p, dtype=float)
    K = len(p)
    names = names or [f"$A^{{({j + 1})}}$" for j in range(K)]
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.8 * K + 0.8))
    ys = 1.4 * (np.linspace(K - 1, 0, K) - (K - 1) / 2)
    box = {"boxstyle": "round,pad=0.12", "linewidth": 1.2}
    for j, y in enumerate(ys):
        ax.add_patch(FancyBboxPatch((0.0, y - 0.3), 1.9, 0.6, fc="#eef3fa", ec="#1f77b4", **box))
        ax.text(0.95, y, f"candidate {names[j]}", ha="center", va="center")
        ax.add_patch(FancyArrowPatch((2.1, y), (3.3, 0), arrowstyle="-|>", mutation_scale=12,
                                     lw=0.8 + 3 * p[j], color="#555555"))
        ax.text(2.2, y + 0.22, f"$p_{j + 1} = {p[j]:.2f}$", ha="left", fontsize="small")
        seen = j == selected
        ax.text(6.5, y, f"$R^{{({j + 1})}} = {rewards[j]:g}$" if seen else f"$R^{{({j + 1})}}$ = ?",
                ha="left", va="center", color="k" if seen else "#999999",
                fontweight="bold" if seen else "normal")
    ax.add_patch(FancyBboxPatch((3.35, -0.45), 1.3, 0.9, fc="#fff4e5", ec="#ff7f0e", **box))
    ax.text(4.0, 0, "router\n$I \\sim p$", ha="center", va="center")
    ax.add_patch(FancyArrowPatch((4.75, 0), (6.3, ys[selected]), arrowstyle="-|>", mutation_scale=14, lw=2,
                                 color="#ff7f0e"))
    ax.text(5.5, 0.3 + ys[selected] / 2, f"deploy $I = {selected + 1}$", ha="center", fontsize="small")
    ax.text(6.5, ys.min() - 0.8,
            f"observed: $G = R^{{(I)}} = {rewards[selected]:g}$; the rest are never seen",
            ha="left", fontsize="small")
    ax.set(xlim=(-0.2, 10.5), ylim=(ys.min() - 1.0, ys.max() + 0.6))
    ax.axis("off")
    return ax


# chapters 1-4

__all__ += ["draw_field"]


def draw_field(field, ax, lim: float, names=None, label: str = r"$\Delta_{i|S}$"):
    """A contribution field (agents x background groups S) as a heatmap on the range [-lim, lim].

    Unlike :func:`field_heatmap`, the colour range is given, so that several panels share
    one scale (equal colours mean equal values), and the colour bar's label is set by the
    caller. Columns are named by :func:`mcpg.signals.group_name` over ``names`` (default
    "1", "2", ...: the text's numbering); NaN cells (i in S) are blank. Returns ``ax``.
    """
    import seaborn as sns

    from .signals import group_name

    field = np.asarray(field, dtype=float)
    if field.ndim != 2 or field.shape[1] != 1 << field.shape[0]:
        raise ValueError(f"field must have shape (n, 2**n), got {field.shape}")
    if not np.isfinite(lim) or lim <= 0:
        raise ValueError(f"lim must be a positive number, got {lim}")
    names = list(names) if names is not None else [str(i + 1) for i in range(field.shape[0])]
    if len(names) != field.shape[0]:
        raise ValueError(f"names must hold one name per agent ({field.shape[0]}), got {len(names)}")
    cols = [group_name(S, names) for S in range(field.shape[1])]
    sns.heatmap(field, ax=ax, cmap="vlag", center=0, vmin=-lim, vmax=lim, annot=True, fmt=".2f",
                xticklabels=cols, yticklabels=names, cbar_kws={"label": label})
    ax.set(xlabel="background group S", ylabel="agent i")
    ax.tick_params(axis="y", labelrotation=0)
    return ax
