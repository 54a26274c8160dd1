"""benchmarks/noise.py and benchmarks/gpu_es_step.py: shapes, the cost model, the CPU paths.

The benchmarks' numbers are not asserted (tests check behaviour, not time); what is checked
is that they measure the right thing: the paper models' parameter counts, the host and
device paths computing the same update, the cost model's arithmetic, and the GPU script's
refusal without CUDA.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu_es_step  # noqa: E402
import noise  # noqa: E402


@pytest.mark.parametrize("model,params", [("qwen2.5-0.5b", 494_032_768), ("qwen2.5-1.5b", 1_543_714_304),
                                          ("qwen2.5-7b", 7_615_616_512)])
def test_model_tensors_add_up_to_the_hub_models(model, params):
    assert sum(t.numel * t.count for t in noise.model_tensors(noise.MODELS[model])) == params


def test_host_and_device_paths_compute_the_same_step():
    """The benchmark's 'before' path is the old arithmetic: on CPU both give the same bits."""
    shape = (96, 64)
    out = {}
    for path, (perturb, update) in noise.PATHS.items():
        p = torch.ones(shape, dtype=torch.bfloat16)
        master = torch.ones(shape, dtype=torch.float32)
        perturb(p, master, "w", 5, 1e-2)
        perturbed = p.clone()
        noise.copy_tensor(p, master)
        sq = update(p, master, "w", [5, 6, 7], [1.0, -0.5, 2.0], 1e-2)
        out[path] = (perturbed, p.clone(), master.clone(), sq)
    for a, b in zip(out["host"], out["device"]):
        assert (a == b) if isinstance(a, float) else torch.equal(a, b)


def test_cost_model_arithmetic():
    params = 1_000_000_000
    cm = noise.cost_model(params, host_samples_per_s=1e8)
    gpu, setting = noise.GPU, noise.SETTING
    members = setting["population"] // setting["engines"]
    tokens_per_s = setting["prompts"] * gpu["decode_efficiency"] * gpu["hbm_bytes_per_s"] / (2 * params)
    assert cm["generation_s"] == pytest.approx(members * setting["prompts"] * setting["response_tokens"] / tokens_per_s)
    draws = (members + setting["population"]) * params / gpu["device_rng_samples_per_s"]
    assert cm["device"]["noise_s"] > draws
    share = cm["device"]["noise_s"] / (cm["device"]["noise_s"] + cm["generation_s"])
    assert cm["device"]["projected_overhead_share"] == pytest.approx(share)
    # the host path draws the same samples at host speed: far slower
    assert cm["host"]["noise_s"] > 10 * cm["device"]["noise_s"]
    # sharded: own members drawn twice, their bytes, one int64 all-reduce over NVLink
    b, e = noise.BYTES, setting["engines"]
    elementwise = params * (members * (b["perturb"] + b["restore"] + b["accumulate"]) + b["zeros"] + b["quantize"]
                            + b["dequantize"] + b["apply"]) / (gpu["hbm_bytes_per_s"] * gpu["elementwise_efficiency"])
    wire = 2 * (e - 1) / e * 8 * params / gpu["nvlink_bytes_per_s"]
    want = 2 * members * params / gpu["device_rng_samples_per_s"] + elementwise + wire
    assert cm["sharded"]["noise_s"] == pytest.approx(want) and cm["sharded"]["allreduce_s"] == pytest.approx(wire)
    assert cm["sharded"]["projected_overhead_share"] < cm["device"]["projected_overhead_share"]
    # a longer response or a slower vLLM lowers the share; the share is independent of P
    rows = {(r["decode_efficiency"], r["response_tokens"]): r["projected_overhead_share"]
            for r in noise.sensitivity(params, 1e8)}
    assert rows[(0.5, 1024)] < rows[(0.5, 512)] < rows[(0.5, 256)]
    assert rows[(0.25, 512)] < rows[(0.5, 512)] < rows[(1.0, 512)]
    assert noise.cost_model(7 * params, 1e8)["device"]["projected_overhead_share"] == \
        pytest.approx(cm["device"]["projected_overhead_share"])
    assert noise.cost_model(7 * params, 1e8)["sharded"]["projected_overhead_share"] == \
        pytest.approx(cm["sharded"]["projected_overhead_share"])


def test_sharded_path_is_one_engines_share_of_the_same_update():
    shape = (96, 64)
    got = {}
    for path in ("device", "sharded"):
        perturb, update = noise.PATHS[path]
        p = torch.ones(shape, dtype=torch.bfloat16)
        master = torch.ones(shape, dtype=torch.float32)
        update(p, master, "w", [5, 6, 7], [1.0, -0.5, 2.0], 1e-2)
        got[path] = master
    assert torch.allclose(got["device"], got["sharded"], rtol=0, atol=1e-8)
    assert not torch.equal(got["sharded"], torch.ones(shape))


def test_gpu_script_refuses_without_cuda():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU visible, on any machine
    proc = subprocess.run([sys.executable, str(BENCH / "gpu_es_step.py")], capture_output=True, text=True, env=env)
    assert proc.returncode == 2 and "needs a CUDA GPU" in proc.stderr


def test_gpu_script_builds_random_weights_with_the_hub_shapes(tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    small = dict(gpu_es_step.ARCH["qwen2.5-0.5b"], hidden_size=28, intermediate_size=48, num_hidden_layers=2,
                 num_attention_heads=2, num_key_value_heads=1, vocab_size=512)
    monkeypatch.setitem(gpu_es_step.ARCH, "small", small)
    path = gpu_es_step.random_model_dir("small", tmp_path / "m")
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.model_type == "qwen2" and model.config.tie_word_embeddings
    assert model.model.embed_tokens.weight.shape == (512, 28)
    assert model.model.layers[0].self_attn.k_proj.weight.shape == (14, 28)  # kv heads x head dim
