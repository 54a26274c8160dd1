"""The assumptions of ``esreason experiment plan``, in one table, each value with its source.

Every value is a published figure, a datasheet figure, derived from them by a stated rule, an
assumption of ours, or measured on one H100 (2026-11-28, ``gpu-results/2026-11-28-h100/`` beside
the repository: the GRPO padded-token cost, the ES perturb/restore/update costs, HF decode), and says which. Each entry's ``label`` is "measured on one H100" for those, "given" for
datasheet/dataset/default values and "estimate" for the rest. Replace a value by a measured one
(e.g. from ``benchmarks/gpu_es_step.py``) by editing its entry and its ``source``.

Throughput is **generated tokens per second per GPU**, keyed by (GPU type, model size class,
workload):

- ``vllm``: vLLM with many concurrent sequences (evaluation: thousands of requests per engine);
- ``vllm64``: vLLM decoding 64 sequences at a time (one ES member's 64 prompts on an engine; one
  GRPO process's share of a 64 x 8 rollout batch on 8 GPUs), memory-bound on the weights;
- ``hf``: our transformers sampler on one GPU;
- ``hf_generate``: transformers' ``generate`` (TRL's rollouts without vLLM) on one GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from esreason.errors import UserError


@dataclass(frozen=True)
class Assumption:
    """One value of the plan's table: what it is, its unit and where it comes from."""

    key: str
    """Dotted name, e.g. ``throughput.h100.7b.vllm``."""
    value: float
    """The number used."""
    unit: str
    """Its unit."""
    source: str
    """'published: ...', 'cited: ...', 'datasheet: ...', 'derived: ...' or 'assumption (ours): ...'."""

    @property
    def label(self) -> str:
        """'measured on one H100', 'cited' (a figure another project measured, with its address), 'given'
        (datasheet, dataset, an esreason default) or 'estimate'."""
        if self.source.startswith(MEASURED_H100):
            return MEASURED_H100
        if self.source.startswith("cited:"):
            return "cited"
        if self.source.split(":")[0] in ("datasheet", "dataset", "esreason default"):
            return "given"
        return "estimate"

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "unit": self.unit, "source": self.source, "label": self.label}


#: The label (and source prefix) of the constants measured on the lent H100.
MEASURED_H100 = "measured on one H100"
H100_RUN = ("2026-11-28, NVIDIA H100 80GB HBM3, torch 2.11.0+cu130, Qwen2.5-1.5B shapes with random bf16 weights; "
            "gpu-results/2026-11-28-h100/")


#: GPU types: memory, HBM bandwidth and dense bf16 peak (datasheets).
GPUS: dict[str, dict[str, Any]] = {
    "h100": {"name": "NVIDIA H100 SXM5 80GB", "memory_gib": 80.0, "hbm_bytes_per_s": 3.35e12,
             "bf16_flops": 989e12, "nvlink_bytes_per_s": 4.5e11,
             "source": "datasheet: NVIDIA H100 Tensor Core GPU (SXM5): 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s dense "
                       "bf16, NVLink 900 GB/s (450 GB/s per direction)"},
    "a100": {"name": "NVIDIA A100 SXM4 80GB", "memory_gib": 80.0, "hbm_bytes_per_s": 2.04e12,
             "bf16_flops": 312e12, "nvlink_bytes_per_s": 3.0e11,
             "source": "datasheet: NVIDIA A100 Tensor Core GPU (SXM4 80GB): 2.04 TB/s, 312 TFLOP/s dense bf16, "
                       "NVLink 600 GB/s (300 GB/s per direction)"},
    # memory_gib: torch's total_memory on an H200 (esreason.experiments.memplan.H200_TORCH_GIB, its source),
    # the capacity the launcher decides with; written here as a number, checked equal in tests/test_gpu_h200.py
    "h200": {"name": "NVIDIA H200 SXM 141GB", "memory_gib": 139.80, "hbm_bytes_per_s": 4.8e12,
             "bf16_flops": 989e12, "nvlink_bytes_per_s": 4.5e11,
             "source": "datasheet: NVIDIA H200 Tensor Core GPU (H200 SXM): 141 GB HBM3e, 4.8 TB/s, BF16 Tensor Core "
                       "1,979 TFLOP/s with sparsity (989 dense, the H100's GH100 chip), NVLink 900 GB/s (450 GB/s per "
                       "direction); memory_gib is what torch reports (139.80 GiB, memplan.H200_TORCH_GIB)"},
}

