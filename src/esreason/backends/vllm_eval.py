"""Evaluation on engines: per-request seeded sampling on vLLM, spread over E engines (Ray when E > 1).

The paper evaluates 32 samples + 1 greedy response per problem (appendix "Evaluation
Configuration"); at Easy scale that is the dominant compute, so ``esreason eval --backend
vllm --engines E`` runs it on E single-GPU vLLM engines. The contract of the HF path is
kept (:mod:`esreason.eval.collect`): the harness still makes one ``generate`` call per
chunk of problems with the call seed of (protocol seed, task, call index); this module is
the :class:`~esreason.backends.base.Generator` behind it.

One call of :class:`EngineGenerator`:

1. prompts are tokenised on the driver without special tokens (the chat template already
   put BOS), exactly as the HF sampler does;
2. every row gets its own sampling seed, ``request_seeds(call seed, rows)``
   (:func:`esreason.backends.vllm.request_seeds`, also used by the ES vLLM engine), computed
   on the driver before the rows are split, so a row's response does not depend on E;
3. rows are split into E contiguous blocks (problem-major rows: each engine gets whole
   problems except at block edges), sent to the engines (Ray actors when E > 1, each
   with one GPU) and merged back in prompt order;
4. texts are decoded on the driver with :func:`esreason.embedded.safe_decode`, like the
   sampler's; token ids exclude the stop token; the entropy sums (``compute_entropy``) come
   from a teacher-forced pass (:class:`esreason.backends.scoring.EntropyScorer`) over the
   sampled responses: on the engine's device by its own transformers copy (``esreason
   eval``), or on the driver by the trainer's policy (held-out evaluation during ES).

A row whose prompt fills the context gets an empty response (the sampler's rule); the
response budget is ``min(max_new_tokens, max_model_len - prompt length)``.

Engines: :class:`VLLMEvalEngine` (vLLM + transformers scorer) and :class:`HFEvalEngine`
(our sampler, one row at a time with its own seed: the CPU twin used to test the fan-out,
sharding and merging without vLLM). ES pool engines (``backend.type: ray`` / ``vllm``)
serve the same calls through :func:`engine_generate_requests`. vLLM and Ray are imported
lazily, here and in :mod:`esreason.backends.ray_pool` only.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

from esreason.backends.base import Generation, SamplingParams
from esreason.backends.request_rows import RequestOutput, sampler_generate_requests
from esreason.backends.request_rows import strip_stop as _strip_stop
from esreason.backends.vllm import import_vllm, request_seeds
from esreason.errors import UserError

log = logging.getLogger(__name__)

class RequestEngine(Protocol):
    """The small interface an evaluation engine implements (in-process or inside a Ray actor)."""

    def generate_requests(self, prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int],
                          params: SamplingParams) -> RequestOutput:
        """One response per row, row i sampled with ``seeds[i]``."""

    def identity(self) -> str:
        """``sha256:`` of the weights (:func:`esreason.io.hash_state_dict`), as the HF path records it."""


@dataclass(frozen=True)
class EvalEngineOptions:
    """How an evaluation engine starts (one per GPU)."""

    model: str
    """Local model directory (resolved by the caller)."""
    kind: str = "vllm"
    """'vllm' (:class:`VLLMEvalEngine`) or 'hf' (:class:`HFEvalEngine`, CPU twin)."""
    dtype: str = "float32"
    """Weights dtype of the engine and of its transformers scorer."""
    device: str | None = None
    """Device of the transformers scorer / HF engine (None: cuda when available)."""
    max_model_len: int | None = None
    """vLLM context (None: the model's ``max_position_embeddings``)."""
    gpu_memory_utilization: float = 0.6
    """vLLM's share of the GPU; the rest holds the scorer's copy of the weights."""
    enforce_eager: bool = False
    """vLLM without CUDA graphs / compilation (:func:`~esreason.backends.eval_pool.build_eval_generator`
    sets it on machines without CUDA, where graphs do not apply)."""
    batch_size: int = 256
    """HF engine: sampler rows per forward (rows are sampled one seed at a time)."""
    tensor_parallel_size: int = 1
    """vLLM engine: GPUs it spans (tensor parallelism). The transformers scorer's copy is then spread
    over the same GPUs layer by layer (``device_map="auto"``) instead of held whole on one."""


def eos_ids(model_dir: str, tokenizer: Any) -> set[int]:
    """The tokenizer's EOS plus ``generation_config.eos_token_id`` (int or list), as the sampler uses."""
    from transformers import GenerationConfig

    ids = {int(tokenizer.eos_token_id)} if getattr(tokenizer, "eos_token_id", None) is not None else set()
    try:
        extra = GenerationConfig.from_pretrained(model_dir).eos_token_id
    except OSError:
        extra = None
    if isinstance(extra, int):
        ids.add(extra)
    elif isinstance(extra, (list, tuple)):
        ids.update(int(i) for i in extra)
    return ids


_CALLS = itertools.count()


def vllm_generate(llm: Any, prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int], params: SamplingParams,
                  eos: set[int], counters: Any = None) -> list[list[int]]:
    """Per-request seeded sampling on a ``vllm.LLM``; token ids per row (stop token dropped).

    The rows are added to the ``LLMEngine`` and stepped until all are finished, as ``LLM.generate``
    does; ``counters`` (an :class:`esreason.backends.eval_stream.StreamCounters`) gets the call's
    ``row_s``: the integral over its steps of the rows in flight (occupancy)."""
    from esreason.backends.eval_stream import step_rows

    vllm = import_vllm()
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    max_len = int(engine.model_config.max_model_len)
    out: list[list[int]] = [[] for _ in prompt_ids]
    call = next(_CALLS)
    owner: dict[str, int] = {}
    for i, (ids, seed) in enumerate(zip(prompt_ids, seeds)):
        budget = min(params.max_new_tokens, max_len - len(ids))
        if budget <= 0:
            continue  # the prompt fills the context: empty response (the sampler's rule)
        rid = f"esr-call-{call}-{i}"
        owner[rid] = i
        engine.add_request(rid, {"prompt_token_ids": [int(t) for t in ids]},
                           vllm.SamplingParams(temperature=float(params.temperature), top_p=float(params.top_p),
                                               max_tokens=int(budget), seed=int(seed), detokenize=False,
                                               output_kind=RequestOutputKind.FINAL_ONLY))
    for rid, choice in step_rows(engine, owner, counters):
        out[owner[rid]] = _strip_stop(choice.token_ids, choice.finish_reason, eos)
    return out


