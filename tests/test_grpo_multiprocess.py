"""GRPO under ``accelerate launch`` with 2 processes on the CPU (gloo), against one process.

accelerate's ``--cpu`` flag selects its single-process / mpirun launcher, so two CPU processes
are started with ``--multi_gpu --num_processes 2`` (torch.distributed.run); our ``device: cpu``
makes TRL's TrainingArguments build a MULTI_CPU (gloo) process group.

What is identical between 1 and 2 processes, and tested:
- the run directory layout, config.yaml, metrics keys and rows, step / optimizer_steps / epoch;
- T, the prompts per update and the optimizer steps per update (the batch plan is global);
- the held-out metrics at update 0 (the starting model, seeded sampler);
- with (near-)deterministic sampling and a zero learning rate, every rollout metric
  (reward, accuracy, format, reward std, completion lengths): the same prompts per update.
What is not identical: the rollouts at temperature 1 (every process samples its share of the
batch from its own random stream), hence rewards, losses and the weights after update 1.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from esreason.errors import UserError
from esreason.grpo.config import load_grpo_config
from esreason.grpo.distributed import Processes
from esreason.grpo.plan import plan_batches
from esreason.grpo.run import run_grpo

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

ROOT = Path(__file__).resolve().parents[1]
DEMO_CONFIG = ROOT / "configs" / "demo" / "grpo.yaml"
ACCEL = ROOT / "configs" / "accelerate"
# 2 updates of 8 prompts x 8 responses; the micro-batch of 32 lets 2 processes split 64 sequences.
TRAIN = ["train.max_steps=2", "checkpoint.every=1", "grpo.micro_batch_size=32", "eval.every=1",
         "eval.limit=8", "eval.samples=4", "eval.ks=1,4", "generation.max_new_tokens=48"]
# Near-greedy rollouts and no learning: the rollouts depend only on the prompts of each update.
FROZEN = ["train.max_steps=2", "checkpoint.every=2", "grpo.micro_batch_size=32", "eval.every=0",
          "grpo.learning_rate=0", "generation.temperature=1e-4", "generation.max_new_tokens=48"]
TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"):
        env.pop(key, None)
    return env


def launch_two(out: Path, overrides: list[str], *extra: str) -> subprocess.CompletedProcess:
    """``accelerate launch --multi_gpu --num_processes 2 -m esreason.cli train grpo`` on the CPU."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu",
           "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), "-m", "esreason.cli", "train", "grpo",
           "--config", str(DEMO_CONFIG), "--output", str(out), "--no-progress", *extra]
    for item in overrides:
        cmd += ["--set", item]
    return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def tree(run: Path) -> list[str]:
    """Relative paths under RUN, TensorBoard event file names (host, pid, time) generalised."""
    out = []
    for p in sorted(run.rglob("*")):
        rel = p.relative_to(run).as_posix()
        out.append("tensorboard/events" if rel.startswith("tensorboard/events") else rel)
    return out


def tree_without_rng(run: Path) -> list[str]:
    return [p for p in tree(run) if "rng_state" not in p]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("grpo_mp")
    res = {}
    for name, overrides in (("train", TRAIN), ("frozen", FROZEN)):
        t0 = time.perf_counter()
        proc = launch_two(base / f"{name}2", overrides)
        assert proc.returncode == 0, proc.stderr[-3000:]
        res[f"{name}2_s"] = time.perf_counter() - t0
        res[f"{name}2_stdout"] = proc.stdout
        t0 = time.perf_counter()
        run_grpo(load_grpo_config(DEMO_CONFIG, overrides), base / f"{name}1", progress=False)
        res[f"{name}1_s"] = time.perf_counter() - t0
        res[name] = (base / f"{name}1", base / f"{name}2")
    print({k: round(v, 1) for k, v in res.items() if k.endswith("_s")})
    return res


