"""The masked critic: learning retention values from ordinary training data (paper §6).

A single network q̂_φ(H, m(S), A^(S)) reads the prompt, a mask m(S) ∈ {0, 1}^K saying
which agents are present, and the present agents' actions (absent agents' inputs are
zeroed). It is trained by the squared loss on the deployed reward G,

    L(φ) = E[(G − q̂_φ(H, m(S), A^(S)))²],

with the masks S drawn independently of the whole trajectory given H (the actions, the
reward's noise, a router's draw). Lemma 2: the minimiser is
E[G | H, A^(S)] = q^ret(S), the retention value of Eq. (8), for every S the mask design
reaches. Proposition 5: for agent i and any S that excludes A^(i) (and every agent that
acts after i), the factual residual G − q̂(S) of a *fixed or cross-fitted* critic is a
gradient-correct signal, E[Ψ_i (G − q̂(S))] = ∇_θi J_sys (Eq. 15), whatever the critic's
accuracy.
Corollary 2: any fixed or cross-fitted predictor of G from (H, A^(−i)) is a valid baseline.

What this module holds:

- masks and inputs: :func:`sample_masks`, :func:`group_masks`, :func:`encode_inputs`
  (general prompt and action features), :func:`encode` (one-hot inputs of a small system
  of :mod:`mcpg.mechanisms`), :func:`masked_dataset` (each trajectory under one or several
  masks), :func:`population_dataset` (Lemma 2's loss in the population, exactly);
- the network: :class:`MaskedCritic`, an MLP that can hold an *ensemble* of independent
  members (one per cross-fitting fold or per Monte Carlo repetition) trained in one
  batched call;
- training: :func:`empirical_minimiser` (the best function of the input, in closed form),
  :func:`fit_critic` (full-batch Adam on the squared loss), :func:`train_critic` (straight
  from a system's samples);
- using it: :func:`critic_values` (q̂ at every group and outcome, the shape of
  :func:`mcpg.mechanisms.retention_values`), :func:`default_groups`, :func:`baselines`,
  :func:`cross_fit` (K-fold cross-fitting: out-of-fold baselines), :func:`flat_scores`,
  and :func:`repeated_gradient_estimates` (the in-sample against cross-fitted experiment).

Training is exact full-batch gradient descent on the squared loss, done on the *distinct*
input rows: rows with equal inputs are merged into one row carrying their total weight and
mean target. Since Σ_k (y_k − f(x))² = n_x (ȳ_x − f(x))² + Σ_k (y_k − ȳ_x)², the merged loss
differs from the original by a constant, so its gradients, and hence the trained network,
are the same; for one-hot inputs it makes training independent of the number of samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from ._checks import as_float_array
from .mechanisms import Samples, System

__all__ = [
    "sample_masks",
    "group_masks",
    "encode_inputs",
    "encode",
    "n_inputs",
    "MaskedData",
    "masked_dataset",
    "population_dataset",
    "MaskedCritic",
    "empirical_minimiser",
    "fit_critic",
    "train_critic",
    "critic_values",
    "default_groups",
    "baselines",
    "fold_assignment",
    "CrossFit",
    "cross_fit",
    "flat_scores",
    "repeated_gradient_estimates",
]

DTYPE = torch.float32


# --- masks and inputs ----------------------------------------------------------------


def sample_masks(n: int, n_agents: int, rng: np.random.Generator, prob: float = 0.5) -> np.ndarray:
    """Masks m(S) drawn independently of everything else (Lemma 2's design).

    Each agent is present with probability ``prob``, independently across agents and
    draws; with ``prob = 1/2`` the group S is uniform over all 2**K groups. The draw reads
    nothing of the trajectory (the actions, the reward's noise, a router's draw), which is
    Lemma 2's condition: S independent of the trajectory given H. Not reading the actions
    is not enough; a mask drawn from the reward alone reads no action and still moves the
    minimiser (chapter 4).

    Returns:
        bool array (n, n_agents), True where the agent is present.
    """
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    if int(n_agents) != n_agents or n_agents < 1:
        raise ValueError(f"n_agents must be a positive integer, got {n_agents}")
    if not 0.0 <= prob <= 1.0:
        raise ValueError(f"prob must lie in [0, 1], got {prob}")
    return rng.random((int(n), int(n_agents))) < prob


def group_masks(groups, n_agents: int) -> np.ndarray:
    """Bool masks (len(groups), n_agents) of groups given as bitmasks (bit i = agent i present)."""
    if int(n_agents) != n_agents or n_agents < 1:
        raise ValueError(f"n_agents must be a positive integer, got {n_agents}")
    g = np.asarray(groups)
    if g.ndim != 1 or not np.issubdtype(g.dtype, np.integer):
        raise ValueError(f"groups must be a 1-d sequence of integer bitmasks, got {groups!r}")
    if ((g < 0) | (g >= 1 << int(n_agents))).any():
        raise ValueError(f"groups must be bitmasks in [0, 2**{n_agents})")
    return (g[:, None] >> np.arange(int(n_agents))) & 1 == 1


def _mask_to_group(masks: np.ndarray) -> np.ndarray:
    return (masks.astype(np.int64) << np.arange(masks.shape[1])).sum(axis=1)


def encode_inputs(prompt_features, masks, action_features) -> torch.Tensor:
    """The critic's input (H, m(S), A^(S)): prompt features, the mask, masked action features.

    Args:
        prompt_features: array (n, d_H), e.g. a one-hot of the prompt or an embedding.
        masks: bool or {0, 1} array (n, K), 1 where the agent is present.
        action_features: array (n, K, d_A), e.g. one-hot actions or embeddings of outputs.

    Returns:
        float32 tensor (n, d_H + K + K * d_A); the action features of absent agents are
        zeroed, so the critic cannot see them, and the mask tells it which zeros mean
        "absent" rather than "a zero feature".
    """
    h = as_float_array(prompt_features, "prompt_features")
    m = as_float_array(masks, "masks")
    a = as_float_array(action_features, "action_features")
    if h.ndim != 2:
        raise ValueError(f"prompt_features must have shape (n, d_H), got {h.shape}")
    if m.ndim != 2 or m.shape[0] != h.shape[0]:
        raise ValueError(f"masks must have shape ({h.shape[0]}, K), got {m.shape}")
    if not np.isin(m, (0.0, 1.0)).all():
        raise ValueError("masks must hold only 0/1 (or False/True)")
    if a.ndim != 3 or a.shape[:2] != m.shape:
        raise ValueError(f"action_features must have shape ({m.shape[0]}, {m.shape[1]}, d_A), got {a.shape}")
    x = np.concatenate([h, m, (a * m[..., None]).reshape(len(a), -1)], axis=1)
    return torch.as_tensor(x, dtype=DTYPE)


def _masks_for(samples_n: int, n_agents: int, masks) -> np.ndarray:
    """Broadcast ``masks`` (an int bitmask S or an (n, K) array) to bool (n, K)."""
    if np.ndim(masks) == 0:
        S = masks
        if int(S) != S:
            raise ValueError(f"masks must be an integer bitmask or an (n, K) array, got {masks!r}")
        return np.repeat(group_masks([int(S)], n_agents), samples_n, axis=0)
    m = np.asarray(masks)
    if m.shape != (samples_n, n_agents):
        raise ValueError(f"masks must have shape ({samples_n}, {n_agents}), got {m.shape}")
    if m.dtype != bool and not np.isin(m, (0, 1)).all():
        raise ValueError("masks must hold only 0/1 (or False/True)")
    return m.astype(bool)


def encode(system: System, samples: Samples, masks) -> torch.Tensor:
    """One-hot critic inputs for draws of a small system of :mod:`mcpg.mechanisms`.

    The prompt is one-hot over the system's n_H prompts and each action one-hot over its M
    actions (zeroed when the agent is absent): :func:`encode_inputs` with one-hot features.

    Args:
        samples: draws (only ``h`` and ``actions`` are read).
        masks: an integer bitmask S (the same group for every draw) or a bool array (n, K).
    """
    n, K = len(samples), system.n_agents
    m = _masks_for(n, K, masks)
    h = np.eye(system.n_prompts)[samples.h]
    a = np.eye(system.n_actions)[samples.actions]
    return encode_inputs(h, m, a)


def n_inputs(system: System) -> int:
    """Width of :func:`encode`'s rows for ``system``: n_H + K + K * M."""
    return system.n_prompts + system.n_agents * (1 + system.n_actions)


@dataclass
class MaskedData:
    """Trajectories under masks: the rows the critic is trained on.

    Attributes:
        inputs: tensor (rows, d), :func:`encode` of each (trajectory, mask) pair.
        targets: array (rows,), the trajectory's deployed reward G.
        trajectory: array (rows,), index of the trajectory each row comes from (folds
            must split trajectories, not rows).
        groups: array (rows,), the bitmask S of each row's mask.
        weights: array (rows,) of row weights, or None (every row weight 1).
    """

    inputs: torch.Tensor
    targets: np.ndarray
    trajectory: np.ndarray
    groups: np.ndarray
    weights: np.ndarray | None = None


def masked_dataset(system: System, samples: Samples, masks="all", rng: np.random.Generator | None = None,
                   n_random: int = 1, prob: float = 0.5) -> MaskedData:
    """Pair each trajectory with masks drawn independently of the trajectory (Lemma 2).

    Args:
        masks: the mask design.
            ``"all"``: every trajectory under every one of the 2**K groups;
            ``"random"``: ``n_random`` masks per trajectory from :func:`sample_masks`, each
            agent present with probability ``prob`` (needs ``rng``);
            an int S: every trajectory under the one group S (as in :func:`encode`);
            a 1-d sequence of bitmasks: every trajectory under each listed group
            (e.g. the groups N \\ {i} that the baselines will query);
            a bool array (n, K): one given mask per trajectory (the caller vouches that it
            was drawn independently of the trajectory given H: a mask that reads the actions,
            or only the reward, breaks Lemma 2).
    """
    n, K = len(samples), system.n_agents
    if isinstance(masks, str):
        if masks not in ("all", "random"):
            raise ValueError("masks must be 'all', 'random', a bitmask, a sequence of bitmasks "
                             f"or an (n, K) array, "
                             f"got {masks!r}")
        if masks == "all":
            masks = np.arange(1 << K)
    if isinstance(masks, str):  # "random"
        if int(n_random) != n_random or n_random < 1:
            raise ValueError(f"n_random must be a positive integer, got {n_random}")
        if rng is None:
            raise ValueError("rng is needed to draw random masks")
        traj = np.repeat(np.arange(n), int(n_random))
        mk = sample_masks(n * int(n_random), K, rng, prob)
    elif np.ndim(masks) <= 1:
        gm = group_masks(np.atleast_1d(np.asarray(masks)), K)
        traj = np.tile(np.arange(n), len(gm))
        mk = np.repeat(gm, n, axis=0)
    else:
        mk = _masks_for(n, K, masks)
        traj = np.arange(n)
    sub = Samples(h=samples.h[traj], actions=samples.actions[traj], reward=samples.reward[traj])
    targets = np.asarray(samples.reward, dtype=float)[traj]
    return MaskedData(encode(system, sub, mk), targets, traj, _mask_to_group(mk))


def population_dataset(system: System, mask_probs=None) -> MaskedData:
    """Lemma 2's loss in the population: every (S, H, A) with its exact weight and target.

    Row (S, H, A) has weight P(H, A) · P(S | H, A) and target E[G | H, A]. The squared loss
    on these rows is the expected loss of §6 up to a constant (the reward noise
    around E[G | H, A]), so :func:`empirical_minimiser` on them is the population minimiser.

    Args:
        mask_probs: P(S | H, A), array (2**K, n_H, M, ..., M) summing to 1 over S; default
            1 / 2**K (masks independent of everything, Lemma 2's design). A design that
            reads the actions can be given to see Lemma 2 fail.

    Returns:
        :class:`MaskedData` whose ``trajectory`` is the flat index of (H, A) in
        ``system.joint_shape`` and whose rows run over S first: reshaping any per-row array
        to (2**K, *system.joint_shape) gives the layout of
        :func:`mcpg.mechanisms.retention_values`.
    """
    K = system.n_agents
    shape = (1 << K,) + system.joint_shape
    if mask_probs is None:
        pS = np.full(shape, 1.0 / (1 << K))
    else:
        pS = as_float_array(mask_probs, "mask_probs")
        if pS.shape != shape:
            raise ValueError(f"mask_probs must have shape {shape}, got {pS.shape}")
        if (pS < 0).any() or not np.allclose(pS.sum(axis=0), 1.0):
            raise ValueError("mask_probs must be non-negative and sum to 1 over the groups S (axis 0)")
    inputs, groups = _every_group_and_outcome(system)
    n = inputs.shape[0] >> K
    P = system.joint_prob().detach().numpy().ravel()
    G = system.reward_mean().detach().numpy().ravel()
    return MaskedData(inputs, np.tile(G, 1 << K), np.tile(np.arange(n), 1 << K), groups,
                      np.tile(P, 1 << K) * pS.reshape(-1))


# --- the network ---------------------------------------------------------------------


class MaskedCritic(torch.nn.Module):
    """An MLP q̂_φ(H, m(S), A^(S)) (§6), possibly an ensemble of independent members.

    Every member has its own weights; ``critic(x)`` evaluates all members on the same rows.
    Members are trained jointly by :func:`fit_critic` but independently (the loss is a sum
    over members and Adam acts coordinate-wise), so an ensemble of E members is the same as
    E critics trained one after another, only faster.

    Args:
        n_inputs: input width d (see :func:`encode`, :func:`n_inputs`).
        hidden: width of the hidden layers.
        depth: number of hidden layers (ReLU).
        n_members: ensemble size E.
        seed: seed of the initial weights (PyTorch's default ``Linear`` initialisation).
    """

    def __init__(self, n_inputs: int, hidden: int = 64, depth: int = 2, n_members: int = 1, seed: int = 0):
        super().__init__()
        sizes = (("n_inputs", n_inputs), ("hidden", hidden), ("depth", depth), ("n_members", n_members))
        for name, val in sizes:
            if int(val) != val or val < 1:
                raise ValueError(f"{name} must be a positive integer, got {val}")
        gen = torch.Generator().manual_seed(int(seed))
        widths = [int(n_inputs)] + [int(hidden)] * int(depth) + [1]
        self.weights = torch.nn.ParameterList()
        self.biases = torch.nn.ParameterList()
        for d_in, d_out in zip(widths[:-1], widths[1:]):
            bound = 1.0 / math.sqrt(d_in)
            w = (torch.rand(n_members, d_in, d_out, generator=gen) * 2 - 1) * bound
            self.weights.append(torch.nn.Parameter(w))
            b = (torch.rand(n_members, 1, d_out, generator=gen) * 2 - 1) * bound
            self.biases.append(torch.nn.Parameter(b))
        self.n_inputs, self.n_members = int(n_inputs), int(n_members)

    @classmethod
    def for_system(cls, system: System, **kwargs) -> "MaskedCritic":
        """A critic whose input width fits :func:`encode` of ``system`` (untrained)."""
        return cls(n_inputs(system), **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """q̂ of every member at rows x (n, d): tensor (E, n)."""
        if x.ndim != 2 or x.shape[1] != self.n_inputs:
            raise ValueError(f"x must have shape (n, {self.n_inputs}), got {tuple(x.shape)}")
        W0 = self.weights[0]
        x = x.to(W0.dtype)
        E, d, h = W0.shape
        z = (x @ W0.permute(1, 0, 2).reshape(d, E * h)).reshape(-1, E, h).transpose(0, 1) + self.biases[0]
        for W, b in zip(self.weights[1:], self.biases[1:]):
            z = torch.baddbmm(b, torch.relu(z), W)
        return z.squeeze(-1)

    def predict(self, x: torch.Tensor, member: int | None = None) -> np.ndarray:
        """Numpy predictions without gradients: (E, n), or (n,) for one member."""
        with torch.no_grad():
            out = self(x).double().numpy()
        if member is None:
            return out
        if int(member) != member or not 0 <= member < self.n_members:
            raise ValueError(f"member must be in [0, {self.n_members}), got {member}")
        return out[int(member)]


def _distinct_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct rows of a 2-d array and the index of each row's distinct row (fast: rows as bytes)."""
    x = np.ascontiguousarray(x + 0.0)  # + 0.0 turns -0.0 into 0.0, so equal rows have equal bytes
    keys = x.view(np.dtype((np.void, x.dtype.itemsize * x.shape[1]))).ravel()
    _, first, inv = np.unique(keys, return_index=True, return_inverse=True)
    return x[first], inv.ravel()


def _merge_rows(inputs: torch.Tensor, targets: np.ndarray, member: np.ndarray, row: np.ndarray,
                weight: np.ndarray, n_members: int):
    """Distinct rows of ``inputs`` with each member's total weight and weighted mean target.

    The data are given sparsely: member ``member[k]`` sees row ``row[k]`` with weight
    ``weight[k]``. Returns the distinct rows (U, d) and arrays W, Y of shape (E, U).
    """
    uniq, inv = _distinct_rows(inputs.numpy())
    U = len(uniq)
    flat = member * U + inv[row]
    W = np.bincount(flat, weights=weight, minlength=n_members * U).reshape(n_members, U)
    WY = np.bincount(flat, weights=weight * targets[row], minlength=n_members * U).reshape(n_members, U)
    Y = np.divide(WY, W, out=np.zeros_like(WY), where=W > 0)
    return torch.as_tensor(uniq, dtype=DTYPE), W, Y


def empirical_minimiser(inputs: torch.Tensor, targets, weights=None) -> np.ndarray:
    """The minimiser of Σ_k w_k (y_k − f(x_k))² over *all* functions f, at every row (Lemma 2).

    It is the weighted mean of the targets over the rows with the same input. On
    :func:`population_dataset` rows (weights P(H, A) P(S | H, A), targets E[G | H, A]) it is
    q^ret(S) exactly when S is drawn independently of the trajectory given H (Lemma 2,
    Appendix B.8). A mask law that reads the actions (``mask_probs``), or the reward alone
    (rows split by the value of G, as chapter 4 builds them), moves it. With sampled data
    it is the cell mean, the best any critic can do on those data. Returns shape (n,).
    """
    if not torch.is_tensor(inputs) or inputs.ndim != 2:
        raise ValueError("inputs must be a 2-d torch tensor (n, d), e.g. from encode()")
    n = inputs.shape[0]
    y = as_float_array(targets, "targets")
    if y.shape != (n,):
        raise ValueError(f"targets must have shape ({n},), got {y.shape}")
    w = np.ones(n) if weights is None else as_float_array(weights, "weights")
    if w.shape != (n,):
        raise ValueError(f"weights must have shape ({n},), got {w.shape}")
    if (w < 0).any() or not w.sum() > 0:
        raise ValueError("weights must be non-negative and not all zero")
    x = np.ascontiguousarray(inputs.numpy().astype(np.float64) + 0.0)
    _, inv = _distinct_rows(x)
    W = np.bincount(inv, weights=w)
    WY = np.bincount(inv, weights=w * y)
    return np.divide(WY, W, out=np.full_like(WY, np.nan), where=W > 0)[inv]


def fit_critic(inputs: torch.Tensor, targets, weights=None, *, hidden: int = 64, depth: int = 2,
               steps: int = 600,
               lr: float = 0.01, weight_decay: float = 0.0, seed: int = 0) -> MaskedCritic:
    """Train a masked critic by full-batch Adam on the squared loss of §6 (Lemma 2).

    Member e minimises Σ_k w_ek (y_k − q̂_e(x_k))² / Σ_k w_ek. By Lemma 2 its minimiser over
    all functions is E[G | H, A^(S)] on every (H, S, A^(S)) the data reach, when the masks
    were drawn independently of the whole trajectory given H (the actions, the reward's noise,
    a router's draw); not reading the actions is not enough. The learning rate follows a cosine schedule
    to zero, so the last steps settle rather than oscillate; each member's output bias
    starts at its weighted mean target.

    Args:
        inputs: tensor (n, d), e.g. :attr:`MaskedData.inputs`.
        targets: array (n,), the deployed rewards G.
        weights: non-negative array (n,) or (E, n): one row per ensemble member (zero
            weight = the member never sees that row, as in cross-fitting). Default: one
            member, every row weight 1.
        hidden, depth: network size (:class:`MaskedCritic`).
        steps, lr, weight_decay: Adam's iterations, peak learning rate and L2 penalty.
        seed: seed of the initial weights.
    """
    if not torch.is_tensor(inputs) or inputs.ndim != 2:
        raise ValueError("inputs must be a 2-d torch tensor (n, d), e.g. from encode()")
    if torch.isnan(inputs).any():
        raise ValueError("inputs contains NaN")
    n = inputs.shape[0]
    y = as_float_array(targets, "targets")
    if y.shape != (n,):
        raise ValueError(f"targets must have shape ({n},), got {y.shape}")
    w = np.ones((1, n)) if weights is None else as_float_array(weights, "weights")
    if w.ndim == 1:
        w = w[None]
    if w.ndim != 2 or w.shape[1] != n:
        raise ValueError(f"weights must have shape ({n},) or (E, {n}), got {w.shape}")
    if (w < 0).any():
        raise ValueError("weights must be non-negative")
    if (w.sum(axis=1) <= 0).any():
        raise ValueError("weights gives some member no data (a row of zeros)")
    member, row = np.nonzero(w)
    x, W, Y = _merge_rows(inputs.to(DTYPE), y, member, row, w[member, row], len(w))
    return _fit_merged(x, W, Y, hidden=hidden, depth=depth, steps=steps, lr=lr,
                       weight_decay=weight_decay, seed=seed)


def _fit_merged(x: torch.Tensor, W: np.ndarray, Y: np.ndarray, *, hidden: int = 64, depth: int = 2,
                steps: int = 600,
                lr: float = 0.01, weight_decay: float = 0.0, seed: int = 0) -> MaskedCritic:
    """Adam on Σ_e Σ_u W_eu (Y_eu − q̂_e(x_u))² with each member's weights normalised to sum 1."""
    if int(steps) != steps or steps < 0:
        raise ValueError(f"steps must be a non-negative integer, got {steps}")
    if not lr > 0:
        raise ValueError(f"lr must be positive, got {lr}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be non-negative, got {weight_decay}")
    W = W / W.sum(axis=1, keepdims=True)
    W_t, Y_t = torch.as_tensor(W, dtype=DTYPE), torch.as_tensor(Y, dtype=DTYPE)
    critic = MaskedCritic(x.shape[1], hidden=hidden, depth=depth, n_members=len(W), seed=seed)
    with torch.no_grad():
        critic.biases[-1].copy_((W_t * Y_t).sum(dim=1).reshape(-1, 1, 1))
    if steps == 0:
        return critic.eval()
    opt = torch.optim.Adam(critic.parameters(), lr=lr, weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=int(steps))
    with _threads_for(len(W) * x.shape[0] * hidden * depth):
        for _ in range(int(steps)):
            opt.zero_grad()
            loss = (W_t * (critic(x) - Y_t) ** 2).sum()
            loss.backward()
            opt.step()
            sched.step()
    return critic.eval()


@contextmanager
def _threads_for(work: int) -> Iterator[None]:
    """Run small trainings on one thread, restoring PyTorch's setting afterwards.

    For networks this small, thread start-up dominates each step, and on a busy machine
    several threads can be many times slower than one.
    """
    n = torch.get_num_threads()
    if work >= 20_000_000 or n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def train_critic(system: System, samples: Samples, masks="all", rng: np.random.Generator | None = None,
                 **fit_kwargs) -> MaskedCritic:
    """Fit one critic on a system's draws under a mask design (:func:`masked_dataset`, :func:`fit_critic`)."""
    data = masked_dataset(system, samples, masks, rng)
    return fit_critic(data.inputs, data.targets, **fit_kwargs)


# --- using the critic ----------------------------------------------------------------


def _every_group_and_outcome(system: System) -> tuple[torch.Tensor, np.ndarray]:
    """:func:`encode` of every (S, H, A), S slowest, then (H, A) in C order of the joint; and S per row."""
    K = system.n_agents
    idx = np.indices(system.joint_shape).reshape(K + 1, -1)
    n = idx.shape[1]
    groups = np.repeat(np.arange(1 << K), n)
    tiled = Samples(h=np.tile(idx[0], 1 << K), actions=np.tile(idx[1:].T, (1 << K, 1)),
                    reward=np.zeros(n << K))
    return encode(system, tiled, group_masks(groups, K)), groups


def critic_values(critic: MaskedCritic, system: System, member: int | None = 0) -> np.ndarray:
    """q̂(H, m(S), A^(S)) at every group S and every outcome (H, A).

    The same layout as :func:`mcpg.mechanisms.retention_values`: shape (2**K, n_H, M, ..., M)
    for one member, (E, 2**K, n_H, M, ..., M) when ``member`` is None. Entries do not
    depend on the actions of agents outside S (the critic never sees them).
    """
    K = system.n_agents
    q = critic.predict(_every_group_and_outcome(system)[0])
    q = q.reshape((critic.n_members, 1 << K) + system.joint_shape)
    return q if member is None else q[_check_member(critic, member)]


def _check_member(critic: MaskedCritic, member) -> int:
    if int(member) != member or not 0 <= member < critic.n_members:
        raise ValueError(f"member must be in [0, {critic.n_members}), got {member}")
    return int(member)


def _later_agents(system: System, i: int) -> list[int]:
    """Agents in layers after agent i's: their actions may depend on A^(i)."""
    out: list[int] = []
    seen = False
    for layer in system.layers:
        if seen:
            out.extend(layer)
        if i in layer:
            seen = True
    return out


def default_groups(system: System) -> list[int]:
    """For each agent i, the largest group S whose actions are independent of A^(i) given H_ℓ.

    Every agent except i and the agents of later layers: N \\ {i} for a pool; the earlier
    agents for a pipeline. By Proposition 4 a larger S leaves less variance in G − q^ret(S).
    """
    full = (1 << system.n_agents) - 1
    out = []
    for i in range(system.n_agents):
        drop = (1 << i) | sum(1 << j for j in _later_agents(system, i))
        out.append(full & ~drop)
    return out


def _check_groups(system: System, groups) -> list[int]:
    K = system.n_agents
    if groups is None:
        return default_groups(system)
    groups = list(groups)
    if len(groups) != K:
        raise ValueError(f"groups must give one bitmask per agent ({K}), got {len(groups)}")
    out = []
    for i, S in enumerate(groups):
        if int(S) != S or not 0 <= S < 1 << K:
            raise ValueError(f"groups[{i}] must be a bitmask in [0, 2**{K}), got {S}")
        S = int(S)
        bad = [j for j in [i] + _later_agents(system, i) if (S >> j) & 1]
        if bad:
            if bad == [i]:
                why = f"agent {i} itself (Proposition 5 needs i ∉ S)"
            else:
                why = (f"agent(s) {bad}, whose actions may depend on A^({i}): Proposition 5 "
                       f"needs S within agent {i}'s own layer, S ⊆ N_ℓ \\ {{{i}}} (earlier "
                       "layers' outputs are part of the history H_ℓ)")
            raise ValueError(f"groups[{i}] contains {why}; the baseline would not be valid")
        out.append(S)
    return out


def baselines(critic: MaskedCritic, system: System, samples: Samples, groups=None,
              member: int = 0) -> np.ndarray:
    """Agent i's baseline q̂(H, m(S_i), A^(S_i)) at every draw, shape (n, K).

    The actor signal of agent i is then the factual residual G − q̂(S_i) (Proposition 5).

    Args:
        groups: one bitmask S_i per agent; default :func:`default_groups`. A group that
            contains i, or an agent acting after i, is refused: the baseline would read
            A^(i) and stop being gradient-correct.
        member: which ensemble member to use.
    """
    groups = _check_groups(system, groups)
    member = _check_member(critic, member)
    return np.stack([critic.predict(encode(system, samples, S), member) for S in groups], axis=1)


def fold_assignment(n: int, n_folds: int, rng: np.random.Generator) -> np.ndarray:
    """A random balanced split of n trajectories into ``n_folds`` folds: fold id per trajectory."""
    if int(n_folds) != n_folds or n_folds < 2:
        raise ValueError(f"n_folds must be an integer >= 2, got {n_folds}")
    if int(n) != n or n < n_folds:
        raise ValueError(f"n must be an integer >= n_folds ({n_folds}), got {n}")
    return rng.permutation(np.arange(int(n)) % int(n_folds))


@dataclass
class CrossFit:
    """K-fold cross-fitted critics and their out-of-fold baselines.

    Attributes:
        critic: an ensemble with one member per fold; member k never saw fold k.
        fold: fold of each trajectory, shape (n,).
        groups: the group S_i of each agent's baseline.
        baselines: out-of-fold q̂(S_i) at every trajectory, shape (n, K): trajectory t's
            value comes from member fold[t], trained without t.
    """

    critic: MaskedCritic
    fold: np.ndarray
    groups: list[int]
    baselines: np.ndarray


def cross_fit(system: System, samples: Samples, rng: np.random.Generator, n_folds: int = 2, groups=None,
              masks=None, **fit_kwargs) -> CrossFit:
    """Cross-fitting (§6): the trajectory being updated never entered its own critic.

    Trajectories are split into ``n_folds`` folds; member k of the critic is trained on
    every fold except k, and trajectory t's baseline comes from member fold[t]. Given the
    other folds, that baseline is a fixed function of (H, A^(S_i)), so Proposition 5 and
    Corollary 2 apply to it.

    Args:
        groups: one bitmask S_i per agent (default :func:`default_groups`).
        masks: the mask design for training (see :func:`masked_dataset`); default: the
            groups the baselines query.
        fit_kwargs: passed to :func:`fit_critic`.
    """
    groups = _check_groups(system, groups)
    n = len(samples)
    fold = fold_assignment(n, n_folds, rng)
    data = masked_dataset(system, samples, sorted(set(groups)) if masks is None else masks, rng)
    weights = (fold[data.trajectory][None, :] != np.arange(n_folds)[:, None]).astype(float)
    critic = fit_critic(data.inputs, data.targets, weights, **fit_kwargs)
    b = np.empty((n, system.n_agents))
    for i, S in enumerate(groups):
        all_members = critic.predict(encode(system, samples, S))  # (n_folds, n)
        b[:, i] = all_members[fold, np.arange(n)]
    return CrossFit(critic, fold, groups, b)


def flat_scores(system: System, samples: Samples) -> tuple[np.ndarray, np.ndarray]:
    """Every agent's score Ψ_i at every draw, side by side: (n, D), and the agent owning each column, (D,).

    Columns follow ``np.concatenate([g.ravel() for g in system_gradient(system)])``, so the
    per-draw terms of a score-function estimate with per-agent signals X (n, K) are
    ``psi * X[:, owner]``.
    """
    psi = [p.reshape(len(samples), -1) for p in system.score_vectors(samples)]
    owner = np.concatenate([np.full(p.shape[1], i) for i, p in enumerate(psi)])
    return np.concatenate(psi, axis=1), owner


def repeated_gradient_estimates(system: System, n_samples: int, n_reps: int, rng: np.random.Generator,
                                n_folds: int = 2, groups=None, masks=None,
                                **fit_kwargs) -> dict[str, np.ndarray]:
    """Repeat a small-batch policy-gradient estimate with four baselines (§6, Proposition 5).

    Each repetition draws ``n_samples`` trajectories and estimates every agent's gradient
    as the mean of Ψ_i (G − b_i) with

    - ``"no baseline"``: b_i = 0;
    - ``"in-sample critic"``: q̂(S_i) from a critic fitted on the same trajectories (its
      parameters depend on each trajectory's own G, hence on A^(i): not a fixed critic);
    - ``"cross-fitted critic"``: :func:`cross_fit` with ``n_folds`` folds;
    - ``"independent critic"``: q̂(S_i) from a critic fitted on a fresh, independent draw of
      the same size (a fixed critic as far as these trajectories are concerned).

    All critics of all repetitions are trained in one batched :func:`fit_critic` call.

    Returns:
        method name -> array (n_reps, D) of gradient estimates, the agents' parameters
        flattened and concatenated in agent order (the layout of
        ``np.concatenate([g.ravel() for g in system_gradient(system)])``).
    """
    for name, val in (("n_samples", n_samples), ("n_reps", n_reps)):
        if int(val) != val or val < 1:
            raise ValueError(f"{name} must be a positive integer, got {val}")
    if n_samples < n_folds:
        raise ValueError(f"n_samples must be at least n_folds ({n_folds}), got {n_samples}")
    groups = _check_groups(system, groups)
    R, n = int(n_reps), int(n_samples)
    main = system.sample(R * n, rng)
    fresh = system.sample(R * n, rng)
    rep = np.repeat(np.arange(R), n)
    fold = np.concatenate([fold_assignment(n, n_folds, rng) for _ in range(R)])
    design = sorted(set(groups)) if masks is None else masks
    d_main = masked_dataset(system, main, design, rng)
    d_fresh = masked_dataset(system, fresh, design, rng)
    rows_main, rows_fresh = len(d_main.targets), len(d_fresh.targets)
    # members: [0, R) in-sample; R + r * n_folds + k cross-fitted (r, k); R + R * n_folds + r independent.
    # Each (member, row) pair is listed once (sparse), since a dense (members x rows) weight matrix
    # would be large.
    r_main, f_main = rep[d_main.trajectory], fold[d_main.trajectory]
    rows = np.arange(rows_main)
    member = [r_main, R + r_main[:, None] * n_folds + np.arange(n_folds)[None, :],
              R * (1 + n_folds) + rep[d_fresh.trajectory]]
    row = [rows, np.repeat(rows[:, None], n_folds, axis=1), rows_main + np.arange(rows_fresh)]
    keep = f_main[:, None] != np.arange(n_folds)[None, :]  # member (r, k) never sees fold k
    member[1], row[1] = member[1][keep], row[1][keep]
    member, row = np.concatenate(member), np.concatenate(row)
    inputs = torch.cat([d_main.inputs, d_fresh.inputs])
    targets = np.concatenate([d_main.targets, d_fresh.targets])
    x, W, Y = _merge_rows(inputs, targets, member, row, np.ones(len(row)), R * (2 + n_folds))
    critic = _fit_merged(x, W, Y, **fit_kwargs)

    b = {name: np.empty((R * n, system.n_agents)) for name in ("in-sample critic", "cross-fitted critic",
                                                                 "independent critic")}
    for i, S in enumerate(groups):
        xq, inv = _distinct_rows(encode(system, main, S).numpy())
        q = critic.predict(torch.as_tensor(xq))  # (members, distinct rows)
        b["in-sample critic"][:, i] = q[rep, inv]
        b["cross-fitted critic"][:, i] = q[R + rep * n_folds + fold, inv]
        b["independent critic"][:, i] = q[R + R * n_folds + rep, inv]
    psi, owner = flat_scores(system, main)
    G = main.reward[:, None]
    out = {"no baseline": (psi * G).reshape(R, n, -1).mean(axis=1)}
    for name, base in b.items():
        out[name] = (psi * (G - base[:, owner])).reshape(R, n, -1).mean(axis=1)
    return out