class VLLMEvalEngine:
    """A plain ``vllm.LLM`` over a model directory plus a transformers scorer for entropies."""

    def __init__(self, options: EvalEngineOptions) -> None:
        from esreason.backends.hf import load_model
        from esreason.backends.scoring import EntropyScorer

        vllm = import_vllm()
        kwargs: dict[str, Any] = dict(model=options.model, tokenizer=options.model, dtype=options.dtype, seed=0,
                                      enforce_eager=options.enforce_eager,
                                      gpu_memory_utilization=options.gpu_memory_utilization)
        if options.max_model_len is not None:
            kwargs["max_model_len"] = options.max_model_len
        device = options.device or _device()
        if options.tensor_parallel_size > 1:
            from esreason.backends.vllm import cpu_thread_binding

            kwargs.update(tensor_parallel_size=options.tensor_parallel_size, distributed_executor_backend="mp")
            if device == "cpu":
                cpu_thread_binding(options.tensor_parallel_size)
            if device.startswith("cuda"):
                device = "auto"  # the scorer's layers spread over the engine's GPUs (load_model's device_map)
        self.llm = vllm.LLM(**kwargs)
        model, tokenizer = load_model(options.model, dtype=options.dtype, device=device)
        self.model = model
        self.scorer = EntropyScorer(model)
        self.eos = eos_ids(options.model, tokenizer)
        self.generating_s = 0.0  # seconds inside vLLM's generate (call path; eval_stream counts its own)
        from esreason.backends.eval_stream import StreamCounters

        self.call_counters = StreamCounters()  # the call path's occupancy (row_s)

    def generate_requests(self, prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int],
                          params: SamplingParams) -> RequestOutput:
        t0 = time.perf_counter()
        ids = vllm_generate(self.llm, prompt_ids, seeds, params, self.eos, self.call_counters)
        self.generating_s += time.perf_counter() - t0
        ent = self.scorer.entropy_sums(prompt_ids, ids, params.temperature) if params.compute_entropy else None
        return RequestOutput(ids, ent)

    def stream_groups(self, groups: Sequence[Any], params: SamplingParams, stop: Any, counters: Any) -> Any:
        """Every row of ``groups`` at once, entropies scored beside generation
        (:func:`esreason.backends.eval_stream.vllm_stream`)."""
        from esreason.backends.eval_stream import vllm_stream

        return vllm_stream(self.llm, groups, params, self.eos, self.scorer, stop, counters)

    def identity(self) -> str:
        return _identity(self.model)


