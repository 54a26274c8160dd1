"""Peak device memory of a stage's step, traced with fake tensors at the real shapes.

No GPU, no weights, no hub: the model is built from its ``config.json`` values
(:mod:`esreason.io.architectures`) inside ``torch._subclasses.fake_tensor.FakeTensorMode``,
and ``torch.distributed._tools.mem_tracker.MemTracker`` records every tensor the step allocates
and frees, by category (parameters, gradients, optimizer states, activations, temporaries). The
peak is what the caching allocator must hold at once, before fragmentation and everything the
trace cannot see (:mod:`esreason.experiments.memplan` adds those as named terms).

Traced steps (each the step of the shipped code path, at the config's dtype and longest sequence):

- :func:`trace_grpo_microstep`: one GRPO micro-step in steady state (micro-step >= 2 of a
  gradient-accumulation window: gradients and AdamW states already exist) with our reference loss
  (:mod:`esreason.grpo.objective`: full-vocabulary log-softmax of the completion), fp32 masters
  under bf16 autocast, the fp32 reference model's forward when beta > 0, activation checkpointing
  when the config asks for it. TRL's own loss keeps only the completion's logits and computes the
  log-softmax row by row, so this is an upper bound on TRL's activations.
- :func:`trace_forward`: one no-grad forward (the HF sampler's prefill at the full length with its
  KV cache: an ES member pass; or the entropy scorer's packed forward plus one logits slice).

Layers: in a training step every decoder layer saves the same activations and the peak comes when
all are saved, so a trace at 1 and at 2 layers determines every category exactly as
``a + b * layers``; tests/test_memtrace.py checks the extrapolation against a direct trace. That
keeps a 28-layer 1.5B GRPO trace to a few seconds on a 2-core CPU (a direct one takes about a
minute). A forward's peak can sit in different places at 1, 2 and 28 layers (the KV cache grows
with the layers, a layer's temporaries do not), so forwards are traced whole (under a second).

Device: fake tensors live on the CPU device here, so autocast is CPU autocast (bf16 matmuls,
float32 softmax as CUDA autocast) and attention is SDPA's flash kernel for CPU (memory linear in
the sequence, as FlashAttention on the GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Trace:
    """Bytes held at the traced step's peak, by what holds them."""

    parameters: int
    """Model weights (and the reference model's, when traced)."""
    gradients: int
    """Gradients of the trainable weights."""
    optimizer: int
    """Optimizer states (AdamW: two per weight)."""
    activations: int
    """Everything else live at the peak: saved activations, temporaries, KV cache, logits."""

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations

    def as_gib(self) -> dict[str, float]:
        g = 2.0 ** 30
        return {"parameters": self.parameters / g, "gradients": self.gradients / g,
                "optimizer": self.optimizer / g, "activations": self.activations / g, "total": self.total / g}


def _peak(tracker: Any) -> Trace:
    from torch.distributed._tools.mem_tracker import _MemRefType

    snap = tracker.get_tracker_snapshot("peak")
    total = {k: 0 for k in ("parameters", "gradients", "optimizer", "activations")}
    names = {_MemRefType.PARAM: "parameters", _MemRefType.GRAD: "gradients", _MemRefType.OPT: "optimizer"}
    for per_device in snap.values():
        for ref, nbytes in per_device.items():
            if ref == "Total":
                continue
            total[names.get(ref, "activations")] += int(nbytes)
    return Trace(**total)


