"""GRPO on more than one process: who am I, how is the model sharded, and who writes.

``esreason train grpo`` runs as one process, or as P processes started by a launcher::

    accelerate launch --config_file configs/accelerate/ddp-8gpu.yaml -m esreason.cli train grpo --config FILE
    accelerate launch --config_file configs/accelerate/fsdp-7b.yaml  -m esreason.cli train grpo --config FILE

(``accelerate launch`` starts the processes through ``torch.distributed.run`` and describes the
setup in environment variables, TRL's supported path; ``torchrun`` works the same way for
plain data parallel.) The launcher decides P and the sharding; the run config does not
change with it (:mod:`esreason.grpo.plan`: B x G stays the global batch).

Writers: only the main process (rank 0) writes esreason's files (config.yaml, manifest.json,
metrics.jsonl, tensorboard/, checkpoints/step_N). transformers writes TRL's resume state under
RUN/trl: the model, optimizer, scheduler and trainer state from the main process (FSDP with
FULL_STATE_DICT: gathered there) and one ``rng_state_<rank>.pth`` per process, which a
resumed run needs to restore every process's sampling stream.

Sharded runs (FSDP, DeepSpeed) gather the full weights for an HF checkpoint: every process
takes part in :func:`full_state_dict` (a collective), the main process writes.

Several machines: the same command on every machine, each with its ``--machine_rank``, the same
``--num_machines``, ``--main_process_ip`` and ``--main_process_port``, and ``--num_processes`` the
total over all machines (accelerate's multi-node launch; docs/cluster.md). Nothing above changes:
ranks are global, the batch plan is global, rank 0 writes. What the machines must share is the run
directory (:func:`check_shared_run_directory`); each needs the model and the task data at the same
paths, and the same environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Mapping

Sharding = Literal["none", "fsdp", "deepspeed"]


def _flag(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "false").strip().lower() in ("1", "true", "yes")


@dataclass(frozen=True)
class Processes:
    """The process group this run belongs to, as the launcher describes it in the environment."""

    num_processes: int = 1
    """P: WORLD_SIZE (set by accelerate launch / torchrun; 1 without a launcher)."""
    process_index: int = 0
    """This process's rank: RANK (0 without a launcher)."""
    sharding: Sharding = "none"
    """How the launcher shards the model: ACCELERATE_USE_FSDP / ACCELERATE_USE_DEEPSPEED (none =
    a full replica per process, data parallel)."""

    @property
    def is_main(self) -> bool:
        """Rank 0: the only process that writes esreason's files."""
        return self.process_index == 0

    @property
    def distributed(self) -> bool:
        return self.num_processes > 1

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Processes":
        """Read WORLD_SIZE, RANK, ACCELERATE_USE_FSDP and ACCELERATE_USE_DEEPSPEED."""
        from esreason.errors import UserError

        env = os.environ if env is None else env
        try:
            world = int(env.get("WORLD_SIZE", "1"))
            rank = int(env.get("RANK", "0"))
        except ValueError:
            raise UserError(f"WORLD_SIZE={env.get('WORLD_SIZE')!r} / RANK={env.get('RANK')!r} "
                            "are not integers (set by the launcher)") from None
        if world < 1 or not 0 <= rank < world:
            raise UserError(f"inconsistent launcher environment: WORLD_SIZE={world}, RANK={rank}")
        sharding: Sharding = "none"
        if _flag(env, "ACCELERATE_USE_FSDP"):
            sharding = "fsdp"
        elif _flag(env, "ACCELERATE_USE_DEEPSPEED"):
            sharding = "deepspeed"
        return cls(num_processes=world, process_index=rank, sharding=sharding)


def spans_machines(env: Mapping[str, str] | None = None) -> bool:
    """True under a launch across several machines: WORLD_SIZE above LOCAL_WORLD_SIZE (both set by
    torch.distributed.run, which ``accelerate launch`` runs)."""
    env = os.environ if env is None else env
    try:
        return int(env.get("WORLD_SIZE", "1")) > int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1")))
    except ValueError:
        return False


