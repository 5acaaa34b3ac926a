"""A simulated routed pool trained by the multi-agent GRPO objective (paper §8; chapter 7).

No language model: the agents are softmax policies over a handful of candidate answers,
so one training run takes about a second on a CPU and a comparison can use many seeds.
Everything that is not the agents is the LLM engine's own code: "route, draw I, credit,
advantages" is :func:`mcpg.grpo.objective.route_and_credit`, the function the engine's
update calls, and the clipped loss is :func:`~mcpg.grpo.objective.clipped_grpo_loss`; the router of
Eq. (3), its leave-one-out propensities, its
draw and its inverse-propensity-weighted outcome loss from :mod:`mcpg.routing`. The loop
follows ``mcpg.grpo.train.Engine.update`` step by step.

The environment
---------------
- Questions have one of T types (by default the LLM engine's keyword specialties
  ``money``, ``time`` and ``geometry``). A question of type t has a hidden correct answer
  Z among M candidate answers, drawn from ``answer_probs[t]``: answer 0 is the most often
  correct, answer 1 the next, and so on. The reward is ``R = 1{A = Z}``: deterministic
  given the question and the candidate, as in GSM8K, so condition (17) of the paper holds.
- Agent k is a tabular softmax policy over the M answers of each type (logits
  ``theta[k, t, :]``). It sees the type, not Z, so no agent can be right on every question
  of a type; only different agents giving different answers can cover more of them.
  All agents start from one shared base policy (logits ``log answer_probs``: it samples
  each answer as often as it is right, and its greedy answer is the most common right
  one), as LoRA agents on one base model do. Agent k's keyword specialty is type
  ``k mod T``: its initial logits favour that type's most often correct answer by
  ``specialty_bonus`` (a weak head start, as a role prompt).
- The router reads each candidate. Its features are one-hots of (type, answer) and of
  (type, agent), a bias, and a noisy check of the candidate: ``C = 1{A = Z}`` flipped
  with probability ``check_flip`` (the same verdict for the same answer to the same
  question; a stand-in for what an outcome model can read in a solution). A linear model
  on these features gives the score ``s_j``; it is the router's score in Eq. (3) and the
  outcome model's logit, ``mu_hat_j = sigmoid(s_j)``, as in ``mcpg.grpo.router.Router``.
  It starts at zero (uniform routing) and learns only from the selected candidate's
  reward, by :func:`mcpg.routing.ipw_outcome_loss`, after each actor update.
  ``candidate_blind=True`` drops the answer and check features: the router then reads the
  type and the agent only (Theorem 1's case ``b_i = 0``).

One update (on-policy, as §8): draw ``prompts_per_update`` questions; every agent samples
m answers to each; the g-th answers form slate g; the router scores every slate, draws I
from Eq. (3) and only ``G = R^(I)`` is fed back; :func:`~mcpg.grpo.objective.credit`
scores every agent on every slate (``wta``, ``removal`` or ``oracle``);
:func:`~mcpg.grpo.objective.group_advantages` turns each agent's m scores into advantages
(``scale_rewards="group"``: standardised, the engine's default; ``"none"``: centred);
:func:`~mcpg.grpo.objective.clipped_grpo_loss` is applied per agent (Adam); then the
router takes ``router_steps`` steps on the rollout's selected feedback. The method
``frozen`` skips the actor update (agents stay at their initial policies, the router
still learns): the reference.

Evaluation, as ``mcpg.grpo.train.evaluate_pool``: on held-out questions each agent
gives its greedy answer (and, for the ``sampled_*`` metrics, one sampled answer), the router
deploys the highest score; reported are accuracy,
routing entropy (of Eq. 3 on the greedy slate), the Brier score of the deployed candidate,
specialization (the fraction deployed to the agent whose specialty is the question's
type), oracle accuracy (some agent is right) and regret = oracle - accuracy. The mechanism
diagnostics ``overlap`` (how often two agents' sampled answers coincide) and ``coverage``
(the chance that some agent's sampled answer is right) are computed exactly from the
policies.

:func:`exact_pool` turns a trained pool into a :class:`mcpg.mechanisms.RoutedPool`
(one type at a time; prompts = Z and the check flips), on which
:func:`theorem1_diagnostics`, :func:`unilateral_deviations` and :func:`profile_table`
compute J_sys, the private utilities U_i and their gradients exactly (Theorem 1), and
:func:`advantage_probe` measures by Monte Carlo which way each signal pushes an agent.

The package has six modules: ``pool`` (configuration, questions,
features, calibrated router), ``loop`` (training and evaluation),
``experiment`` (seeds, paired t-intervals, tables, curves),
``exact`` (Theorem 1 exactly), ``probes`` and ``twin`` (the pool set from chapter 8's slates);
everything is re-exported here, so ``sim.X`` works for all of them.

Seeds are a leading batch axis: :func:`train_pool` trains several independent pools at
once, each with its own generators (``numpy.random.default_rng([seed, stream])``) and its
own slice of every parameter, so a seed's run depends on that seed only. Torch runs on one
thread inside these functions: the tensors are tiny and a thread pool only adds overhead.
"""

from . import exact, experiment, loop, pool, probes, twin
from .exact import *  # noqa: F403
from .experiment import *  # noqa: F403
from .loop import *  # noqa: F403
from .pool import *  # noqa: F403
from .probes import *  # noqa: F403
from .twin import *  # noqa: F403

# the five modules' public names, in the order the docstring lists the modules
__all__ = [*pool.__all__, *loop.__all__, *experiment.__all__, *exact.__all__, *probes.__all__,
           *twin.__all__]