class HFEvalEngine:
    """Our transformers sampler with one seed per row (CPU twin of :class:`VLLMEvalEngine`)."""

    def __init__(self, options: EvalEngineOptions) -> None:
        from esreason.backends.hf import load_model
        from esreason.backends.sampling import Sampler

        model, tokenizer = load_model(options.model, dtype=options.dtype, device=options.device or _device())
        self.model = model
        self.sampler = Sampler(model, tokenizer, batch_size=options.batch_size)
        self.generating_s = 0.0

    def generate_requests(self, prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int],
                          params: SamplingParams) -> RequestOutput:
        t0 = time.perf_counter()
        out = sampler_generate_requests(self.sampler, prompt_ids, seeds, params)
        self.generating_s += time.perf_counter() - t0
        return out

    def stream_groups(self, groups: Sequence[Any], params: SamplingParams, stop: Any, counters: Any) -> Any:
        """Group after group, each row alone with its seed (:func:`esreason.backends.eval_stream.sampler_stream`)."""
        from esreason.backends.eval_stream import sampler_stream

        return sampler_stream(self.sampler, groups, params, stop, counters)

    def identity(self) -> str:
        return _identity(self.model)


def engine_generate_requests(engine: Any, prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int],
                             params: SamplingParams) -> RequestOutput:
    """The same call on an ES pool engine at its centre (:class:`~esreason.backends.vllm.VLLMEngine`
    or :class:`~esreason.backends.engine.HFEngine`); no entropies (the driver scores them)."""
    plain = SamplingParams(max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                           top_p=params.top_p, seed=params.seed, compute_entropy=False)
    llm = getattr(engine, "llm", None)
    if llm is not None:
        if not hasattr(engine, "_eval_eos"):
            engine._eval_eos = eos_ids(str(engine._model_dir), engine.tokenizer)
        return RequestOutput(vllm_generate(llm, prompt_ids, seeds, plain, engine._eval_eos), None)
    return sampler_generate_requests(engine.sampler, prompt_ids, seeds, plain)


def build_engine(options: EvalEngineOptions) -> RequestEngine:
    """The evaluation engine of ``options.kind``."""
    if options.kind == "vllm":
        return VLLMEvalEngine(options)
    if options.kind == "hf":
        return HFEvalEngine(options)
    raise UserError(f"evaluation engine kind must be 'vllm' or 'hf', got {options.kind!r}")


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _identity(model: Any) -> str:
    from esreason.io.hashing import hash_state_dict

    return "sha256:" + hash_state_dict(model.state_dict())


