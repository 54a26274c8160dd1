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
  under bf16 autocast, activation checkpointing when the config asks for it, and the KL reference
  model's weights resident (beta != 0) in TRL's dtype for it. TRL's own loss keeps only the
  completion's logits and computes the log-softmax row by row, so this is an upper bound on TRL's
  activations. The reference's forward is not part of the micro-step: TRL runs it once per rollout
  batch, at generation time (``_generate_and_score_completions``), which :func:`trace_grpo_scoring`
  traces.
- :func:`trace_grpo_scoring`: that generation-time forward, no grad, one micro-batch of rows through
  the reference (beta != 0; else the policy for the old log-probabilities), beside the policy's
  weights and AdamW states (TRL's optimizer step leaves no gradients: ``zero_grad(set_to_none=True)``).
- :func:`trace_forward`: one no-grad forward (the HF sampler's prefill at the full length with its
  KV cache: an ES member pass; or the entropy scorer's packed forward plus one logits slice).

Sharding (``sharding='fsdp'``, ``processes`` = P): the models are sharded as the run shards them, with
FSDP2's ``fully_shard`` on a fake process group of P ranks (``torch.distributed`` backend ``fake``: no
communication, one rank's tensors), so the trace holds what one process holds. The policy as accelerate's
``fsdp2_prepare_model`` wraps it (TRANSFORMER_BASED_WRAP: one unit per decoder layer, then the root), with
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16)`` under bf16 autocast (accelerate sets it
from ``mixed_precision='bf16'``, which TRL's ``bf16=True`` gives); the reference as TRL 1.16's
``prepare_fsdp`` wraps it: ``fully_shard`` on the root only, so its forward all-gathers the whole model
at once. DDP (``sharding='ddp'``): full replicas, and accelerate's ``prepare_model`` runs the reference's
forward under bf16 autocast, which keeps a bf16 copy of every fp32 weight it casts until the forward ends.

Layers: in a training step every decoder layer saves the same activations, so once the peak sits
where it stays (:func:`_linear`: three traces at consecutive layer counts that grow alike) every
category is exactly ``a + b * layers``; tests/test_memtrace.py checks the extrapolation against a
direct trace. That keeps a 28-layer 1.5B GRPO trace to a few seconds on a 2-core CPU (a direct one
takes about a minute). A forward's peak can sit in different places at 1, 2 and 28 layers (the KV cache grows
with the layers, a layer's temporaries do not), so forwards are traced whole (under a second).

Device: fake tensors live on the CPU device here, so autocast is CPU autocast (bf16 matmuls,
float32 softmax as CUDA autocast) and attention is SDPA's flash kernel for CPU (memory linear in
the sequence, as FlashAttention on the GPU).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Iterator

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
    reference: int = 0
    """The KL reference model's weights this process holds (its shard under FSDP); not in ``parameters``."""
    gathered: int = 0
    """Weights all-gathered at the peak beyond the shards (FSDP: the units being computed; the reference whole
    in its forward); not in ``parameters``."""

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations + self.reference + self.gathered

    def as_gib(self) -> dict[str, float]:
        g = 2.0 ** 30
        return {"parameters": self.parameters / g, "gradients": self.gradients / g,
                "optimizer": self.optimizer / g, "activations": self.activations / g,
                "reference": self.reference / g, "gathered": self.gathered / g, "total": self.total / g}


def _peak(tracker: Any, reference: int = 0, policy: int | None = None) -> Trace:
    """The tracker's peak by category; ``reference``: bytes of the reference's resident weights, moved out
    of ``parameters`` into their own field; ``policy``: bytes of the policy's resident weights (its shards):
    the rest of ``parameters`` is ``gathered`` (None: nothing is)."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    snap = tracker.get_tracker_snapshot("peak")
    total = {k: 0 for k in ("parameters", "gradients", "optimizer", "activations")}
    names = {_MemRefType.PARAM: "parameters", _MemRefType.GRAD: "gradients", _MemRefType.OPT: "optimizer"}
    for per_device in snap.values():
        for ref, nbytes in per_device.items():
            if ref == "Total":
                continue
            total[names.get(ref, "activations")] += int(nbytes)
    total["parameters"] -= reference
    gathered = 0 if policy is None else total["parameters"] - policy
    total["parameters"] -= gathered
    return Trace(**total, reference=reference, gathered=gathered)


def _local_bytes(model: torch.nn.Module | None) -> int:
    """Bytes of ``model``'s weights this process holds: a DTensor's local shard, else the whole tensor."""
    if model is None:
        return 0
    return sum((p.to_local() if hasattr(p, "to_local") else p).nbytes for p in model.parameters())


@contextmanager
def fake_world(processes: int) -> Iterator[Any]:
    """A fake process group of ``processes`` ranks (this process rank 0) and its 1-D CPU device mesh, for
    tracing FSDP2 sharding: collectives are no-ops, tensors are one rank's. Refused inside a process that
    already has a process group (a training process), whose group it would replace."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("an FSDP memory trace needs its own fake process group, and this process has one")
    dist.init_process_group("fake", rank=0, world_size=processes, store=FakeStore())
    try:
        yield init_device_mesh("cpu", (processes,))
    finally:
        dist.destroy_process_group()


def _fsdp_policy(model: torch.nn.Module, mesh: Any, param_dtype: torch.dtype | None) -> torch.nn.Module:
    """``model`` sharded as accelerate's fsdp2_prepare_model shards the policy: each decoder layer, then the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=param_dtype)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    return model


def _fsdp_reference(model: torch.nn.Module, mesh: Any, param_dtype: torch.dtype | None) -> torch.nn.Module:
    """``model`` sharded as TRL 1.16's prepare_fsdp shards the reference: the root alone, one unit."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=param_dtype),
                reshard_after_forward=True)
    return model.eval()