#: Model size classes: the largest parameter count of each, and the representative size the
#: published figure was taken at.
SIZE_CLASSES = (("1.5b", 2.5e9), ("3b", 4.5e9), ("7b", 9.0e9), ("14b", 20e9), ("32b", 40e9))

PUBLISHED_8B = 12_500.0
PUBLISHED_8B_SOURCE = ("published: Llama 3.1 8B (BF16), 1x H100 80GB, vLLM, ~12,500 output tokens/s "
                       "(third-party benchmark collection, morphllm.com/vllm-benchmarks, 2026)")
SMALL_MODEL_CAP = 3.0
HF_FACTOR = 14.0
HF_SOURCE = ("derived: the vllm value / 14 (vLLM's launch post: 14x-24x the throughput of HuggingFace "
             "Transformers, LLaMA-7B/13B on A100; we take the low end)")
#: Greedy decode at 64 rows x 256 tokens on one H100 at 1.5B (gen_cmp.txt): esreason's Sampler
#: (cache auto) and transformers' ``generate``, tokens/s.
HF_MEASURED_1_5B = {"hf": (1592.0, "esreason Sampler (cache auto)"), "hf_generate": (2681.0, "transformers generate")}
A100_FACTOR = 0.5
A100_SOURCE = "derived: the h100 value x 0.5 (Lambda Labs vllm-benchmark: H100 ~2x A100 throughput)"
H200_SOURCE = ("derived: the h100 value x 1.0 (the H200 is the H100's GH100 chip with the same compute, clocks and "
               "kernel launches; decode at 1.5B-8B and these batch sizes was launch- and host-bound on the H100 "
               "(gen_cmp.txt), so the H200's 1.43x HBM bandwidth is not credited; the vllm64 roof uses its 4.8 TB/s)")
#: Throughput per GPU type relative to the h100's table: (factor, source; None for the h100 itself).
GPU_SCALE: dict[str, tuple[float, str | None]] = {"h100": (1.0, None), "a100": (A100_FACTOR, A100_SOURCE),
                                                  "h200": (1.0, H200_SOURCE)}
DECODE_EFFICIENCY = 0.5

#: Representative parameter counts of the size classes (the paper's models).
CLASS_PARAMS = {"1.5b": 1.54e9, "3b": 3.21e9, "7b": 7.62e9, "14b": 14.77e9, "32b": 32.76e9}