def check_shared_run_directory(out: Path) -> None:
    """Across machines, every process must be given the same run directory and see what the main
    process writes there; else a UserError on every process naming the machines that do not (call
    it with the process group up, before any process reads the run directory).

    Why: only rank 0 writes esreason's files, while every process writes its own RNG state under
    RUN/trl and reads RUN on ``--resume`` to decide where to continue. On disks of their own, the
    other machines' processes would resume from nothing while rank 0 resumes from its checkpoint.
    How: rank 0 writes a probe file named by a random token in the nearest existing directory on the
    way to ``out`` (so nothing is created when the check fails); every process looks for it."""
    import socket
    import uuid

    import torch.distributed as dist

    from esreason.errors import UserError

    if not (dist.is_available() and dist.is_initialized() and spans_machines()):
        return
    mine = Path(out).resolve()
    where = mine
    while not where.is_dir() and where != where.parent:
        where = where.parent
    token: list[Any] = [(str(where), uuid.uuid4().hex) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(token, src=0)
    probe = Path(token[0][0]) / f".esreason-shared-{token[0][1]}"
    if dist.get_rank() == 0:
        probe.write_text("")
    dist.barrier()
    seen: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(seen, (socket.gethostname(), str(mine), probe.is_file()))
    dist.barrier()
    if dist.get_rank() == 0:
        probe.unlink(missing_ok=True)
    outputs = sorted({path for _, path, _ in seen})
    if len(outputs) > 1:
        raise UserError(f"--output: the processes of this launch were given different run directories "
                        f"({', '.join(outputs)}); give every machine the same --output, on a filesystem they share")
    blind = sorted({host for host, _, ok in seen if not ok})
    if blind:
        raise UserError(f"--output {out}: GRPO across machines needs the run directory on a filesystem every "
                        f"machine shares (NFS, Lustre, ...); the processes on {', '.join(blind)} do not see "
                        f"what rank 0 writes in {token[0][0]}. Put --output on a shared filesystem "
                        "(docs/cluster.md, \"GRPO on several machines\")")


def barrier() -> None:
    """Wait for every process (no-op without an initialised process group)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown_process_group(vllm_colocated: bool = False) -> None:
    """Destroy the default process group, if any, while the interpreter is fully alive.

    Call once per process at the end of a launched run. Without it, gloo's worker threads can
    still hold work objects when Python finalises, and the process aborts at exit ("terminate
    called without an active exception", SIGABRT) after a run that otherwise finished (CI
    has seen it with 2 CPU processes). torch documents the call as every trainer process's last
    step (pytorch/pytorch#122358); for NCCL it also avoids the leaked-communicator warning.

    Destroying the group is not enough by itself: DDP's reducer holds a reference to it, and the
    trainer that holds the DDP module sits in a reference cycle (trainer -> callbacks -> our
    checkpoint closure -> trainer), so after ``run_grpo`` returns the gloo group stays alive
    until the cyclic garbage collector runs -- possibly during interpreter finalisation, where
    gloo's destructor can abort the process. In a 2-process run one DDP module is alive after
    ``run_grpo`` returns and none after ``gc.collect()``. So the cycles are collected first, while the interpreter is alive,
    and the group's last reference goes with ``destroy_process_group``.

    vllm_colocated: the process runs a vLLM engine (TRL's colocate mode). That engine owns
    subgroups of the default group and destroys them and the default group in its own exit
    handler (``vllm.distributed.parallel_state.cleanup_dist_env_and_memory``); destroying the
    default group first makes that handler fail, so nothing is done here.
    """
    import gc

    import torch.distributed as dist

    if not vllm_colocated and dist.is_available() and dist.is_initialized():
        gc.collect()  # DDP modules in reference cycles release the group now, not at finalisation
        dist.destroy_process_group()
        gc.collect()


def full_state_dict(accelerator: Any, model: Any) -> dict[str, Any]:
    """The complete (unsharded) state dict of ``model``; every process must call it.

    An FSDP2 module (``fully_shard``): torch's ``get_model_state_dict`` with
    ``full_state_dict=True, cpu_offload=True`` (what ``accelerate.Accelerator.get_state_dict``
    does for FSDP2): the shards are all-gathered, rank 0 gets every tensor on the CPU, the
    other ranks an empty dict. Anything else goes through ``accelerator.get_state_dict``, which
    unwraps DDP, gathers a FULL_STATE_DICT for FSDP1 (rank 0 only) and consolidates DeepSpeed
    ZeRO-3's 16-bit weights. Only the main process's result is a complete checkpoint.
    """
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return accelerator.get_state_dict(model)


__all__ = ["Processes", "Sharding", "barrier", "check_shared_run_directory", "full_state_dict",
           "shutdown_process_group", "spans_machines"]
