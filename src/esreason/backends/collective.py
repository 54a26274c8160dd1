"""A process group among the engines of a pool, for the sharded update's all-reduce.

The engines of a Ray pool (:mod:`esreason.backends.ray_pool`) are separate processes --
vLLM workers or HF engine actors -- that already own torch.distributed's default group
(vLLM uses it for its own tensor parallelism). So the pool's group is *stateless*: a
``ProcessGroupGloo`` (CPU weights) or ``ProcessGroupNCCL`` (CUDA weights) constructed directly
over a ``TCPStore`` that the pool's driver hosts, under a key prefix per group generation;
nothing global is initialised and a group can be dropped and rebuilt (after an engine is
lost) without touching vLLM's.

The group carries only :func:`all_reduce_` of int64 noise-block sums (one per block of each
tensor, in the same order on every engine; :mod:`esreason.es.sharded`). A collective whose
peer died raises (gloo: the peer's socket closes; NCCL: after ``timeout_s``), which the pool
turns into a re-broadcast of the reference centre.

NCCL faults. By default torch's NCCL watchdog (``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``) *kills
the process* on a collective timeout instead of raising, and ``Work.wait()`` blocks only the
stream, so the host would hang in the next sync; the recovery above could not run. Our NCCL
group is therefore built with ``TORCH_NCCL_BLOCKING_WAIT=1`` (``wait()`` blocks the host and
raises ``DistBackendError`` after ``timeout_s``; torch then turns the watchdog's tear-down
off for this group) and ``TORCH_NCCL_ASYNC_ERROR_HANDLING=2`` (clean up communicators, never
kill), set only while this group is constructed (torch reads both per group), so vLLM's own
groups keep their settings. A dropped group is aborted (``abort()``), so its communicators
and a wedged kernel are released before the next group forms. Limits: a peer that dies
*inside* a kernel can leave the GPU stream unusable until the communicator is aborted, and
a crash of the vLLM worker process itself still surfaces as a lost engine (the pool replaces
it). Never exercised on GPUs by this project (docs/internals.md, "GPU-specific risks").
"""

from __future__ import annotations

import datetime
import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Mapping

import torch


log = logging.getLogger(__name__)

#: Set while our NCCL group is constructed (see the module docstring).
NCCL_FAULT_ENV = {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in os.environ for the block, then restore what was there."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass(frozen=True)
class GroupSpec:
    """Where and how engines meet: the driver's store (host, port), this group's key prefix,
    the engine's rank and the group size, and the collective timeout in seconds."""

    host: str
    port: int
    prefix: str
    rank: int
    world: int
    timeout_s: float = 600.0


def host_store(host: str, timeout_s: float = 600.0) -> "torch.distributed.TCPStore":
    """A TCPStore server on ``host`` at a free port (the driver keeps it for the pool's life)."""
    import torch.distributed as dist

    return dist.TCPStore(host, 0, None, True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


class EngineGroup:
    """One engine's membership of the pool's group (construct on every engine concurrently)."""

    def __init__(self, spec: GroupSpec, device: torch.device) -> None:
        import torch.distributed as dist

        self.spec, self.device = spec, torch.device(device)
        self.pg = None
        if spec.world == 1:
            return  # alone: every reduce is the identity, no store needed
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        store = dist.PrefixStore(spec.prefix, dist.TCPStore(spec.host, spec.port, None, False, timeout=timeout))
        if self.device.type == "cuda":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            with environment(NCCL_FAULT_ENV):  # raise on a timeout instead of killing the engine
                self.pg = dist.ProcessGroupNCCL(store, spec.rank, spec.world, options)
        else:
            self.pg = dist.ProcessGroupGloo(store, spec.rank, spec.world, timeout)

    def all_reduce_(self, t: torch.Tensor) -> None:
        """t <- sum of t over the group's engines, in place (int64 on the weights' device)."""
        if self.pg is None:
            return
        self.pg.allreduce([t]).wait()

    def close(self) -> None:
        """Abort and drop the group: its communicators (and a collective stuck on a dead peer) are released."""
        pg, self.pg = self.pg, None
        abort = getattr(pg, "abort", None)
        if abort is None:
            return
        try:
            abort()
        except RuntimeError as exc:  # already broken: nothing left to release
            log.info("engine group: abort: %s", exc)