def test_two_processes_write_the_same_run_directory_once(runs):
    one, two = runs["train"]
    assert tree_without_rng(two) == tree_without_rng(one)
    # RUN/trl holds one RNG state per process (transformers' resume state, written by each process).
    assert sorted(p.name for p in (two / "trl" / "checkpoint-2").glob("rng_state*")) == [
        "rng_state_0.pth", "rng_state_1.pth"]
    assert sorted(p.name for p in (one / "trl" / "checkpoint-2").glob("rng_state*")) == ["rng_state.pth"]
    # written once: one step_N per period, no temporaries, one event file, one manifest, one summary
    assert sorted(p.name for p in (two / "checkpoints").iterdir()) == ["step_1", "step_2"]
    assert not list(two.rglob(".tmp-*"))
    assert len(list((two / "tensorboard").iterdir())) == 1
    assert runs["train2_stdout"].count("GRPO run finished") == 1
    assert (two / "config.yaml").read_text() == (one / "config.yaml").read_text()
    m1, m2 = (json.loads((r / "manifest.json").read_text())["trainer"]["batch_plan"] for r in (one, two))
    assert m2["num_processes"] == 2 and m1["num_processes"] == 1
    same = ("prompts_per_update", "generations", "sequences_per_update", "prompts_per_optimizer_step",
            "optimizer_steps_per_update", "total_updates", "total_optimizer_steps", "updates_per_epoch")
    assert {k: m2[k] for k in same} == {k: m1[k] for k in same}
    assert m2["gradient_accumulation_steps"] * 2 == m1["gradient_accumulation_steps"]
    assert m2["sequences_per_process"] == 32


def test_two_processes_log_the_same_rows_and_keys(runs):
    one, two = runs["train"]
    r1, r2 = rows(one), rows(two)
    assert [r["step"] for r in r2] == [r["step"] for r in r1] == [0, 1, 2]
    assert [set(r) for r in r2] == [set(r) for r in r1]
    for a, b in zip(r1[1:], r2[1:]):
        assert (a["optimizer_steps"], a["epoch"]) == (b["optimizer_steps"], b["epoch"])
    assert r1[1]["kl"] == r2[1]["kl"] == 0.0  # the first update samples from the reference itself
    # update 0: the starting model, evaluated with the seeded sampler, before any process trains
    # Counts and rates are equal exactly; token entropy is a float reduction whose summation order
    # follows the batch shapes of the process that evaluates, so it agrees to float32 rounding
    # (CI measured a relative difference of 7e-8).
    held1 = {k: v for k, v in r1[0].items() if k.startswith("heldout/") and "/time/" not in k}
    held2 = {k: v for k, v in r2[0].items() if k.startswith("heldout/") and "/time/" not in k}
    assert held1 and set(held1) == set(held2)
    for key, value in held1.items():
        if key.endswith("entropy"):
            assert held2[key] == pytest.approx(value, rel=1e-6), key
        else:
            assert held2[key] == value, key


def test_two_process_checkpoint_loads_as_a_plain_hf_model(runs):
    import torch
    from transformers import AutoModelForCausalLM

    from esreason.backends.hf import load_model

    one, two = runs["train"]
    m2 = AutoModelForCausalLM.from_pretrained(two / "checkpoints" / "step_2")
    m1 = AutoModelForCausalLM.from_pretrained(one / "checkpoints" / "step_2")
    base, _ = load_model("demo")
    assert set(m2.state_dict()) == set(m1.state_dict())
    moved = max((a - b).abs().max().item() for a, b in zip(m2.state_dict().values(), base.state_dict().values()))
    assert moved > 0  # 2 updates at lr 1e-5 moved the weights
    trl_model = AutoModelForCausalLM.from_pretrained(two / "trl" / "checkpoint-2")
    assert all(torch.equal(a, b) for a, b in zip(m2.state_dict().values(), trl_model.state_dict().values()))
    state = json.loads((two / "checkpoints" / "step_2" / "grpo_state.json").read_text())
    assert (state["step"], state["optimizer_steps"], state["plan"]["num_processes"]) == (2, 2, 2)


