"""The body of one ES engine actor of the Ray pool (:mod:`esreason.backends.ray_pool`).

:class:`EngineHost` builds an engine (:mod:`esreason.backends.engine`: HF on CPU, vLLM on GPUs or
vLLM's CPU build) from checkpoint files and forwards the pool's calls to it. The pool starts it as
a Ray actor (``ray.remote(EngineHost)``); it also reports where it runs (host, Ray node, Ray GPU
ids) and at which CPU priority (``os.nice(0)``: :mod:`esreason.backends.ray_niceness`), and removes
the start-state copies it wrote on a node other than the driver's when the pool closes. Ray itself
is imported only where an actor method needs it.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, Sequence

from esreason.backends.base import SamplingParams
from esreason.backends.engine import Engine, HFEngine, MemberOutput, StartState, StateDir, StateFiles
from esreason.backends.engine_env import gpu_start_lock, local_state, pin_visible_gpu, ray_gpu_assignment

log = logging.getLogger(__name__)


def build_engine(kind: str, options: Any, state: StartState) -> Engine:
    """The engine of ``kind`` ('hf' or 'vllm') built from checkpoint files."""
    if kind == "hf":
        return HFEngine(options, state)
    if kind == "vllm":
        from esreason.backends.vllm import VLLMEngine

        return VLLMEngine(options, state)
    raise ValueError(f"unknown engine kind {kind!r}")


class EngineHost:
    """The body of one Ray actor: builds an engine and forwards the pool's calls to it."""

    def __init__(self, kind: str, options: Any, state: StartState) -> None:
        self.copies: set[str] = set()  # keys of start states this engine's node holds as its own copy
        state = self._local(state)
        gpu_ids, held = ray_gpu_assignment()
        if kind == "vllm":
            pinned = pin_visible_gpu(os.environ, gpu_ids)
            if pinned is not None:
                log.info("engine: CUDA_VISIBLE_DEVICES=%s from ray.get_gpu_ids()", pinned)
        with gpu_start_lock(gpu_ids, held):  # engines sharing a GPU start one after another
            self.engine = build_engine(kind, options, state)

    def _local(self, state: StartState) -> StartState:
        """:func:`local_state`, remembering a copy written (or found) for this node."""
        local = local_state(state)
        if isinstance(state, StateDir) and isinstance(local, StateDir) and local.path != state.path:
            self.copies.add(local.key)
        return local

    def where(self) -> dict[str, Any]:
        """Where this engine runs: host, Ray node id, Ray GPU ids and CPU niceness (``os.nice(0)``)."""
        import ray

        return {"host": socket.gethostname(), "node": ray.get_runtime_context().get_node_id(),
                "gpu_ids": self.gpu_ids(), "niceness": self.niceness()}

    def drop_state_copies(self) -> list[str]:
        """Remove the start states this node holds as its own copies (the pool's close: the driver
        removes its node's, each other node's engines theirs); returns their keys."""
        from esreason.backends.engine import remove_shared_state

        dropped = sorted(self.copies)
        for key in dropped:
            remove_shared_state(key)
        self.copies.clear()
        return dropped

    def niceness(self) -> int:
        """The CPU priority this actor's process runs at (``os.nice(0)``; 0 is normal priority)."""
        return os.nice(0)

    def gpu_ids(self) -> list[str]:
        """The Ray GPU ids this actor holds (shared with the other engines of its GPU)."""
        import ray

        return [str(g) for g in ray.get_gpu_ids()]

    def run_member(self, index: int, seed: int, sigma: float, prompts: Sequence[str],
                   params: SamplingParams) -> MemberOutput:
        return self.engine.run_member(index, seed, sigma, prompts, params)

    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> float:
        return self.engine.apply_update(seeds, weights, alpha)

    def join_group(self, spec: Any) -> None:
        self.engine.join_group(spec)

    def apply_update_sharded(self, seeds: Sequence[int], weights: Sequence[float], alpha: float,
                             num_shards: int, shards: Sequence[int]) -> float:
        return self.engine.apply_update_sharded(seeds, weights, alpha, num_shards, shards)

    def checksum(self) -> str:
        return self.engine.checksum()

    def checksum_layout(self) -> Any:
        """A tensor-parallel engine's rank layouts (:mod:`esreason.backends.tp_checksum`); None: whole tensors."""
        return getattr(self.engine, "checksum_layout", lambda: None)()

    def noise_domain(self) -> str:
        return self.engine.noise_domain()

    def generate_requests(self, prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int],
                          params: SamplingParams) -> Any:
        """Held-out evaluation at the centre (:func:`esreason.backends.eval_pool.pool_generator`)."""
        from esreason.backends.vllm_eval import engine_generate_requests

        return engine_generate_requests(self.engine, prompt_ids, seeds, params)

    def export_state(self) -> StateFiles:
        return self.engine.export_state()

    def load_state(self, state: StartState) -> None:
        self.engine.load_state(self._local(state))
