"""Batched multi-LoRA: K LoRA adapters applied to one mixed batch with a few ops per layer.

peft's mixed-adapter inference (``adapter_names=[...]``) splits the batch by adapter in every
LoRA layer at every forward pass: per adapter an index, two matmuls and a scatter back. On a
CPU the arithmetic hides those ops; on a GPU each op is a kernel launch, and a decoding step
of a 30-layer model with 7 adapted linears per layer becomes launch-bound (issue "The engine
at GPU speed": about 6x the aten ops of a plain ``generate`` of the base model).

Here the K adapters of one LoRA linear layer are concatenated once per batch,
``A = [A_1; ...; A_K]`` of shape ``(K r, d_in)`` and ``B = [B_1, ..., B_K]`` of shape
``(d_out, K r)``, and row ``n`` (adapter ``k_n``) gets a mask ``M_n`` that is the LoRA
scaling on the ``r`` columns of its own adapter and 0 elsewhere (all 0 for the frozen base,
``"__base__"``). The layer then computes, for every row at once,

    y_n = W x_n + B ((A x_n) * M_n) = W x_n + s B_{k_n} A_{k_n} x_n,

with one batched matmul for ``A``, one product with the mask and one fused batched
multiply-add for ``B`` (``torch.bmm`` / ``torch.baddbmm`` over expanded, not copied,
weights): 3 ops per layer whatever the number of adapters, the same in decoding and in
scoring. The masked columns are exact zeros, so each row's output is exactly its own
adapter's (up to floating-point summation order), and the gradient of a loss reaches only
the adapters of the rows it depends on. The cost is K times LoRA's own (small) arithmetic.

:class:`MultiLoRA` installs this on a peft model's LoRA ``Linear`` layers; it is active only
inside :meth:`MultiLoRA.rows`, and peft's own forward runs otherwise (single-adapter use,
``disable_adapter()``, merged weights, or ``adapter_names`` passed explicitly).
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["BASE", "MultiLoRA", "supported"]

BASE = "__base__"
"""The adapter name of a row that goes through the frozen base model (peft's name)."""


def _lora_layers(model):
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


def supported(model, names: list[str]) -> bool:
    """Whether every LoRA layer of ``model`` is a plain LoRA ``Linear`` that :class:`MultiLoRA`
    computes exactly: every adapter of ``names`` present, no DoRA or other variant, no
    dropout, no LoRA bias, weights not transposed (``fan_in_fan_out``)."""
    from peft.tuners.lora import Linear

    layers = _lora_layers(model)
    if not layers:
        return False
    for m in layers:
        if type(m) is not Linear or getattr(m, "fan_in_fan_out", False):
            return False
        for name in names:
            if name not in m.lora_A or name in getattr(m, "lora_variant", {}):
                return False
            if not isinstance(m.lora_dropout[name], torch.nn.Identity):
                return False
            if getattr(m.lora_B[name], "bias", None) is not None:
                return False
    return True


class MultiLoRA:
    """Batched mixed-adapter LoRA on a peft model (see the module docstring).

    Args:
        model: a peft model whose LoRA layers hold the adapters ``names`` (checked with
            :func:`supported`).
        names: the adapters, in the order of their blocks in the concatenated weights.
    """

    def __init__(self, model, names: list[str]):
        if not supported(model, names):
            raise ValueError("MultiLoRA needs plain LoRA Linear layers holding every adapter "
                             "(no DoRA, dropout or bias)")
        self.names = list(names)
        self.layers = _lora_layers(model)
        self._peft_forward = {}
        self._state = None
        for m in self.layers:
            self._peft_forward[id(m)] = m.forward
            m.forward = self._make_forward(m)

    def _make_forward(self, m):
        peft_forward = self._peft_forward[id(m)]

        def forward(x, *args, **kwargs):
            st = self._state
            if st is None or m.disable_adapters or m.merged or kwargs.get("adapter_names") is not None:
                return peft_forward(x, *args, **kwargs)
            return self._forward(m, st, x, *args, **kwargs)

        return forward

    # -- state of one batch ------------------------------------------------------------------
    def _weights(self, m, n_rows: int):
        """``A^T`` (n, d_in, K r) and ``B^T`` (n, K r, d_out) of one layer, expanded (views)."""
        A = torch.cat([m.lora_A[k].weight for k in self.names], 0)   # (K r, d_in)
        B = torch.cat([m.lora_B[k].weight for k in self.names], 1)   # (d_out, K r)
        return A.t().expand(n_rows, -1, -1), B.t().expand(n_rows, -1, -1)

    def _mask(self, adapters: list[str], device, dtype) -> torch.Tensor:
        unknown = sorted(set(adapters) - set(self.names) - {BASE})
        if unknown:
            raise ValueError(f"unknown adapters {unknown}; known: {self.names} and {BASE!r}")
        m0 = self.layers[0]
        ranks = [m0.lora_A[k].weight.shape[0] for k in self.names]
        offsets = [sum(ranks[:i]) for i in range(len(ranks))]
        mask = torch.zeros(len(adapters), 1, sum(ranks), dtype=dtype)
        for row, name in enumerate(adapters):
            if name != BASE:
                k = self.names.index(name)
                mask[row, 0, offsets[k]:offsets[k] + ranks[k]] = m0.scaling[name]
        return mask.to(device)

    @contextlib.contextmanager
    def rows(self, adapters: list[str]):
        """Within this context, row ``n`` of every forward pass goes through adapter
        ``adapters[n]`` (``"__base__"``: the frozen base model).

        The concatenated weights are built once on entry: without gradients (generation) they
        are reused by every decoding step; with gradients (scoring) they are part of the graph,
        so a loss back-propagates to each adapter's own parameters. Every scaling must be the
        same across layers for one adapter (peft sets one per adapter).
        """
        m0 = self.layers[0]
        dtype = m0.lora_A[self.names[0]].weight.dtype
        device = m0.lora_A[self.names[0]].weight.device
        for m in self.layers:
            for k in self.names:
                if m.scaling[k] != m0.scaling[k]:
                    raise ValueError(f"adapter {k!r} has different scalings across layers "
                                     "(rank or alpha patterns)")
        n = len(adapters)
        state = {"n": n, "mask": self._mask(adapters, device, dtype),
                 "w": {id(m): self._weights(m, n) for m in self.layers}}
        previous, self._state = self._state, state
        try:
            yield
        finally:
            self._state = previous

    def snapshot(self):
        """The current batch state (None outside :meth:`rows`); see :meth:`restored`."""
        return self._state

    @contextlib.contextmanager
    def restored(self, state):
        """Run with a state from :meth:`snapshot`: gradient checkpointing recomputes a layer
        during the backward pass, after :meth:`rows` has exited, and must see the same rows."""
        previous, self._state = self._state, state
        try:
            yield
        finally:
            self._state = previous

    @staticmethod
    def _forward(m, st, x, *args, **kwargs):
        result = m.base_layer(x, *args, **kwargs)
        A, B = st["w"][id(m)]
        if x.shape[0] != st["n"]:
            raise RuntimeError(f"MultiLoRA: batch of {x.shape[0]} rows inside rows() of {st['n']} adapters")
        shape = x.shape
        x3 = x.reshape(shape[0], -1, shape[-1]) if x.dim() != 3 else x
        if x3.dtype != A.dtype:
            x3 = x3.to(A.dtype)
        h = torch.bmm(x3, A) * st["mask"]
        r3 = result if result.dim() == 3 else result.reshape(shape[0], -1, result.shape[-1])
        if r3.dtype == B.dtype:
            out = r3.baddbmm_(h, B)  # in place: the base output is a fresh tensor nothing else holds
        else:  # a bfloat16 base, float32 adapters: LoRA in float32, added in the base's dtype (as peft)
            out = r3 + torch.bmm(h, B).to(r3.dtype)
        return out if out.shape == result.shape else out.reshape(result.shape)