def split_rows(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous [start, end) blocks covering range(n), sizes differing by at most one
    (empty blocks dropped)."""
    base, extra = divmod(n, parts)
    blocks, start = [], 0
    for k in range(parts):
        end = start + base + (1 if k < extra else 0)
        if end > start:
            blocks.append((start, end))
        start = end
    return blocks


#: Sends one block of rows to engine k and returns a handle; ``collect`` turns handles into outputs.
Submit = Callable[[int, list[list[int]], list[int], SamplingParams], Any]


class EngineGenerator:
    """A :class:`~esreason.backends.base.Generator` over E engines (see the module docstring).

    tokenizer: the model's tokenizer (prompts are tokenised and responses decoded here).
    engines: how many engines ``submit`` can address. submit/collect: dispatch one block
        and gather all blocks (in-process: call directly; Ray: ``.remote`` and ``ray.get``).
    scorer: an :class:`~esreason.backends.scoring.EntropyScorer` on the driver, or None when the
        engines compute entropies themselves.
    identity: the weights' identity recorded in the evaluation manifest.
    """

    def __init__(self, tokenizer: Any, engines: int, submit: Submit, collect: Callable[[list[Any]], list[Any]],
                 *, scorer: Any = None, identity: str | None = None, close: Callable[[], None] | None = None,
                 streams: Any = None) -> None:
        self.tokenizer = tokenizer
        self.engines = engines
        self._submit, self._collect, self._close = submit, collect, close
        self.scorer = scorer
        self.identity = identity
        self.records: list[dict[str, Any]] = []  # one per engine started (eval_pool.engine_record)
        self._streams = streams  # eval_stream.LocalStreams / RayStreams, or None (calls only)
        self.stream_counters: list[dict[str, Any]] = []  # per engine, of the last stream

    @property
    def can_stream(self) -> bool:
        """Whether :meth:`stream` is available (evaluation engines; not an ES pool's engines)."""
        return self._streams is not None

    def stream(self, jobs: Sequence[Any], params: SamplingParams, poll_s: float = 5.0) -> Any:
        """Every job (:class:`esreason.backends.eval_stream.StreamJob`: one problem) at once, dealt
        into one share per engine (round-robin); yields a :class:`~esreason.backends.eval_stream.StreamResult`
        per problem as its engine finishes it (module doc of :mod:`esreason.backends.eval_stream`).
        Closing the iterator early stops every engine's stream."""
        from esreason.backends.eval_stream import RequestGroup, StreamResult, split_groups
        from esreason.backends.sampling import check_params
        from esreason.embedded import safe_decode

        if self._streams is None:
            raise RuntimeError("these engines evaluate by calls only (no stream)")
        check_params(params)
        ids = [list(r) for r in self.tokenizer([j.prompt for j in jobs], add_special_tokens=False)["input_ids"]] \
            if jobs else []
        groups = [RequestGroup(i, ids[i], [int(s) for s in job.seeds], job.greedy_seed) for i, job in enumerate(jobs)]
        shares = split_groups(groups, self.engines)
        self.stream_counters = []
        for k, share in enumerate(shares):
            self._streams.start(k, share, params)
        remaining = len(shares)

        def text(tokens: list[int]) -> str:
            return safe_decode(self.tokenizer, tokens, skip_special_tokens=True)

        try:
            while remaining:
                for k, outs, counters in self._streams.poll(poll_s):
                    for o in outs:
                        if len(o.token_ids) != len(jobs[o.key].seeds):
                            raise RuntimeError(f"an evaluation engine returned {len(o.token_ids)} responses for "
                                               f"{len(jobs[o.key].seeds)} rows")
                        yield StreamResult(jobs[o.key], [text(t) for t in o.token_ids], o.token_ids, o.entropy_sum,
                                           None if o.greedy_ids is None else text(o.greedy_ids), o.greedy_ids, k)
                    if counters is not None:
                        remaining -= 1
                        self.stream_counters.append({"engine": k, **counters})
        finally:
            if remaining:
                self._streams.stop()

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> Generation:
        from esreason.backends.sampling import check_params
        from esreason.embedded import safe_decode

        check_params(params)
        ids = [list(r) for r in self.tokenizer(list(prompts), add_special_tokens=False)["input_ids"]] \
            if len(prompts) else []
        seeds = request_seeds(params.seed, len(ids))
        blocks = split_rows(len(ids), max(1, self.engines))
        engine_params = params if self.scorer is None else SamplingParams(
            max_new_tokens=params.max_new_tokens, temperature=params.temperature, top_p=params.top_p,
            seed=params.seed, compute_entropy=False)
        handles = [self._submit(k, ids[a:b], seeds[a:b], engine_params) for k, (a, b) in enumerate(blocks)]
        token_ids: list[list[int]] = []
        entropy: list[float] | None = [] if params.compute_entropy else None
        for (a, b), out in zip(blocks, self._collect(handles)):
            if len(out.token_ids) != b - a:
                raise RuntimeError(f"an evaluation engine returned {len(out.token_ids)} responses for {b - a} rows")
            token_ids.extend(out.token_ids)
            if entropy is not None and self.scorer is None:
                entropy.extend(out.entropy_sum)
        if entropy is not None and self.scorer is not None:
            entropy = self.scorer.entropy_sums(ids, token_ids, params.temperature)
        texts = [safe_decode(self.tokenizer, t, skip_special_tokens=True) for t in token_ids]
        return Generation(texts=texts, token_ids=token_ids, entropy_sum=entropy)

    def close(self) -> None:
        if self._close is not None:
            self._close()
            self._close = None


def local_generator(engine: RequestEngine, tokenizer: Any, scorer: Any = None,
                    identity: str | None = None) -> EngineGenerator:
    """One in-process engine (streams too when the engine has ``stream_groups``)."""
    from esreason.backends.eval_stream import LocalStreams

    streams = LocalStreams([engine]) if hasattr(engine, "stream_groups") and scorer is None else None
    return EngineGenerator(tokenizer, 1, lambda k, ids, seeds, p: engine.generate_requests(ids, seeds, p),
                           lambda outs: outs, scorer=scorer,
                           identity=identity if identity is not None else engine.identity(), streams=streams)
