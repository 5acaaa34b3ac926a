"""K LLM agents as LoRA adapters on one frozen base model (paper §8 "Setup").

Every agent i is a LoRA adapter named ``agents[i].name`` on the same frozen base model
(peft multi-adapter: one ``get_peft_model`` for the first agent, then ``add_adapter`` per
further agent). Agents differ in their role prompt, their sampling temperature and a
specialty label (on GSM8K a keyword class, which the role prompt mentions and which defines the
specialization diagnostic).

A rollout asks each agent for m completions of each prompt. All K agents generate in ONE
batch: peft's mixed-adapter inference routes row r through adapter ``adapter_names[r]``
(``model.generate(..., adapter_names=[...])``), and ``"__base__"`` routes a row through
the frozen base model, the single-agent reference. ``generate`` takes one temperature, so
each row's own temperature is applied by :class:`RowTemperature`, a logits processor that
divides row r's logits by ``T_r``.

Rows that share a prompt and an adapter (the m completions of one agent for one prompt)
share one prefill: the prompt's KV cache is computed once, in the same mixed-adapter way,
and copied to the m rows before decoding.

The actor loss needs every row's token log-probabilities under its own adapter; they too
come from one mixed-adapter forward pass (:meth:`AgentPool.token_logprobs`). The model stays
in eval mode throughout (peft allows ``adapter_names`` only in eval mode); that changes
nothing here because LoRA dropout is 0 and the base model has no active dropout, and
gradients flow as usual.

Speed and memory (issue "The engine at GPU speed"): by default the mixed batches do not go
through peft's per-adapter split but through :class:`mcpg.grpo.multilora.MultiLoRA`, which
applies all K adapters with 3 batched ops per LoRA layer (exactly the same function);
scoring computes the hidden states once, then the output head, log-softmax and the chosen
tokens' log-probabilities in chunks of ``logprob_chunk`` tokens, each recomputed in the
backward pass, so full-vocabulary logits of more than one chunk are never held; and with
``gradient_checkpointing`` each decoder layer keeps only its input for the backward pass and
recomputes the rest.

Row layout of a rollout: for prompt b, agent k and completion g the row index is
``(b * K + k) * m + g``; so ``x.view(B, K, m)`` then ``.transpose(1, 2)`` gives the
``(B, m, K)`` slate layout of :mod:`mcpg.grpo.objective` (slate g = the g-th completion of
every agent).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .multilora import BASE, MultiLoRA, supported

__all__ = ["AgentSpec", "RowTemperature", "Rollout", "AgentPool", "selective_logprobs", "BASE"]

INSTRUCTION = (
    "Solve the math word problem. Write the final answer as a number on the last line in the "
    "form '#### <number>'."
)
"""The default instruction after each agent's role (config key ``instruction``). It asks for
the answer format only: how much reasoning to write is the task's to say (the arithmetic task
asks for one short line; an earlier "think step by step" made SmolLM2 run past its token budget
on 62 % of completions)."""
REFERENCE_ROLE = "You are a helpful assistant. " + INSTRUCTION


@dataclass(frozen=True)
class AgentSpec:
    """One agent: adapter name, role prompt, sampling temperature, specialty (a label; GSM8K's keyword
    classes money, time and geometry define the specialization diagnostic)."""

    name: str
    role: str
    temperature: float = 1.0
    specialty: str | None = None

    def __post_init__(self):
        if not self.name or self.name == BASE or not self.name.replace("_", "").isalnum():
            raise ValueError(f"agent name must be an identifier other than {BASE!r}, got {self.name!r}")
        if not self.temperature > 0:
            raise ValueError(f"agent {self.name!r}: temperature must be > 0, got {self.temperature}")


class RowTemperature:
    """Logits processor dividing row r's next-token logits by its own temperature ``T_r``.

    ``model.generate`` accepts one ``temperature`` for the whole batch; with
    ``temperature=1.0`` and this processor, row r samples from ``softmax(logits_r / T_r)``.
    """

    def __init__(self, temperatures: torch.Tensor):
        self.temperatures = temperatures.reshape(-1, 1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.temperatures.device != scores.device or self.temperatures.dtype != scores.dtype:
            # moved once, not at every step
            self.temperatures = self.temperatures.to(device=scores.device, dtype=scores.dtype)
        return scores / self.temperatures


class _SamplerLogprobs:
    """A logits processor (last in the list) recording ``log softmax`` of the distribution each
    token was sampled from, at the sampled token: the generator's own log-probabilities."""

    def __init__(self):
        self.prev, self.picked = None, []

    def __call__(self, input_ids, scores):
        if self.prev is not None:
            self.picked.append(self.prev.gather(1, input_ids[:, -1:]))
        self.prev = torch.log_softmax(scores.float(), -1)
        return scores

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        if self.prev is not None:
            self.picked.append(self.prev.gather(1, last_tokens[:, None]))
        return torch.cat(self.picked, 1)


