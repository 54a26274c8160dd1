"""``esreason experiment plan EXPERIMENT.yaml --gpus N [--json]``: the cost before spending it.

For every stage ``esreason experiment run`` would execute — training of each
method (a composition's two stages separately) and the evaluation of each method — the plan states
what runs where (engines, processes), how many responses are generated and how many tokens, the
projected wall time and GPU-hours on N GPUs of a stated type, and the memory per GPU. Every
throughput and constant comes from one table with its source (:mod:`esreason.experiments.plan_table`).

Model of a stage (the runner runs stages one after another, so wall times add up). Each stage's
wall time is the sum of named terms (``stages[].terms_s``), modelled on what the code does:

- **start**: engines (vLLM) and the trainer process start once per stage (K per GPU one after another).
- **engines per GPU** (``backend.engines_per_gpu`` / ``eval.engines_per_gpu`` = K; ``auto``:
  memplan_engines): K ES engines each keep their host floor while the GPU serves their reads one
  after another (plan_terms.step_s), and share its HBM for the update; an evaluation engine's step is
  K / speedup times as long (``plan_table.shared_gpu_speedup``), its decode at the many-row rate.
- **decode** and **tail** (:mod:`esreason.experiments.plan_terms`): a synchronous call
  (an ES member's B prompts; a GRPO process's share of a rollout batch) runs until its longest row
  ends, each step reading the weights and the running rows' KV cache (at least the host floor;
  seeded rows add a sampler iteration each); decode is the call at the mean length, tail the rest; an
  ES update's last round of member calls waits for the slowest engine (plan_terms.es_calls_s).
  GRPO's processes wait for each other (rewards are gathered), so a rollout lasts the longest of
  all B x G responses. Lengths: a runaway share at the cap (experiment key ``plan.runaway_share``)
  and lognormal otherwise (:class:`esreason.experiments.lengths.LengthModel`), or with ``--lengths
  DIR`` the lengths a run recorded. A vLLM evaluation streams (eval.streamed: each engine its whole
  share at once, rows refilled as they finish): its decode is at the many-row ``vllm`` rate plus
  the seeded sampler iterations, and it waits once per engine for its last wave of ``STREAM_WAVE`` rows.
- **entropy**: the evaluation's teacher-forced entropy pass forwards each problem's prompt once and
  every sampled response against it (backends.scoring, shared prompts; 2 P FLOPs per token at the
  training MFU); prompt lengths per task in the table.
- **update** (ES, paper Alg. 1): perturb/restore every member and apply the update, in HBM bytes
  per parameter of benchmarks/noise.py's cost model (replicated sums all N directions, sharded
  N/E plus an int64 all-reduce), at the costs measured on one H100 (plan_terms.es_noise_s).
  **train** (GRPO): the padded tokens of the slowest process times the forwards TRL runs at the
  measured cost per padded token (plan_terms.grpo_train_s). **reload** (GRPO on vLLM): the weight
  push before every rollout, plus sleep and wake with ``grpo.vllm_sleep``.
- **heldout**: periodic evaluation during training (``eval.every``, update 0 included).
- **limit** (ES stages, not a term): the update against plain batched inference of the same
  sequences, and the low-rank members-in-one-batch mode (:mod:`esreason.experiments.plan_limit`).
- **checksum** (ES on engines): every ``backend.check_every`` updates each engine hashes its
  weights and fp32 masters (all engines at once). **checkpoint**: every ``checkpoint.every``
  updates and at the end, written and read back for the sha256 manifest. **mbpp**: sandboxed
  execution of every MBPP response.

ES runs on a Ray pool of E vLLM engines (``backend: vllm``: one engine; ``hf``/``batched``: the in-process
sampler on one GPU). GRPO runs on P = N processes (one per GPU; vLLM colocate: one engine each). Evaluation
runs on ``eval.engines`` vLLM engines or the HF sampler (one GPU). A stage on fewer GPUs than the node's N is
still charged N GPU-hours (``gpus_held``). With ``seeds``, every trained method is planned once per seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from esreason.errors import UserError
from esreason.experiments import memplan, memplan_engines, memplan_host, plan_compute, plan_limit, plan_terms, plan_tp
from esreason.experiments import plan_table as tab
from esreason.experiments.plan_hf import hf_only
from esreason.experiments.plan_render import render
from esreason.experiments.spec import ExperimentSpec, run_stage_configs

GIB = 2.0 ** 30
BYTES_PER_PARAM = {"perturb": 10, "restore": 6, "draw": 4, "accumulate": 12, "apply": 48, "zeros": 4,
                   "quantize": 12, "dequantize": 20, "allreduce_element": 8}


@dataclass
class Stage:
    """One row of the plan."""

    name: str
    runs_on: str
    responses: int
    tokens: int
    gpus: int
    wall_hours: float
    memory_gib_per_gpu: dict[str, float] = field(default_factory=dict)
    roles: Any = None
    """GPU memory in GiB -> this stage's :class:`esreason.experiments.memplan.Role` list."""
    memory: dict[str, Any] = field(default_factory=dict)
    """Per-GPU memory terms of each role at the plan's GPU type, and a verdict per GPU type."""
    host: Any = None
    """GPU memory in GiB -> host RAM, pinned memory and disk of one node (memplan.*_host)."""
    terms: dict[str, float] = field(default_factory=dict)
    """Named parts of the wall time in seconds: start, decode, tail, entropy, update,
    train, reload, heldout, checksum, checkpoint, mbpp; ``wall_hours`` is their sum."""
    gpus_held: int = 0
    """GPUs the stage holds (the node's, when it uses fewer); GPU-hours are charged on these."""
    compute: dict[str, Any] | None = None  # a training stage's compute as spent (plan_compute.stage_compute)
    limit: dict[str, Any] | None = None
    """ES stages: the update against plain batched inference (:mod:`esreason.experiments.plan_limit`)."""

    @property
    def gpu_hours(self) -> float:
        return self.wall_hours * max(self.gpus, self.gpus_held)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "runs_on": self.runs_on, "responses": self.responses, "tokens": self.tokens,
                "gpu_hours": round(self.gpu_hours, 2), "gpus": self.gpus,
                "gpus_held": max(self.gpus, self.gpus_held), "wall_hours": round(self.wall_hours, 3),
                "terms_s": {k: round(v, 1) for k, v in self.terms.items()},
                "memory_gib_per_gpu": {k: round(v, 1) for k, v in self.memory_gib_per_gpu.items()},
                "memory": self.memory, **({"compute": self.compute} if self.compute is not None else {}),
                **({"limit": self.limit} if self.limit is not None else {})}


