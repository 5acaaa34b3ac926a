"""Slate diagnostics: what the credit signals and their GRPO advantages do on slates, logged
or simulated, where every candidate's reward is known.

On groups of slates (arrays; the simulated pool of chapter 7 reads them too):

- :func:`advantage_moments`, :func:`expected_advantages`: ``E[A | completions]`` and
  ``E[A^2 | completions]`` over the router's draws, exactly (enumerated over the K^m draws);
- :func:`group_alignment`: how much of a signal's advantage is about the completion it is
  given;
- :func:`group_by_outcome`: which kinds of completion (:data:`OUTCOMES`) it pushes towards.

On a recorded run's logged slates (:class:`mcpg.grpo.rundir.Run`):

- :func:`slate_credit`: Eq. (19) from the deployed reward only, its exact expectation over the
  router's draw, and the exact removal contribution (Corollary 3: the last two are equal);
- :func:`allocation_risks`: Theorem 2's gradient risk of a budgeted run's exact evaluations;
- :func:`evaluation_probabilities`: where a budgeted run's evaluation probabilities lay (0, 1
  or in between), rollout by rollout;
- :func:`advantage_distance`: how far the trained advantages lay from the exact signal's;
- :func:`group_signal`: per GRPO group, whether any candidate was right and how far it moved;
- :func:`expected_advantage`, :func:`advantage_bias`: the bias group standardisation adds;
- :func:`slate_groups`: the logged slates as the arrays above;
- :func:`advantage_alignment`, :func:`advantage_by_outcome`: the tables of
  :func:`~mcpg.grpo.slate_diagnostics.group_alignment` and
  :func:`~mcpg.grpo.slate_diagnostics.group_by_outcome` over signals and scalings.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd

from .. import allocation
from .objective import ADVANTAGE_EPS, credit, credit_leverage, group_advantages
from .rundir import Run

__all__ = ["advantage_moments", "expected_advantages", "group_alignment", "OUTCOMES", "group_by_outcome",
           "slate_credit", "allocation_risks", "evaluation_probabilities", "advantage_distance",
           "group_signal", "expected_advantage", "slate_groups", "advantage_alignment",
           "advantage_by_outcome", "advantage_bias"]


def advantage_moments(signal: str, p, P, mu_hat, rewards_all, scale_rewards: str = "group",
                      eps: float = ADVANTAGE_EPS) -> tuple[np.ndarray, np.ndarray]:
    """``E[A | completions]`` and ``E[A^2 | completions]``: each agent's GRPO advantage over the
    router's draws, exactly.

    A group is one prompt's m slates (axis -2), each routed by its own independent draw
    ``I_g ~ p_g`` (Eq. 3). Given the completions (so R, p, P and mu_hat are fixed), the
    advantage of agent i's completion g depends on all m draws through the group's
    baseline (and, with ``scale_rewards="group"``, its standard deviation), so both moments
    are sums over the ``K^m`` joint draws, weighted by ``prod_g p_g(I_g)``.
    ``E[A^2] - E[A]^2`` is the variance the router's draw adds to the advantage; it is 0 for
    ``"oracle"``, whose credit does not depend on the draw.

    Args:
        signal: ``"wta"``, ``"removal"`` or ``"oracle"`` (:func:`~mcpg.grpo.objective.credit`).
        p: propensities ``(..., m, K)``; P: leave-one-out propensities ``(..., m, K, K)``;
            mu_hat: ``(..., m, K)``; rewards_all: every candidate's ``R^(j)``, ``(..., m, K)``.
        scale_rewards, eps: as :func:`~mcpg.grpo.objective.group_advantages`.

    Returns:
        two arrays ``(..., m, K)``. The cost grows as ``K^m`` (81 joint draws for K = 3, m = 4;
        6561 for m = 8).
    """
    p = np.asarray(p, dtype=float)
    R = np.asarray(rewards_all, dtype=float)
    P = np.asarray(P, dtype=float)
    mu = np.asarray(mu_hat, dtype=float)
    if p.ndim < 2 or R.shape != p.shape or mu.shape != p.shape or P.shape != p.shape + p.shape[-1:]:
        raise ValueError(
            f"p, mu_hat and rewards_all must share a shape (..., m, K) and P be (..., m, K, K); "
            f"got {p.shape}, {mu.shape}, {R.shape}, {P.shape}"
        )
    m, K = p.shape[-2:]
    if K**m > 100_000:
        raise ValueError(f"K^m = {K**m} joint draws is too many to enumerate")
    batch = p.shape[:-2]
    flat = [x.reshape((-1,) + x.shape[len(batch):]) for x in (p, P, mu, R)]
    n_groups = flat[0].shape[0]
    # table[b, g, j, i]: agent i's credit on slate g of group b if the router draws j there
    # (a slate's credit depends on its own draw only)
    table = np.stack([
        credit(signal, np.full(flat[0].shape[:-1], j), flat[3][..., j], flat[0], flat[1], flat[2],
               rewards_all=flat[3])
        for j in range(K)
    ], axis=-2)
    combos = np.array(list(itertools.product(range(K), repeat=m)))  # (K^m, m): one draw per slate
    slate = np.arange(m)
    first, second = np.empty((n_groups, m, K)), np.empty((n_groups, m, K))
    chunk = max(1, 2_000_000 // (len(combos) * m * K))
    for lo in range(0, n_groups, chunk):
        t = table[lo:lo + chunk]  # (b, m, K draws, K agents)
        scores = t[:, slate, combos]  # (b, K^m, m, K agents)
        A = group_advantages(scores, scale_rewards, eps=eps, axis=-2)
        weight = flat[0][lo:lo + chunk][:, slate, combos].prod(-1)  # (b, K^m)
        first[lo:lo + chunk] = np.einsum("bc,bcgi->bgi", weight, A)
        second[lo:lo + chunk] = np.einsum("bc,bcgi->bgi", weight, A * A)
    return first.reshape(p.shape), second.reshape(p.shape)


def expected_advantages(signal: str, p, P, mu_hat, rewards_all, scale_rewards: str = "group",
                        eps: float = ADVANTAGE_EPS) -> np.ndarray:
    """``E[A | completions]``: each agent's GRPO advantage averaged over the router's draw, exactly.

    The first of :func:`~mcpg.grpo.slate_diagnostics.advantage_moments` (same arguments and cost).
    Centred (``"none"``), advantages are linear in the scores, so for ``"removal"`` (Eq. 19,
    unbiased given the slate, Corollary 3) the result equals the centred exact removal contribution
    (``"oracle"``). Standardised, it need not: in a group with no right candidate every exact
    contribution is 0, yet this expectation is not.
    """
    return advantage_moments(signal, p, P, mu_hat, rewards_all, scale_rewards, eps)[0]


def group_alignment(signal: str, p, P, mu_hat, rewards_all, scale_rewards: str = "group",
                        eps: float = ADVANTAGE_EPS, moments: tuple | None = None) -> dict:
    """How much of the GRPO advantage a signal hands a completion is about that completion.

    Over every completion of the groups given (uniform weight) and the router's draws
    (exact, :func:`~mcpg.grpo.slate_diagnostics.advantage_moments`), with the completion's own
    reward ``R`` fixed:

    - ``corr``: the correlation of the advantage ``A`` with ``R``. An agent's GRPO step is
      ``sum_g A_g grad log pi(y_g)``; the larger ``corr``, the more of it moves probability
      towards the agent's right answers and away from its wrong ones. Winner-take-all's credit
      is ``1{I = i} R``; the exact removal contribution also depends on the other agents'
      candidates on the slate (``p_i (R_i - mean of the others)`` when ``P`` renormalises ``p``);
      Eq. (19) adds the noise of the router's draw to that;
    - ``rms``: ``sqrt(E[A^2])``, the size of the steps;
    - ``expected_share``: ``E[E[A | completions]^2] / E[A^2]``, the part of the advantage's
      second moment that is left after averaging over the router's draws (1 for ``"oracle"``);
      the rest is the noise the draw adds.

    Arguments as :func:`~mcpg.grpo.slate_diagnostics.advantage_moments`. NaN where ``R`` or ``A``
    does not vary. ``moments``: that function's ``(first, second)`` for the same arguments,
    when the caller has them already (the enumeration over draws is the whole cost).
    """
    first, second = (advantage_moments(signal, p, P, mu_hat, rewards_all, scale_rewards, eps)
                     if moments is None else moments)
    R = np.asarray(rewards_all, dtype=float)
    var_a = second.mean() - first.mean() ** 2
    cov = (first * R).mean() - first.mean() * R.mean()
    denom = np.sqrt(var_a * R.var())
    return {"corr": float(cov / denom) if denom > 1e-15 else np.nan,
            "rms": float(np.sqrt(second.mean())),
            "expected_share": float((first**2).sum() / second.sum()) if second.sum() > 1e-15 else np.nan}


OUTCOMES: tuple[str, ...] = ("right, alone", "right, shared", "wrong, other right", "wrong, none right")
"""The four kinds of completion :func:`advantage_by_outcome` tells apart: the completion's own
reward, and whether another agent's candidate on the same slate is right."""