def _model(arch: dict[str, Any], layers: int, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from esreason.io.architectures import hf_config

    return AutoModelForCausalLM.from_config(hf_config(arch, layers), dtype=dtype)


def _linear(trace_at: Any, layers: int, first: int = 1) -> Trace:
    """``trace_at(n)`` extrapolated exactly to ``layers``: from the first n >= ``first`` at which the traces at
    n, n + 1 and n + 2 layers grow by the same bytes in every category (traced directly when none is below
    ``layers``). The peak can move with the layer count (a forward's logits at few layers, the backward's
    gradients at more; under FSDP its in-flight buffers appear from the second and third unit on); past the
    move every layer adds the same, and the third trace checks it (tests/test_memtrace.py compares with direct
    traces)."""
    fields = list(Trace.__dataclass_fields__)
    seen: dict[int, Trace] = {}

    def at(k: int) -> Trace:
        if k not in seen:
            seen[k] = trace_at(k)
        return seen[k]

    n = first
    while n + 2 < layers:
        a, b, c = at(n), at(n + 1), at(n + 2)
        if all(getattr(b, f) - getattr(a, f) == getattr(c, f) - getattr(b, f) for f in fields):
            return Trace(*(getattr(a, f) + (getattr(b, f) - getattr(a, f)) * (layers - n) for f in fields))
        n += 1
    return trace_at(layers)


def trace_grpo_microstep(arch: dict[str, Any], *, micro_batch: int, prompt_len: int, completion_len: int,
                         master_dtype: str = "float32", autocast: str | None = "bfloat16", beta: float = 0.0,
                         gradient_checkpointing: bool = False, reference_dtype: str | None = None,
                         sharding: str = "ddp", processes: int = 1, layers: int | None = None,
                         extrapolate: bool = True) -> Trace:
    """Peak of one steady-state GRPO micro-step (module docstring).

    micro_batch sequences of prompt_len + completion_len tokens (the longest the config allows).
    beta != 0: the reference's weights are resident, in ``reference_dtype`` (None: ``master_dtype``, TRL's
    default). sharding 'ddp' (a replica per process) or 'fsdp' over ``processes`` ranks. layers: decoder
    layers (default: the architecture's); extrapolate: trace 1 and 2 layers and extend linearly (False:
    trace all layers directly).
    """
    n_layers = int(layers or arch["num_hidden_layers"])

    def trace_at(n: int) -> Trace:
        return _trace_grpo(arch, n, micro_batch, prompt_len, completion_len, DTYPES[master_dtype],
                           DTYPES[autocast] if autocast else None, beta, gradient_checkpointing,
                           DTYPES[reference_dtype or master_dtype], sharding, processes)

    return _linear(trace_at, n_layers, _first(sharding)) if extrapolate else trace_at(n_layers)


def _first(sharding: str) -> int:
    """The fewest layers :func:`_linear` starts from: 3 under FSDP (its in-flight buffers, the next unit's
    all-gather and the previous one's reduce-scatter, exist only from the third unit on), else 1."""
    return 3 if sharding == "fsdp" else 1


def trace_grpo_scoring(arch: dict[str, Any], *, micro_batch: int, prompt_len: int, completion_len: int,
                       master_dtype: str = "float32", autocast: str | None = "bfloat16", beta: float = 0.0,
                       reference_dtype: str | None = None, sharding: str = "ddp", processes: int = 1,
                       layers: int | None = None, extrapolate: bool = True) -> Trace:
    """Peak of the generation-time scoring forward (module docstring): micro_batch rows through the
    reference (beta != 0) or the policy (beta 0: the old log-probabilities), no grad, beside the policy's
    weights and AdamW states. Arguments as :func:`trace_grpo_microstep`."""
    n_layers = int(layers or arch["num_hidden_layers"])

    def trace_at(n: int) -> Trace:
        return _trace_scoring(arch, n, micro_batch, prompt_len, completion_len, DTYPES[master_dtype],
                              DTYPES[autocast] if autocast else None, beta, DTYPES[reference_dtype or master_dtype],
                              sharding, processes)

    return _linear(trace_at, n_layers, _first(sharding)) if extrapolate else trace_at(n_layers)


def _models(arch: dict[str, Any], layers: int, master: torch.dtype, autocast: torch.dtype | None, beta: float,
            ref_dtype: torch.dtype, mesh: Any) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any]:
    """Inside FakeTensorMode: the policy (sharded with ``mesh``) with AdamW states, and the reference (beta != 0,
    sharded as TRL shards it) or None."""
    model = _model(arch, layers, master)
    if mesh is not None:
        model = _fsdp_policy(model, mesh, autocast)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for p in model.parameters():  # steady state: AdamW states exist
        p.grad = torch.zeros_like(p)
    opt.step()
    ref = None
    if beta:
        ref = _model(arch, layers, ref_dtype).eval()
        if mesh is not None:
            ref = _fsdp_reference(ref, mesh, autocast)
    return model, opt, ref