def _throughput_table() -> dict[tuple[str, str, str], Assumption]:
    table: dict[tuple[str, str, str], Assumption] = {}
    for gpu in GPUS:
        scale, scale_src = GPU_SCALE[gpu]
        for size, params in CLASS_PARAMS.items():
            ratio = 8.03e9 / params
            if size == "7b":
                vllm, src = PUBLISHED_8B, PUBLISHED_8B_SOURCE
            else:
                vllm = PUBLISHED_8B * min(ratio, SMALL_MODEL_CAP)
                src = (f"derived: the published 8B figure ({PUBLISHED_8B:,.0f} tokens/s, H100) x min(8.03B / P, "
                       f"{SMALL_MODEL_CAP:g}) (decode reads the weights once per step; capped because small models "
                       "turn overhead-bound)" + (" per GPU; a model this size runs tensor parallel, each GPU reading "
                                                 "its shard per step (the all-reduces: plan_tp)" if ratio < 1 else ""))
            vllm *= scale
            roof = 64 * DECODE_EFFICIENCY * GPUS[gpu]["hbm_bytes_per_s"] / (2 * params)
            v64 = min(vllm, roof)
            src64 = (f"derived: min(the vllm value, 64 x {DECODE_EFFICIENCY} x HBM / (2 bytes x {params / 1e9:.2f}B)) "
                     "(64 sequences, memory-bound on the bf16 weights; the decode model of benchmarks/noise.py)")
            if scale_src is not None:
                src = f"{scale_src}; h100: {src}"
            base = f"throughput.{gpu}.{size}"
            table[(gpu, size, "vllm")] = Assumption(f"{base}.vllm", round(vllm), "tokens/s per GPU", src)
            table[(gpu, size, "vllm64")] = Assumption(f"{base}.vllm64", round(v64), "tokens/s per GPU", src64)
            for work, (measured, who) in HF_MEASURED_1_5B.items():
                if size == "1.5b":  # launch-bound: the 1.5B figure measured on the H100 (scaled per GPU_SCALE)
                    value = measured * scale
                    hf_src = (f"{MEASURED_H100}: {who}, greedy, 64 rows x 256 tokens, {measured:,.0f} tokens/s "
                              f"({H100_RUN}gen_cmp.txt)" + ("" if scale_src is None else f"; {scale_src}"))
                else:  # a larger model with as many layers launches as many kernels: no faster than 1.5B
                    value = min(vllm / HF_FACTOR, measured * scale)
                    hf_src = f"{HF_SOURCE}; at most the 1.5B measured rate (decode is launch-bound at these sizes)"
                table[(gpu, size, work)] = Assumption(f"{base}.{work}", round(value), "tokens/s per GPU", hf_src)
    return table


THROUGHPUT = _throughput_table()