class _AnswerLine:
    """A stopping criterion: a row stops once its completion holds a finished answer line
    (:data:`mcpg.grpo.gsm8k.ANSWER_LINE`). ``length[r]`` records how many tokens row r had
    sampled when it stopped (0: it did not stop here; a row that ended with EOS is left alone)."""

    def __init__(self, tokenizer, start: int, rows: int):
        from .gsm8k import ANSWER_LINE

        self.tokenizer, self.start, self.pattern = tokenizer, start, ANSWER_LINE
        self.length = torch.zeros(rows, dtype=torch.long)

    def __call__(self, input_ids, scores, **kwargs):
        completion = input_ids[:, self.start:].cpu()
        ended = (completion == self.tokenizer.eos_token_id).any(dim=1)
        for r in ((self.length == 0) & ~ended).nonzero().flatten().tolist():
            if self.pattern.search(self.tokenizer.decode(completion[r], skip_special_tokens=True)):
                self.length[r] = completion.shape[1]
        return (self.length > 0).to(input_ids.device)


class _StepProgress:
    """A logits processor that only advances a progress bar by one per decoding step."""

    def __init__(self, bar):
        self.bar = bar

    def __call__(self, input_ids, scores):
        self.bar.update(1)
        return scores


def selective_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[token]`` per position, without materialising the full log-softmax."""
    picked = torch.gather(logits, -1, tokens.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


@dataclass
class Rollout:
    """Generated rows: prompts and completions as token tensors, plus their texts.

    ``prompt_ids``/``prompt_mask`` are left-padded, ``completion_ids``/``completion_mask``
    right-padded; the mask covers the completion up to and including its first EOS token
    (TRL's convention), or its answer line (``generate(..., stop_at_answer=True)``).
    ``truncated[r]``: row r was cut at the token budget (neither EOS nor the answer line).
    ``adapters[r]`` and ``temperatures[r]`` say who generated row r.
    ``sampler_logprobs`` (only with ``generate(..., keep_logprobs=True)``) holds the
    generator's log-probability of each completion token (meaningful where the mask is 1).
    """

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    texts: list[str]
    adapters: list[str]
    temperatures: torch.Tensor
    truncated: torch.Tensor = field(default=None)
    sampler_logprobs: torch.Tensor = field(default=None)

    def __len__(self) -> int:
        return len(self.texts)

    def rows(self, idx) -> "Rollout":
        """The sub-rollout of the given row indices (used for micro-batches)."""
        idx = list(idx)
        t = torch.as_tensor(idx, dtype=torch.long)
        return Rollout(
            self.prompt_ids[t], self.prompt_mask[t], self.completion_ids[t], self.completion_mask[t],
            [self.texts[i] for i in idx], [self.adapters[i] for i in idx], self.temperatures[t],
            None if self.truncated is None else self.truncated[t],
            None if self.sampler_logprobs is None else self.sampler_logprobs[t],
        )


class AgentPool:
    """K LoRA agents on one frozen base model, generating and scoring in mixed-adapter batches.

    Args:
        base_model: a causal LM (frozen; only the adapters train).
        tokenizer: its tokenizer, padding on the left, with a chat template.
        agents: the K :class:`AgentSpec`.
        lora_r, lora_alpha, lora_dropout, target_modules: the LoRA configuration shared by
            every adapter (``target_modules="all-linear"`` adapts every linear layer but the
            output head).
        seed: seeds the adapters' random initialisation (LoRA's B starts at 0, so every
            agent starts as the base model and they differ only by prompt and temperature).
        share_prefill: compute the prompt's KV cache once per (prompt, agent) pair and copy it
            to that pair's m completions, instead of m identical prefills, in the rollout and in
            differentiable scoring (``_shared_prompt_hidden``); False: every row runs its
            own prompt. The same results either way (config key ``shared_prefix``).
        multilora: apply the adapters of a mixed batch with :class:`~mcpg.grpo.multilora.MultiLoRA`
            (3 batched ops per LoRA layer) instead of peft's per-adapter split; the same function,
            far fewer ops (kernel launches on a GPU). Falls back to peft when the LoRA layers are
            not plain ``Linear`` ones.
        gradient_checkpointing: in differentiable scoring, keep only each decoder layer's input
            for the backward pass and recompute the layer then (less memory, one more forward).
        logprob_chunk: tokens (rows x positions) per chunk of the output head and log-softmax in
            scoring; 0: all at once (holds the full-vocabulary logits of the whole batch).
    """

    def __init__(self, base_model, tokenizer, agents: list[AgentSpec], lora_r: int = 8, lora_alpha: int = 16,
                 lora_dropout: float = 0.0, target_modules="all-linear", seed: int = 0,
                 share_prefill: bool = True, multilora: bool = True, gradient_checkpointing: bool = True,
                 logprob_chunk: int = 512, instruction: str | None = None):
        from peft import LoraConfig, get_peft_model

        if len(agents) < 1:
            raise ValueError("agents must hold at least 1 agent")
        names = [a.name for a in agents]
        if len(set(names)) != len(names):
            raise ValueError(f"agents must have distinct names, got {names}")
        if lora_dropout != 0.0:
            raise ValueError("lora_dropout must be 0: the pool runs in eval mode (mixed-adapter batches)")
        self.agents = list(agents)
        self.tokenizer = tokenizer
        self.share_prefill = share_prefill
        self.instruction = INSTRUCTION if instruction is None else str(instruction)
        cfg = LoraConfig(r=lora_r, lora_alpha=lora_alpha, lora_dropout=0.0, target_modules=target_modules,
                         task_type="CAUSAL_LM", bias="none")
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            # peft reads transformers' deprecated `is_gradient_checkpointing` (renamed in transformers 5);
            # a warning about peft's code, nothing this pool can change
            warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated",
                                    category=FutureWarning)
            # peft warns when a name is a substring of its prefix 'lora_' ('a', 'r'): such adapters
            # save and load unchanged, in this pool and in PeftModel.from_pretrained (tested)
            warnings.filterwarnings("ignore", message=r"Adapter name .* should not be contained in the")
            torch.manual_seed(seed)
            model = get_peft_model(base_model, cfg, adapter_name=names[0])
            for name in names[1:]:
                model.add_adapter(name, cfg)
        # every adapter trains; the base stays frozen
        for pname, param in model.named_parameters():
            param.requires_grad_(".lora_" in pname)
        model.eval()
        self.model = model
        if logprob_chunk < 0:
            raise ValueError(f"logprob_chunk must be >= 0, got {logprob_chunk}")
        self.logprob_chunk = int(logprob_chunk)
        self.multilora = MultiLoRA(model, names) if multilora and supported(model, names) else None
        self.gradient_checkpointing = bool(gradient_checkpointing)
        self._checkpointing = False  # True only inside differentiable scoring
        self._install_checkpointing()

    # -- prompts -------------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        return [a.name for a in self.agents]

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def prompt(self, question: str, agent: AgentSpec | None = None) -> str:
        """The chat-formatted prompt of one agent (``None``: the frozen reference)."""
        role = "You are a helpful assistant." if agent is None else agent.role
        role = f"{role} {self.instruction}" if self.instruction else role  # none: the role alone
        messages = [{"role": "system", "content": role}, {"role": "user", "content": question}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def adapter_params(self, name: str) -> list[torch.nn.Parameter]:
        """The trainable parameters of one agent's adapter."""
        pattern = re.compile(r"\.lora_\w+\." + re.escape(name) + r"\.")
        return [p for n, p in self.model.named_parameters() if pattern.search(n)]

    # -- generation ----------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: list[str], adapters: list[str], temperatures, max_new_tokens: int,
                 greedy: bool = False, batch_size: int | None = None, progress=None,
                 min_new_tokens: int = 0, keep_logprobs: bool = False,
                 stop_at_answer: bool = False) -> Rollout:
        """Generate one completion per row, all rows' adapters mixed in each batch.

        ``progress`` is an optional tqdm bar advanced by one per decoding step, with
        ``max_new_tokens`` steps per batch;
        ``min_new_tokens`` forbids EOS before that many tokens (benchmarks use it to fix
        the amount of work). ``keep_logprobs`` records the generator's own log-probability of
        every sampled token in ``Rollout.sampler_logprobs`` (a check of the scoring pass).
        ``stop_at_answer`` ends a row at its first finished answer line (``#### <n>`` and a
        newline, :data:`mcpg.grpo.gsm8k.ANSWER_LINE`): its mask ends at the newline's token, no
        EOS follows it, and it is not ``truncated``.
        """
        n = len(prompts)
        if len(adapters) != n:
            raise ValueError(f"adapters must have one entry per prompt ({n}), got {len(adapters)}")
        temps = torch.as_tensor(temperatures, dtype=torch.float32).reshape(-1)
        if temps.numel() != n or not bool((temps > 0).all()):
            raise ValueError("temperatures must hold one positive temperature per prompt")
        bs = n if not batch_size else int(batch_size)
        parts = [self._generate_batch(prompts[i:i + bs], adapters[i:i + bs], temps[i:i + bs],
                                      max_new_tokens, greedy, progress, min_new_tokens, keep_logprobs,
                                      stop_at_answer)
                 for i in range(0, n, bs)]
        return _concat(parts, self.tokenizer.pad_token_id)

    def _mixed(self, adapters: list[str]):
        """``(context, kwargs)`` for a forward pass or ``generate`` whose row r uses ``adapters[r]``."""
        if self.multilora is not None:
            return self.multilora.rows(list(adapters)), {}
        return contextlib.nullcontext(), {"adapter_names": list(adapters)}

    def _generate_batch(self, prompts, adapters, temps, max_new_tokens, greedy, progress, min_new_tokens=0,
                        keep_logprobs=False, stop_at_answer=False) -> Rollout:
        from transformers import LogitsProcessorList, StoppingCriteriaList

        tok, dev = self.tokenizer, self.device
        kwargs = {"max_new_tokens": max_new_tokens, "pad_token_id": tok.pad_token_id,
                  "eos_token_id": tok.eos_token_id}
        if min_new_tokens:
            kwargs["min_new_tokens"] = min_new_tokens
        processors = LogitsProcessorList()
        if greedy:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
        else:
            kwargs.update(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
            processors.append(RowTemperature(temps))
        if progress is not None:
            processors.append(_StepProgress(progress))
        recorder = _SamplerLogprobs() if keep_logprobs else None
        if recorder is not None:
            processors.append(recorder)

        # Shared prefill: the m completions of one (prompt, agent) pair start from the same
        # prompt, so its KV cache is computed once (mixed adapters, all but the last prompt
        # token) and copied to the m rows; generate() then runs only the decoding steps.
        uniq, row_map, _ = _groups(list(zip(prompts, adapters)), dev)
        enc = tok([p for p, _ in uniq], return_tensors="pt", padding=True, add_special_tokens=False).to(dev)
        input_ids, attention = enc.input_ids[row_map], enc.attention_mask[row_map]
        if self.share_prefill and len(uniq) < len(prompts) and enc.input_ids.shape[1] >= 2:
            position_ids = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
            ctx, extra = self._mixed([a for _, a in uniq])
            with torch.no_grad(), ctx:
                out = self.model(input_ids=enc.input_ids[:, :-1], attention_mask=enc.attention_mask[:, :-1],
                                 position_ids=position_ids[:, :-1], use_cache=True, logits_to_keep=1, **extra)
            name = "cache" if "cache" in out else "past_key_values"  # transformers >= 5.2 renamed it
            cache = out[name]
            cache.batch_select_indices(row_map)
            kwargs[name] = cache
        stop = _AnswerLine(tok, input_ids.shape[1], len(prompts)) if stop_at_answer else None
        if stop is not None:
            kwargs["stopping_criteria"] = StoppingCriteriaList([stop])
        ctx, extra = self._mixed(adapters)
        with ctx:
            out = self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs, **extra,
                                      logits_processor=processors)
        sampler_lp = None if recorder is None else recorder.finish(out[:, -1]).cpu()
        completion = out[:, input_ids.shape[1]:].cpu()
        is_eos = completion == tok.eos_token_id
        has_eos = is_eos.any(dim=1)
        no_eos = torch.full_like(has_eos, completion.shape[1], dtype=torch.long)
        first = torch.where(has_eos, is_eos.int().argmax(dim=1), no_eos)
        stopped = torch.zeros_like(has_eos) if stop is None else stop.length > 0
        if stop is not None:  # a stopped row (no EOS before) ends at its answer line's newline
            first = torch.where(stopped, stop.length - 1, first)
        pos = torch.arange(completion.shape[1]).unsqueeze(0)
        mask = (pos <= first.unsqueeze(1)).long()
        completion = torch.where(mask.bool(), completion, torch.full_like(completion, tok.pad_token_id))
        texts = tok.batch_decode(completion, skip_special_tokens=True)
        if progress is not None:  # generation may stop early (every row hit EOS): fill the bar
            progress.update(max_new_tokens - completion.shape[1])
        return Rollout(input_ids.cpu(), attention.cpu(), completion, mask, texts, list(adapters), temps.cpu(),
                       ~has_eos & ~stopped, sampler_lp)

    # -- scoring -------------------------------------------------------------------------
    def _install_checkpointing(self) -> None:
        """Wrap each decoder layer's forward so that, inside differentiable scoring only, it runs
        under non-reentrant ``torch.utils.checkpoint`` (the model stays in eval mode, where
        transformers' own gradient checkpointing would not engage). The recomputation in the
        backward pass sees the same mixed-adapter rows as the forward pass, and, when the layer
        reads and extends a KV cache (shared-prompt scoring), the cache as the forward pass found
        it: the layer's cache entry is put back to its state before the forward pass for the
        recomputation (else the recomputed layer would append its keys a second time), then
        restored. Only with :class:`MultiLoRA`: peft's ``adapter_names`` hooks live only during
        the forward call, so a recomputation through peft's path would use the wrong adapters."""
        from torch.utils.checkpoint import checkpoint
        from transformers.modeling_layers import GradientCheckpointingLayer

        pool = self

        def context_fn(cache):
            rows = pool.multilora.snapshot()
            before = None if cache is None else _cache_state(cache)

            @contextlib.contextmanager
            def again():
                after = None if cache is None else _cache_state(cache)
                with pool.multilora.restored(rows):
                    if cache is not None:
                        _set_cache_state(cache, before)
                    try:
                        yield
                    finally:
                        if cache is not None:
                            _set_cache_state(cache, after)

            return contextlib.nullcontext(), again()

        def wrap(inner):
            def forward(*args, **kwargs):
                if (pool._checkpointing and pool.gradient_checkpointing and pool.multilora is not None
                        and torch.is_grad_enabled()):
                    cache = kwargs.get("cache", kwargs.get("past_key_values"))
                    if cache is None or isinstance(getattr(cache, "layers", None), list):
                        return checkpoint(inner, *args, use_reentrant=False,
                                          context_fn=functools.partial(context_fn, cache), **kwargs)
                return inner(*args, **kwargs)
            return forward

        for module in self.model.modules():
            if isinstance(module, GradientCheckpointingLayer):
                module.forward = wrap(module.forward)

    def _head_parts(self):
        """``(decoder, head)`` when the logits are exactly ``head(decoder(...).last_hidden_state)``
        (no soft-capping or logit scaling, head not adapted); otherwise None."""
        base = self.model.get_base_model()
        cfg = base.config
        scaled = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")
        if any(getattr(cfg, k, None) not in (None, 1.0) for k in scaled):
            return None
        decoder, head = getattr(base, "model", None), base.get_output_embeddings()
        if decoder is None or type(head) is not torch.nn.Linear:
            return None
        return decoder, head

    def token_logprobs(self, batch: Rollout, with_entropy: bool = False):
        """Log-probabilities (N, T) of each row's completion tokens under its own adapter.

        One mixed-adapter forward pass; logits are divided by the row's sampling temperature
        first (as TRL does with its single temperature), so these are the log-probabilities
        of the distribution that sampled the tokens. Differentiable in the adapters.
        The output head and log-softmax run on chunks of ``logprob_chunk`` tokens (each
        recomputed in the backward pass), so at most one chunk's full-vocabulary logits is
        held at a time. ``with_entropy``: also return the entropy (N, T) of each position's
        distribution (TRL's ``entropies``; no gradient), from the same logits:
        ``(logprobs, entropies)``.
        """
        dev = self.device
        prompt_ids, completion_ids = batch.prompt_ids.to(dev), batch.completion_ids.to(dev)
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention = torch.cat([batch.prompt_mask.to(dev), batch.completion_mask.to(dev)], dim=1)
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)  # the positions generate() used
        N, T = completion_ids.shape
        temps = batch.temperatures.to(dev)
        parts = self._head_parts() if self.logprob_chunk and self.multilora is not None else None
        keys = [(tuple(p), a) for p, a in zip(batch.prompt_ids.tolist(), batch.adapters)]
        uniq, row_map, first = _groups(keys, dev)
        if parts is not None and self.share_prefill and len(uniq) < N:
            hidden = self._shared_prompt_hidden(parts[0], batch, [a for _, a in uniq], row_map, first,
                                                input_ids, attention, position_ids)
            head = parts[1]
        else:
            ctx, extra = self._mixed(batch.adapters)
            self._checkpointing = True
            try:
                with ctx:
                    if parts is None:  # the model's own forward: full-vocabulary logits of the whole batch
                        out = self.model(input_ids=input_ids, attention_mask=attention,
                                         position_ids=position_ids,
                                         logits_to_keep=T + 1, use_cache=False, **extra)
                        logits = out.logits[:, :-1, :].float() / temps.reshape(-1, 1, 1)
                        lp = selective_logprobs(logits, completion_ids)
                        return (lp, _entropy(logits)) if with_entropy else lp
                    decoder, head = parts
                    out = decoder(input_ids=input_ids[:, :-1], attention_mask=attention[:, :-1],
                                  position_ids=position_ids[:, :-1], use_cache=False, **extra)
                    hidden = out.last_hidden_state
            finally:
                self._checkpointing = False
            hidden = hidden[:, -T:]
        hidden = hidden.reshape(N * T, -1)
        tokens = completion_ids.reshape(-1)
        row_temps = temps.repeat_interleave(T)
        out = []
        for i in range(0, N * T, self.logprob_chunk):
            sl = slice(i, i + self.logprob_chunk)
            if torch.is_grad_enabled() and hidden.requires_grad:
                from torch.utils.checkpoint import checkpoint

                out.append(checkpoint(_head_logprobs, hidden[sl], tokens[sl], row_temps[sl], head,
                                      with_entropy, use_reentrant=False))
            else:
                out.append(_head_logprobs(hidden[sl], tokens[sl], row_temps[sl], head, with_entropy))
        if with_entropy:
            return (torch.cat([lp for lp, _ in out]).reshape(N, T),
                    torch.cat([h for _, h in out]).reshape(N, T))
        return torch.cat(out).reshape(N, T)

    @torch.no_grad()
    def reference_logprobs(self, batch: Rollout) -> torch.Tensor:
        """Log-probabilities (N, T) of each row's completion under the reference policy of the KL
        term (config key ``beta``): the frozen base model, at the row's temperature, as TRL takes
        the base model with the adapter disabled as the reference of a PEFT model."""
        return self.token_logprobs(dataclasses.replace(batch, adapters=[BASE] * len(batch)))

    def _shared_prompt_hidden(self, decoder, batch, pair_adapters, row_map, first, input_ids, attention,
                              position_ids):
        """Hidden states (N, T, d) that predict each row's completion tokens, with each (prompt,
        agent) pair's prompt run once (the shared-prefix pass; config key ``shared_prefix``).

        The m completions of one pair share their prompt tokens and their adapter, so

        1. the prompt of each pair runs once, with gradients, through the decoder, keeping its
           key-value cache;
        2. the cache is expanded to the pair's rows by indexing its batch dimension
           (``DynamicCache.batch_select_indices``: ``keys[rows]``, ``values[rows]``), an
           indexing op, so autograd sums the rows' gradients back into the prompt's keys and
           values, hence into its activations and every LoRA factor that made them;
        3. only the completion tokens of every row run on that cache, each row under its own
           adapter (one mixed-adapter batch, :class:`~mcpg.grpo.multilora.MultiLoRA`).

        Exact, up to float summation order: the log-probabilities and every adapter's gradient
        are those of one pass over every row's prompt + completion, because the inputs are the
        same — the same prompt tokens, left-padded to the batch's prompt width; the same
        attention mask (the prompt's followed by the completion's, so a right-padded
        completion's pads stay masked); the same position ids (``cumsum(mask) - 1``, the
        positions ``generate`` used); the same temperature per row. The prompt's cost falls to
        1/m. ``tests/test_grpo_prefix.py`` checks it (per-token log-probabilities, each
        adapter's gradient, a whole update's metrics row for every loss type) on the tiny random
        model and on SmolLM2-135M.

        Scoring takes this path when the pool can run the decoder and the head apart
        (``logprob_chunk`` > 0, :class:`~mcpg.grpo.multilora.MultiLoRA`) and the rows repeat a
        pair. It works on whatever rows it is given: a micro-batch (config key ``train_micro_batch``)
        that splits a pair runs that pair's prompt once per piece (still exact, only dearer), and
        a micro-batch without a repeated pair takes the unshared path. Data parallelism is
        unchanged: each process scores its own rows, and the loss normalisers and gradients are
        summed across processes as before. With ``gradient_checkpointing`` both passes keep
        only each decoder layer's input (and the KV cache, which the forward pass holds anyway)
        for the backward pass; a checkpointed layer that extends the cache gets it back as the
        forward pass found it for its recomputation (:meth:`_install_checkpointing`).
        """
        P, T = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
        self._checkpointing = True
        try:
            ctx, extra = self._mixed(pair_adapters)
            with ctx:
                out = decoder(input_ids=input_ids[first, :P], attention_mask=attention[first, :P],
                              position_ids=position_ids[first, :P], use_cache=True, **extra)
            hidden = [out.last_hidden_state[:, -1:][row_map]]  # predicts each row's first completion token
            if T > 1:
                name = "cache" if "cache" in out else "past_key_values"  # transformers >= 5.2 renamed it
                cache = out[name]
                cache.batch_select_indices(row_map)
                ctx, extra = self._mixed(batch.adapters)
                with ctx:
                    rest = decoder(input_ids=input_ids[:, P:-1], attention_mask=attention[:, :-1],
                                   position_ids=position_ids[:, P:-1], use_cache=True, **{name: cache},
                                   **extra)
                hidden.append(rest.last_hidden_state)
        finally:
            self._checkpointing = False
        return torch.cat(hidden, dim=1)

    # -- persistence ---------------------------------------------------------------------
    def adapter_state(self, name: str) -> dict[str, torch.Tensor]:
        """One adapter's weights, keyed by parameter name with the adapter name removed."""
        from peft import get_peft_model_state_dict

        with warnings.catch_warnings():
            # peft looks for the base model's config.json to see whether the vocabulary was resized;
            # a GGUF base (SmolLM2 offline) has none next to it. The adapters never touch the
            # embeddings (LoRA on linear layers only), so peft's assumption "not modified" is right.
            warnings.filterwarnings("ignore", message=r"Could not find a config file", category=UserWarning)
            state = get_peft_model_state_dict(self.model, adapter_name=name)
        return {k: v.detach().cpu().clone().contiguous() for k, v in state.items()}

    def load_adapter_state(self, name: str, state: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        result = set_peft_model_state_dict(self.model, state, adapter_name=name)
        missing = [k for k in getattr(result, "missing_keys", []) if f".{name}." in k and ".lora_" in k]
        if missing:
            raise ValueError(f"adapter {name!r}: state lacks {len(missing)} tensors, e.g. {missing[0]}")

    def save_adapters(self, folder: str | Path, base_model: str | None = None) -> None:
        """Save every agent in PEFT's own format (``PeftModel.save_pretrained``): agent ``name`` in
        ``<folder>/<name>/`` as ``adapter_config.json`` and ``adapter_model.safetensors``, which
        ``peft.PeftModel.from_pretrained(base_model, folder / name)`` loads as a model of its own.
        The tensors are :meth:`adapter_state`'s (peft's ``get_peft_model_state_dict``).
        ``base_model``: what ``adapter_config.json`` records as ``base_model_name_or_path``
        (:func:`mcpg.grpo.models.base_model_id`; peft's ``AutoPeftModelForCausalLM`` loads it)."""
        folder = Path(folder)
        if base_model is not None:
            for name in self.names:
                self.model.peft_config[name].base_model_name_or_path = base_model
        with warnings.catch_warnings():
            # as in adapter_state: peft looks for the base model's config.json (absent for a GGUF base)
            warnings.filterwarnings("ignore", message=r"Could not find a config file", category=UserWarning)
            for name in self.names:
                # peft writes an adapter named "default" into the folder it is given, any other into
                # a subfolder of its name: either way agent `name` lands in <folder>/<name>
                target = folder / name if name == "default" else folder
                self.model.save_pretrained(str(target), selected_adapters=[name])

    def load_adapters(self, folder: str | Path) -> None:
        """Load every agent saved by :meth:`save_adapters` (``<folder>/<name>/``, peft's format), or
        saved in the layout of runs recorded before it: ``<folder>/<name>.safetensors``, the same
        tensors without ``adapter_config.json``. An adapter saved with another LoRA rank or scaling
        than this pool's is refused."""
        from peft import PeftConfig
        from peft.utils import CONFIG_NAME, SAFETENSORS_WEIGHTS_NAME, load_peft_weights
        from safetensors.torch import load_file

        folder = Path(folder)
        for name in self.names:
            peft_dir, bare = folder / name, folder / f"{name}.safetensors"
            if (peft_dir / SAFETENSORS_WEIGHTS_NAME).is_file():
                saved, ours = PeftConfig.from_pretrained(str(peft_dir)), self.model.peft_config[name]
                for key in ("r", "lora_alpha"):
                    if getattr(saved, key) != getattr(ours, key):
                        raise ValueError(f"adapter {name!r} in {peft_dir / CONFIG_NAME} has {key} "
                                         f"{getattr(saved, key)}, this pool {getattr(ours, key)}")
                state = load_peft_weights(str(peft_dir), device=str(self.device))
            elif bare.is_file():
                state = load_file(str(bare), device=str(self.device))
            else:
                raise ValueError(f"folder {folder!s} has no adapter {name!r} "
                                 f"({name}/{SAFETENSORS_WEIGHTS_NAME} or {bare.name})")
            self.load_adapter_state(name, state)


def _cache_state(cache):
    """The layers of a KV cache and each one's attributes (its key and value tensors, ...)."""
    layers = list(cache.layers)
    return layers, [dict(vars(layer)) for layer in layers]


def _set_cache_state(cache, state) -> None:
    """Put a KV cache back to a state from :func:`_cache_state` (no tensor is copied)."""
    layers, attributes = state
    cache.layers[:] = layers
    for layer, attrs in zip(layers, attributes):
        vars(layer).clear()
        vars(layer).update(attrs)


def _groups(keys: list, device) -> tuple[list, torch.Tensor, torch.Tensor]:
    """Rows grouped by key (prompt and adapter): ``(uniq, row_map, first)`` with ``uniq`` the
    distinct keys in order of first appearance, ``row_map[r]`` the index in ``uniq`` of row r's
    key and ``first[u]`` the first row whose key is ``uniq[u]`` (so ``row_map[first]`` is
    ``0, 1, ...``). Rows of one group share a prompt's KV cache."""
    index: dict = {}
    row_map = [index.setdefault(k, len(index)) for k in keys]
    first = {}
    for r, u in enumerate(row_map):
        first.setdefault(u, r)
    return (list(index), torch.tensor(row_map, dtype=torch.long, device=device),
            torch.tensor(list(first.values()), dtype=torch.long, device=device))


def _head_logprobs(hidden, tokens, temps, head, with_entropy: bool = False):
    """Temperature-scaled log-probabilities of ``tokens`` from hidden states through the head
    (and, ``with_entropy``, each position's entropy: ``(logprobs, entropies)``)."""
    logits = head(hidden).float() / temps[:, None]
    lp = selective_logprobs(logits, tokens)
    return (lp, _entropy(logits)) if with_entropy else lp


def _entropy(logits: torch.Tensor) -> torch.Tensor:
    """The entropy (nats) of ``softmax(logits)`` on the last axis, without gradient (TRL's
    ``entropy_from_logits``)."""
    with torch.no_grad():
        logp = torch.log_softmax(logits, dim=-1)
        return -(logp.exp() * logp).sum(-1)


def _concat(parts: list[Rollout], pad_id: int) -> Rollout:
    if len(parts) == 1:
        return parts[0]

    def cat(tensors, left: bool, value: int):
        width = max(t.shape[1] for t in tensors)
        padded = []
        for t in tensors:
            pad = torch.full((t.shape[0], width - t.shape[1]), value, dtype=t.dtype)
            padded.append(torch.cat([pad, t] if left else [t, pad], dim=1))
        return torch.cat(padded)

    return Rollout(
        cat([p.prompt_ids for p in parts], True, pad_id), cat([p.prompt_mask for p in parts], True, 0),
        cat([p.completion_ids for p in parts], False, pad_id),
        cat([p.completion_mask for p in parts], False, 0),
        sum((p.texts for p in parts), []), sum((p.adapters for p in parts), []),
        torch.cat([p.temperatures for p in parts]), torch.cat([p.truncated for p in parts]),
        None if any(p.sampler_logprobs is None for p in parts) else
        cat([p.sampler_logprobs for p in parts], False, 0),
    )
