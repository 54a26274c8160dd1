"""RAM-efficient loading under FSDP: only local rank 0 reads the weights.

``configs/accelerate/fsdp-7b.yaml`` and the launcher's generated FSDP config set
``fsdp_cpu_ram_efficient_loading: true``. accelerate exports it to every process as
``FSDP_CPU_RAM_EFFICIENT_LOADING``; transformers then leaves the weights of every process but
local rank 0 unread, and accelerate broadcasts rank 0's when it shards the model.
transformers 5 no longer skips the read on those processes, so our loader
(``esreason.backends.hf.load_model``, used by ``train grpo``) builds the architecture with
meta parameters there itself (``fsdp_broadcast_receiver``). TRL's reference model is still read
by every process (TRL shards it without a broadcast): the node reads the 7B policy once and the
reference once per process (about 270 GB at start instead of 490 GB).

accelerate refuses FSDP on a CPU (its plugin is dropped for MULTI_CPU), so the sharding itself
runs only on GPUs; here two real processes in a gloo group load the embedded model as
``train grpo`` does under the launcher, and the test checks who holds weights.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.heavy  # four processes that import torch and transformers (about 40 s)

SCRIPT = r"""
import json, os, sys
import torch.distributed as dist
dist.init_process_group("gloo")
from esreason.backends.hf import load_model
model, _ = load_model("demo", "float32", "cpu")
devices = sorted({p.device.type for p in model.parameters()})
real = sum(p.numel() for p in model.parameters() if p.device.type != "meta")
buffers = sorted({b.device.type for b in model.buffers()})
finite = all(bool(b.float().isfinite().all()) and bool(b.abs().sum() > 0) for b in model.buffers() if b.is_floating_point())
print(json.dumps({"rank": dist.get_rank(), "devices": devices, "real_elements": real, "buffers": buffers,
                  "buffers_computed": finite, "elements": sum(p.numel() for p in model.parameters())}))
dist.destroy_process_group()
"""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _load_in_two_processes(efficient: bool) -> list[dict]:
    port, procs = _port(), []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "ACCELERATE_USE_FSDP": "true",
               "FSDP_CPU_RAM_EFFICIENT_LOADING": "true" if efficient else "false", "HF_HUB_OFFLINE": "1",
               "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, stderr[-3000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return sorted(out, key=lambda r: r["rank"])


def test_only_local_rank_0_reads_the_weights_and_the_loader_accepts_meta_tensors():
    rank0, rank1 = _load_in_two_processes(efficient=True)
    assert rank0["devices"] == ["cpu"] and rank0["real_elements"] > 800_000  # the 0.87M embedded model
    assert rank1["devices"] == ["meta"] and rank1["real_elements"] == 0  # nothing read on this process
    assert rank1["elements"] == rank0["elements"]  # the same architecture, to be filled by the broadcast
    # the rotary tables are real on every process: accelerate re-registers them after sharding
    assert rank1["buffers"] == ["cpu"] and rank1["buffers_computed"]


def test_without_the_setting_every_process_reads_the_weights():
    rank0, rank1 = _load_in_two_processes(efficient=False)
    assert rank0["devices"] == rank1["devices"] == ["cpu"]
    assert rank0["real_elements"] == rank1["real_elements"] > 800_000


def test_shipped_and_generated_fsdp_configs_load_ram_efficiently():
    from esreason.experiments.launch import accelerate_config

    shipped = yaml.safe_load((ROOT / "configs" / "accelerate" / "fsdp-7b.yaml").read_text())
    assert shipped["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] is True
    assert accelerate_config("fsdp", 8)["fsdp_config"]["fsdp_cpu_ram_efficient_loading"] is True