#: Other constants of the plan.
CONSTANTS: dict[str, Assumption] = {
    "train_mfu": Assumption("train_mfu", 0.30, "fraction of dense bf16 peak",
                            "assumption (ours): model FLOP utilisation of the evaluation's teacher-forced entropy "
                            "forward (bf16); the GRPO train term uses the measured grpo_forward_token_us instead"),
    "grpo_forward_token_us": Assumption(
        "grpo_forward_token_us", round(0.30505 / (2 * 2432) / 5 * 1e6, 2), "us per padded token per forward at 1.54B",
        f"{MEASURED_H100}: one GRPO-like micro-step of 2 x 2,432 tokens with activation checkpointing and a bf16 "
        "reference forward took 0.305 s (grpo_real.jsonl), i.e. 62.7 us per padded token for 5 forward-equivalents "
        "(forward, backward = 2, checkpoint recompute, reference); it also steps AdamW every micro-step, which TRL "
        f"does once per accumulation (<= 5 % high) ({H100_RUN}). Scaled by parameters and by bf16 peak elsewhere"),
    "es_member_s": Assumption("es_member_s", round(0.028176 + 0.010078, 4), "s per member at 1.54B (perturb + restore)",
                              f"{MEASURED_H100}: benchmarks/gpu_check.py, HFPolicy with fp32 masters, perturb "
                              f"(directions drawn on the GPU) 28.2 ms + exact restore 10.1 ms (gpucheck.json; "
                              f"{H100_RUN}); the engines' worker extension runs the same kernels. Scaled by parameters "
                              "and HBM bandwidth elsewhere"),
    "es_update_s": Assumption("es_update_s", 0.0881, "s per update at 1.54B (sum of up to 8 members + apply)",
                              f"{MEASURED_H100}: benchmarks/gpu_check.py apply_update, 88.1 ms at N = 8 and 87.9 ms at "
                              f"N = 4 (gpucheck.json, gpucheck_big.json; {H100_RUN}); members beyond 8 at the cost "
                              "model's 16 bytes per parameter each"),
    "decode_step_floor_s": Assumption("decode_step_floor_s", 0.003, "s per vLLM decode step, at least",
                                      "assumption (ours): vLLM V1's host work per step (scheduler, input preparation, "
                                      "sampler, output processing) with CUDA graphs; at 1.5B a 64-row step is bound by "
                                      "it, not by HBM (our HF decode on the H100 was launch-bound too)"),
    "seeded_row_us": Assumption("seeded_row_us", 8.0, "us per seeded row per decode step",
                                "assumption (ours): vLLM V1's sampler draws each request with its own seed in a Python "
                                "loop, one exponential_ kernel per row (vllm/v1/sample/ops/topk_topp_sampler.py "
                                "random_sample): one launch plus one iteration, ~5-10 us"),
    "vllm_sleep_wake_s": Assumption("vllm_sleep_wake_s", 1.0, "s per rollout (sleep level 2 + wake of weights and KV)",
                                    "assumption (ours): TRL's colocate engine sleeps after every generation "
                                    "(trl/generation/vllm_generation.py VLLMGeneration.generate: llm.sleep(level=2)) "
                                    "and wakes its weights (sync_weights: wake_up(tags=['weights'])) and KV cache "
                                    "(generate: wake_up(tags=['kv_cache'])) before the next: freeing and remapping "
                                    "~25 GiB of cumem allocations, and empty_cache"),
    "weight_reload_tensor_ms": Assumption("weight_reload_tensor_ms", 1.0, "ms per parameter tensor",
                                          "assumption (ours): TRL pushes the trainer's weights into its colocate engine "
                                          "before every rollout, one load_weights call per named parameter "
                                          "(trl/generation/vllm_generation.py VLLMGeneration.sync_weights); host-bound "
                                          "(~12 tensors per layer)"),
    "elementwise_efficiency": Assumption("elementwise_efficiency", 0.8, "fraction of HBM bandwidth",
                                         "assumption (ours): as benchmarks/noise.py, ES perturb/restore/update "
                                         "kernels reach 80% of HBM bandwidth; bytes per parameter from that cost model"),
    "engine_memory_fraction": Assumption("engine_memory_fraction", 0.6, "fraction of GPU memory",
                                         "esreason default: VLLMEngineOptions.gpu_memory_utilization (an ES engine's "
                                         "reservation for weights + KV cache)"),
    "trainer_gpu_gib": Assumption("trainer_gpu_gib", 0.6, "GiB on GPU 0 beside its engine",
                                  "assumption (ours): the trainer's reference lives in host memory beside GPU "
                                  "engines (esreason.es_loop.run.reference_placement) and keeps on the GPU only its "
                                  "CUDA context (~0.5 GiB) and three 16 MiB noise blocks"),
    "shared_read_efficiency": Assumption(
        "shared_read_efficiency", DECODE_EFFICIENCY, "fraction of HBM bandwidth",
        "assumption (ours): K engines sharing a GPU (backend.engines_per_gpu) get its reads served one after "
        "another at the efficiency one engine reaches (DECODE_EFFICIENCY); only the time a step waits on its host "
        "floor is filled by the others (time-sliced, no MPS: kernels of different processes do not overlap). 1.0 "
        "is the reading of shared_gpu_speedup, where the half roofline one engine leaves is host time that the "
        "others fill; unmeasured either way (plan_terms.step_s)"),
    "lora_token_overhead": Assumption(
        "lora_token_overhead", round(2693.62 / 1791.53 - 1, 3), "extra time per generated token with LoRA adapters",
        "cited: vLLM's own LoRA throughput benchmark, benchmarks/benchmark_throughput.py on 1x A100, Llama-2-7B, "
        "1,000 ShareGPT prompts: 2,693.62 output tokens/s without LoRA, 1,791.53 with --enable-lora --max-loras 4 "
        "--max-lora-rank 8 (vllm-project/vllm#11267, 2024-12-17); 2,693.62 / 1,791.53 - 1. The only "
        "same-machine, same-build pair we found; a V1 LoRA run two weeks later on the same kind of machine gave "
        "2,577.68 (vllm-project/vllm#11613), i.e. 0.045 against that base, and EGGROLL reports low-rank "
        "populations at ~91 % of inference throughput (0.099; arXiv 2511.16652, not vLLM). Prices the low-rank "
        "members-in-one-batch mode (plan_limit); replace it by a measured figure"),
    "lora_adapter_load_s": Assumption(
        "lora_adapter_load_s", 0.01, "s per member adapter per engine and update",
        "assumption (ours): each update loads every member's rank-r adapter of the engine into vLLM's LoRA slots "
        "(a few MB of factors per adapter at 1.5B, copied to the GPU); host-bound, ~10 ms"),
    "eval_memory_fraction": Assumption("eval_memory_fraction", 0.9, "fraction of GPU memory",
                                       "assumption (ours): an evaluation engine owns its GPU (vLLM's default 0.9)"),
}

