"""The shipped 14B (TP = 2) and 32B (TP = 4) Easy experiments: planned on 8 x H100 with tensor-parallel
terms, ES and evaluation shown to fit by the memory plan (fake-tensor traces, no GPU), and GRPO at
32B (and 14B, with the paper's settings) refused with its numbers by the plan, ``experiment run`` and
the GRPO launcher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from esreason.errors import UserError
from esreason.experiments import memplan
from esreason.experiments import plan_terms as terms
from esreason.experiments.plan_tp import allreduce_s, kv_split, layout

ROOT = Path(__file__).resolve().parents[1]
H100 = memplan.GPU_MEMORY_GIB["h100"]
GIB = 2.0 ** 30
SIZES = {"14b": ("Qwen/Qwen2.5-14B-Instruct", 2, 4), "32b": ("Qwen/Qwen2.5-32B-Instruct", 4, 2)}


@pytest.fixture(scope="module")
def plans():
    from esreason.experiments.plan import build_plan
    from esreason.experiments.spec import load_spec

    return {size: json.loads(json.dumps(build_plan(load_spec(str(ROOT / f"configs/experiments/easy-qwen2.5-{size}.yaml"),
                                                              []), 8))) for size in SIZES}


def test_a_rank_holds_1_over_tp_and_draws_more():
    """Every tensor's elements once over the ranks; a rank draws whole row-parallel weights."""
    from esreason.io.architectures import architecture

    for model, tp, _ in SIZES.values():
        lay, arch = layout(model, tp), architecture(model)
        p, h, layers = lay["params"], arch["hidden_size"], arch["num_hidden_layers"]
        assert p / tp <= lay["held"] <= p / tp * 1.001  # norms replicated: +0.01 %
        # o_proj and down_proj are drawn whole on every rank, the other weights a band of their blocks plus at
        # most one partly used block at each end (5 column-parallel weights per layer, 2 vocabulary shards)
        row = layers * (h * h + h * arch["intermediate_size"]) / p
        low = row + (1 - row) / tp
        assert low < lay["drawn"] / p < low + 2 * 2 ** 22 * (5 * layers + 2) / p
        assert kv_split(model, tp) == tp  # 8 KV heads: the cache splits TP ways
    assert layout("Qwen/Qwen2.5-7B-Instruct", 1)["drawn"] == layout("Qwen/Qwen2.5-7B-Instruct", 1)["params"]


def test_tp_step_reads_a_shard_and_pays_two_all_reduces_per_layer(plans):
    from types import SimpleNamespace

    from esreason.experiments.plan_table import GPUS, CONSTANTS

    model = SIZES["32b"][0]
    ctx = SimpleNamespace(gpu=GPUS["h100"], params=layout(model, 1)["params"], kv_bytes=262144.0,
                          spec=SimpleNamespace(model=model), note=lambda a: a.value,
                          const=lambda k: CONSTANTS[k].value)
    one, four = terms.step_s(ctx, 64, 500, False), terms.step_s(ctx, 64, 500, False, tp=4)
    assert four == pytest.approx(one / 4, rel=0.01)  # weights and KV cache split 4 ways
    ar = allreduce_s(ctx, model, 64, 4)
    # 128 all-reduces (2 x 64 layers) of 64 x 5,120 bf16 values: latency + 2 (TP-1)/TP of 640 KiB at 450 GB/s
    assert ar == pytest.approx(128 * (10e-6 + 1.5 * 64 * 5120 * 2 / 4.5e11), rel=1e-9)
    assert allreduce_s(ctx, model, 64, 1) == 0.0
    for size, (_, tp, engines) in SIZES.items():
        es = next(s for s in plans[size]["stages"] if s["name"] == "train/es")
        assert f"{engines} vLLM engines (Ray pool, {tp} GPUs each, tensor parallel" in es["runs_on"]
        assert es["gpus"] == 8 and es["terms_s"]["allreduce"] > 0
        assert 0.05 < es["terms_s"]["allreduce"] / (es["terms_s"]["decode"] + es["terms_s"]["tail"]) < 0.3


def test_es_and_evaluation_fit_an_h100_at_14b_and_32b(plans):
    for size, (model, tp, _) in SIZES.items():
        for st in plans[size]["stages"]:
            if "grpo" in st["name"].rsplit("/", 1)[-1] and st["name"].startswith("train"):
                continue
            v = st["memory"]["verdicts"]["h100"]
            assert v["fits"], (size, st["name"], v)
            if st["name"].startswith("train"):  # the ES engines: their reservation and the trainer's GPU
                assert v["margin"] >= 0.10, (size, st["name"], v)
                share = next(r for r in st["memory"]["roles"] if r["role"].startswith("one engine's"))
                assert share["terms_gib"]["weights"] == pytest.approx(2 * layout(model, tp)["held"] / GIB, abs=0.01)


