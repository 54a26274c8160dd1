"""Memory proven at the real shapes: the fake-tensor tracer against a measurement on this
CPU, its layer extrapolation, the architecture files, the plan's verdicts and the run's refusal."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from esreason.experiments import memplan
from esreason.io.architectures import architecture, hf_config, known, parameter_count
from esreason.experiments.memtrace import trace_forward, trace_grpo_microstep, trace_grpo_scoring

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.heavy  # CLI subprocesses and real-shape traces (about 80 s on one worker)
MIB = 2.0 ** 20

#: A small real Qwen2-shaped model (23 MiB of fp32 weights) whose step we can run and measure here.
SMALL = {"model_type": "qwen2", "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 4,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 8192, "max_position_embeddings": 2048,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": True}


def _allocated_peak(step) -> int:
    """Peak bytes the CPU allocator holds during ``step()`` beyond what was allocated before it, from
    the profiler's allocation events (each carries the allocator's running total; not RSS)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    allocs = []

    def walk(nodes):
        for node in nodes:
            if node.tag == _EventType.Allocation:
                allocs.append(node.extra_fields.total_allocated)
            walk(node.children)

    walk(prof.profiler.kineto_results.experimental_event_tree())
    assert allocs, "the profiler recorded no allocation"
    return max(allocs)


def _state_bytes(*objs) -> int:
    seen, total = set(), 0
    for obj in objs:
        tensors = []
        if isinstance(obj, torch.nn.Module):
            tensors = [p for p in obj.parameters()] + [p.grad for p in obj.parameters() if p.grad is not None]
        elif isinstance(obj, torch.optim.Optimizer):
            tensors = [v for st in obj.state.values() for v in st.values() if torch.is_tensor(v)]
        for t in tensors:
            key = t.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
    return total


def test_traced_grpo_microstep_matches_the_measured_peak_within_ten_percent():
    from transformers import AutoModelForCausalLM

    from esreason.grpo.objective import completion_logprobs, grpo_loss

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(hf_config(SMALL), dtype=torch.float32).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for p in model.parameters():  # steady state, as traced: gradients and AdamW states exist
        p.grad = torch.zeros_like(p)
    opt.step()
    n, plen, clen = 2, 64, 448
    prompt, completion = torch.randint(0, 8192, (n, plen)), torch.randint(0, 8192, (n, clen))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp = completion_logprobs(model, prompt, torch.ones_like(prompt), completion, torch.ones_like(completion))
        grpo_loss(logp, logp.detach(), torch.zeros(n), torch.ones_like(completion)).loss.backward()

    step()  # warm (lazy initialisations) outside the measurement
    measured = _allocated_peak(step) + _state_bytes(model, opt)
    traced = trace_grpo_microstep(SMALL, micro_batch=n, prompt_len=plen, completion_len=clen, extrapolate=False)
    print({"measured_mib": measured / MIB, "traced_mib": traced.total / MIB})
    assert traced.total == pytest.approx(measured, rel=0.10)