#: Mean generated tokens per response by model family (capped by the run's max_new_tokens).
RESPONSE_TOKENS: dict[str, Assumption] = {
    "instruct": Assumption("response_tokens.instruct", 250, "tokens per response",
                           "assumption (ours): ~250 tokens per response of the Easy setting's "
                           "Instruct models (benchmarks/noise.py: GSM8K answers of Qwen2.5-1.5B-Instruct ~300 "
                           "tokens)"),
    "r1-distill": Assumption("response_tokens.r1-distill", 4000, "tokens per response",
                             "assumption (ours): R1-distilled models write long chains of thought (the Hard "
                             "setting caps them at 8,192 tokens); half the cap"),
}

#: Spread of response lengths by model family: coefficient of variation of a lognormal length
#: distribution with the mean above (the tail term). Used for the expected longest response of a
#: batch of n (a synchronous call waits for it), capped at the run's max_new_tokens.
RESPONSE_CV: dict[str, Assumption] = {
    "instruct": Assumption("response_cv.instruct", 0.6, "std / mean of response tokens",
                           "assumption (ours): lognormal lengths; a 250-token mean with a 150-token standard "
                           "deviation (GSM8K-style answers of Instruct models range from ~80 to ~800 tokens)"),
    "r1-distill": Assumption("response_cv.r1-distill", 0.5, "std / mean of response tokens",
                             "assumption (ours): lognormal lengths; long chains of thought, many reaching the cap"),
}

#: Prompt tokens per problem (chat template included), for forwards over prompt + response (the
#: evaluation's entropy pass scores prompt + response). Estimates from each dataset's format, not
#: token counts.
PROMPT_TOKENS: dict[str, Assumption] = {
    task: Assumption(f"prompt_tokens.{task}", value, "tokens per prompt", f"assumption (ours): {why}")
    for task, value, why in (
        ("gsm8k", 150, "a ~60-word question + the template's instruction"),
        ("csqa", 120, "a question, five choices and the instruction"),
        ("hotpotqa", 1000, "the distractor setting's ten paragraphs (~70-100 words each) + the question"),
        ("countdown", 120, "numbers, target and the instruction"),
        ("gpqa", 350, "a graduate-level question with four long choices"),
        ("mbpp", 200, "the description, three asserts and the instruction"),
        ("aime24", 180, "one competition problem"), ("aime25", 180, "one competition problem"),
        ("amc23", 160, "one competition problem"), ("math500", 150, "one MATH problem"),
    )
}
DEFAULT_PROMPT_TOKENS = Assumption("prompt_tokens.default", 200, "tokens per prompt",
                                   "assumption (ours): a task without its own figure")