class _Ctx:
    """The inputs every stage reads, and the assumptions it used (recorded once each)."""

    def __init__(self, spec: ExperimentSpec, gpus: int, gpu: str, lengths: Any = None, nodes: int = 1) -> None:
        from esreason.accounting.flops import count_parameters

        self.lengths = lengths  # esreason.experiments.lengths.RecordedLengths or None (the table's lognormal)
        self.stage_kind = "es"  # the kind of stage being planned (es, grpo, eval): which recorded lengths it uses

        if gpus < 1:
            raise UserError(f"--gpus: expected an integer >= 1 (got {gpus})")
        if nodes < 1:
            raise UserError(f"--nodes: expected an integer >= 1 (got {nodes})")
        self.nodes = nodes  # GRPO stages train on nodes x gpus processes
        self.spec, self.gpus, self.gpu_type = spec, gpus, gpu
        self.gpu = tab.gpu_spec(gpu)
        self.params = count_parameters(spec.model)
        self.size = tab.size_class(self.params)
        self.used: dict[str, tab.Assumption] = {}
        self.notes: list[str] = []
        self.note(tab.Assumption(f"gpu.{gpu}", self.gpu["memory_gib"], "GiB per GPU", self.gpu["source"]))
        kv, how = plan_terms.kv_bytes_per_token(spec.model, self.params)
        self.kv_bytes = self.note(tab.Assumption("kv_bytes_per_token", kv, "bytes of bf16 KV cache per token",
                                                 f"derived: {how}"))

    def note(self, a: tab.Assumption) -> float:
        self.used.setdefault(a.key, a)
        return a.value

    def rate(self, workload: str) -> float:
        return self.note(tab.throughput(self.gpu_type, self.size, workload))

    def const(self, name: str) -> float:
        return self.note(tab.CONSTANTS[name])

    def lengths_model(self) -> Any:
        """The response-length distribution: the recorded lengths for this kind of stage, or the table's LengthModel."""
        if self.lengths is not None:
            which, measured = self.lengths.for_stage(self.stage_kind)
            self.note(tab.Assumption(f"response_tokens.measured.{which}", round(measured.mean(float("inf")), 1),
                                     "tokens per response (mean, before each stage's cap)", measured.source))
            return measured
        from esreason.experiments.lengths import LengthModel

        share = self.spec.plan.runaway_share  # experiment key plan.runaway_share (None: the family's)
        return LengthModel(self.note(tab.response_tokens(self.spec.model)), self.note(tab.response_cv(self.spec.model)),
                           self.note(tab.runaway_share(self.spec.model, share)))

    def length(self, max_new_tokens: int) -> float:
        """Mean response tokens under the cap."""
        return self.lengths_model().mean(float(max_new_tokens))

    def over(self, name: str) -> float:
        return self.note(tab.OVERHEADS[name])

    def longest(self, n: int, max_new_tokens: int) -> float:
        """Expected longest of n responses, capped at max_new_tokens (an order statistic of
        :meth:`lengths_model`)."""
        return self.lengths_model().longest(n, float(max_new_tokens))

    def checkpoint_s(self, nbytes: float) -> float:
        """Write a checkpoint and read it back for its sha256 manifest (io.verify)."""
        return nbytes / self.over("disk_bytes_per_s") + nbytes / self.over("hash_bytes_per_s")

    def slowdown(self, engines_per_gpu: int) -> float:
        """How much longer each engine's decode step takes when K engines share its GPU: K / the
        shared-GPU speedup (plan_table.shared_gpu_speedup; 1 for K = 1)."""
        if engines_per_gpu <= 1:
            return 1.0
        return engines_per_gpu / self.note(tab.shared_gpu_speedup(self.gpu_type, self.size, engines_per_gpu))

    def hbm_seconds(self, bytes_per_param: float) -> float:
        return self.params * bytes_per_param / (self.gpu["hbm_bytes_per_s"] * self.const("elementwise_efficiency"))