def test_grpo_at_32b_does_not_fit_one_node_and_the_launcher_refuses_it(plans, monkeypatch, tmp_path):
    from esreason.experiments import launch

    stage = next(s for s in plans["32b"]["stages"] if s["name"] == "train/grpo")
    v = stage["memory"]["verdicts"]["h100"]
    scoring = next(r for r in stage["memory"]["roles"] if r["role"] == "training process, scoring forward")
    assert not v["fits"] and v["total_gib"] > 2 * H100[1] and v["role"] == scoring["role"]
    # TRL wraps the reference as one FSDP unit: its forward all-gathers all 32.8B weights (bf16) on every process
    assert scoring["terms_gib"]["reference_gathered"] == pytest.approx(2 * 32_763_876_352 / GIB, rel=0.01)
    advice = stage["memory"]["advice"]
    assert advice["nodes_to_fit"] is None and advice["nodes_to_fit_beta0"] is not None  # beta 0: no reference
    assert "reference_gathered" in advice["at_max_nodes"]["unsharded_terms_gib"]
    assert any(n.startswith("train/grpo: does not fit NVIDIA H100 80GB") and "no number of nodes" in n
               and "with grpo.beta=0: `--nodes" in n for n in plans["32b"]["notes"])

    cfg = memplan.load_run_config(ROOT / "configs/easy/grpo-qwen2.5-32b.yaml")
    with pytest.raises(UserError, match=r"does not fit 8 x NVIDIA H100 80GB under FSDP: one training process, scoring "
                                        r"forward needs \d+\.\d GiB of 79\.1 .*grpo.beta=0 -> \d+\.\d GiB"):
        launch.check_grpo_fits(cfg, 8, "fsdp", H100)
    launched = []
    monkeypatch.setattr(launch, "stage_processes", lambda device: 8)
    monkeypatch.setattr(launch, "_sharding_for", lambda cfg: "fsdp")
    monkeypatch.setattr(launch, "_fit_gpu", lambda: H100)  # the GPU torch would see on the node
    monkeypatch.setattr(launch, "launch_grpo", lambda *a, **k: launched.append(k))
    monkeypatch.delenv(launch.FORCE_ENV, raising=False)
    with pytest.raises(UserError, match="GRPO for Qwen/Qwen2.5-32B-Instruct does not fit"):
        launch.train_grpo(cfg, tmp_path / "grpo", resume=False, progress=False)
    assert not launched and not (tmp_path / "grpo").exists()  # refused before anything started
    monkeypatch.setenv(launch.FORCE_ENV, "1")  # experiment run --force
    launch.train_grpo(cfg, tmp_path / "grpo", resume=False, progress=False)
    assert launched and launched[0]["sharding"] == "fsdp"
    fits = memplan.load_run_config(ROOT / "configs/easy/grpo-qwen2.5-7b.yaml")
    launch.check_grpo_fits(fits, 8, "fsdp", H100)  # the 7B config still starts


def test_grpo_at_14b_names_beta_and_the_reference_dtype_with_their_figures_and_the_nodes_that_fit(plans):
    """The 14B plan on one node: the refusal names only keys that change the figure, each with it, and the nodes
    on which the paper's settings fit; `--nodes` plans it there."""
    from esreason.experiments.plan import build_plan
    from esreason.experiments.spec import load_spec

    stage = next(s for s in plans["14b"]["stages"] if s["name"] == "train/grpo")
    v, advice = stage["memory"]["verdicts"]["h100"], stage["memory"]["advice"]
    assert not v["fits"]
    alt = {a["set"]: a for a in advice["alternatives"]}
    assert set(alt) <= {"grpo.beta=0", "grpo.reference_dtype=bfloat16", "grpo.micro_batch_size=1"}
    assert alt["grpo.beta=0"]["fits"] and alt["grpo.beta=0"]["total_gib"] < v["total_gib"]
    assert v["total_gib"] - alt["grpo.reference_dtype=bfloat16"]["total_gib"] == pytest.approx(
        14_770_033_664 * 2 / 8 / GIB * 1.1, rel=0.05)  # its shard halves (fp32 -> bf16), with fragmentation
    assert "grpo.gradient_checkpointing=true" not in alt  # already set: it would not change the figure
    nodes = advice["nodes_to_fit"]
    assert nodes is not None and nodes > 1
    note = next(n for n in plans["14b"]["notes"] if n.startswith("train/grpo: does not fit"))
    assert f"grpo.beta=0 -> {alt['grpo.beta=0']['total_gib']:.1f} GiB (fits)" in note and f"`--nodes {nodes}`" in note
    multi = build_plan(load_spec(str(ROOT / "configs/experiments/easy-qwen2.5-14b.yaml"), ["methods=[grpo]"]), 8,
                       nodes=nodes)
    grpo = next(s for s in multi["stages"] if s["name"] == "train/grpo")
    assert grpo["gpus"] == grpo["gpus_held"] == 8 * nodes and f"{nodes} nodes" in grpo["runs_on"]
    assert grpo["memory"]["verdicts"]["h100"]["fits"] and multi["nodes"] == nodes


def test_experiment_run_refuses_the_32b_experiment_naming_the_grpo_stage(tmp_path):
    out = tmp_path / "exp"
    run = subprocess.run([sys.executable, "-m", "esreason.cli", "experiment", "run",
                          str(ROOT / "configs/experiments/easy-qwen2.5-32b.yaml"), "--assume-gpu", "h100",
                          "--output", str(out)], capture_output=True, text=True)
    assert run.returncode == 2, run.stderr
    line = run.stderr.strip().splitlines()[-1]
    assert "stage train (grpo) does not fit NVIDIA H100 80GB" in line and "GiB of 79.1" in line and "--force" in line
    assert not out.exists()
