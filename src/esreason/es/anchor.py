"""Anchored ES (``es.anchor_decay``): after every update, pull the centre toward the start weights.

The update with anchor decay lambda = ``es.anchor_decay`` (alpha = ``es.alpha``, N members,
w_i the shaped weights, theta_0 the weights the run started from)::

    theta'      = theta_t + alpha / N * sum_i w_i eps_i          (the ES step, es/update.py)
    theta_{t+1} = theta' - c * (theta' - theta_0),   c = alpha * lambda,  0 <= c < 1
                = theta_0 + (1 - c) * (theta' - theta_0)

Every update shrinks the distance from theta_0 by the factor (1 - c) after the ES step.
lambda = 0 (the default) is the plain ES update, bit for bit: nothing here runs.

How it maps to arXiv 2605.30148 ("Overcoming Forgetting in LLM Fine-Tuning with Evolution
Strategies", Schweighofer, Hayes, Dailey, Miikkulainen, Qiu: Anchored Weight Decay, AWD).
The paper adds to the ES objective a penalty on the distance from the initial parameters,
lambda/2 * ||theta - theta_0||^2 (its L2 form); the penalty's gradient is lambda (theta - theta_0),
and one step of size alpha along it -- the same step size as the ES term -- is the pull above.
The authors' released code (github.com/kschweig/es-awd, ``weight_update_utils.py``, weight decay
type ``l2``) applies it *decoupled*, after the ES step, as ``w <- w_0 + (1 - alpha*lambda)(w - w_0)``
with lambda in units of alpha (their recommended lambda = 10 at alpha = 5e-4: c = 5e-3 per update);
``es.anchor_decay`` is that lambda and the update is that form. The paper's own equation could
not be read from the stored copy of the paper (only its abstract and the released code), so this
follows the code. The paper's L1 variant (soft-thresholding toward theta_0) is not implemented.

Arithmetic. Per piece of a tensor, in fp32 on the device that holds the weights::

    new  = old + delta          (the ES step; one exactly rounded addition)
    diff = new - theta_0        (exactly rounded)
    diff = diff * c             (exactly rounded; c rounded to fp32 once)
    new  = new - diff           (exactly rounded)

Three separate exactly rounded IEEE operations, never a fused multiply-add, so every device that
holds a copy of the centre (the trainer's host-resident reference, every engine of a Ray pool, a
vLLM worker on a GPU) computes the same bits. With fp32 masters the master receives ``new`` and
the model-dtype weight is round(new), as for the plain update.

Memory. theta_0 is one more copy of the weights, kept in the model dtype (exact: with masters the
start master is the start weights converted to fp32, so the model-dtype copy loses nothing): one
model's worth of memory (1.5B parameters in bf16: 3.1 GB) per process that updates a centre. On a
GPU it is kept in host memory (page-locked) and each piece is copied to the device when the update
reaches it, so the GPU holds one piece (16 MiB) of it at a time. How a run keeps theta_0 across a
resume and hands it to its engines is :mod:`esreason.es_loop.anchor`.
"""

from __future__ import annotations

import torch

_F32 = torch.float32


def anchor_factor(alpha: float, anchor_decay: float) -> float:
    """c = alpha * lambda, the fraction of (theta' - theta_0) removed per update (ValueError outside [0, 1))."""
    c = float(alpha) * float(anchor_decay)
    if not 0.0 <= c < 1.0:
        raise ValueError(f"anchor pull alpha * anchor_decay = {c} must be in [0, 1) (alpha {alpha}, "
                         f"anchor_decay {anchor_decay})")
    return c


@torch.no_grad()
def pull_toward(new: torch.Tensor, anchor: torch.Tensor, c: float) -> torch.Tensor:
    """new <- new - c * (new - anchor), in place: ``new`` fp32 [n], ``anchor`` [n] any float dtype on any
    device (brought to ``new``'s device in its own dtype, then widened there: exact). Returns ``new``."""
    if c == 0.0:
        return new
    a = anchor if anchor.device == new.device else anchor.to(new.device, non_blocking=False)
    diff = torch.sub(new, a.to(_F32))  # [n] fp32, exactly rounded
    diff.mul_(c)  # [n] fp32: c is rounded to fp32 once, the product exactly rounded
    return new.sub_(diff)  # exactly rounded; no fused multiply-add anywhere


def anchor_storage(device: torch.device) -> torch.device:
    """Where theta_0 lives for weights on ``device``: host memory for a GPU's weights, else beside them."""
    return torch.device("cpu") if device.type == "cuda" else device


def snapshot_anchor(params: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """theta_0 from the current weights: {name: copy in the model dtype}, in host memory (page-locked
    when CUDA is up) for weights on a GPU, beside the weights otherwise."""
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, p in params:
            where = anchor_storage(p.device)
            copy = torch.empty(p.shape, dtype=p.dtype, device=where,
                               pin_memory=where.type == "cpu" and p.device.type == "cuda")
            copy.copy_(p.detach())
            out[name] = copy
    return out