def _sharded(sharding: str, processes: int) -> Any:
    if sharding not in ("ddp", "fsdp"):
        raise ValueError(f"sharding must be 'ddp' or 'fsdp', got {sharding!r}")
    return fake_world(processes) if sharding == "fsdp" else nullcontext(None)


def _batch(n: int, prompt_len: int, completion_len: int) -> tuple[torch.Tensor, ...]:
    prompt = torch.zeros((n, prompt_len), dtype=torch.long)  # [n, P]
    completion = torch.zeros((n, completion_len), dtype=torch.long)  # [n, C]
    return prompt, torch.ones_like(prompt), completion, torch.ones_like(completion)


def _trace_grpo(arch: dict[str, Any], layers: int, micro_batch: int, prompt_len: int, completion_len: int,
                master: torch.dtype, autocast: torch.dtype | None, beta: float, checkpointing: bool,
                ref_dtype: torch.dtype, sharding: str, processes: int) -> Trace:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from esreason.grpo.objective import completion_logprobs, grpo_loss

    with _sharded(sharding, processes) as mesh, FakeTensorMode():
        model, opt, ref = _models(arch, layers, master, autocast, beta, ref_dtype, mesh)
        model.train()
        if checkpointing:  # transformers >= 5.23 names it activation checkpointing (the old name warns)
            if hasattr(model, "activation_checkpointing_enable"):
                model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
            else:
                model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        n = micro_batch
        prompt, pmask, completion, cmask = _batch(n, prompt_len, completion_len)
        tracker = MemTracker()
        tracker.track_external(*(m for m in (model, opt, ref) if m is not None))
        ctx = torch.autocast("cpu", dtype=autocast) if autocast else torch.autocast("cpu", enabled=False)
        with tracker:
            with ctx:
                logp = completion_logprobs(model, prompt, pmask, completion, cmask)  # [n, C] float32
            ref_logp = torch.zeros_like(logp) if ref is not None else None  # computed at generation time (TRL)
            loss = grpo_loss(logp, logp.detach(), torch.zeros(n), cmask, beta=beta, ref_logp=ref_logp).loss
            loss.backward()
        return _peak(tracker, _local_bytes(ref), _local_bytes(model) if mesh is not None else None)


def _trace_scoring(arch: dict[str, Any], layers: int, micro_batch: int, prompt_len: int, completion_len: int,
                   master: torch.dtype, autocast: torch.dtype | None, beta: float, ref_dtype: torch.dtype,
                   sharding: str, processes: int) -> Trace:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from esreason.grpo.objective import completion_logprobs

    with _sharded(sharding, processes) as mesh, FakeTensorMode():
        model, opt, ref = _models(arch, layers, master, autocast, beta, ref_dtype, mesh)
        opt.zero_grad(set_to_none=True)  # after an optimizer step (transformers' Trainer): no gradients
        prompt, pmask, completion, cmask = _batch(micro_batch, prompt_len, completion_len)
        tracker = MemTracker()
        tracker.track_external(*(m for m in (model, opt, ref) if m is not None))
        scorer = ref if ref is not None else model.eval()
        ctx = torch.autocast("cpu", dtype=autocast) if autocast else torch.autocast("cpu", enabled=False)
        with tracker, torch.no_grad(), ctx:
            completion_logprobs(scorer, prompt, pmask, completion, cmask)
        return _peak(tracker, _local_bytes(ref), _local_bytes(model) if mesh is not None else None)


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