def _model(arch: dict[str, Any], layers: int, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from esreason.io.architectures import hf_config

    return AutoModelForCausalLM.from_config(hf_config(arch, layers), dtype=dtype)


def _linear(trace_at: Any, layers: int) -> Trace:
    """``trace_at(n)`` at n = 1 and 2 layers, extrapolated exactly to ``layers``."""
    one, two = trace_at(1), trace_at(2)
    if layers <= 2:
        return one if layers == 1 else two

    def at(a: int, b: int) -> int:
        return a + (b - a) * (layers - 1)

    return Trace(at(one.parameters, two.parameters), at(one.gradients, two.gradients),
                 at(one.optimizer, two.optimizer), at(one.activations, two.activations))


def trace_grpo_microstep(arch: dict[str, Any], *, micro_batch: int, prompt_len: int, completion_len: int,
                         master_dtype: str = "float32", autocast: str | None = "bfloat16", beta: float = 0.0,
                         gradient_checkpointing: bool = False, layers: int | None = None,
                         extrapolate: bool = True) -> Trace:
    """Peak of one steady-state GRPO micro-step (module docstring).

    micro_batch sequences of prompt_len + completion_len tokens (the longest the config allows).
    layers: decoder layers (default: the architecture's); extrapolate: trace 1 and 2 layers and
    extend linearly (False: trace all layers directly).
    """
    n_layers = int(layers or arch["num_hidden_layers"])

    def trace_at(n: int) -> Trace:
        return _trace_grpo(arch, n, micro_batch, prompt_len, completion_len, DTYPES[master_dtype],
                           DTYPES[autocast] if autocast else None, beta, gradient_checkpointing)

    return _linear(trace_at, n_layers) if extrapolate else trace_at(n_layers)


def _trace_grpo(arch: dict[str, Any], layers: int, micro_batch: int, prompt_len: int, completion_len: int,
                master: torch.dtype, autocast: torch.dtype | None, beta: float, checkpointing: bool) -> Trace:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from esreason.grpo.objective import completion_logprobs, grpo_loss

    with FakeTensorMode():
        model = _model(arch, layers, master)
        model.train()
        if checkpointing:  # transformers >= 5.23 names it activation checkpointing (the old name warns)
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        for p in model.parameters():  # steady state: a previous micro-step's gradients, AdamW states
            p.grad = torch.zeros_like(p)
        opt.step()
        ref = _model(arch, layers, master).eval() if beta else None
        n = micro_batch
        prompt = torch.zeros((n, prompt_len), dtype=torch.long)  # [n, P]
        completion = torch.zeros((n, completion_len), dtype=torch.long)  # [n, C]
        pmask, cmask = torch.ones_like(prompt), torch.ones_like(completion)
        tracker = MemTracker()
        tracker.track_external(*(m for m in (model, opt, ref) if m is not None))
        ctx = torch.autocast("cpu", dtype=autocast) if autocast else torch.autocast("cpu", enabled=False)
        with tracker:
            with ctx:
                logp = completion_logprobs(model, prompt, pmask, completion, cmask)  # [n, C] float32
                ref_logp = None
                if ref is not None:
                    with torch.no_grad():
                        ref_logp = completion_logprobs(ref, prompt, pmask, completion, cmask)
            loss = grpo_loss(logp, logp.detach(), torch.zeros(n), cmask, beta=beta, ref_logp=ref_logp).loss
            loss.backward()
        return _peak(tracker)


def trace_forward(arch: dict[str, Any], *, batch: int, seq_len: int, dtype: str = "bfloat16",
                  kind: str = "prefill", slice_tokens: int = 256, layers: int | None = None) -> Trace:
    """Peak of one no-grad forward of ``batch`` rows of ``seq_len`` tokens in ``dtype``.

    kind: ``"prefill"`` (the HF sampler's prefill with its KV cache kept, last position's logits:
    an ES member pass at the full length) or ``"scorer"`` (the entropy scorer: final hidden states,
    then one ``slice_tokens``-row logits slice in float32 with its log-softmax and entropy).
    """
    return _trace_forward(arch, int(layers or arch["num_hidden_layers"]), batch, seq_len, DTYPES[dtype], kind,
                          slice_tokens)


def _trace_forward(arch: dict[str, Any], layers: int, batch: int, seq_len: int, dtype: torch.dtype, kind: str,
                   slice_tokens: int) -> Trace:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from esreason.backends import topp

    if kind not in ("prefill", "scorer"):
        raise ValueError(f"unknown forward kind {kind!r}")
    with FakeTensorMode():
        model = _model(arch, layers, dtype).eval()
        ids = torch.zeros((batch, seq_len), dtype=torch.long)  # [B, L]
        mask = torch.ones_like(ids)
        tracker = MemTracker()
        tracker.track_external(model)
        with tracker, torch.inference_mode():
            if kind == "prefill":
                out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1)
                keep = (out.logits, out.past_key_values)  # noqa: F841  (live at the peak, as in the sampler)
            else:
                body, head = model.get_decoder(), model.get_output_embeddings()
                hidden = body(input_ids=ids, attention_mask=mask).last_hidden_state  # [B, L, H]
                logits = head(hidden[0, :slice_tokens])  # [S, V]
                topp.entropy(topp.scaled_log_probs(logits, 0.6)).double().sum()
        return _peak(tracker)