def group_by_outcome(signal: str, p, P, mu_hat, rewards_all, scale_rewards: str = "group",
                         eps: float = ADVANTAGE_EPS) -> dict:
    """Which completions a signal's GRPO advantage pushes towards, by kind of completion.

    Each completion is one of ``OUTCOMES``: right where no other agent's candidate on its
    slate is (``right, alone``), right where another's is too (``right, shared``), wrong where
    another's is right, or wrong with every candidate wrong. For each kind: its ``share`` of the
    completions, and the mean of ``E[A | completions]`` over its completions in units of the
    advantage's ``rms`` (:func:`advantage_alignment`), so that signals and scalings of different
    sizes compare (AdamW's steps do not grow with a common factor on the advantages).

    Winner-take-all's expected credit is ``p_i R_i``: a right answer earns it whoever else is
    right. The exact removal contribution is ``p_i (R_i - sum_{j != i} P^{-i}_j R_j)`` when
    ``P`` renormalises ``p``: about 0 for an answer another agent also gets right. Centred
    within the agent's group, such an answer then sits *below* the group's mean wherever the
    agent's other completions were right alone, and the step moves probability away from it;
    standardising gives every group a unit-size step and changes which completions end up below
    the mean (chapter 8 measures both on the recorded slates).

    Arguments as :func:`~mcpg.grpo.slate_diagnostics.advantage_moments`. Returns ``{kind: {"share",
    "mean_advantage"}}``;
    ``mean_advantage`` is NaN for a kind with no completion.
    """
    first, second = advantage_moments(signal, p, P, mu_hat, rewards_all, scale_rewards, eps)
    R = np.asarray(rewards_all, dtype=float)
    right = R > 0
    other = right.sum(-1, keepdims=True) - right > 0  # another agent's candidate on the slate is right
    kinds = dict(zip(OUTCOMES, (right & ~other, right & other, ~right & other, ~right & ~other)))
    rms = float(np.sqrt(second.mean()))
    return {k: {"share": float(w.mean()),
                "mean_advantage": float(first[w].mean() / rms) if w.any() and rms > 1e-15 else np.nan}
            for k, w in kinds.items()}