#: Fixed costs of a stage: starting engines, writing and verifying checkpoints, checksums.
OVERHEADS: dict[str, Assumption] = {
    "engine_start_s": Assumption("engine_start_s", 90.0, "s per engine start (engines start in parallel)",
                                 "assumption (ours): vLLM V1 start at 1.5B-7B on an H100 (weights from local "
                                 "disk, torch.compile and CUDA-graph capture), typically 1-2 minutes"),
    "trainer_start_s": Assumption("trainer_start_s", 60.0, "s per training stage",
                                  "assumption (ours): process start, imports, loading the policy (and reference) "
                                  "and, under accelerate, the process group"),
    "disk_bytes_per_s": Assumption("disk_bytes_per_s", 1.0e9, "bytes/s written or read",
                                   "assumption (ours): a node-local NVMe under a safetensors write"),
    "hash_bytes_per_s": Assumption("hash_bytes_per_s", 0.9e9, "bytes/s hashed (checkpoint read-back)",
                                   "measured: benchmarks/checksum.py on this project's 2-core CPU machine (not a GPU "
                                   "node), blake2b per tensor on 8 threads, 1.1 GB in 1.24 s"),
    "hash_bytes_per_s_per_core": Assumption("hash_bytes_per_s_per_core", 0.44e9, "bytes/s hashed per CPU core",
                                            "measured: benchmarks/checksum.py on this project's 2-core CPU machine, "
                                            "1.1 GB in 1.24 s on both cores (blake2b per tensor); an engine's checksum "
                                            "threads (backends.engine.CHECKSUM_THREADS) each get a core of the node"),
    "node_cores": Assumption("node_cores", 112.0, "CPU cores per node",
                             "datasheet: NVIDIA DGX H100, 2x Intel Xeon Platinum 8480C (56 cores each)"),
    "mbpp_exec_s": Assumption("mbpp_exec_s", 0.15, "s per MBPP response, on one core",
                              "assumption (ours): one sandboxed interpreter start (~50 ms) + three asserts with "
                              "their time limits rarely reached"),
    "verify_workers": Assumption("verify_workers", 16.0, "parallel sandboxed verifiers",
                                 "assumption (ours): a DGX node's cores beside the engines"),
}


#: Share of responses that never end and stop at max_new_tokens: greedy and sampled
#: repetition loops. The default of the experiment key ``plan.runaway_share``.
RUNAWAY_SHARE: dict[str, Assumption] = {
    "instruct": Assumption("runaway_share.instruct", 0.01, "share of responses at the cap",
                           "assumption (ours): 1 % of a small Instruct model's GSM8K-style responses loop until the "
                           "cap (a share at the cap, not in the lognormal tail: the longest of 512 GRPO rollouts or "
                           "of an ES member's 64 is then usually a runaway); set plan.runaway_share from a run's "
                           "completions/clipped_ratio (TRL) or use --lengths"),
    "r1-distill": Assumption("runaway_share.r1-distill", 0.10, "share of responses at the cap",
                             "assumption (ours): R1-distilled chains of thought often reach an 8k cap ("
                             "https://github.com/allenai/olmo-eval/issues/399 reports 19-37 % cap hits for reasoning models on GPQA/IFEval); we take 10 %"),
}


def runaway_share(model: str, configured: float | None = None) -> Assumption:
    """The runaway share: ``plan.runaway_share`` when the experiment sets it, else the family's."""
    if configured is not None:
        return Assumption("runaway_share.configured", configured, "share of responses at the cap",
                          "experiment key plan.runaway_share")
    return RUNAWAY_SHARE["r1-distill" if "r1-distill" in model.lower() else "instruct"]


def response_cv(model: str) -> Assumption:
    return RESPONSE_CV["r1-distill" if "r1-distill" in model.lower() else "instruct"]


def prompt_tokens(task: str) -> Assumption:
    return PROMPT_TOKENS.get(task, DEFAULT_PROMPT_TOKENS)


def expected_longest(mean: float, cv: float, n: int, cap: float, runaway: float = 0.0) -> float:
    """E[min(cap, max of n lengths)] for lognormal lengths of mean ``mean`` and std ``cv * mean`` with a
    ``runaway`` share at the cap (:class:`esreason.experiments.lengths.LengthModel`, an order statistic:
    integral over [0, cap] of 1 - P(length <= x)^n dx). n = 1 gives the capped mean."""
    from esreason.experiments.lengths import LengthModel

    return LengthModel(mean, cv, runaway).longest(n, cap)


#: Problems in the evaluated split of each paper task (eval uses every problem unless eval.limit).
TEST_SIZES: dict[str, tuple[int, str]] = {
    "gsm8k": (1319, "dataset: openai/gsm8k test split"),
    "csqa": (1221, "dataset: tau/commonsense_qa validation split"),
    "hotpotqa": (7405, "dataset: HotpotQA hotpot_dev_distractor_v1.json"),
    "countdown": (1000, "assumption (ours): HuggingFaceTB/Countdown-Task-GOLD test size not stated; 1,000 brings "
                        "the Easy suites to the ~11k problems we estimate for them"),
    "gpqa": (198, "dataset: Idavidrein/gpqa gpqa_diamond"),
    "mbpp": (257, "dataset: google-research-datasets/mbpp sanitized test split"),
    "aime24": (30, "dataset: math-ai/aime24"),
    "aime25": (30, "dataset: math-ai/aime25"),
    "amc23": (40, "dataset: math-ai/amc23"),
    "math500": (500, "dataset: HuggingFaceH4/MATH-500"),
}


