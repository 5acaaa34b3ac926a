"""Optimal allocation of exact counterfactual evaluations (paper §7, Theorems 2 and 3, App. B.12).

One entry per marginal contribution Δ_{i|S} that may be evaluated exactly, with

- ``a``: gradient leverage a_i = ‖Ψ_i‖ (non-negative);
- ``sigma2``: variance σ² of one exact evaluation Y_{i|S};
- ``eta2``: squared error η² = (Δ̂ − Δ)² of the learned estimate;
- ``cost``: cost c of one exact evaluation (non-negative);
- ``budget``: the expected-cost budget C (a non-negative scalar, may be ``inf``).

An evaluation runs with probability p (Z ~ Bernoulli(p)) and the estimate is corrected by
Eq. (21). Entries with a²(σ² + η²) = 0 gain nothing from evaluation: they get p = 0 and add
nothing to the risk. Entries of cost 0 and positive weight are always evaluated (p = 1).

Inside training (chapter 9) the unit of evaluation is a *slate*: one exact evaluation
queries every candidate's reward, so it reveals the exact removal contribution of every
agent on that slate at once. :func:`slate_entries` folds a slate's agents into one entry of
Theorem 2 (their a²σ² and a²η² summed), so :func:`neyman_allocation` and the functions
above apply to slates unchanged; :func:`slate_allocation` adds the baselines and the floor;
:func:`removal_error_proxy` predicts Eq. (19)'s squared error from what is observed; and
:class:`ExactBudget` holds the estimates learned from earlier exact evaluations (§7's
suggestion) and draws the evaluations of one rollout.
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array, check_nonnegative, check_same_shape, leave_one_out

__all__ = [
    "ALLOCATIONS",
    "ExactBudget",
    "allocation_risk",
    "convex_allocation",
    "corrected_contribution",
    "neyman_allocation",
    "predraw_allocation",
    "predraw_error_proxy",
    "predraw_risk",
    "proportional_allocation",
    "removal_error_proxy",
    "risk_lower_bound",
    "slate_allocation",
    "slate_entries",
    "simulate_corrected_risk",
    "uniform_allocation",
]


def _nonneg(x, name: str, finite: bool = True) -> np.ndarray:
    arr = as_float_array(x, name)
    check_nonnegative(arr, name)
    if finite and not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite")
    return arr


def _budget(budget) -> float:
    b = _nonneg(budget, "budget", finite=False)
    if b.ndim != 0:
        raise ValueError(f"budget must be a scalar, got shape {b.shape}")
    return float(b)


def _entries(a, sigma2, eta2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a, sigma2, eta2 = _nonneg(a, "a"), _nonneg(sigma2, "sigma2"), _nonneg(eta2, "eta2")
    check_same_shape(a, sigma2, "a", "sigma2")
    check_same_shape(a, eta2, "a", "eta2")
    return a, sigma2, eta2


def _water_fill(r: np.ndarray, cost: np.ndarray, budget: float) -> np.ndarray:
    """Solve p = min{1, t·r} with Σ p·c = C for the level t ≥ 0 (exactly, by sorting).

    Entries with r = 0 get p = 0; entries with c = 0 and r > 0 get p = 1 (they are free).
    If every remaining entry fits in the budget, all of them get p = 1.
    Returns p. Sorting by r, the k entries with the largest r saturate, where k is the
    smallest index with t_k · r_(k) ≤ 1, t_k = (C − Σ_{j<k} c_(j)) / Σ_{j≥k} c_(j) r_(j).
    (The test t_k r_(k) ≤ 1 is monotone in k, and its first success is consistent.)
    """
    p = np.where((r > 0) & (cost == 0), 1.0, 0.0)
    live = np.flatnonzero((r > 0) & (cost > 0))
    if cost[live].sum() <= budget:
        p[live] = 1.0
        return p
    order = live[np.argsort(-r[live], kind="stable")]
    rs, cs = r[order] / r[order[0]], cost[order]  # p is invariant to the scale of r
    spent = np.concatenate(([0.0], np.cumsum(cs)[:-1]))  # cost of saturating the first k
    rest = np.cumsum((cs * rs)[::-1])[::-1]  # Σ_{j ≥ k} c_j r_j
    levels = (budget - spent) / rest
    k = int(np.argmax(levels * rs <= 1.0))  # exists: the last k always passes
    t = levels[k]
    p[order[:k]] = 1.0
    p[order[k:]] = np.minimum(1.0, t * rs[k:])
    return p


def neyman_allocation(a, sigma2, eta2, cost, budget) -> np.ndarray:
    """Optimal evaluation probabilities, Theorem 2 (Eq. 22).

    p*_{i|S} = min{1, a_i √(σ² + η²) / √(ν c)}, with ν > 0 chosen so that Σ p* c = C; every
    entry is evaluated (p* = 1) when the budget covers them all. Solved exactly by
    water-filling (sort by a √(σ²+η²)/√c and find the saturated set), not by bisection.

    Arrays ``a, sigma2, eta2, cost`` of one shape, scalar ``budget``; returns p of that shape
    with entries in [0, 1]. Entries with a²(σ²+η²) = 0 get p = 0. With ``budget = 0`` every
    entry of positive cost gets p = 0 (its risk is then infinite).
    """
    a, sigma2, eta2 = _entries(a, sigma2, eta2)
    cost = _nonneg(cost, "cost")
    check_same_shape(a, cost, "a", "cost")
    budget = _budget(budget)
    w = (a * np.sqrt(sigma2 + eta2)).ravel()
    c = cost.ravel()
    r = np.divide(w, np.sqrt(c), out=np.zeros_like(w), where=c > 0)
    r[(c == 0) & (w > 0)] = np.inf  # free entries: never limited by the budget
    return _water_fill(np.where(w > 0, r, 0.0), c, budget).reshape(a.shape)


def proportional_allocation(weights, cost, budget) -> np.ndarray:
    """A comparison allocation p = min{1, t · weights}, t set so that Σ p c = C.

    E.g. ``weights=cost`` (cost-proportional) or ``weights=a**2`` (leverage-proportional).
    Not optimal in general; Theorem 3 bounds its risk from below. Entries with weight 0 get
    p = 0, free entries of positive weight p = 1; all p = 1 when the budget covers them all.
    """
    weights, cost = _nonneg(weights, "weights"), _nonneg(cost, "cost")
    check_same_shape(weights, cost, "weights", "cost")
    return _water_fill(weights.ravel(), cost.ravel(), _budget(budget)).reshape(cost.shape)


def uniform_allocation(cost, budget) -> np.ndarray:
    """A comparison allocation: the same p = min{1, C / Σ c} for every entry (budget binds)."""
    cost = _nonneg(cost, "cost")
    return proportional_allocation(np.ones_like(cost), cost, budget)


def allocation_risk(p, a, sigma2, eta2) -> float:
    """Gradient risk of an allocation, Theorem 2: R(p) = Σ a² ((σ² + η²)/p − η²).

    R(p) = Σ E[a² (Δ̃ − Δ)²] for the corrected estimate Δ̃ of Eq. (21). By definition an entry
    with a²(σ²+η²) = 0 contributes 0 (also at p = 0, the 0/0 case); an entry with positive
    weight and p = 0 contributes inf (Eq. 21 then never corrects it and divides by zero).
    ``p`` in [0, 1], all arrays of one shape. Returns a float.
    """
    a, sigma2, eta2 = _entries(a, sigma2, eta2)
    p = _nonneg(p, "p")
    check_same_shape(p, a, "p", "a")
    if (p > 1).any():
        raise ValueError("p must be at most 1 (it is a probability)")
    weighted = a * np.sqrt(sigma2 + eta2) > 0  # a²(σ²+η²) > 0, robust to underflow
    if (weighted & (p == 0)).any():
        return float("inf")
    w2 = a**2 * (sigma2 + eta2)
    terms = np.divide(w2, p, out=np.zeros_like(w2), where=weighted) - a**2 * eta2
    return float(np.sum(np.where(weighted, terms, 0.0)))


def risk_lower_bound(a, sigma2, eta2, cost, budget) -> float:
    """Theorem 3 (Appendix B.12): the least risk of any allocation with Σ p c ≤ C.

    Σ_A a²σ² + (Σ_U a √(σ²+η²) √c)² / C_U − Σ_U a²η², where A holds the entries at p* = 1,
    U the other entries of positive weight a²(σ²+η²), and C_U = C − Σ_A c. It is attained by
    :func:`neyman_allocation`. Returns a float (inf when the budget leaves C_U = 0 for U ≠ ∅).
    """
    p = neyman_allocation(a, sigma2, eta2, cost, budget)
    a, sigma2, eta2 = _entries(a, sigma2, eta2)
    cost = np.asarray(cost, dtype=float)
    w = a * np.sqrt(sigma2 + eta2)
    sat, unsat = (w > 0) & (p == 1), (w > 0) & (p < 1)
    bound = float(np.sum((a**2 * sigma2)[sat]))
    if unsat.any():
        c_u = float(budget) - cost[sat].sum()
        if c_u <= 0:
            return float("inf")
        bound += np.sum((w * np.sqrt(cost))[unsat]) ** 2 / c_u - np.sum((a**2 * eta2)[unsat])
    return float(bound)


def corrected_contribution(delta_hat, y, z, p) -> np.ndarray:
    """The corrected estimate, Eq. (21): Δ̃ = Δ̂ + Z/p · (Y − Δ̂).

    Unbiased for Δ whenever E[Y] = Δ and Z ~ Bernoulli(p) independent of Y (Theorem 2).
    ``delta_hat`` learned estimates, ``y`` exact evaluations (must be finite everywhere; where
    z = 0 their value is ignored, so pass any placeholder such as 0), ``z`` in {0, 1}, ``p``
    propensities in [0, 1], strictly positive where z = 1. Arguments broadcast together.
    """
    delta_hat, y = as_float_array(delta_hat, "delta_hat"), as_float_array(y, "y")
    z, p = as_float_array(z, "z"), _nonneg(p, "p")
    for arr, name in ((delta_hat, "delta_hat"), (y, "y")):
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} must be finite")
    if not np.isin(z, (0.0, 1.0)).all():
        raise ValueError("z must be 0 or 1 (whether the exact evaluation ran)")
    if (p > 1).any():
        raise ValueError("p must be at most 1 (it is a probability)")
    try:
        delta_hat, y, z, p = np.broadcast_arrays(delta_hat, y, z, p)
    except ValueError:
        raise ValueError(
            f"delta_hat, y, z and p must broadcast together, got shapes "
            f"{delta_hat.shape}, {y.shape}, {z.shape}, {p.shape}"
        ) from None
    ran = z == 1
    if (p[ran] == 0).any():
        raise ValueError("p must be strictly positive where z = 1 (the estimator divides by it)")
    correction = np.divide(y - delta_hat, p, out=np.zeros(delta_hat.shape), where=ran)
    # where p = 1 the estimate is Y itself; return it exactly (Δ̂ + (Y − Δ̂) may round)
    return np.where(ran & (p == 1), y, delta_hat + correction)


def simulate_corrected_risk(
    p, delta, delta_hat, sigma2, a, n_rep: int, rng=None, return_stderr: bool = False
) -> float | tuple[float, float]:
    """Monte Carlo estimate of R(p) = E Σ a² (Δ̃ − Δ)², to compare with :func:`allocation_risk`.

    Draws Z ~ Bernoulli(p) and Y ~ Normal(Δ, σ²) independently per entry, forms Δ̃ by Eq. (21)
    and averages Σ a² (Δ̃ − Δ)² over ``n_rep`` replications (vectorised, in chunks). With
    ``return_stderr`` also returns the Monte Carlo standard error. Entries with p = 0 are never
    corrected, so they contribute a²η² here while the formula (which needs p > 0) gives inf.
    ``rng``: a ``numpy.random.Generator`` or a seed.
    """
    p = _nonneg(p, "p")
    if (p > 1).any():
        raise ValueError("p must be at most 1 (it is a probability)")
    delta, delta_hat = as_float_array(delta, "delta"), as_float_array(delta_hat, "delta_hat")
    sigma2, a = _nonneg(sigma2, "sigma2"), _nonneg(a, "a")
    for arr, name in ((delta, "delta"), (delta_hat, "delta_hat"), (sigma2, "sigma2"), (a, "a")):
        check_same_shape(p, arr, "p", name)
    if int(n_rep) < 1:
        raise ValueError("n_rep must be at least 1")
    rng = np.random.default_rng(rng)
    p, delta, delta_hat, sigma2, a = (x.ravel() for x in (p, delta, delta_hat, sigma2, a))
    chunk = max(1, (1 << 22) // max(p.size, 1))
    losses = []
    for start in range(0, int(n_rep), chunk):
        m = min(chunk, int(n_rep) - start)
        z = rng.random((m, p.size)) < p
        y = delta + np.sqrt(sigma2) * rng.standard_normal((m, p.size))
        tilde = delta_hat + np.divide(y - delta_hat, p, out=np.zeros_like(y), where=z)
        losses.append(np.sum(a**2 * (tilde - delta) ** 2, axis=1))
    loss = np.concatenate(losses)
    mean = float(loss.mean())
    if return_stderr:
        return mean, float(loss.std(ddof=1) / np.sqrt(loss.size)) if loss.size > 1 else np.nan
    return mean


def convex_allocation(a, sigma2, eta2, cost, budget, p_min: float = 1e-6, tol: float = 1e-12):
    """Minimise the risk of Theorem 2 over allocations with a generic convex solver.

    An independent check of Eq. (22) and of Theorem 3: sequential quadratic programming
    (SciPy's SLSQP) on ``min_p Σ a²((σ²+η²)/p − η²)`` subject to ``Σ p c ≤ C`` and
    ``p_min ≤ p ≤ 1``, with the analytic gradient, started from the uniform allocation. It uses
    neither the square-root form nor water-filling. Entries of weight a²(σ²+η²) = 0 are left
    out (p = 0). Returns ``(p, risk)``; raises if the solver reports failure.
    """
    from scipy.optimize import minimize

    a, sigma2, eta2 = _entries(a, sigma2, eta2)
    cost = _nonneg(cost, "cost")
    check_same_shape(a, cost, "a", "cost")
    C = _budget(budget)
    w2 = (a**2 * (sigma2 + eta2)).ravel()
    on = w2 > 0
    c = cost.ravel()[on]
    x0 = np.clip(np.full(on.sum(), C / max(c.sum(), 1e-300)), p_min, 1.0)
    scale = np.sum(w2[on] / x0)  # the objective at the start is 1: the solver's tolerances are relative
    res = minimize(lambda p: np.sum(w2[on] / p) / scale, x0, jac=lambda p: -w2[on] / p**2 / scale,
                   method="SLSQP", bounds=[(p_min, 1.0)] * int(on.sum()),
                   constraints=[{"type": "ineq", "fun": lambda p: (C - p @ c) / C, "jac": lambda p: -c / C}],
                   options={"ftol": tol, "maxiter": 2000})
    if not res.success:
        raise RuntimeError(f"the convex solver failed: {res.message}")
    p = np.zeros(w2.shape)
    p[on] = res.x
    p = p.reshape(a.shape)
    return p, allocation_risk(p, a, sigma2, eta2)


# ------------------------------------------------------------------------------------------
# exact evaluations of slates inside training (chapter 9)
# ------------------------------------------------------------------------------------------
ALLOCATIONS: tuple[str, ...] = ("sqrt", "uniform", "proportional", "leverage")
"""The allocation rules of :func:`slate_allocation`: Eq. (22), the two baselines, and Eq. (22)
before the draw with p = 0 allowed (:func:`predraw_allocation`, aimed at the gradient)."""


def slate_entries(a, sigma2, eta2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Theorem 2's entries when one evaluation serves every agent of a slate.

    ``a, sigma2, eta2`` have shape ``(..., K)`` (agent i of each slate). With one draw
    Z ~ Bernoulli(p) per slate, each agent's Δ̃_i of Eq. (21) is still unbiased and its risk
    is a_i²((σ_i² + η_i²)/p − η_i²) (it involves Z only through its marginal), so the risk
    of a slate is Theorem 2's with ``a = 1``, ``σ² = Σ_i a_i² σ_i²``, ``η² = Σ_i a_i² η_i²``.
    Returns those three arrays of shape ``(...)``; every function of this module then
    applies to slates: :func:`neyman_allocation` is Eq. (22) per slate, and
    :func:`risk_lower_bound` is Theorem 3 over all allocations of slate evaluations.
    """
    a, sigma2, eta2 = _entries(a, sigma2, eta2)
    s2, e2 = (a**2 * sigma2).sum(-1), (a**2 * eta2).sum(-1)
    return np.ones_like(s2), s2, e2


def predraw_risk(p, w2) -> float:
    """Risk of an allocation fixed before the router's draw, with p = 0 allowed.

    Σ_s r_s with r_s = w_s² (1/p_s − 1) for p_s > 0 (Eq. 21 corrects the slate; Theorem 2 with
    σ² = 0) and r_s = w_s² at p_s = 0 (the slate keeps Eq. 19's estimate, whose squared error
    has expectation w_s² over the draw). ``w2`` = Σ_i a_i² η_i² of each slate
    (:func:`slate_entries`), ``p`` in [0, 1], one shape. Returns a float.
    """
    p, w2 = _nonneg(p, "p"), _nonneg(w2, "w2")
    check_same_shape(p, w2, "p", "w2")
    if (p > 1).any():
        raise ValueError("p must be at most 1 (it is a probability)")
    with np.errstate(over="ignore"):  # a tiny p: the risk is inf
        corrected = np.divide(w2, p, out=np.zeros_like(w2), where=p > 0) - w2
        return float(np.sum(np.where(p > 0, corrected, w2)))


def predraw_allocation(w2, cost, budget) -> np.ndarray:
    """The least :func:`predraw_risk` over allocations with Σ p c ≤ C, p = 0 allowed: the top-n rule.

    Not Eq. (22), which it departs from in three ways: p = 0 is allowed (Eq. 21 divides by p,
    so Theorems 2 and 3, read with every p > 0, do not cover it); only the n slates of largest
    weight are evaluated, with n chosen to give the least risk, and Eq. (22)'s water-filling
    applies on those n alone; and the weight w² must be fixed before the router's draw. When
    p is fixed before the router's draw, Eq. (19) is unbiased over the draw on a slate
    that is never evaluated, so p = 0 is allowed and costs w² (:func:`predraw_risk`). As
    w²(1/p − 1) ≥ w² for p ≤ ½, only p ∈ {0} ∪ (½, 1] can be optimal. With equal costs an
    optimal allocation evaluates the n slates of largest w for some n (swapping a p = 0
    slate of larger w with an evaluated one changes the risk by (w_t² − w_s²)(1/p − 2) ≤ 0)
    and on them is Eq. (22)'s water-filling p = min{1, t w}; so this tries every n and keeps
    the least risk (exactly: the risk of n is (S_n − S_k)² / (B − k) − Σ_{k ≤ j < n} w_j²
    + Σ_{j ≥ n} w_j², with S the cumulative sums of the sorted w, B = C / c the expected
    number of evaluations and k the saturated slates).

    ``w2`` per slate (non-negative), ``cost`` per slate, all equal and positive (one
    evaluation queries the same K − 1 rewards on every slate); scalar ``budget`` C. Returns p
    of ``w2``'s shape. Every slate gets p = 1 when the budget covers them all (so a full
    budget is the oracle); else slates with w² = 0 get p = 0, every slate of positive weight
    gets p = 1 when the budget covers those; otherwise the spend Σ p c lies within one slate's
    cost of C (what is left would buy only p ≤ ½ somewhere, which never helps).

    With p = 0 allowed, Eq. (21)'s credit is unbiased *over the router's draw* (and over Z),
    not conditionally on the draw as with every p > 0; this needs p to use no information
    from the draw (I, G): pass w² from :func:`predraw_error_proxy`.
    """
    w2 = _nonneg(w2, "w2")
    cost = _nonneg(cost, "cost")
    check_same_shape(w2, cost, "w2", "cost")
    B = _budget(budget)
    flat_c = cost.ravel()
    if flat_c.size and (flat_c[0] <= 0 or (flat_c != flat_c[0]).any()):
        raise ValueError("predraw_allocation needs one positive cost shared by every slate")
    flat = w2.ravel()
    if flat.size == 0 or flat.size * flat_c[0] <= B:  # the budget covers every slate
        return np.ones(w2.shape)
    p = np.zeros(flat.shape)
    live = np.flatnonzero(flat > 0)
    if live.size == 0:
        return p.reshape(w2.shape)
    B = B / flat_c[0]  # expected number of evaluations
    if live.size <= B:
        p[live] = 1.0
        return p.reshape(w2.shape)
    order = live[np.argsort(-flat[live], kind="stable")]
    w = np.sqrt(flat[order])
    n_all = w.size
    S = np.concatenate(([0.0], np.cumsum(w)))  # S[n] = Σ_{j<n} w_j
    Q = np.concatenate(([0.0], np.cumsum(w**2)))
    n = np.arange(1, n_all + 1)[:, None]  # active slates (rows)
    k = np.arange(n_all)[None, :]  # saturated slates (columns), k < n
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # inf: a hopeless candidate
        level = (B - k) / (S[n] - S[k])
        ok = (k < n) & ((level * w[k] <= 1.0) | (k >= B))
        ok[(n <= B)[:, 0]] = False
        first = np.where(ok.any(1), ok.argmax(1), n[:, 0])  # saturated count per n
        fill = (S[n[:, 0]] - S[first]) ** 2 / (B - first) - (Q[n[:, 0]] - Q[first])
        fill = np.where(first < n[:, 0], np.where(B - first > 0, fill, np.inf), 0.0)
    risk = np.concatenate(([Q[-1]], fill + (Q[-1] - Q[n[:, 0]])))  # n = 0: evaluate nothing
    n_best = int(np.argmin(risk))  # the first of equal risks: the fewest evaluated slates
    if n_best == 0:
        return p.reshape(w2.shape)
    k_best = int(first[n_best - 1])
    q = np.ones(n_best)
    if k_best < n_best:
        t = (B - k_best) / (S[n_best] - S[k_best])
        q[k_best:] = np.minimum(1.0, t * w[k_best:n_best])
    p[order[:n_best]] = q
    return p.reshape(w2.shape)


def slate_allocation(a, sigma2, eta2, cost, budget, rule: str = "sqrt", floor: float = 0.0) -> np.ndarray:
    """Evaluation probabilities of slates under an expected-cost budget C.

    ``a, sigma2, eta2`` of shape ``(N, K)`` (or ``(..., K)``), ``cost`` one per slate. Rules:

    - ``"sqrt"``: Eq. (22) on the slate entries of :func:`slate_entries`,
      p ∝ √(Σ_i a_i²(σ_i² + η_i²)) / √c (Theorem 2's optimum for slates). It departs from
      Eq. (22) in that a slate's K agents share one draw (one evaluation reveals every reward
      of the slate), so the unit is a slate, not a contribution; and, with ``floor`` > 0, in
      the floor below. :class:`ExactBudget` adds the engine's other departures;
    - ``"uniform"``: the same p for every slate (when every slate costs the same, it is also
      chapter 6's cost-proportional allocation);
    - ``"proportional"``: p ∝ Σ_i a_i²(σ_i² + η_i²), proportional to the risk weight rather
      than its square root;
    - ``"leverage"``: :func:`predraw_allocation` on w² = Σ_i a_i²(σ_i² + η_i²), p = 0 allowed,
      for a the gradient leverage ‖Ψ_i‖ and η² predicted before the draw (no floor: ``floor``
      must be 0; equal costs).

    Each spends Σ p c = min(C, Σ c) when every slate has positive weight. ``floor`` λ in
    [0, 1] mixes in the uniform allocation, p = (1 − λ) p_rule + λ p_uniform, which spends
    the same budget and keeps every p ≥ λ C / Σ c > 0 (Eq. 21 needs p > 0).
    """
    if rule not in ALLOCATIONS:
        raise ValueError(f"rule must be one of {ALLOCATIONS}, got {rule!r}")
    if not 0.0 <= floor <= 1.0:
        raise ValueError(f"floor must lie in [0, 1], got {floor}")
    one, s2, e2 = slate_entries(a, sigma2, eta2)
    cost = _nonneg(cost, "cost")
    check_same_shape(one, cost, "slates", "cost")
    if rule == "leverage":
        if floor != 0.0:
            raise ValueError("rule 'leverage' has no floor (p = 0 is allowed); pass floor=0")
        return predraw_allocation(s2 + e2, cost, budget)
    uniform = uniform_allocation(cost, budget)
    if rule == "uniform":
        return uniform
    if rule == "sqrt":
        p = neyman_allocation(one, s2, e2, cost, budget)
    else:
        p = proportional_allocation(s2 + e2, cost, budget)
    mixed = np.minimum(1.0, (1.0 - floor) * p + floor * uniform)
    return np.where((p == 1.0) & (uniform == 1.0), 1.0, mixed)  # exactly 1 where both are


def _removal_terms(p, P, mu_hat) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Checked ``p, mu_hat`` and the weights C_ij = p_j − P^{-i}_j of the removal contribution
    Δ_i = Σ_j C_ij g_j, shape ``(..., K, K)``, that both error proxies of Eq. (19) use."""
    p = as_float_array(p, "p")
    mu = as_float_array(mu_hat, "mu_hat")
    check_same_shape(mu, p, "mu_hat", "p")
    P = leave_one_out(P, p)
    if (p <= 0).any():
        raise ValueError("p must be positive (Eq. 19 divides by it)")
    return p, mu, p[..., None, :] - P


def removal_error_proxy(selected, reward, p, P, mu_hat) -> np.ndarray:
    """The squared error of Eq. (19) that the outcome model predicts, from observed data only.

    The removal contribution is linear in the candidate values, Δ_i = Σ_j C_ij g_j with
    C_ij = p_j − P^{-i}_j, so Eq. (19)'s error is Δ̂_i − Δ_i = Σ_j C_ij (ĝ_j − R^(j)). The
    deployed candidate's term is known, C_iI (G − μ̂_I)(1/p_I − 1); for j ≠ I the term is
    C_ij(μ̂_j − R^(j)). Taking R^(j) ~ Bernoulli(μ̂_j) independently (the outcome model's
    belief) gives the prediction

        v_i = (C_iI (G − μ̂_I)(1/p_I − 1))² + Σ_{j ≠ I} C_ij² μ̂_j (1 − μ̂_j).

    Shapes as :func:`mcpg.routing.dr_removal_contributions`; returns ``(..., K)``. It uses no
    reward but G, so an allocation built on it may be drawn before any exact evaluation.
    """
    p, mu, C = _removal_terms(p, P, mu_hat)
    G = as_float_array(reward, "reward")
    if G.shape != p.shape[:-1]:
        raise ValueError(f"reward must have shape {p.shape[:-1]}, got {G.shape}")
    sel = np.asarray(selected).astype(int)
    if sel.shape != G.shape:
        raise ValueError(f"selected must have shape {G.shape}, got {sel.shape}")
    K = p.shape[-1]
    onehot = np.arange(K) == sel[..., None]
    p_I = np.take_along_axis(p, sel[..., None], -1)
    mu_I = np.take_along_axis(mu, sel[..., None], -1)
    known = np.take_along_axis(C, np.broadcast_to(sel[..., None, None], C.shape[:-1] + (1,)), -1)[..., 0]
    known = known * (G[..., None] - mu_I) * (1.0 / p_I - 1.0)
    unknown = (C**2 * np.where(onehot, 0.0, mu * (1.0 - mu))[..., None, :]).sum(-1)
    return known**2 + unknown


def predraw_error_proxy(p, P, mu_hat) -> np.ndarray:
    """Eq. (19)'s expected squared error before the router's draw, under the outcome model.

    Δ̂_i − Δ_i = Σ_j C_ij (μ̂_j − R^(j))(1 − 1{I = j}/p_j) with C_ij = p_j − P^{-i}_j. Taking
    R^(j) ~ Bernoulli(μ̂_j) independently (the outcome model's belief) and I ~ p independent
    of them, the cross terms vanish (E[(1 − 1{I=j}/p_j)(1 − 1{I=k}/p_k)] = δ_jk/p_j − 1 and
    the R^(j) are centred and independent), which leaves

        E[η_i²] = Σ_j C_ij² μ̂_j (1 − μ̂_j) (1/p_j − 1).

    Shapes: ``p, mu_hat`` ``(..., K)``, ``P`` ``(..., K, K)``; returns ``(..., K)``. It uses
    neither I nor G, so an allocation built on it is fixed before the draw
    (:func:`predraw_allocation`).
    """
    p, mu, C = _removal_terms(p, P, mu_hat)
    return (C**2 * (mu * (1.0 - mu) * (1.0 / p - 1.0))[..., None, :]).sum(-1)


class ExactBudget:
    """Exact evaluations on a budget inside training: Eq. (21), with p from a rule of :data:`ALLOCATIONS`.

    Rule ``"sqrt"`` is Eq. (22) with four departures, which chapter 9 names: one draw per
    slate, shared by its K agents (:func:`slate_allocation`); the leverage ``a`` is what the
    caller passes (the engine passes the advantage's first-order sensitivity,
    :func:`mcpg.grpo.objective.credit_leverage`, not the paper's ‖Ψ_i‖); η² is predicted
    (κ_i v_i below, v given the router's draw) rather than known; and a floor mixes in a
    tenth of the uniform allocation by default, the pilot rollout being uniform.

    ``share`` is the expected fraction of slates evaluated exactly (one evaluation serves all
    K agents of its slate, so it is also the share of agent-slates); the budget of a rollout
    of N slates is C = share · Σ_s c_s, with c_s the reward queries beyond the deployed one
    (K − 1). ``rule`` is one of :data:`ALLOCATIONS`; ``floor`` the uniform mixture of
    :func:`slate_allocation`.

    The predicted η² of a slate's agent i is κ_i v_i, with v_i from
    :func:`removal_error_proxy` and κ_i ≥ 0 a per-agent calibration learned from the exact
    evaluations of *earlier* rollouts: κ_i = Σ_evaluated (Δ̂_i − Y_i)²/p / Σ_{p>0} v_i, the
    inverse-propensity estimate of the total squared error over the total prediction. Until
    an evaluation has been made (the pilot rollout) the allocation is uniform. σ² = 0: the
    exact evaluation Y is the removal contribution computed from the slate's own rewards,
    a function of the slate (rewards are deterministic given a candidate).

    Rule ``"leverage"`` (:func:`predraw_allocation`) differs in three ways: v is
    :func:`predraw_error_proxy` (no I, no G), ``a`` is the gradient leverage ‖Ψ_i‖ (or a proxy
    of it) rather than the advantage's, and there is no floor, so slates may get p = 0. The
    inverse-propensity sum then estimates the error of the slates with p > 0 only, so κ's
    denominator sums v over those slates (for the other rules every p > 0: the same κ).
    """

    def __init__(self, share: float, rule: str = "sqrt", floor: float | None = None):
        if not (isinstance(share, (int, float)) and 0.0 <= share <= 1.0):
            raise ValueError(f"share must lie in [0, 1], got {share!r}")
        if rule not in ALLOCATIONS:
            raise ValueError(f"rule must be one of {ALLOCATIONS}, got {rule!r}")
        if floor is None:  # the old rules' default floor; "leverage" has none
            floor = 0.0 if rule == "leverage" else 0.1
        if not 0.0 <= floor <= 1.0:
            raise ValueError(f"floor must lie in [0, 1], got {floor}")
        self.share, self.rule, self.floor = float(share), rule, float(floor)
        self.err_sum: np.ndarray | None = None  # Σ over evaluated (agent, slate) of (Δ̂ − Y)²/p
        self.proxy_sum: np.ndarray | None = None  # Σ over (agent, slate) with p > 0 of v
        self.evaluations = 0  # exact evaluations so far (slates)

    def kappa(self) -> np.ndarray | None:
        """The per-agent calibration κ of the η² prediction, or None before any evaluation."""
        if not self.evaluations:
            return None
        return np.divide(self.err_sum, self.proxy_sum, out=np.zeros_like(self.err_sum),
                         where=self.proxy_sum > 0)

    def probabilities(self, a, proxy, cost, rule: str | None = None) -> np.ndarray:
        """The slates' evaluation probabilities, shape ``cost.shape``.

        ``a`` (leverage) and ``proxy`` (v) have shape ``cost.shape + (K,)``. Uniform in the
        pilot rollout (no evaluation yet) and whenever every predicted weight is 0; under
        ``"leverage"`` the pilot takes κ = 1 (the outcome model's own belief) instead, since
        a uniform p below ½ would cost more than evaluating nothing (:func:`predraw_risk`).
        """
        cost = np.asarray(cost, dtype=float)
        budget = self.share * float(cost.sum())
        kappa = self.kappa()
        rule = self.rule if rule is None else rule
        if kappa is None and rule == "leverage":
            kappa = np.ones(np.shape(proxy)[-1])
        eta2 = None if kappa is None else kappa * np.asarray(proxy, dtype=float)
        if rule == "uniform" or eta2 is None or not (np.asarray(a) ** 2 * eta2).sum() > 0:
            return uniform_allocation(cost, budget)
        return slate_allocation(a, np.zeros_like(eta2), eta2, cost, budget, rule=rule, floor=self.floor)

    def observe(self, z, p, delta_hat, y, proxy) -> None:
        """Learn from one rollout's exact evaluations (``z`` = 1) after its credit is formed.

        ``z, p`` per slate; ``delta_hat, y, proxy`` per (slate, agent); y is read where z = 1.
        Slates with p = 0 (rule ``"leverage"``) leave κ unchanged: they are never evaluated.
        """
        z = np.asarray(z, dtype=bool)
        p = np.asarray(p, dtype=float)
        dh, proxy = np.asarray(delta_hat, dtype=float), np.asarray(proxy, dtype=float)
        K = dh.shape[-1]
        err = np.zeros(K)
        if z.any():
            d = dh[z] - np.asarray(y, dtype=float)[z]
            err = (d**2 / p[z][..., None]).reshape(-1, K).sum(0)
        if self.err_sum is None:
            self.err_sum, self.proxy_sum = np.zeros(K), np.zeros(K)
        self.err_sum = self.err_sum + err
        self.proxy_sum = self.proxy_sum + proxy.reshape(-1, K)[p.reshape(-1) > 0].sum(0)
        self.evaluations += int(z.sum())

    def state_dict(self) -> dict:
        """What a checkpoint keeps (plain JSON types)."""
        return {"share": self.share, "rule": self.rule, "floor": self.floor, "evaluations": self.evaluations,
                "err_sum": None if self.err_sum is None else self.err_sum.tolist(),
                "proxy_sum": None if self.proxy_sum is None else self.proxy_sum.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.share, self.rule, self.floor = float(state["share"]), state["rule"], float(state["floor"])
        self.evaluations = int(state["evaluations"])
        self.err_sum = None if state["err_sum"] is None else np.array(state["err_sum"], dtype=float)
        self.proxy_sum = None if state["proxy_sum"] is None else np.array(state["proxy_sum"], dtype=float)