def test_traced_scorer_forward_matches_the_measured_peak_within_ten_percent():
    from transformers import AutoModelForCausalLM

    from esreason.backends import topp

    model = AutoModelForCausalLM.from_config(hf_config(SMALL), dtype=torch.float32).eval()
    ids = torch.randint(0, 8192, (4, 512))

    def step():
        with torch.inference_mode():
            hidden = model.get_decoder()(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state
            logits = model.get_output_embeddings()(hidden[0, :256])
            topp.entropy(topp.scaled_log_probs(logits, 0.6)).double().sum()

    step()
    measured = _allocated_peak(step) + _state_bytes(model)
    traced = trace_forward(SMALL, batch=4, seq_len=512, dtype="float32", kind="scorer")
    print({"measured_mib": measured / MIB, "traced_mib": traced.total / MIB})
    assert traced.total == pytest.approx(measured, rel=0.10)


@pytest.mark.parametrize("checkpointing, sharding", [(False, "ddp"), (True, "ddp"), (True, "fsdp")])
def test_layer_extrapolation_equals_a_direct_trace(checkpointing, sharding):
    kw = dict(micro_batch=2, prompt_len=32, completion_len=96, beta=0.001, gradient_checkpointing=checkpointing,
              sharding=sharding, processes=4)
    layers = 5 if sharding == "ddp" else 6  # FSDP: its in-flight buffers settle from the third unit on
    direct = trace_grpo_microstep({**SMALL, "num_hidden_layers": layers}, extrapolate=False, **kw)
    linear = trace_grpo_microstep({**SMALL, "num_hidden_layers": layers}, extrapolate=True, **kw)
    assert linear == direct
    if sharding == "fsdp":  # the scoring forward gathers TRL's reference whole: it too grows alike per layer
        kw.pop("gradient_checkpointing")
        assert trace_grpo_scoring({**SMALL, "num_hidden_layers": layers}, extrapolate=False, **kw) == \
            trace_grpo_scoring({**SMALL, "num_hidden_layers": layers}, extrapolate=True, **kw)


def test_fsdp_trace_shards_the_policy_and_gathers_trls_reference_whole():
    """Under FSDP over P ranks a process holds 1/P of the policy, its gradients, AdamW states and the reference
    (DTensor shards, padded to the rank count); the scoring forward all-gathers the whole reference at once, as
    TRL's prepare_fsdp wraps it as one unit, in bf16 (accelerate's mixed-precision policy under bf16)."""
    arch, p = {**SMALL, "num_hidden_layers": 3}, 4
    full = parameter_count(arch)
    kw = dict(micro_batch=2, prompt_len=32, completion_len=96, beta=0.001, master_dtype="float32",
              autocast="bfloat16", extrapolate=False)
    replica = trace_grpo_microstep(arch, **kw)
    sharded = trace_grpo_microstep(arch, sharding="fsdp", processes=p, **kw)
    assert replica.reference == 4 * full and sharded.reference == pytest.approx(4 * full / p, rel=0.01)
    assert sharded.optimizer == pytest.approx(replica.optimizer / p, rel=0.01)
    scoring = trace_grpo_scoring(arch, sharding="fsdp", processes=p, **kw)
    assert scoring.gathered == pytest.approx(2 * full, rel=0.01) and scoring.gradients == 0
    bf16 = trace_grpo_scoring(arch, sharding="fsdp", processes=p, reference_dtype="bfloat16", **kw)
    assert bf16.reference == pytest.approx(scoring.reference / 2, rel=0.01)
    none = trace_grpo_microstep(arch, sharding="fsdp", processes=p, **{**kw, "beta": 0.0})
    assert none.reference == 0


def test_architecture_files_give_the_known_parameter_counts():
    from esreason.accounting.flops import KNOWN_PARAMS

    assert set(known()) == set(KNOWN_PARAMS)
    for model, params in KNOWN_PARAMS.items():
        assert parameter_count(architecture(model)) == params, model
    with pytest.raises(Exception, match="no architecture for model 'nope/nope'"):
        architecture("nope/nope")


#: Shipped configs that do not fit one node of 8 x H100 (the plan says so with its numbers and the GRPO
#: launcher refuses them: tests/test_tp_plan.py): full-parameter GRPO at 14B and 32B under FSDP, whose KL
#: reference TRL all-gathers whole in its forward.
BEYOND_ONE_NODE = ("grpo-qwen2.5-14b.yaml", "grpo-qwen2.5-32b.yaml")


def test_every_shipped_gpu_config_fits_an_h100_with_ten_percent_margin():
    gib = memplan.GPU_MEMORY_GIB["h100"][1]
    paths = sorted(glob.glob(str(ROOT / "configs" / "easy" / "*.yaml")) + glob.glob(str(ROOT / "configs" / "hard" / "*.yaml")))
    assert len(paths) >= 9 and all((ROOT / "configs" / "easy" / name).is_file() for name in BEYOND_ONE_NODE)
    for path in (p for p in paths if os.path.basename(p) not in BEYOND_ONE_NODE):
        from esreason.experiments.memplan_engines import resolve

        cfg = resolve(memplan.load_run_config(path), gib)  # engines_per_gpu: auto, as a run on an H100 resolves it
        gpus = 1 if "1gpu" in path else 8
        roles = memplan.run_config_roles(cfg, gpus, gib)
        assert roles, path
        v = memplan.verdict(roles, gib)
        assert v["fits"] and v["margin"] >= 0.10, (path, v, memplan.roles_json(roles))


def _plan(name: str) -> dict:
    """``esreason experiment plan configs/experiments/NAME.yaml --gpus 8 --json``, in-process (the
    traces are cached per process, so the tests of this file trace each shape once)."""
    from esreason.experiments.plan import build_plan
    from esreason.experiments.spec import load_spec

    return json.loads(json.dumps(build_plan(load_spec(str(ROOT / "configs/experiments" / f"{name}.yaml"), []), 8)))


@pytest.fixture(scope="module")
def easy_plan():
    return _plan("easy")


def test_plan_gives_every_stage_named_terms_and_a_verdict_per_gpu(easy_plan):
    stages = easy_plan["stages"]
    assert {s["name"] for s in stages} >= {"train/grpo", "train/es", "eval/base"}
    for s in stages:
        mem = s["memory"]
        assert mem["on_gpu"] is True
        assert set(mem["verdicts"]) >= {"h100", "a100-40", "a100-80", "h200"}
        h100 = mem["verdicts"]["h100"]
        assert h100["fits"] and h100["margin"] >= 0.10, (s["name"], h100)
        for role in mem["roles"]:
            assert role["total_gib"] == pytest.approx(sum(role["terms_gib"].values()), abs=0.1)
    grpo = next(s for s in stages if s["name"] == "train/grpo")["memory"]["roles"][0]["terms_gib"]
    assert {"parameters", "gradients", "optimizer", "ddp_buckets", "cuda_context", "vllm"} <= set(grpo)


def test_the_7b_experiment_does_not_fit_an_a100_40gb_and_run_refuses_before_starting(tmp_path):
    spec = str(ROOT / "configs/experiments/easy-qwen2.5-7b.yaml")
    plan = _plan("easy-qwen2.5-7b")
    v = next(s for s in plan["stages"] if s["name"] == "train/grpo")["memory"]["verdicts"]["a100-40"]
    assert any("train/grpo: does not fit" in n for n in plan["notes"]) is False  # the plan's GPU is an H100
    assert not v["fits"] and v["term"] and v["key"] != "-"
    out = tmp_path / "exp"
    run = subprocess.run([sys.executable, "-m", "esreason.cli", "experiment", "run", spec, "--assume-gpu", "a100-40",
                          "--output", str(out)], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert "stage train (grpo) does not fit NVIDIA A100 40GB" in line and v["term"] in line and "--force" in line
    assert not out.exists()  # refused before anything was written


def test_every_gpu_stage_plans_host_ram_pinned_memory_and_disk_per_node():
    """The host side, at 7B on 8 GPUs: the masters each engine pins are exactly their bytes
    (backends/pinned.PinnedArena; one tensor at a time they rounded to about twice that), the start
    state is on disk once per node, and under FSDP only rank 0 reads the policy (TRL's reference is
    read by every process)."""
    from esreason.io.architectures import architecture, parameter_count

    plan = _plan("easy-qwen2.5-7b")
    params = parameter_count(architecture("Qwen/Qwen2.5-7B-Instruct"))
    gib = 2.0 ** 30
    for s in plan["stages"]:
        host = s["memory"]["host"]
        assert host["host_ram_total_gib"] == pytest.approx(sum(host["host_ram_gib"].values()), abs=0.1)
        assert host["disk_total_gib"] == pytest.approx(sum(host["disk_gib"].values()), abs=0.1)
        assert host["host_fits"] and set(host["keys"]) >= set(host["host_ram_gib"]) | set(host["disk_gib"])
    es = next(s for s in plan["stages"] if s["name"] == "train/es")["memory"]["host"]
    assert es["pinned_gib"]["engine_masters"] == pytest.approx(8 * 4 * params / gib, rel=1e-3)
    assert es["pinned_gib"]["engine_masters"] == es["host_ram_gib"]["engine_masters_pinned"]  # pinned is host RAM
    assert es["disk_gib"]["start_state"] == pytest.approx((2 + 4) * params / gib, rel=1e-3)  # once, not 8 times
    # the trainer holds the start state's bytes while the engines start (backends.engine.policy_state)
    assert es["host_ram_gib"]["trainer_start_state"] == pytest.approx((2 + 4) * params / gib, rel=1e-3)
    grpo = next(s for s in plan["stages"] if s["name"] == "train/grpo")
    assert "(FSDP)" in grpo["runs_on"]
    host = grpo["memory"]["host"]["host_ram_gib"]
    assert host["load_policy"] == pytest.approx(4 * params / gib, rel=1e-3)  # rank 0 only
    assert host["load_reference"] == pytest.approx(8 * 4 * params / gib, rel=1e-3)
    assert set(plan["host_terms"]) >= {"process", "vllm_engine_process", "node_ram"}
