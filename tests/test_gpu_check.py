"""scripts/gpu-check.sh / benchmarks/gpu_check.py in its CPU mode (--tiny --device cpu).

The same code runs on the lent GPU machine at Qwen2.5-1.5B shapes; here it must run from the
source tree through the shell script, report every check true, and import nothing that
machine lacks (vLLM, TRL, Ray, datasets). Times are reported, not asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_cpu_twin_runs_from_source_and_every_check_holds(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHON"] = sys.executable
    proc = subprocess.run([str(ROOT / "scripts" / "gpu-check.sh"), "--tiny", "--device", "cpu", "--population", "4",
                           "--prompts", "2", "--tokens", "4", "--cycles", "3"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["ok"] is True and out["absent_on_gpu_machine_but_imported"] == []
    assert out["restore"]["bit_exact_every_cycle"] and out["restore"]["changed_fraction_min"] > 0.5
    det = out["determinism"]
    assert det["same_seed_same_update"] and det["other_seeds_other_update"] and det["update_moved_the_centre"]
    assert det["masters_compared"] > 0  # bf16 weights: the fp32 masters are compared too
    host = out["host_reference"]
    assert host["ok"] and host["host_masters_equal_device_masters"] and host["masters_compared"] > 0
    timing = out["timing"]
    for key in ("member_generation_s", "direction_draw_s", "perturb_s", "restore_s", "update_s"):
        assert timing[key] > 0, key
    assert 0 < timing["es_overhead_share"] < 1
    assert out["memory"]["es_vs_inference_peak"] is None and "CUDA" in out["memory"]["note"]
    # the sharded update's arithmetic, pinned masters, the memory model at the configs' shapes
    sharded = out["sharded_update"]
    assert sharded["ok"] and sharded["two_engines_equal_reference"] and sharded["device_arithmetic_equals_host"]
    assert sharded["apply_equal"] and sharded["elements"] > 0
    pinned = out["pinned"]
    assert pinned["ok"] and pinned["buffer_vs_payload"] < 1.05 and pinned["pinned_gib"] == 0  # nothing to pin on a CPU
    model = out["memory_model"]
    assert model["ok"] and model["configs"] == ["configs/easy/grpo-qwen2.5-1.5b.yaml", "configs/easy/es-qwen2.5-1.5b.yaml"]
    assert model["shapes"]["grpo"]["gradient_checkpointing"] is True and model["shapes"]["grpo"]["beta"] > 0
    for step in ("grpo_microstep", "es_member_pass"):
        assert model[step]["traced_gib"] > 0 and model[step]["measured_gib"] is None  # measured on CUDA only
    assert model["grpo_microstep"]["traced_terms_gib"]["optimizer"] > 0


def test_gpu_check_refuses_cuda_without_a_gpu(monkeypatch):
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match=r"torch.cuda.is_available\(\) is False"):
        gpu_check.run(gpu_check.parse_args(["--device", "cuda"]))