def _problems(ctx: _Ctx, tasks: tuple[str, ...] | list[str], limit: int | None) -> int:
    total = 0
    for task in tasks:
        n, source = tab.test_size(task)
        ctx.note(tab.Assumption(f"test_size.{task}", n, "problems", source))
        total += min(n, limit) if limit else n
    return total


def _heldout(ctx: _Ctx, cfg: Any, updates: int) -> tuple[int, float]:
    """(responses, tokens) of the periodic held-out evaluation during training (eval.every; at update 0 too)."""
    if not cfg.eval.every:
        return 0, 0.0
    problems = _problems(ctx, cfg.eval.tasks or (cfg.task,), cfg.eval.limit)
    responses = (updates // cfg.eval.every + 1) * problems * cfg.eval.samples
    return responses, responses * ctx.length(cfg.eval.max_new_tokens or cfg.generation.max_new_tokens)


def _checkpoints(cfg: Any, updates: int) -> int:
    """Checkpoints a training stage writes: every ``checkpoint.every`` updates and the final one."""
    every = cfg.checkpoint.every
    return (updates // every if every else 0) + (0 if every and updates % every == 0 else 1)


def _es_stage(ctx: _Ctx, cfg: Any, name: str, updates: int) -> Stage:
    label, gib = memplan.GPU_MEMORY_GIB.get(gpu_type_key(ctx.gpu_type), (ctx.gpu["name"], ctx.gpu["memory_gib"]))
    configured, (cfg, note) = cfg, memplan_engines.plan_choice(cfg, label, gib)  # ``auto``: per GPU type
    ctx.notes += [note] if note else []
    be, n, b = cfg.backend, cfg.es.population_size, cfg.train.batch_size
    responses = updates * n * b
    heldout, heldout_tokens = _heldout(ctx, cfg, updates)
    tokens = responses * ctx.length(cfg.generation.max_new_tokens) + heldout_tokens
    mem_w = 2 if cfg.dtype in ("bfloat16", "float16") else 4
    masters = 4 * ctx.params / GIB if mem_w == 2 and cfg.es.master_weights != "none" else 0.0
    # The trainer's HF policy: weights, fp32 masters (or an exact-restore centre copy), direction cache.
    centre = mem_w * ctx.params / GIB if cfg.es.restore == "exact" and not masters else 0.0
    trainer = mem_w * ctx.params / GIB + masters + centre + cfg.es.direction_cache_mb / 1024
    if be.type in ("ray", "vllm"):
        engines = be.engines if be.type == "ray" else 1
        per_gpu = getattr(be, "engines_per_gpu", 1)  # K engines share a GPU
        tp = plan_tp.tp_of(be)  # GPUs per engine; each rank holds / draws a share (plan_tp.layout)
        lay = plan_tp.layout(cfg.model, tp) if tp > 1 else {"held": ctx.params, "drawn": ctx.params}
        held, drawn = lay["held"] / ctx.params, lay["drawn"] / ctx.params
        if engines * tp > ctx.gpus * per_gpu:
            room = ctx.gpus * per_gpu // tp
            each = f" x {tp} GPUs each" if tp > 1 else ""
            auto = note is not None  # backend.engines counts GPUs
            ctx.notes.append(f"{name}: backend.engines={configured.backend.engines}{each} but only {ctx.gpus} GPUs "
                             + (f"(engines_per_gpu: auto, {per_gpu} per GPU)" if auto else f"x {per_gpu} engines per "
                                "GPU") + f": the pool would refuse to start; planned with {room} engines (set "
                             f"backend.engines={ctx.gpus if auto else room})")
            engines = room
        gpus_used = -(-engines // per_gpu) * tp
        members = -(-n // engines)
        if be.update == "sharded" and engines > 1:  # N/E members summed, quantized, all-reduced (int64)
            wire = 2 * (engines - 1) / engines * BYTES_PER_PARAM["allreduce_element"] * ctx.params * held
            fixed = ctx.hbm_seconds(sum(BYTES_PER_PARAM[k] for k in ("zeros", "quantize", "dequantize"))) * held
            noise = per_gpu * (plan_terms.es_noise_s(ctx, members, members) * drawn + fixed) + \
                wire / ctx.gpu["nvlink_bytes_per_s"]
        else:  # the K engines of a GPU share its HBM; a TP rank draws its shards' blocks
            noise = per_gpu * plan_terms.es_noise_s(ctx, members, n) * drawn
        max_new = cfg.generation.max_new_tokens
        # members' calls of B rows, per-row seeds when sampling (backends/vllm.py generate), K engines per
        # GPU decoding side by side (plan_terms.step_s); the last round waits for the slowest engine
        decode, tail = plan_terms.es_calls_s(ctx, members, b, engines, ctx.note(tab.prompt_tokens(cfg.task)), max_new,
                                             cfg.generation.temperature > 0, tp, per_gpu)
        checks = updates // be.check_every if be.check_every else 0
        master_bytes = 4 if masters else 0
        # engines sharing a GPU start one after another (engine_env.gpu_start_lock)
        terms = {"start": per_gpu * ctx.over("engine_start_s") + ctx.over("trainer_start_s"),
                 "decode": updates * decode,
                 "tail": updates * tail,
                 "heldout": heldout_tokens / (ctx.rate("vllm") * gpus_used),
                 "update": updates * noise,
                 "checksum": checks * (mem_w + master_bytes) * ctx.params * held /
                 plan_terms.checksum_rate(ctx, engines * tp),
                 "checkpoint": _checkpoints(cfg, updates) * ctx.checkpoint_s(mem_w * ctx.params)}
        # 2 all-reduces per layer per decode step of each member's call (plan_tp)
        allreduce = members * ctx.longest(b, max_new) * plan_tp.allreduce_s(ctx, cfg.model, b, tp) if tp > 1 else 0.0
        terms.update({"allreduce": updates * allreduce} if tp > 1 else {})
        limit = plan_limit.es_limit(ctx, cfg, gpus_used // tp, tp, decode + tail + noise + allreduce, per_gpu)
        wall = sum(terms.values())
        frac = ctx.const("engine_memory_fraction")
        # The engine keeps its centre copy (fp32 masters) on the GPU when it fits outside vLLM's
        # reservation with a 1 GiB + 20% margin, else in pinned host memory (docs/internals.md, "Centre copy").
        on_gpu = memplan.masters_fit_on_gpu(per_gpu * masters * held, frac, ctx.gpu["memory_gib"])
        engine_gib = frac * ctx.gpu["memory_gib"] + (per_gpu * masters * held if on_gpu else 0.0)  # per GPU
        if masters and not on_gpu:
            ctx.notes.append(f"{name}: each engine keeps its {masters:.0f} GiB fp32 masters in pinned host memory "
                             "(they do not fit beside vLLM's reservation)")
        kind = f"{engines} vLLM engine{'s' if engines > 1 else ''}"
        share = ("1 GPU each" if tp == 1 else f"{tp} GPUs each, tensor parallel") if per_gpu == 1 else \
            f"{per_gpu} per GPU on {gpus_used} GPUs"
        where = (f"{kind} (Ray pool, {share}; {be.update} update)" if be.type == "ray"
                 else f"{kind} in-process (1 GPU)")
        # The trainer's reference is in host memory beside GPU engines (es_loop.run.reference_placement):
        # GPU 0 holds its engine plus the trainer's CUDA context and noise blocks only.
        memory = {"engine": engine_gib, "gpu0_with_trainer": engine_gib + ctx.const("trainer_gpu_gib"),
                  "trainer_host": trainer}
        trainer_gpu = ctx.const("trainer_gpu_gib")
        return Stage(name, where, responses + heldout, round(tokens), gpus_used, wall / 3600, memory,
                     roles=lambda gib: memplan.es_roles(memplan_engines.resolve(configured, gib), engines, gib, frac,
                                                        trainer_gpu) if _on_gpu(cfg) else [],
                     host=lambda gib: memplan_host.es_host(configured, engines, gib, frac, updates), terms=terms,
                     gpus_held=ctx.gpus, limit=limit)
    # The HF sampler's rate is a throughput figure without a step model: no separate tail term.
    terms = {"start": ctx.over("trainer_start_s"), "decode": tokens / ctx.rate("hf"),
             "update": updates * plan_terms.es_noise_s(ctx, n, n),
             "checkpoint": _checkpoints(cfg, updates) * ctx.checkpoint_s(mem_w * ctx.params)}
    wall = sum(terms.values())
    where = f"HF transformers sampler, in-process ({be.type}), 1 GPU, members one {'batch' if be.type == 'batched' else 'at a time'}"
    limit = plan_limit.hf_limit(n * b * ctx.length(cfg.generation.max_new_tokens) / ctx.rate("hf"),
                                plan_terms.es_noise_s(ctx, n, n))
    return Stage(name, where, responses + heldout, round(tokens), 1, wall / 3600, {"trainer": trainer},
                 roles=lambda gib: memplan.es_roles(cfg, 1, gib, 0.0, 0.0) if _on_gpu(cfg) else [],
                 host=lambda gib: memplan_host.es_host(cfg, 1, gib, 0.0, updates), terms=terms, gpus_held=ctx.gpus,
                 limit=limit)


def _grpo_stage(ctx: _Ctx, cfg: Any, name: str, updates: int) -> Stage:
    from esreason.experiments.launch import choose_sharding, training_state_bytes

    g = cfg.grpo
    procs = ctx.gpus * ctx.nodes if cfg.device.startswith("cuda") else 1  # --nodes: one process per GPU of each
    responses = updates * cfg.train.batch_size * g.num_generations
    rollout_tokens = responses * ctx.length(cfg.generation.max_new_tokens)
    heldout, heldout_tokens = _heldout(ctx, cfg, updates)  # the main process's HF sampler (docs/grpo.md)
    colocate = g.use_vllm and g.vllm_mode == "colocate"
    mem_bytes = ctx.gpu["memory_gib"] * GIB
    share = g.vllm_gpu_memory_utilization if colocate else 0.0
    gib = memplan.GPU_MEMORY_GIB.get(gpu_type_key(ctx.gpu_type), (None, ctx.gpu["memory_gib"]))[1]
    sharding = memplan.pick_sharding(cfg, procs, gib) if procs > 1 and _on_gpu(cfg) else \
        choose_sharding(ctx.params, cfg.dtype, g.beta, mem_bytes, share) if procs > 1 else "ddp"
    state = training_state_bytes(ctx.params, cfg.dtype, g.beta, memplan.reference_dtype(cfg)) / GIB
    per_gpu = state / procs if sharding == "fsdp" else state
    if procs > 1:
        layout = f"accelerate launch, {procs} processes ({sharding.upper()}), 1 GPU each{plan_compute.nodes(ctx.nodes)}"
    else:
        layout = "1 process, 1 GPU"
    rollouts = (f"vLLM colocate rollouts ({procs} engine{'s' if procs > 1 else ''})" if colocate
                else "vLLM server rollouts" if g.use_vllm else "HF generate rollouts")
    memory = {"training_state": per_gpu, "vllm": share * ctx.gpu["memory_gib"]}
    from esreason.grpo.plan import trl_forwards

    try:  # the batch must split over the processes exactly as `train grpo` will require
        from esreason.accounting.flops import train_size
        from esreason.grpo.plan import plan_batches

        plan_batches(cfg, train_size(cfg.task, cfg.data_path, cfg.train.split, cfg.train.limit), procs)
        forwards = trl_forwards(cfg, procs)
    except UserError as exc:
        ctx.notes.append(f"{name}: on {procs} processes the run would stop: {exc}")
        forwards = trl_forwards(cfg, 1)
    max_new, total = cfg.generation.max_new_tokens, cfg.train.batch_size * g.num_generations
    share = -(-total // procs)  # one process's rollouts per update
    prompt = ctx.note(tab.prompt_tokens(cfg.task))
    longest = ctx.longest(total, max_new)  # the slowest process sets the pace (rewards gathered, DDP syncs)
    train = plan_terms.grpo_train_s(share, prompt, longest, sum(forwards.values()), plan_terms.forward_token_s(ctx))
    if g.use_vllm:  # TRL's vLLM rollouts carry no per-request seed (vllm_generation.generate)
        decode, tail = plan_terms.call_s(ctx, share, prompt, max_new, total, False)
        decode, tail = updates * decode, updates * tail
    else:  # TRL's generate or our sampler (grpo.rollouts), one process's share at a time
        work = "hf" if g.rollouts == "sampler" or (g.rollouts == "auto" and not _on_gpu(cfg)) else "hf_generate"
        decode, tail = rollout_tokens / (ctx.rate(work) * procs), 0.0
    reload = updates * plan_terms.grpo_reload_s(ctx, plan_terms.layers_of(cfg.model, ctx.params),
                                                colocate and g.vllm_sleep) if g.use_vllm else 0.0
    terms = {"start": ctx.over("trainer_start_s") + (ctx.over("engine_start_s") if g.use_vllm else 0.0),
             "decode": decode, "tail": tail, "reload": reload,
             "heldout": heldout_tokens / ctx.rate("hf") if heldout else 0.0,
             "train": updates * train,
             # TRL's checkpoint: the weights and AdamW's two fp32 moments
             "checkpoint": _checkpoints(cfg, updates) * ctx.checkpoint_s(
                 ctx.params * ((4 if cfg.dtype == "float32" else 2) + 8))}
    return Stage(name, f"{layout}; {rollouts}", responses + heldout, round(rollout_tokens + heldout_tokens), procs,
                 sum(terms.values()) / 3600, memory, terms=terms, gpus_held=max(ctx.gpus, procs),
                 roles=lambda gib: memplan.run_config_roles(cfg, procs, gib),  # sharding as the launcher picks on that GPU
                 host=lambda gib: memplan_host.grpo_host(cfg, procs, memplan.pick_sharding(cfg, procs, gib), updates))


def _mbpp_s(ctx: _Ctx, per_problem: int) -> float:
    """Sandboxed execution of every MBPP response (verify workers in parallel)."""
    p = ctx.spec.eval
    if "mbpp" not in p.tasks:
        return 0.0
    return _problems(ctx, ["mbpp"], p.limit) * per_problem * ctx.over("mbpp_exec_s") / ctx.over("verify_workers")


#: Rows a vLLM engine decodes at once at the end of a streamed evaluation (vLLM's default
#: ``max_num_seqs``): the last wave whose longest row the engine waits for.
STREAM_WAVE = 256


def _eval_stage(ctx: _Ctx, name: str) -> Stage:
    """Evaluation as the code runs it (eval.harness). vLLM engines: streamed (eval.streamed), every
    engine gets its share of problems x (samples + greedy) rows at once and keeps its batch full; it
    waits once, at the end, for the longest row of its last wave (``STREAM_WAVE`` rows); the entropy
    pass covers each prompt once and every sampled response. HF sampler: calls, as before."""
    p = ctx.spec.eval
    per_problem = p.samples + (1 if p.greedy else 0)
    problems = _problems(ctx, p.tasks, p.limit)
    responses = problems * per_problem
    tokens = responses * ctx.length(p.max_new_tokens)
    if p.backend == "vllm":
        per_gpu, tp = getattr(p, "engines_per_gpu", 1), plan_tp.tp_of(p)
        engines = min(p.engines, ctx.gpus * per_gpu // tp)
        if p.engines > ctx.gpus * per_gpu // tp:
            each = f" x {tp} GPUs each" if tp > 1 else ""
            ctx.notes.append(f"{name}: eval.engines={p.engines}{each} but only {ctx.gpus} GPUs x {per_gpu} engines per "
                             f"GPU; planned with {engines}")
        gpus_used = -(-engines // per_gpu) * tp
        slow = ctx.slowdown(per_gpu)
        per_engine = math.ceil(problems / engines)
        wave = min(per_engine * per_problem, STREAM_WAVE)  # streamed: one drain at the end per engine
        mean = ctx.length(p.max_new_tokens)
        prompts = sum(_problems(ctx, [t], p.limit) * ctx.note(tab.prompt_tokens(t)) for t in p.tasks)
        seeded = p.temperature > 0  # sampled rows carry per-row seeds (backends/vllm_eval.py), greedy rows none
        tail = plan_terms.call_s(ctx, wave, prompts / problems, p.max_new_tokens, wave, seeded, tp)[1] * slow
        scored = prompts + problems * p.samples * mean  # each prompt once for its samples (shared), every response
        sampler = problems * p.samples * mean * ctx.const("seeded_row_us") * 1e-6 / gpus_used if seeded else 0.0
        # decode: many sequences per engine reach the GPU's "vllm" rate, which sharing does not raise; plus
        # the sampler's launch per seeded row and step (per GPU: K engines' launches share it; conservative)
        terms = {"start": per_gpu * ctx.over("engine_start_s"),
                 "decode": tokens / ctx.rate("vllm") / gpus_used + sampler,
                 "tail": tail,
                 # a TP engine's scorer runs its layers on its GPUs one after another: one GPU per engine busy
                 "entropy": 2 * ctx.params * scored / (ctx.gpu["bf16_flops"] * ctx.const("train_mfu")) / (gpus_used / tp),
                 "mbpp": _mbpp_s(ctx, per_problem)}
        if tp > 1:  # full waves of STREAM_WAVE rows per engine, 2 all-reduces per layer per step (plan_tp)
            terms["allreduce"] = tokens / engines / STREAM_WAVE * plan_tp.allreduce_s(ctx, ctx.spec.model, STREAM_WAVE, tp)
        frac = ctx.const("eval_memory_fraction")
        share = (f"{tp} GPUs each, tensor parallel" if tp > 1 else "1 GPU each") if per_gpu == 1 else \
            f"{per_gpu} per GPU on {gpus_used} GPUs"
        where = f"{engines} vLLM engine{'s' if engines > 1 else ''} ({share}) + teacher-forced entropy pass"
        return Stage(name, where, responses, round(tokens), gpus_used, sum(terms.values()) / 3600,
                     {"engine": frac * ctx.gpu["memory_gib"]}, roles=lambda gib: _eval_roles(ctx, gib),
                     host=lambda gib: memplan_host.eval_host(ctx.spec, engines), terms=terms, gpus_held=ctx.gpus)
    # The HF sampler scores entropy while it samples: no separate pass.
    terms = {"start": ctx.over("trainer_start_s"), "decode": tokens / ctx.rate("hf"), "mbpp": _mbpp_s(ctx, per_problem)}
    if ctx.gpus > 1:
        ctx.notes.append(f"{name}: the HF sampler evaluates on 1 GPU while the node holds {ctx.gpus}; GPU-hours "
                         f"charge all {ctx.gpus}. Without vLLM, shard it yourself: one `esreason eval --backend hf` "
                         "per GPU (CUDA_VISIBLE_DEVICES=i) over disjoint --tasks")
    return Stage(name, "HF transformers sampler, 1 GPU", responses, round(tokens), 1,
                 sum(terms.values()) / 3600, {"model": 2 * ctx.params / GIB}, roles=lambda gib: _eval_roles(ctx, gib),
                 host=lambda gib: memplan_host.eval_host(ctx.spec, 1), terms=terms, gpus_held=ctx.gpus)


def _on_gpu(cfg: Any) -> bool:
    return str(cfg.device).startswith("cuda")


def _eval_roles(ctx: _Ctx, gib: float) -> list:
    """The evaluation engine's roles, in the dtype and on the device the runner evaluates with."""
    from esreason.backends.vllm_eval import EvalEngineOptions
    from esreason.backends.scoring import TOKENS_PER_FORWARD
    from esreason.experiments.spec import eval_settings

    device, dtype = eval_settings(ctx.spec)
    if not str(device).startswith("cuda"):
        return []
    util = EvalEngineOptions.__dataclass_fields__["gpu_memory_utilization"].default
    return memplan.eval_roles(ctx.spec, gib, util, dtype, TOKENS_PER_FORWARD)


def build_plan(spec: ExperimentSpec, gpus: int, gpu: str = "h100", lengths: Any = None, nodes: int = 1) -> dict:
    """The plan as one JSON-able object: stages, total_gpu_hours, wall_hours, assumptions (+ context).
    ``nodes``: GRPO trains on nodes x gpus processes (docs/planning.md); ES and evaluation on one node."""
    ctx = _Ctx(spec, gpus, gpu, lengths, nodes)
    stages: list[Stage] = []
    configs: list[Any] = []
    for name, kind, updates, cfg in run_stage_configs(spec):
        ctx.stage_kind = kind
        stages.append(_es_stage(ctx, cfg, name, updates) if kind == "es" else
                      _grpo_stage(ctx, cfg, name, updates) if kind == "grpo" else _eval_stage(ctx, name))
        configs.append(cfg)  # a training stage's compute as spent: what it runs per generated token, its FLOPs
        stages[-1].compute = plan_compute.stage_compute(cfg, updates, ctx.params, ctx.length) if cfg else None
    for st, cfg in zip(stages, configs):
        st.memory = memplan.memory_verdicts(st.roles, st.host, gpu_type_key(gpu))
        v = st.memory.get("verdicts", {}).get(gpu_type_key(gpu))
        if v is not None and not v["fits"]:  # a GRPO stage's note: what would change it, and the nodes
            ctx.notes.append(plan_compute.misfit_note(st, cfg, v, ctx.gpus))
    ctx.notes = list(dict.fromkeys(ctx.notes))
    return {
        "experiment": spec.name, "model": spec.model, "parameters": ctx.params, "size_class": ctx.size,
        "gpus": gpus, "nodes": nodes, "gpu_type": ctx.gpu["name"],
        "stages": [s.as_dict() for s in stages],
        "total_gpu_hours": round(sum(s.gpu_hours for s in stages), 2),
        "wall_hours": round(sum(s.wall_hours for s in stages), 2),
        "assumptions": [a.as_dict() for a in ctx.used.values()],
        "host_terms": {k: {"value": v, "unit": u, "source": src} for k, (v, u, src) in memplan_host.HOST_TERMS.items()},
        "notes": ctx.notes,
    }


def gpu_type_key(gpu: str) -> str:
    """The memory table's key of the plan's ``--gpu-type`` (``a100`` is the 80 GB part)."""
    return {"a100": "a100-80"}.get(gpu, gpu)


__all__ = ["Stage", "build_plan", "hf_only", "render"]
