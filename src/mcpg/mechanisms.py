"""Mechanisms: small multi-agent systems whose expectations are computed exactly.

Paper §3. A system draws a prompt H, then every agent i acts, A^(i) ~ pi_theta_i, and a
mechanism turns the actions into a deployed reward G. The systems here are small enough
to enumerate every joint action, so every expectation in the paper (J_sys = E[G], the
private utilities U_i = E[alpha_i G], the retention values q^ret(S) = E[G | H, A^(S)],
E[Psi_i X] for any signal X) is a finite sum, and gradients come from torch autograd on
those sums. They are the book's laboratory: every identity is checked on them exactly,
and every Monte Carlo estimator is compared with them.

Three mechanisms:

- :class:`ParallelPool`: one layer of K agents acting without sight of one another, and a
  reward table E[G | H, A] (e.g. Proposition 1's two systems).
- :class:`RoutedPool`: the routed system of §3.1. Each agent proposes a candidate; the
  router of Eq. (3) selects I, and G = R^(I). The router reads candidates (scores depend
  on the answer) or is candidate-blind (scores depend on H and the agent only).
- :class:`Pipeline`: a chain of singleton layers (planner -> solver -> critic); each agent
  reads the previous agent's output.

Policies are tabular softmax: agent i's parameter theta_i holds one logit per action for
each context it reads (H for a pool; H and the previous output for a pipeline), so its
score is Psi_i = onehot(context) x (e_a - pi_i(. | context)).

Joint tensors have shape ``(n_H, M_1, ..., M_K)``: axis 0 is the prompt, axis i + 1 is
agent i's action. Groups of agents S are bitmasks (bit i set = agent i in S), as in
:mod:`mcpg.fields`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from . import routing
from ._checks import as_float_array

__all__ = [
    "System",
    "ParallelPool",
    "RoutedPool",
    "Pipeline",
    "Samples",
    "system_value",
    "system_gradient",
    "score_expectation",
    "private_utilities",
    "private_utility_gradients",
    "winner_take_all_bias",
    "winner_take_all_cosines",
    "retention_value",
    "retention_values",
    "removal_values",
    "valuation_at",
    "expected_conditional_variance",
    "score_function_estimate",
    "finite_difference_gradients",
    "theorem1_table",
    "exact_gradient_ascent",
    "proposition1_systems",
    "random_routed_pool",
]

DTYPE = torch.float64


def _as_logits(x, name: str) -> torch.Tensor:
    arr = as_float_array(x.detach().cpu().numpy() if torch.is_tensor(x) else x, name)
    return torch.tensor(arr, dtype=DTYPE, requires_grad=True)


def _check_probability_table(t: np.ndarray, name: str, noise: str) -> None:
    if noise == "bernoulli" and ((t < 0) | (t > 1)).any():
        raise ValueError(f"{name} must lie in [0, 1] for Bernoulli rewards")


@dataclass
class Samples:
    """Monte Carlo draws from a system.

    Attributes:
        h: prompt index of each draw, shape (n,).
        actions: every agent's action, shape (n, K).
        reward: deployed reward G, shape (n,).
        selected: for routed systems, the deployed candidate I, shape (n,); else None.
        p: for routed systems, the logged propensities, shape (n, K); else None.
        candidate_rewards: for routed systems, every candidate's realised reward R^(j),
            shape (n, K) (observed only for I in filtered feedback; kept for oracles).
    """

    h: np.ndarray
    actions: np.ndarray
    reward: np.ndarray
    selected: np.ndarray | None = None
    p: np.ndarray | None = None
    candidate_rewards: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.h)

    def index(self) -> tuple[np.ndarray, ...]:
        """Index tuple into a joint tensor: ``X[samples.index()]`` is X at each draw."""
        return (self.h, *self.actions.T)


class System:
    """A finite system of K agents (paper §3). Subclasses define the policies and mechanism.

    Attributes:
        params: list of K torch tensors theta_i (requires_grad), tabular softmax logits.
        prompt_probs: P(H), numpy array of shape (n_H,).
        n_actions: number of actions M of each agent.
        layers: the layers as lists of agent indices (a pool is one layer; a pipeline is
            a chain of singleton layers).
        noise: ``"bernoulli"`` (G in {0, 1} with mean E[G | H, A]) or ``"fixed"`` (G is
            the table value itself, random only through the router's draw).
    """

    params: list[torch.Tensor]
    prompt_probs: np.ndarray
    n_actions: int
    layers: list[list[int]]
    noise: str

    @property
    def n_agents(self) -> int:
        return len(self.params)

    @property
    def n_prompts(self) -> int:
        return len(self.prompt_probs)

    @property
    def joint_shape(self) -> tuple[int, ...]:
        return (self.n_prompts,) + (self.n_actions,) * self.n_agents

    # --- to be defined by subclasses -------------------------------------------------
    def log_policies(self) -> list[torch.Tensor]:
        """log pi_i(A^(i) | context) for each agent, each broadcastable to the joint shape."""
        raise NotImplementedError

    def reward_mean(self) -> torch.Tensor:
        """E[G | H, A] over the joint (router and reward noise integrated out)."""
        raise NotImplementedError

    def reward_second_moment(self) -> torch.Tensor:
        """E[G^2 | H, A] over the joint."""
        raise NotImplementedError

    def removal_value(self, S: int) -> torch.Tensor:
        """q^rem(S): expected reward of the reduced system with only S present (§4)."""
        raise NotImplementedError

    def score_vectors(self, samples: Samples) -> list[np.ndarray]:
        """Psi_i at every draw, one array of shape (n, *theta_i.shape) per agent."""
        raise NotImplementedError

    def _sample_reward(self, samples: Samples, rng: np.random.Generator) -> None:
        mean = self.reward_mean().numpy()[samples.index()]
        samples.reward = _draw_reward(mean, self.noise, rng)

    # --- shared ----------------------------------------------------------------------
    def joint_prob(self) -> torch.Tensor:
        """P(H, A) over the joint shape, differentiable in the parameters."""
        logp = sum(self.log_policies())
        ph = torch.as_tensor(self.prompt_probs, dtype=DTYPE).reshape((-1,) + (1,) * self.n_agents)
        return ph * torch.exp(logp)

    def sample(self, n: int, rng: np.random.Generator) -> Samples:
        """Draw n independent trajectories (prompt, actions, deployed reward)."""
        if int(n) != n or n < 1:
            raise ValueError(f"n must be a positive integer, got {n}")
        prob = self.joint_prob().detach().numpy().ravel()
        flat = rng.choice(prob.size, size=int(n), p=prob / prob.sum())
        idx = np.unravel_index(flat, self.joint_shape)
        samples = Samples(h=idx[0], actions=np.stack(idx[1:], axis=1), reward=np.empty(n))
        self._sample_reward(samples, rng)
        return samples

    def history_agents(self, i: int) -> list[int]:
        """Agents in layers before agent i's layer: their outputs are part of H_l."""
        out: list[int] = []
        for layer in self.layers:
            if i in layer:
                return out
            out.extend(layer)
        raise ValueError(f"i={i} is not an agent of this system")


def _draw_reward(mean: np.ndarray, noise: str, rng: np.random.Generator) -> np.ndarray:
    if noise == "bernoulli":
        return (rng.random(mean.shape) < mean).astype(float)
    return np.asarray(mean, dtype=float).copy()


def _agent_axis_view(t: torch.Tensor, i: int, K: int) -> torch.Tensor:
    """Reshape a (n_H, M) table of agent i to broadcast against (n_H, M_1..M_K)."""
    shape = [t.shape[0]] + [1] * K
    shape[i + 1] = t.shape[1]
    return t.reshape(shape)


def _softmax_scores(params: torch.Tensor, ctx: tuple[np.ndarray, ...], a: np.ndarray) -> np.ndarray:
    """Psi for tabular softmax: onehot(context) x (e_a - pi(.|context)), one row per draw."""
    with torch.no_grad():
        pi = torch.softmax(params, dim=-1).numpy()
    n = len(a)
    out = np.zeros((n,) + tuple(params.shape))
    rows = (np.arange(n),) + ctx
    out[rows] = -pi[ctx]
    out[rows + (a,)] += 1.0
    return out


class ParallelPool(System):
    """One layer of K agents and a reward table E[G | H, A^(1..K)] (paper §3).

    Args:
        logits: array (K, n_H, M), agent i's softmax logits for each prompt.
        reward: array (n_H, M, ..., M) of E[G | H, A] (one axis per agent).
        prompt_probs: P(H), uniform if omitted.
        noise: ``"bernoulli"`` or ``"fixed"``.
    """

    def __init__(self, logits, reward, prompt_probs=None, noise: str = "bernoulli"):
        logits = as_float_array(logits, "logits")
        if logits.ndim != 3:
            raise ValueError(f"logits must have shape (K, n_H, M), got {logits.shape}")
        K, n_H, M = logits.shape
        self.params = [_as_logits(logits[i], "logits") for i in range(K)]
        self.n_actions = M
        self.prompt_probs = _prompt_probs(prompt_probs, n_H)
        self.layers = [list(range(K))]
        self.noise = _check_noise(noise)
        if reward is not None:
            r = as_float_array(reward, "reward")
            if r.shape != self.joint_shape:
                raise ValueError(f"reward must have shape {self.joint_shape}, got {r.shape}")
            _check_probability_table(r, "reward", self.noise)
            self._reward = torch.tensor(r, dtype=DTYPE)

    def policies(self) -> list[torch.Tensor]:
        """pi_i(. | H) for each agent, shape (n_H, M)."""
        return [torch.softmax(t, dim=-1) for t in self.params]

    def log_policies(self) -> list[torch.Tensor]:
        K = self.n_agents
        return [_agent_axis_view(torch.log_softmax(t, -1), i, K) for i, t in enumerate(self.params)]

    def reward_mean(self) -> torch.Tensor:
        return self._reward

    def reward_second_moment(self) -> torch.Tensor:
        return self._reward if self.noise == "bernoulli" else self._reward**2

    def score_vectors(self, samples: Samples) -> list[np.ndarray]:
        return [_softmax_scores(t, (samples.h,), samples.actions[:, i]) for i, t in enumerate(self.params)]


class RoutedPool(ParallelPool):
    """A routed system (paper §3.1): K candidates, the softmax router of Eq. (3), G = R^(I).

    Args:
        logits: array (K, n_H, M), agent i's softmax logits over its M answers.
        candidate_reward: g_j(H, a) = E[R^(j) | H, A^(j) = a], array (K, n_H, M) or (n_H, M)
            (shared by all agents).
        router_scores: s(H, A^(j)), array (K, n_H, M) or (n_H, M) for a router that reads
            candidates; an array (K, n_H, 1) (or (K, n_H)) is a candidate-blind router that
            never reads A^(j).
        tau, eps: the router's temperature and uniform exploration (Eq. 3).
    """

    def __init__(self, logits, candidate_reward, router_scores, tau: float = 1.0, eps: float = 0.0,
                 prompt_probs=None, noise: str = "bernoulli"):
        super().__init__(logits, None, prompt_probs, noise)
        K, n_H, M = self.n_agents, self.n_prompts, self.n_actions
        g = self._candidate_table(candidate_reward, "candidate_reward")
        _check_probability_table(g, "candidate_reward", self.noise)
        s = as_float_array(router_scores, "router_scores")
        if s.shape == (K, n_H):
            s = s[..., None]
        if s.shape == (n_H, M):
            s = np.broadcast_to(s, (K, n_H, M))
        if s.shape not in {(K, n_H, M), (K, n_H, 1)}:
            raise ValueError(f"router_scores must have shape ({K}, {n_H}, {M}) or ({K}, {n_H}, 1), "
                             f"got {s.shape}")
        self.candidate_reward = np.array(g)
        self.router_scores = np.broadcast_to(s, (K, n_H, M)).copy()
        self.candidate_blind = s.shape[-1] == 1 or bool(np.all(s == s[..., :1]))
        self.tau, self.eps = float(tau), float(eps)
        self._g = self.per_candidate(self.candidate_reward)  # (joint..., K)
        self._scores = self.per_candidate(self.router_scores)
        self._p = routing.router_propensities(self._scores, self.tau, self.eps)
        self._reward = torch.tensor(np.sum(self._p * self._g, axis=-1), dtype=DTYPE)

    def _candidate_table(self, table, name: str) -> np.ndarray:
        """Check a per-candidate table of shape (K, n_H, M), or (n_H, M) shared by the agents."""
        K, n_H, M = self.n_agents, self.n_prompts, self.n_actions
        t = as_float_array(table, name)
        if t.shape == (n_H, M):
            t = np.broadcast_to(t, (K, n_H, M))
        if t.shape != (K, n_H, M):
            raise ValueError(f"{name} must have shape ({K}, {n_H}, {M}) or ({n_H}, {M}), got {t.shape}")
        return np.array(t)

    def per_candidate(self, table, name: str = "table") -> np.ndarray:
        """Lift a per-candidate table to every joint action.

        ``table`` has shape (K, n_H, M) (entry [j, h, a]: a value of agent j's answer a to
        prompt h, e.g. an outcome model mu_hat_j(h, a)) or (n_H, M) (shared by the agents).
        Returns shape (n_H, M, ..., M, K) whose [h, a_1, ..., a_K, j] entry is table[j, h, a_j],
        aligned with :meth:`candidate_values` and :meth:`propensities`.
        """
        t = self._candidate_table(table, name)
        K = self.n_agents
        cols = []
        for j in range(K):
            view = t[j].reshape([self.n_prompts] + [self.n_actions if k == j else 1 for k in range(K)])
            cols.append(np.broadcast_to(view, self.joint_shape))
        return np.stack(cols, axis=-1)

    def propensities(self) -> np.ndarray:
        """p_j(H, A) of Eq. (3) at every joint action, shape (n_H, M..., M, K)."""
        return self._p

    def leave_one_out_propensities(self) -> np.ndarray:
        """p^{-i}_j at every joint action, shape (n_H, M..., M, K, K)."""
        return routing.leave_one_out_propensities(self._scores, self.tau, self.eps)

    def candidate_values(self) -> np.ndarray:
        """g_j(H, A^(j)) at every joint action, shape (n_H, M..., M, K)."""
        return self._g

    def reward_second_moment(self) -> torch.Tensor:
        if self.noise == "bernoulli":
            return self._reward
        return torch.tensor(np.sum(self._p * self._g**2, axis=-1), dtype=DTYPE)

    def winner_return(self, i: int) -> torch.Tensor:
        """E[1{I = i} G | H, A] = p_i g_i: agent i's share under winner-take-all allocation."""
        return torch.tensor(self._p[..., i] * self._g[..., i], dtype=DTYPE)

    def displaced_return(self, i: int) -> torch.Tensor:
        """d_i at the joint: E[D_i | H, A] with D_i = 1{I != i} G (Theorem 1)."""
        return self._reward - self.winner_return(i)

    def removal_value(self, S: int) -> torch.Tensor:
        """q^rem(S): the router of Eq. (3) on the candidates of S only; 0 for the empty slate."""
        K = self.n_agents
        present = np.array([(S >> j) & 1 for j in range(K)], dtype=bool)
        if not present.any():
            return torch.zeros(self.joint_shape, dtype=DTYPE)
        s = np.where(present, self._scores, -np.inf)
        p = routing.router_propensities(s, self.tau, self.eps)
        return torch.tensor(np.sum(p * self._g, axis=-1), dtype=DTYPE)

    def exact_removal_contributions(self) -> np.ndarray:
        """Delta^rem_i at every joint action (§6.1), shape (n_H, M..., M, K)."""
        return routing.removal_contributions(self._g, self._p, self.leave_one_out_propensities())

    def _sample_reward(self, samples: Samples, rng: np.random.Generator) -> None:
        idx = samples.index()
        p = self._p[idx]
        g = self._g[idx]
        samples.p = p
        samples.selected = routing.sample_selection(p, rng)
        samples.candidate_rewards = _draw_reward(g, self.noise, rng)
        samples.reward = samples.candidate_rewards[np.arange(len(p)), samples.selected]


class Pipeline(System):
    """A chain of singleton layers (paper §3): agent k reads the prompt and agent k-1's output.

    Args:
        logits: list of K arrays: agent 0's logits of shape (n_H, M); agent k >= 1's of
            shape (n_H, M, M), indexed by (H, A^(k-1), A^(k)).
        reward: E[G | H, A^(0..K-1)], array (n_H, M, ..., M).
        prefix_rewards: optional list of K - 1 arrays; entry k is the expected reward when
            the pipeline stops after agent k (its output is deployed), shape (n_H, M^(k+1)).
            Removal (§4) is defined only for groups S = {0, ..., k}: deleting an agent
            whose successor is present leaves the successor without an input. Without
            prefix rewards, only the full group and the empty one (reward 0) are defined.
    """

    def __init__(self, logits, reward, prefix_rewards=None, prompt_probs=None, noise: str = "bernoulli"):
        if len(logits) < 2:
            raise ValueError("logits must hold at least two agents")
        first = as_float_array(logits[0], "logits[0]")
        if first.ndim != 2:
            raise ValueError(f"logits[0] must have shape (n_H, M), got {first.shape}")
        n_H, M = first.shape
        self.params = [_as_logits(first, "logits[0]")]
        for k in range(1, len(logits)):
            t = as_float_array(logits[k], f"logits[{k}]")
            if t.shape != (n_H, M, M):
                raise ValueError(f"logits[{k}] must have shape ({n_H}, {M}, {M}), got {t.shape}")
            self.params.append(_as_logits(t, f"logits[{k}]"))
        self.n_actions = M
        self.prompt_probs = _prompt_probs(prompt_probs, n_H)
        self.layers = [[k] for k in range(len(logits))]
        self.noise = _check_noise(noise)
        r = as_float_array(reward, "reward")
        if r.shape != self.joint_shape:
            raise ValueError(f"reward must have shape {self.joint_shape}, got {r.shape}")
        _check_probability_table(r, "reward", self.noise)
        self._reward = torch.tensor(r, dtype=DTYPE)
        self.prefix_rewards = []
        for k, pr in enumerate(prefix_rewards or []):
            t = as_float_array(pr, f"prefix_rewards[{k}]")
            if t.shape != (n_H,) + (M,) * (k + 1):
                raise ValueError(f"prefix_rewards[{k}] must have shape {(n_H,) + (M,) * (k + 1)}, "
                                 f"got {t.shape}")
            self.prefix_rewards.append(torch.tensor(t, dtype=DTYPE))

    def log_policies(self) -> list[torch.Tensor]:
        K, M, n_H = self.n_agents, self.n_actions, self.n_prompts
        out = [_agent_axis_view(torch.log_softmax(self.params[0], -1), 0, K)]
        for k in range(1, K):
            shape = [n_H] + [1] * K
            shape[k], shape[k + 1] = M, M
            out.append(torch.log_softmax(self.params[k], -1).reshape(shape))
        return out

    def reward_mean(self) -> torch.Tensor:
        return self._reward

    def reward_second_moment(self) -> torch.Tensor:
        return self._reward if self.noise == "bernoulli" else self._reward**2

    def removal_value(self, S: int) -> torch.Tensor:
        K = self.n_agents
        if S == 0:
            return torch.zeros(self.joint_shape, dtype=DTYPE)
        k = S.bit_length() - 1  # last agent present
        if S != (1 << (k + 1)) - 1:  # a gap: some present agent lost its input
            return torch.full(self.joint_shape, float("nan"), dtype=DTYPE)
        if k == K - 1:
            return self._reward
        if k >= len(self.prefix_rewards):
            return torch.full(self.joint_shape, float("nan"), dtype=DTYPE)
        t = self.prefix_rewards[k]
        return t.reshape(t.shape + (1,) * (K - 1 - k)).expand(self.joint_shape)

    def score_vectors(self, samples: Samples) -> list[np.ndarray]:
        a = samples.actions
        out = [_softmax_scores(self.params[0], (samples.h,), a[:, 0])]
        for k in range(1, self.n_agents):
            out.append(_softmax_scores(self.params[k], (samples.h, a[:, k - 1]), a[:, k]))
        return out


def _prompt_probs(prompt_probs, n_H: int) -> np.ndarray:
    if prompt_probs is None:
        return np.full(n_H, 1.0 / n_H)
    p = as_float_array(prompt_probs, "prompt_probs")
    if p.shape != (n_H,) or (p < 0).any() or not np.isclose(p.sum(), 1.0):
        raise ValueError(f"prompt_probs must be a probability vector of length {n_H}")
    return p


def _check_noise(noise: str) -> str:
    if noise not in ("bernoulli", "fixed"):
        raise ValueError(f"noise must be 'bernoulli' or 'fixed', got {noise!r}")
    return noise


# --- exact expectations -------------------------------------------------------------


def _as_joint(system: System, X) -> torch.Tensor:
    t = X.detach() if torch.is_tensor(X) else torch.as_tensor(np.asarray(X, dtype=float))
    t = t.to(DTYPE)
    try:
        return t.expand(system.joint_shape)
    except RuntimeError:
        raise ValueError(f"X must broadcast to the joint shape {system.joint_shape}, "
                         f"got {tuple(t.shape)}") from None


def system_value(system: System) -> torch.Tensor:
    """J_sys = E[G] (§3), a differentiable torch scalar."""
    return (system.joint_prob() * system.reward_mean()).sum()


def system_gradient(system: System) -> list[np.ndarray]:
    """nabla_theta_i J_sys for every agent, by autograd on the exact sum E[G]."""
    grads = torch.autograd.grad(system_value(system), system.params)
    return [g.numpy() for g in grads]


def score_expectation(system: System, X) -> list[np.ndarray]:
    """E[Psi_i X] for every agent i, exactly, for a signal X(H, A) over the joint.

    Computed as the gradient of sum_omega w(omega) log pi_i(A^(i) | context) with the
    weights w = P(H, A) X(H, A) held fixed, which is sum_omega P X Psi_i: a path through
    autograd different from differentiating an expectation. X may be a function of the
    prompt and actions only; a signal with further randomness (the router's draw, reward
    noise) enters through its conditional mean E[X | H, A], since Psi_i is a function of
    (H, A).
    """
    w = (system.joint_prob() * _as_joint(system, X)).detach()
    total = sum((w * lp).sum() for lp in system.log_policies())
    return [g.numpy() for g in torch.autograd.grad(total, system.params)]


def private_utilities(system: RoutedPool) -> torch.Tensor:
    """U_i = E[1{I = i} G] for each agent, under winner-take-all allocation (§3)."""
    P = system.joint_prob()
    return torch.stack([(P * system.winner_return(i)).sum() for i in range(system.n_agents)])


def private_utility_gradients(system: RoutedPool) -> list[np.ndarray]:
    """nabla_theta_i U_i for each agent i, by autograd on the exact U_i (Theorem 1)."""
    U = private_utilities(system)
    return [torch.autograd.grad(U[i], system.params[i], retain_graph=True)[0].numpy()
            for i in range(system.n_agents)]


def winner_take_all_bias(system: RoutedPool) -> list[np.ndarray]:
    """b_i = E[Psi_i D_i], D_i = 1{I != i} G, the displaced competitor return (Theorem 1)."""
    return [score_expectation(system, system.displaced_return(i))[i] for i in range(system.n_agents)]


def winner_take_all_cosines(system: RoutedPool) -> np.ndarray:
    """cos(nabla_theta_i U_i, nabla_theta_i J_sys) for each agent i, exactly (Theorem 1).

    The direction winner-take-all credit follows against the system's: 1 when b_i = 0 (a
    candidate-blind router), negative when the private update points downhill. Shape (K,).
    """
    pairs = zip(private_utility_gradients(system), system_gradient(system))
    return np.array([np.vdot(u, j) / np.linalg.norm(u) / np.linalg.norm(j) for u, j in pairs])


def finite_difference_gradients(system: System, value, step: float = 1e-5) -> list[np.ndarray]:
    """Central finite differences of an exact value in every theta_i, without autograd or scores.

    ``value(system)`` returns a scalar (e.g. :func:`system_value`, giving nabla_theta_i J_sys) or
    a vector with one entry per agent (e.g. :func:`private_utilities`, whose entry i is
    differentiated in theta_i only, giving nabla_theta_i U_i). Each logit is moved by +-``step``
    in place and restored. A check on Theorem 1 that does not share its computational path
    with :func:`score_expectation` (score-weighted sums) or :func:`system_gradient` (autograd):
    it would disagree with them if the policies, the scores or the reward tables were
    inconsistent. The error is of order step**2.
    """
    if not np.isfinite(step) or step <= 0:
        raise ValueError(f"step must be a positive number, got {step}")
    out = []
    with torch.no_grad():
        for i, theta in enumerate(system.params):
            grad = np.empty(tuple(theta.shape))
            for idx in np.ndindex(*theta.shape):
                old = theta[idx].item()
                vals = []
                for sign in (1.0, -1.0):
                    theta[idx] = old + sign * step
                    v = torch.as_tensor(value(system)).reshape(-1)
                    vals.append(float(v[i] if v.numel() > 1 else v[0]))
                theta[idx] = old
                grad[idx] = (vals[0] - vals[1]) / (2 * step)
            out.append(grad)
    return out


def theorem1_table(system: RoutedPool) -> pd.DataFrame:
    """Theorem 1 on one routed pool, exactly: one row per agent, norms over theta_i.

    Columns:

    - ``WTA − ∇U_i``: ||E[1{I=i} Psi_i G] − nabla U_i||, the score-weighted sum against autograd
      on the exact U_i. Both differentiate the same finite sum, and the router's propensities
      do not depend on theta: an identity of the computation, which checks the code.
    - ``∇J − ∇U_i − b_i``: the library computes E[D_i | H, A] as E[G | H, A] − p_i g_i, so this
      is the definition of D_i, again an identity.
    - ``FD − WTA``: central finite differences of the exact U_i
      (:func:`finite_difference_gradients`: no autograd, no scores) against the score-weighted
      sum. This one could fail (a wrong score, a wrong policy table); its size is the
      differencing error.
    - ``‖b_i‖`` (the winner-take-all bias, :func:`winner_take_all_bias`) and ``‖∇_θi J‖``.

    The column ``agent`` numbers agents from 1, as the text does.
    """
    gJ, gU = system_gradient(system), private_utility_gradients(system)
    b = winner_take_all_bias(system)
    wta = [score_expectation(system, system.winner_return(i))[i] for i in range(system.n_agents)]
    fd = finite_difference_gradients(system, private_utilities)
    norm = np.linalg.norm
    return pd.DataFrame({
        "agent": np.arange(1, system.n_agents + 1),
        "WTA − ∇U_i": [norm(w - u) for w, u in zip(wta, gU)],
        "∇J − ∇U_i − b_i": [norm(j - u - c) for j, u, c in zip(gJ, gU, b)],
        "FD − WTA": [norm(f - w) for f, w in zip(fd, wta)],
        "‖b_i‖": [norm(c) for c in b],
        "‖∇_θi J‖": [norm(j) for j in gJ],
    })


def exact_gradient_ascent(system: RoutedPool, credit: str, steps: int = 300,
                          lr: float = 0.5) -> np.ndarray:
    """J_sys along exact gradient ascent in which every agent moves at once.

    ``credit="wta"``: agent i follows nabla_theta_i U_i, the expected winner-take-all update
    (Theorem 1); ``credit="system"``: it follows nabla_theta_i J_sys. Each step rebuilds the
    pool at the new logits (same rewards, router, prompt law and noise) and moves every
    theta_i by ``lr`` times its gradient. Returns J_sys before each of the ``steps`` steps
    (entry 0 is the starting pool's J_sys). ``system`` itself is not modified.
    """
    if credit not in ("wta", "system"):
        raise ValueError(f"credit must be 'wta' or 'system', got {credit!r}")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    if not np.isfinite(lr) or lr <= 0:
        raise ValueError(f"lr must be a positive number, got {lr}")
    theta = np.stack([t.detach().numpy() for t in system.params])
    values = np.empty(steps)
    for k in range(steps):
        q = RoutedPool(theta, system.candidate_reward, system.router_scores, tau=system.tau,
                       eps=system.eps, prompt_probs=system.prompt_probs, noise=system.noise)
        values[k] = system_value(q).item()
        grads = private_utility_gradients(q) if credit == "wta" else system_gradient(q)
        theta = theta + lr * np.stack(grads)
    return values


def retention_value(system: System, S: int) -> torch.Tensor:
    """q^ret(S) = E[G | H, A^(S)] (Eq. 8), broadcast over the joint shape.

    The agents outside S are drawn from their policies given what is observed: the sum
    over their actions of P(H, A) E[G | H, A], divided by the sum of P(H, A).
    """
    _check_group(system, S)
    P = system.joint_prob().detach()
    G = system.reward_mean()
    axes = [k + 1 for k in range(system.n_agents) if not (S >> k) & 1]
    if not axes:
        return G.expand(system.joint_shape)
    num = (P * G).sum(dim=axes, keepdim=True)
    den = P.sum(dim=axes, keepdim=True)
    return (num / den).expand(system.joint_shape)


def retention_values(system: System) -> torch.Tensor:
    """q^ret(S) for every group S, shape (2**K, n_H, M..., M)."""
    return torch.stack([retention_value(system, S) for S in range(1 << system.n_agents)])


def removal_values(system: System) -> torch.Tensor:
    """q^rem(S) for every group S (§4): the reduced system with the others deleted; NaN where undefined."""
    return torch.stack([system.removal_value(S) for S in range(1 << system.n_agents)])


def valuation_at(values: torch.Tensor, h: int, actions) -> np.ndarray:
    """The set function v(S) = q(S) - q(empty set) at one outcome (Eq. 7), shape (2**K,)."""
    q = values[(slice(None), int(h), *[int(a) for a in actions])].numpy()
    return q - q[0]


def expected_conditional_variance(system: System, S: int) -> float:
    """E[Var(G | H, A^(S))] = E[G^2] - E[q^ret(S)^2] (Proposition 4)."""
    P = system.joint_prob().detach()
    q = retention_value(system, S)
    return float((P * system.reward_second_moment()).sum() - (P * q**2).sum())


def _check_group(system: System, S: int) -> None:
    if int(S) != S or not 0 <= S < (1 << system.n_agents):
        raise ValueError(f"S must be a bitmask in [0, 2**{system.n_agents}), got {S}")


# --- Monte Carlo -------------------------------------------------------------------


def score_function_estimate(system: System, samples: Samples, signal) -> list[tuple[np.ndarray, np.ndarray]]:
    """Score-function estimates of E[Psi_i X_i] from draws, with standard errors.

    Args:
        samples: draws from ``system.sample``.
        signal: per-draw training signal, shape (n,) (one signal for all agents, e.g. G)
            or (n, K) (agent i uses column i, e.g. winner-take-all 1{I = i} G).

    Returns:
        For each agent, (mean, standard error), each of shape theta_i.shape.
    """
    X = as_float_array(signal, "signal")
    n, K = len(samples), system.n_agents
    if X.shape == (n,):
        X = np.repeat(X[:, None], K, axis=1)
    if X.shape != (n, K):
        raise ValueError(f"signal must have shape ({n},) or ({n}, {K}), got {X.shape}")
    out = []
    for i, psi in enumerate(system.score_vectors(samples)):
        terms = psi * X[:, i].reshape((n,) + (1,) * (psi.ndim - 1))
        out.append((terms.mean(axis=0), terms.std(axis=0, ddof=1) / np.sqrt(n)))
    return out


# --- ready-made systems ----------------------------------------------------------------


def proposition1_systems() -> tuple[ParallelPool, ParallelPool]:
    """Proposition 1's pair: two agents, A^(1), A^(2) ~ Bernoulli(1/2) independently.

    In the first system G = A^(1) (agent 1 determines the reward); in the second G = A^(2)
    (agent 1 never affects it). Both have the same policies and the same reward law,
    G ~ Bernoulli(1/2). Agent indices are 0-based: agent 1 of the paper is index 0.
    """
    logits = np.zeros((2, 1, 2))
    a1 = np.array([[[0.0, 0.0], [1.0, 1.0]]])  # reward[h, a1, a2] = a1
    a2 = np.array([[[0.0, 1.0], [0.0, 1.0]]])  # reward[h, a1, a2] = a2
    return ParallelPool(logits, a1, noise="fixed"), ParallelPool(logits, a2, noise="fixed")


def random_routed_pool(rng: np.random.Generator, K: int = 3, n_prompts: int = 2, n_actions: int = 3,
                       tau: float = 1.0, eps: float = 0.1, blind: bool = False, noise: str = "bernoulli",
                       logit_scale: float = 1.0) -> RoutedPool:
    """A random routed pool: random policies, candidate rewards in [0, 1] and router scores.

    With ``blind=True`` the router scores depend on the prompt and the agent only.
    """
    logits = logit_scale * rng.normal(size=(K, n_prompts, n_actions))
    g = rng.uniform(size=(K, n_prompts, n_actions))
    scores = rng.normal(size=(K, n_prompts, 1 if blind else n_actions))
    return RoutedPool(logits, g, scores, tau=tau, eps=eps, noise=noise)