def slate_credit(run: Run) -> pd.DataFrame:
    """Eq. (19) against the exact removal contribution on a run's logged slates.

    For every logged slate (update u, slate g; the slates of one prompt are ``m`` consecutive
    ones) and agent i: the candidate's reward ``R``, the propensity ``p``, the outcome model
    ``mu_hat``, whether it was deployed, and three credits from
    :func:`mcpg.grpo.objective.credit`:

    - ``removal``: Eq. (19) from the deployed reward G = R^(I) only (what ``removal`` trains on);
    - ``removal_expected``: its exact expectation over the router's draw I ~ p given the
      slate, ``sum_j p_j Delta_hat_i(I=j, G=R^(j))``;
    - ``oracle``: the exact removal contribution ``sum_j p_j R^(j) - sum_{j != i} p^{-i}_j R^(j)``.

    Corollary 3: ``removal_expected == oracle`` for any fixed ``mu_hat``. ``logged`` is the
    credit the run trained on (its signal's), which must equal that signal's recomputed credit.

    A run with ``exact_budget`` also logs each slate's evaluation probability and draw (paper
    §7): ``exact_p`` and ``exact_z`` (NaN for a run without them). Its ``logged`` credit is then
    Eq. (21), ``removal + exact_z / exact_p * (oracle - removal)``.

    ``cut`` (the candidate was cut at the token budget) and ``tokens`` (its length) are read
    where the engine logged them (runs recorded before it did: NaN).
    """
    if not run.slates:
        raise ValueError(f"{run.path} holds no slates.jsonl")
    m = int(run.config["completions_per_agent"])
    frames = []
    for row in run.slates:
        R, p = np.asarray(row["R"], float), np.asarray(row["p"], float)
        P, mu = np.asarray(row["P"], float), np.asarray(row["mu_hat"], float)
        sel, G = np.asarray(row["I"], int), np.asarray(row["G"], float)
        n, K = R.shape
        removal = credit("removal", sel, G, p, P, mu)
        oracle = credit("oracle", sel, G, p, P, mu, rewards_all=R)
        expected = sum(p[:, [j]] * credit("removal", np.full(n, j), R[:, j], p, P, mu) for j in range(K))
        frames.append(pd.DataFrame({
            "update": row["update"], "slate": np.repeat(np.arange(n), K),
            "prompt": np.repeat(np.arange(n) // m, K),
            "agent": np.tile(run.agents, n), "R": R.ravel(), "p": p.ravel(), "mu_hat": mu.ravel(),
            "deployed": (sel[:, None] == np.arange(K)).ravel(), "G": np.repeat(G, K),
            "removal": removal.ravel(), "removal_expected": expected.ravel(), "oracle": oracle.ravel(),
            "logged": np.asarray(row["score"], float).ravel(),
            **{key: np.repeat(np.asarray(row[key], float), K) if key in row else np.nan
               for key in ("exact_p", "exact_z")},
            **{key: np.asarray(row[key], float).ravel() if key in row else np.nan
               for key in ("cut", "tokens")}}))
    return pd.concat(frames, ignore_index=True)


def allocation_risks(run: Run, flat: float = 1e-3) -> pd.DataFrame:
    """Theorem 2's gradient risk of the exact evaluations a budgeted run drew, rollout by rollout.

    For each logged rollout of a run with ``exact_budget`` (its slates carry ``exact_p`` and
    ``exact_z``), from :func:`slate_credit`: η² is the squared error of Eq. (19) against the
    exact removal contribution, σ² = 0 (an exact evaluation is the contribution itself) and
    a the leverage of :func:`~mcpg.grpo.objective.credit_leverage` on Eq. (19)'s scores over
    each agent's group of m slates, with the run's ``scale_rewards`` (what the engine's
    allocation weighs). One evaluation serves a slate's K agents
    (:func:`mcpg.allocation.slate_entries`) and costs K − 1 reward queries. Columns, one row per
    update:

    - ``evaluated``: slates evaluated exactly (Z = 1);
    - ``Eq. (19) alone``: Σ a² η², the error of the uncorrected estimate;
    - ``risk allocated``: the expected error of Eq. (21)'s credit over the draws Z of the
      logged p (Theorem 2, :func:`mcpg.allocation.allocation_risk`); a slate at p = 0, which
      only the pre-draw ``leverage`` rule sets, keeps Eq. (19)'s error
      (:func:`mcpg.allocation.predraw_risk`, equal to Theorem 2's wherever p > 0 since σ² = 0);
    - ``realised``: Σ a² (Δ̃ − Y)² of the credit the run trained on (one draw of Z);
    - ``risk uniform``: the uniform allocation of the same expected cost Σ p (K − 1);
    - ``Theorem 3 bound``: the least risk of any allocation of that cost
      (:func:`mcpg.allocation.risk_lower_bound`);
    - ``Eq. (19), flat groups``: the part of ``Eq. (19) alone`` on groups whose Eq. (19)
      scores have a standard deviation below ``flat``, where the standardised leverage is
      near its largest, 1/eps;
    - ``expected evaluations``: Σ_s p_s, the slates the allocation evaluates on average;
    - ``expected on flat groups``: Σ_s p_s f_s, f_s the share of slate s's K entries whose
      group is flat (as above). Divided by ``expected evaluations``, the share of the budget
      the allocation spent on flat groups: the share of flat entries for a uniform allocation,
      less for one that spends where a correction can move the gradient.
    """
    sc = slate_credit(run)
    if sc["exact_p"].isna().any():
        raise ValueError(f"{run.path}: its slates log no exact_p (a run without exact_budget)")
    K, m = len(run.agents), int(run.config["completions_per_agent"])
    eps = run.advantage_eps
    rows = []
    for update, g in sc.groupby("update", sort=True):
        removal = g["removal"].to_numpy().reshape(-1, m, K)
        a = credit_leverage(removal, run.scale_rewards, eps, axis=-2, batch_axis=-3).reshape(-1, K)
        eta2 = ((g["removal"] - g["oracle"]).to_numpy() ** 2).reshape(-1, K)
        is_flat = np.broadcast_to(removal.std(axis=1, ddof=1, keepdims=True) < flat, removal.shape)
        one, s2, e2 = allocation.slate_entries(a, np.zeros_like(eta2), eta2)
        p = g["exact_p"].to_numpy()[::K]
        flat_entries = is_flat.reshape(-1, K)
        cost = np.full(p.size, K - 1.0)
        spent = float(p @ cost)
        uniform = allocation.uniform_allocation(cost, spent)
        rows.append({
            "update": update, "evaluated": int(g["exact_z"].to_numpy()[::K].sum()),
            "Eq. (19) alone": float(e2.sum()),
            "risk allocated": allocation.predraw_risk(p, e2),  # σ² = 0: Theorem 2's where p > 0
            "realised": float((a**2 * ((g["logged"] - g["oracle"]).to_numpy() ** 2).reshape(-1, K)).sum()),
            "risk uniform": allocation.allocation_risk(uniform, one, s2, e2),
            "Theorem 3 bound": allocation.risk_lower_bound(one, s2, e2, cost, spent),
            "Eq. (19), flat groups": float((a**2 * eta2)[flat_entries].sum()),
            "expected evaluations": float(p.sum()),
            "expected on flat groups": float(p @ flat_entries.mean(axis=1)),
        })
    return pd.DataFrame(rows).set_index("update")


def evaluation_probabilities(run: Run) -> pd.DataFrame:
    """Where a budgeted run's evaluation probabilities lay, rollout by rollout.

    Read from the ``exact_p`` each logged slate of a run with ``exact_budget`` carries (one per
    slate). A slate at p = 1 is evaluated on every draw and its correction is weighted by
    1/p = 1; a slate at p = 0 is never evaluated and keeps Eq. (19)'s credit; only a slate with
    0 < p < 1 is evaluated at random and has its correction multiplied by 1/p > 1. Columns, one
    row per update:

    - ``slates``: the rollout's slates;
    - ``at 0``, ``at 1``, ``between``: how many slates had p = 0, p = 1 and 0 < p < 1;
    - ``least positive``: the least p above 0 (NaN when every p is 0);
    - ``expected evaluations``: Σ_s p_s.
    """
    rows = []
    for row in run.slates:
        if "exact_p" not in row:
            raise ValueError(f"{run.path}: its slates log no exact_p (a run without exact_budget)")
        p = np.asarray(row["exact_p"], float).ravel()
        positive = p[p > 0]
        rows.append({"update": row["update"], "slates": int(p.size), "at 0": int((p == 0).sum()),
                     "at 1": int((p == 1).sum()), "between": int(((p > 0) & (p < 1)).sum()),
                     "least positive": float(positive.min()) if positive.size else np.nan,
                     "expected evaluations": float(p.sum())})
    if not rows:
        raise ValueError(f"{run.path} holds no slates.jsonl")
    return pd.DataFrame(rows).set_index("update")


def advantage_distance(run: Run) -> dict:
    """How far the GRPO advantages a run trained on lay from the exact signal's, on its own completions.

    From :func:`slate_credit`, three credits of every logged completion become advantages
    (:func:`~mcpg.grpo.objective.group_advantages` with the run's ``scale_rewards`` and
    ``advantage_eps``, standardised when a recording predates the key, as the engine's default
    is; an agent's m slates of one prompt are a group): the credit the run
    trained on (``logged``; Eq. (21) for a budgeted run), Eq. (19) (``removal``) and the exact
    removal contribution (``oracle``). Unlike :func:`allocation_risks`' first-order leverage,
    this is exact, and bounded where a group's scores barely differ.

    Returns ``trained`` and ``eq19``: the mean squared distance of those advantages from the
    oracle's; ``trained_corr`` and ``eq19_corr``: their correlation with the oracle's; the same
    four with suffix ``_signal`` over the groups with a right candidate (elsewhere the oracle's
    advantages are 0); and ``signal_groups``, those groups' share.
    """
    sc = slate_credit(run)
    K, m = len(run.agents), int(run.config["completions_per_agent"])
    eps = run.advantage_eps

    def adv(col: str) -> np.ndarray:
        x = sc[col].to_numpy(dtype=float, copy=True).reshape(len(run.slates), -1, m, K)
        return np.asarray(group_advantages(x, run.scale_rewards, eps, batch_axis=-3)).ravel()

    exact, trained, eq19 = adv("oracle"), adv("logged"), adv("removal")
    signal = (sc.groupby(["update", "prompt"])["R"].transform("max") > 0).to_numpy()

    def corr(x, y):
        return float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else float("nan")

    out = {"signal_groups": float(signal.mean())}
    for name, a in (("trained", trained), ("eq19", eq19)):
        for suffix, sel in (("", slice(None)), ("_signal", signal)):
            out[name + suffix] = float(((a - exact)[sel] ** 2).mean())
            out[f"{name}_corr{suffix}"] = corr(a[sel], exact[sel])
    return out


def group_signal(run: Run) -> pd.DataFrame:
    """Per GRPO group of a run's logged slates: is there a reward to learn from, and how far did it move?

    A group is one agent's ``m`` completions of one prompt (``m`` consecutive logged slates).
    One row per (update, prompt, agent) with:

    - ``any_correct``: some candidate on the group's slates is right (any agent's ``R = 1``);
      without one, every credit in the group is the outcome model's term alone;
    - ``own_correct``: some of this agent's own candidates is right;
    - ``score_std``: the unbiased spread of the agent's ``m`` logged credits;
    - ``mean_abs_advantage``: the mean ``|A|`` the run trained on, the logged credits through
      :func:`mcpg.grpo.objective.group_advantages` with the run's ``scale_rewards`` and
      ``advantage_eps``. With ``"group"`` scaling it is of order one for any group whose spread
      is well above ``advantage_eps``, however small that spread is: Eq. (19)'s noise in a
      group with no right candidate is standardised to steps as large as a real signal's.
    """
    if not run.slates:
        raise ValueError(f"{run.path} holds no slates.jsonl")
    m = int(run.config["completions_per_agent"])
    scale = run.scale_rewards
    eps = run.advantage_eps
    frames = []
    for row in run.slates:
        R, S = np.asarray(row["R"], float), np.asarray(row["score"], float)
        n, K = R.shape
        if n % m:
            raise ValueError(f"update {row['update']}: {n} slates are not whole groups of m = {m}")
        R, S = R.reshape(n // m, m, K), S.reshape(n // m, m, K)
        A = group_advantages(S, scale_rewards=scale, eps=eps, axis=-2, batch_axis=-3)
        frames.append(pd.DataFrame({
            "update": row["update"], "prompt": np.repeat(np.arange(n // m), K),
            "agent": np.tile(run.agents, n // m),
            "any_correct": np.repeat(R.max(axis=(1, 2)) > 0, K), "own_correct": (R.max(axis=1) > 0).ravel(),
            "score_std": S.std(axis=1, ddof=1).ravel(),
            "mean_abs_advantage": np.abs(A).mean(axis=1).ravel()}))
    return pd.concat(frames, ignore_index=True)


def _grouped_slates(run: Run):
    """Each logged update's row with its slates as GRPO groups: ``p``, ``P``, ``mu_hat`` and
    ``R`` shaped ``(prompts, m, K)`` (``P``: ``(prompts, m, K, K)``)."""
    if not run.slates:
        raise ValueError(f"{run.path} holds no slates.jsonl")
    m = int(run.config["completions_per_agent"])
    for row in run.slates:
        arrays = [np.asarray(row[k], float) for k in ("p", "P", "mu_hat", "R")]
        n = arrays[0].shape[0]
        if n % m:
            raise ValueError(f"update {row['update']}: {n} slates are not whole groups of m = {m}")
        yield row, [x.reshape((n // m, m) + x.shape[1:]) for x in arrays]


def expected_advantage(run: Run) -> pd.DataFrame:
    """The advantage each completion's credit gets *on average over the router's draws*, given
    the completions: ``E[A | completions]`` under both advantage scalings, on the logged slates.

    Within one GRPO group (agent i, one prompt's m slates) the router draws I_g ~ p_g on each
    slate independently; :func:`~mcpg.grpo.slate_diagnostics.expected_advantages` sums the run's signal's
    advantages over all K^m joint draws, exactly.

    Centred advantages are linear in the credits, so their expectation is the centred
    *expected* credit; for ``removal`` that is the centred exact removal contribution
    (Corollary 3), 0 in a group with no right candidate. Standardising divides by the group's
    realised spread, which depends on the draws, so the expectation of a ratio is no longer
    the ratio of expectations: in a group with no right candidate it is not 0 but follows
    whatever the outcome model's term does with the draws. One row per (update, slate, agent):
    ``prompt``, ``R``, ``p``, ``mu_hat``, ``any_correct`` (some candidate of the group's slates
    is right), ``expected_credit``, ``expected_group`` (standardised, the run's
    ``advantage_eps``) and ``expected_none`` (centred).
    """
    eps = run.advantage_eps
    frames = []
    for row, groups in _grouped_slates(run):
        p, P, mu, R = (x.reshape((-1,) + x.shape[2:]) for x in groups)
        n, K = R.shape
        m = groups[0].shape[1]
        ea = {sc: expected_advantages(run.signal, *groups, scale_rewards=sc, eps=eps).reshape(n, K)
              for sc in ("group", "none")}
        expected_credit = sum(p[:, [j]] * credit(run.signal, np.full(n, j), R[:, j], p, P, mu, rewards_all=R)
                              for j in range(K))
        any_correct = np.repeat(R.reshape(n // m, m * K).max(1) > 0, m)
        frames.append(pd.DataFrame({
            "update": row["update"], "slate": np.repeat(np.arange(n), K),
            "prompt": np.repeat(np.arange(n) // m, K),
            "agent": np.tile(run.agents, n), "R": R.ravel(), "p": p.ravel(), "mu_hat": mu.ravel(),
            "any_correct": np.repeat(any_correct, K), "expected_credit": expected_credit.ravel(),
            "expected_group": ea["group"].ravel(), "expected_none": ea["none"].ravel()}))
    return pd.concat(frames, ignore_index=True)


def slate_groups(run: Run) -> list[np.ndarray]:
    """All of a run's logged slates as GRPO groups, updates one after another: ``[p, P, mu_hat,
    R]``, each ``(groups, m, K)`` (``P``: ``(groups, m, K, K)``), the arrays that
    :func:`~mcpg.grpo.slate_diagnostics.advantage_moments` and the simulated pool's
    ``group_diagnostics`` read."""
    return [np.concatenate(x) for x in zip(*(g for _, g in _grouped_slates(run)))]


def advantage_alignment(run: Run, signals=("wta", "removal", "oracle"),
                        scalings=("group", "none")) -> pd.DataFrame:
    """How much of each signal's GRPO advantage is about the completion it is given, on one
    run's logged slates: :func:`~mcpg.grpo.slate_diagnostics.group_alignment` over all its groups.

    The slates are the run's own, so every signal is read on the same completions, routed by
    the same router: what winner-take-all, Eq. (19) and the exact removal contribution would
    have handed these completions. One row per (signal, scaling): ``corr`` (of the advantage
    with the completion's own reward, over completions and the router's draws), ``rms`` and
    ``expected_share`` (the part of ``E[A^2]`` left after averaging over the draws).
    """
    eps = run.advantage_eps
    groups = slate_groups(run)
    return pd.DataFrame([{"signal": s, "scaling": sc,
                          **group_alignment(s, *groups, scale_rewards=sc, eps=eps)}
                         for s in signals for sc in scalings]).set_index(["signal", "scaling"])


def advantage_by_outcome(run: Run, signals=("wta", "removal", "oracle"),
                         scalings=("group", "none")) -> pd.DataFrame:
    """Which completions each signal's advantage pushes towards, on one run's logged slates:
    :func:`~mcpg.grpo.slate_diagnostics.group_by_outcome` over all its groups.

    One row per (signal, scaling), one column per kind of completion
    (:data:`~mcpg.grpo.slate_diagnostics.OUTCOMES`): the mean of ``E[A | completions]`` over that kind,
    in units of the advantage's rms. A right answer that another agent's candidate on the same
    slate also gets right is where winner-take-all's and the exact removal contribution's
    advantages part. The kinds' shares of the completions are in ``frame.attrs["share"]``.
    """
    eps = run.advantage_eps
    groups = slate_groups(run)
    rows = {}
    for s in signals:
        for sc in scalings:
            out = group_by_outcome(s, *groups, scale_rewards=sc, eps=eps)
            rows[(s, sc)] = {k: v["mean_advantage"] for k, v in out.items()}
    frame = pd.DataFrame(rows).T.rename_axis(["signal", "scaling"])
    frame.attrs["share"] = {k: v["share"] for k, v in out.items()}  # R alone fixes them
    return frame


def advantage_bias(expected: pd.DataFrame) -> pd.Series:
    """The bias of an advantage scaling, summed up from :func:`expected_advantage`'s frame.

    Over the rows of groups with no right candidate, where the exact removal contribution is 0
    and an unbiased credit has nothing to push: ``groups without a right candidate`` (their
    share), the mean size of ``E[A | completions]`` standardised and centred, and the correlation
    of the standardised one with the completion's propensity ``p`` and with ``mu_hat`` (NaN
    when either does not vary). Centred, the mean size is 0 for ``removal`` (Corollary 3).
    """
    dead = expected[~expected["any_correct"].astype(bool)]

    def corr(x: str) -> float:
        a, b = dead["expected_group"].to_numpy(), dead[x].to_numpy()
        return float(np.corrcoef(a, b)[0, 1]) if len(dead) > 1 and a.std() > 0 and b.std() > 0 else np.nan

    return pd.Series({
        "groups without a right candidate": 1 - float(expected["any_correct"].mean()),
        "mean |E[A]|, standardised": float(dead["expected_group"].abs().mean()),
        "mean |E[A]|, centred": float(dead["expected_none"].abs().mean()),
        "corr with p": corr("p"), "corr with mu_hat": corr("mu_hat"),
    })