def test_two_process_resume_is_bit_identical(runs, tmp_path):
    """Kill after update 1 (simulated: update 2's checkpoints removed), resume with 2 processes:
    TRL restores every process's RNG state (rng_state_<rank>.pth), so update 2 is replayed exactly."""
    import shutil

    import torch
    from safetensors.torch import load_file

    _, two = runs["train"]
    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_2")
    shutil.rmtree(resumed / "trl" / "checkpoint-2")
    proc = launch_two(resumed, TRAIN, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    a = load_file(two / "checkpoints" / "step_2" / "model.safetensors")
    b = load_file(resumed / "checkpoints" / "step_2" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    r_a, r_b = rows(two), rows(resumed)
    assert [r["step"] for r in r_b] == [0, 1, 2]
    assert r_b[2]["reward/mean"] == r_a[2]["reward/mean"] and r_b[2]["loss"] == r_a[2]["loss"]


def test_same_prompts_per_update_with_deterministic_rollouts(runs):
    import torch
    from transformers import AutoModelForCausalLM

    one, two = runs["frozen"]
    r1, r2 = rows(one), rows(two)
    assert len(r1) == len(r2) == 2
    for a, b in zip(r1, r2):
        for key in ("reward/mean", "accuracy/mean", "format/mean", "reward/std", "reward",
                    "completions/mean_length", "completions/max_length", "num_tokens", "rollouts", "tokens"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-7), key  # rollouts, tokens: every process's
    # the two updates draw different prompts (so agreement is not a coincidence of one batch)
    assert r1[0]["completions/mean_length"] != r1[1]["completions/mean_length"] or \
        r1[0]["reward/mean"] != r1[1]["reward/mean"]
    w1 = AutoModelForCausalLM.from_pretrained(one / "checkpoints" / "step_2").state_dict()
    w2 = AutoModelForCausalLM.from_pretrained(two / "checkpoints" / "step_2").state_dict()
    assert all(torch.equal(w1[k], w2[k]) for k in w1)


# --------------------------------------------------------------------------- plan and launcher


@pytest.mark.parametrize("procs", [1, 2, 4, 8])
def test_plan_keeps_the_global_batch_for_any_process_count(procs):
    cfg = load_grpo_config(ROOT / "configs" / "easy" / "grpo-qwen2.5-7b.yaml")
    one, plan = plan_batches(cfg, 7473), plan_batches(cfg, 7473, procs)
    assert (plan.total_updates, plan.prompts_per_update, plan.optimizer_steps_per_update) == (232, 64, 2)
    assert plan.total_optimizer_steps == one.total_optimizer_steps == 464
    # TRL: generation batch = per-device micro x processes x steps_per_generation = B x G
    assert plan.sequences_per_micro_batch * procs * plan.steps_per_generation == 512
    assert plan.sequences_per_micro_batch * procs * plan.gradient_accumulation_steps == 32 * 8
    assert plan.gradient_accumulation_steps == 128 // procs


def test_plan_refuses_a_process_count_that_does_not_split_the_batch():
    cfg = load_grpo_config(DEMO_CONFIG)  # micro-batch 64 = the whole 8 x 8 update
    assert plan_batches(cfg, 100, 1).steps_per_generation == 1
    with pytest.raises(UserError, match=r"grpo.micro_batch_size.*2 processes x 64 .* 64 sequences"):
        plan_batches(cfg, 100, 2)
    cfg = load_grpo_config(DEMO_CONFIG, ["grpo.micro_batch_size=8"])
    with pytest.raises(UserError, match="grpo.micro_batch_size"):
        plan_batches(cfg, 100, 3)


def test_processes_from_the_launcher_environment():
    assert Processes.from_env({}) == Processes(1, 0, "none")
    p = Processes.from_env({"WORLD_SIZE": "8", "RANK": "3", "ACCELERATE_USE_FSDP": "true"})
    assert (p.num_processes, p.process_index, p.sharding, p.is_main, p.distributed) == (8, 3, "fsdp", False, True)
    assert Processes.from_env({"ACCELERATE_USE_DEEPSPEED": "True"}).sharding == "deepspeed"
    with pytest.raises(UserError, match="WORLD_SIZE"):
        Processes.from_env({"WORLD_SIZE": "2", "RANK": "2"})


def test_sharding_on_the_cpu_is_refused_not_silently_unsharded(monkeypatch, tmp_path):
    # accelerate 1.15 drops the FSDP plugin on CPU (MULTI_CPU): refuse before anything is written.
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(UserError, match="config key 'device'.*fsdp sharding"):
        run_grpo(load_grpo_config(DEMO_CONFIG, ["train.max_steps=1"]), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def test_sharded_runs_refuse_in_training_heldout_evaluation():
    from esreason.grpo.run import _check_processes

    cfg = load_grpo_config(DEMO_CONFIG, ["device=cuda"])  # eval.every: 10
    with pytest.raises(UserError, match="config key 'eval.every'"):
        _check_processes(cfg, Processes(8, 0, "fsdp"))
    _check_processes(cfg, Processes(8, 0, "none"))  # data parallel: the main process evaluates


# --------------------------------------------------------------------------- shipped accelerate configs


def test_shipped_accelerate_configs_parse_with_accelerates_loader():
    from accelerate.commands.config.config_args import load_config_from_file

    ddp = load_config_from_file(str(ACCEL / "ddp-8gpu.yaml"))
    assert (ddp.distributed_type.value, ddp.num_processes, ddp.mixed_precision) == ("MULTI_GPU", 8, "no")
    fsdp = load_config_from_file(str(ACCEL / "fsdp-7b.yaml"))
    assert (fsdp.distributed_type.value, fsdp.num_processes) == ("FSDP", 8)
    fc = fsdp.fsdp_config
    assert fc["fsdp_version"] == 2 and fc["fsdp_reshard_after_forward"] is True  # FULL_SHARD
    assert fc["fsdp_state_dict_type"] == "FULL_STATE_DICT"  # checkpoints gathered on rank 0, HF format
    # the batch splits evenly over the config's 8 processes for the 7B run
    plan = plan_batches(load_grpo_config(ROOT / "configs" / "easy" / "grpo-qwen2.5-7b.yaml"), 7473,
                        fsdp.num_processes)
    assert plan.gradient_accumulation_steps == 16 and plan.steps_per_generation == 32


def test_fsdp_config_sets_the_environment_accelerate_reads_for_a_full_state_dict():
    """What ``accelerate launch --config_file fsdp-7b.yaml`` exports to every process, read back by
    accelerate's FSDP plugin: FSDP2, full shard, FULL_STATE_DICT."""
    import argparse

    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    parser = launch_command_parser()
    args = parser.parse_args(["--config_file", str(ACCEL / "fsdp-7b.yaml"), "train.py"])
    args, _, _ = _validate_launch_command(args)
    assert isinstance(args, argparse.Namespace) and args.use_fsdp
    env = prepare_multi_gpu_env(args)
    assert env["ACCELERATE_USE_FSDP"] == "true" and env["FSDP_STATE_DICT_TYPE"] == "FULL_STATE_DICT"
    from esreason.backends.collective import environment

    with environment({k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_USE_FSDP"))}):
        plugin = FullyShardedDataParallelPlugin()
        assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
        assert "FULL_STATE_DICT" in str(plugin.state_dict_type)


FSDP_WORKER = r'''
import sys, torch, torch.distributed as dist
from pathlib import Path
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from esreason.backends.hf import load_model
from esreason.grpo.callbacks import write_hf_checkpoint
from esreason.grpo.distributed import full_state_dict, shutdown_process_group


def main(out: Path) -> None:  # the sharded model is a local: gone before the group is destroyed
    rank = dist.get_rank()
    model, tok = load_model("demo")
    mesh = init_device_mesh("cpu", (2,))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with torch.no_grad():  # each process changes only its own shard, by a different amount
        for p in model.parameters():
            p.to_local().add_(rank + 1.0)
    sd = full_state_dict(None, model)  # collective
    if rank == 0:
        write_hf_checkpoint(out, model, tok, {"step": 1}, state_dict=sd)
    else:
        assert sd == {}, sorted(sd)[:3]
    dist.barrier()


dist.init_process_group("gloo")
main(Path(sys.argv[1]))
shutdown_process_group()  # what every launched run ends with (a live FSDP module at exit aborted rank 1)
'''


def test_fsdp2_sharded_model_is_saved_as_a_full_hf_checkpoint(tmp_path):
    """Our checkpoint path under real FSDP2 sharding (fully_shard over a 2-process gloo CPU mesh):
    the full weights are gathered on rank 0 and load with from_pretrained. (accelerate itself does
    not run FSDP on the CPU, so the GRPO run is not launched sharded here.)"""
    import torch
    from transformers import AutoModelForCausalLM

    from esreason.backends.hf import load_model

    script = tmp_path / "fsdp_worker.py"
    script.write_text(FSDP_WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(_free_port()), str(script), str(tmp_path / "ckpt")]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    base, _ = load_model("demo")
    got, ref = loaded.state_dict(), base.state_dict()
    assert set(got) == set(ref)
    for name, w in ref.items():
        if name == "lm_head.weight":  # tied to the embedding
            continue
        rows0 = (w.shape[0] + 1) // 2  # FSDP2 shards dim 0 in torch.chunk order
        expected = w.clone()
        expected[:rows0] += 1.0
        expected[rows0:] += 2.0
        assert torch.allclose(got[name], expected), name


def test_shutdown_destroys_the_process_group_and_is_a_no_op_without_one(tmp_path):
    import torch.distributed as dist

    from esreason.grpo.distributed import shutdown_process_group

    shutdown_process_group()                                   # nothing initialised: no error
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    assert dist.is_initialized()
    shutdown_process_group(vllm_colocated=True)               # left to vLLM's exit handler
    assert dist.is_initialized()
    shutdown_process_group()
    assert not dist.is_initialized()


def test_shutdown_frees_a_ddp_module_held_in_a_reference_cycle(tmp_path):
    """The trainer holding the DDP module sits in a reference cycle after ``run_grpo`` returns; the
    shutdown collects it while the interpreter is alive, so gloo's group is not destroyed during
    finalisation (where it aborted rank 1 in CI). Fails without the ``gc.collect()``."""
    import gc
    import weakref

    import torch
    import torch.distributed as dist

    from esreason.grpo.distributed import shutdown_process_group

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    gc.disable()  # the test decides when cycles are collected
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))

        class Holder:  # a trainer-like object in a cycle with its callbacks
            def save(self):
                return self.model

        holder = Holder()
        holder.model = ddp
        holder.callbacks = [holder.save]  # the bound method refers back to the holder: a cycle
        alive = weakref.ref(ddp)
        del ddp, holder
        assert alive() is not None  # only the cyclic collector can free it
        shutdown_process_group()
        assert alive() is None and not dist.is_initialized()
    finally:
        gc.enable()
        if dist.is_initialized():
            dist.destroy_process_group()


def test_train_grpo_command_shuts_the_process_group_down_even_when_the_run_fails(monkeypatch):
    """Every launched process ends with destroy_process_group (gloo aborted at exit without it)."""
    import argparse

    from esreason.grpo import run as grpo_run

    calls = []
    monkeypatch.setattr(grpo_run, "shutdown_process_group", lambda **kw: calls.append("shutdown"))

    def failing(*args, **kwargs):
        raise UserError("boom")

    monkeypatch.setattr(grpo_run, "run_grpo", failing)
    args = argparse.Namespace(config=str(DEMO_CONFIG), set=[], output=None, resume=False,
                              no_progress=True, resume_from=None, accept_task_change=False)
    with pytest.raises(UserError, match="boom"):
        grpo_run._cmd_train_grpo(args)
    assert calls == ["shutdown"]
