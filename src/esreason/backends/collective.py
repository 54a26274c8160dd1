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
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch


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
            self.pg = dist.ProcessGroupNCCL(store, spec.rank, spec.world, options)
        else:
            self.pg = dist.ProcessGroupGloo(store, spec.rank, spec.world, timeout)

    def all_reduce_(self, t: torch.Tensor) -> None:
        """t <- sum of t over the group's engines, in place (int64 on the weights' device)."""
        if self.pg is None:
            return
        self.pg.allreduce([t]).wait()

    def close(self) -> None:
        """Drop the group (its connections close with the object)."""
        self.pg = None