def size_class(params: int) -> str:
    """The size class of a model with ``params`` parameters; UserError outside the table."""
    for name, upper in SIZE_CLASSES:
        if 0.5e9 <= params <= upper:
            return name
    raise UserError(f"no throughput assumption for a model of {params / 1e9:.3g}B parameters (the plan's table "
                    f"covers {', '.join(n for n, _ in SIZE_CLASSES)}: 0.5B-40B; esreason.experiments.plan_table); "
                    "plan it with this machine's own constants: --calibrate")


def gpu_spec(gpu: str) -> dict[str, Any]:
    if gpu not in GPUS:
        raise UserError(f"unknown GPU type {gpu!r}; known: {', '.join(GPUS)}")
    return GPUS[gpu]


def throughput(gpu: str, size: str, workload: str) -> Assumption:
    return THROUGHPUT[(gpu, size, workload)]


def shared_gpu_speedup(gpu: str, size: str, engines_per_gpu: int) -> Assumption:
    """How much more a GPU decodes with K engines of 64 sequences each than with one.

    One engine's 64-sequence decode reaches the ``vllm64`` rate, ``DECODE_EFFICIENCY`` of the HBM
    roofline (each step reads the bf16 weights once); we read the rest of the step as time the GPU
    waits on the engine's host side (scheduling, sampling, detokenisation), which the other engines
    of that GPU fill. K engines then decode min(K x vllm64, the full roofline 64 x HBM / (2 P)) tokens/s
    together: each engine's step is K / speedup times as long. A model, never held against a GPU
    measurement: ``scripts/gpu-check.sh`` measures it where a GPU is lent.
    """
    v64 = THROUGHPUT[(gpu, size, "vllm64")].value
    roof = 64 * GPUS[gpu]["hbm_bytes_per_s"] / (2 * CLASS_PARAMS[size])
    value = min(float(engines_per_gpu), roof / v64)
    return Assumption(f"shared_gpu_speedup.{gpu}.{size}.k{engines_per_gpu}", round(value, 3),
                      "x one engine's decode rate on its GPU",
                      f"derived (ours, unmeasured): min(K, full roofline / vllm64 = {roof / v64:.2f}); the "
                      f"vllm64 rate is {DECODE_EFFICIENCY} of the roofline, the rest read as host time other "
                      "engines on the GPU fill (time-sliced, no MPS)")


def response_tokens(model: str) -> Assumption:
    return RESPONSE_TOKENS["r1-distill" if "r1-distill" in model.lower() else "instruct"]


def test_size(task: str) -> tuple[int, str]:
    """(problems in the test split, where the figure comes from). A task that is not one of the paper's
    (a task file, a plugin, the Python API) is counted by loading its test split."""
    if task in TEST_SIZES:
        return TEST_SIZES[task]
    from esreason.tasks import registry

    if task in registry.names() and registry.source(task) != registry.BUILTIN:
        return len(registry.get(task).load("test")), f"counted: the test split of {registry.source(task)}"
    raise UserError(f"no known test size for task {task!r} (known: {', '.join(TEST_SIZES)}); "
                    "plan a local copy with data_dir, or add it to esreason.experiments.plan_table")


__all__ = ["Assumption", "CONSTANTS", "GPUS", "MEASURED_H100", "OVERHEADS", "PROMPT_TOKENS", "RESPONSE_CV",
           "RESPONSE_TOKENS", "RUNAWAY_SHARE", "runaway_share",
           "TEST_SIZES", "THROUGHPUT", "expected_longest", "gpu_spec", "prompt_tokens", "response_cv",
           "response_tokens", "size_class", "test_size", "throughput"]
