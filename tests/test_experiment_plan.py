"""``esreason experiment plan`` and the paper configs' layout.

The plan runs on the CPU from the shipped experiment files (hub ids resolve offline through the
known parameter counts); its numbers come from esreason.experiments.plan_table, so the tests check
the model (responses, tokens, stage layout, sums, sources), not the throughput values.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from esreason.errors import UserError
from esreason.experiments import plan_table as tab
from esreason.experiments.plan import build_plan, hf_only
from esreason.experiments.spec import load_spec

ROOT = Path(__file__).resolve().parents[1]
EXPERIMENTS = ROOT / "configs" / "experiments"
EASY_MODELS = {"Qwen/Qwen2.5-1.5B-Instruct", "meta-llama/Llama-3.2-3B-Instruct", "Qwen/Qwen2.5-7B-Instruct",
               "Qwen/Qwen2.5-14B-Instruct", "Qwen/Qwen2.5-32B-Instruct"}
EASY_PROBLEMS = 1319 + 1221 + 7405 + 1000 + 198 + 257  # gsm8k, csqa, hotpotqa, countdown, gpqa, mbpp


@pytest.fixture(scope="module")
def easy():
    return load_spec(EXPERIMENTS / "easy.yaml")


def _paper_specs():
    os.environ.setdefault("ESREASON_HARD_GRPO_CHECKPOINT", "org/released-grpo")
    return {p.name: load_spec(p) for p in sorted(EXPERIMENTS.glob("*.yaml")) if not p.name.startswith("demo")}  # demo*.yaml: CPU demos


ONE_AND_A_HALF_B = {"Qwen/Qwen2.5-1.5B-Instruct", "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"}


def test_paper_configs_resolve_to_the_vllm_layouts():
    specs = _paper_specs()
    assert {s.model for n, s in specs.items() if n.startswith("easy")} == EASY_MODELS
    for name, spec in specs.items():
        es, grpo, ev = spec.es, spec.grpo, spec.eval
        # every GPU of the node: engines x GPUs per engine (tensor parallel at 14B and 32B)
        tp = es.backend.tensor_parallel_size
        # 1.5B: several engines per GPU (auto), whose update cannot be the sharded one (NCCL); else one per GPU
        update = "replicated" if spec.model in ONE_AND_A_HALF_B else "sharded"
        assert (es.backend.type, es.backend.engines * tp, es.backend.update) == ("ray", 8, update), name
        assert es.backend.engines_per_gpu == "auto", name
        assert es.dtype == "bfloat16" and es.device == "cuda", name
        assert grpo.grpo.use_vllm and grpo.grpo.vllm_mode == "colocate" and grpo.device == "cuda", name
        assert (ev.backend, ev.engines * ev.tensor_parallel_size) == ("vllm", 8), name
        assert tp == ev.tensor_parallel_size == {"Qwen/Qwen2.5-14B-Instruct": 2, "Qwen/Qwen2.5-32B-Instruct": 4}.get(
            spec.model, 1), name
        assert es.model == grpo.model == spec.model, name


def test_one_gpu_variant_is_the_same_run_on_one_engine():
    from esreason.config import load_config, to_dict

    pool = to_dict(load_config(ROOT / "configs" / "easy" / "es-qwen2.5-1.5b.yaml"))
    one = to_dict(load_config(ROOT / "configs" / "easy" / "es-qwen2.5-1.5b-1gpu.yaml"))
    assert one.pop("backend")["type"] == "vllm" and pool.pop("backend")["type"] == "ray"
    assert one == pool


def test_easy_plan_on_8_gpus_runs_every_generation_on_vllm(easy):
    plan = json.loads(json.dumps(build_plan(easy, 8)))  # JSON-able
    assert {"stages", "total_gpu_hours", "wall_hours", "assumptions"} <= set(plan)
    names = [s["name"] for s in plan["stages"]]
    assert names == ["eval/base", "train/grpo", "eval/grpo", "train/es", "eval/es", "train/es_grpo/stage1_es",
                     "train/es_grpo/stage2_grpo", "eval/es_grpo", "train/grpo_es/stage1_grpo",
                     "train/grpo_es/stage2_es", "eval/grpo_es"]
    for s in plan["stages"]:
        assert {"name", "runs_on", "responses", "tokens", "gpu_hours"} <= set(s)
        assert "vLLM" in s["runs_on"] and s["gpus"] == 8, s
        assert s["memory_gib_per_gpu"] and all(0 < v <= 80 for v in s["memory_gib_per_gpu"].values()), s
    by = {s["name"]: s for s in plan["stages"]}
    assert by["train/es"]["responses"] == 232 * 32 * 64
    assert by["train/grpo"]["responses"] == 232 * 64 * 8
    assert by["train/es_grpo/stage1_es"]["responses"] == 116 * 32 * 64
    assert by["eval/es"]["responses"] == EASY_PROBLEMS * 33  # 32 samples + 1 greedy
    from esreason.experiments.lengths import LengthModel

    mean = LengthModel(250, 0.6, tab.RUNAWAY_SHARE["instruct"].value).mean(2048)  # with a share at the cap
    assert by["eval/es"]["tokens"] == pytest.approx(EASY_PROBLEMS * 33 * mean, abs=1)
    # engines_per_gpu: auto -> 2 per H100 with the replicated update (memplan_engines: 4 would leave 6 % free,
    # 3 run the members in as many rounds as 2)
    assert "16 vLLM engines (Ray pool, 2 per GPU on 8 GPUs; replicated update)" in by["train/es"]["runs_on"]
    assert "8 processes" in by["train/grpo"]["runs_on"]
    assert plan["total_gpu_hours"] == pytest.approx(sum(s["gpu_hours"] for s in plan["stages"]), abs=0.05)
    assert plan["wall_hours"] == pytest.approx(sum(s["wall_hours"] for s in plan["stages"]), abs=0.05)
    for a in plan["assumptions"]:
        assert a["source"].split(":")[0] in ("published", "cited", "datasheet", "dataset", "derived", "assumption",
                                             "assumption (ours)", "esreason default", "measured",
                                             "measured on one H100"), a
    keys = {a["key"] for a in plan["assumptions"]}
    assert {"throughput.h100.1.5b.vllm", "decode_step_floor_s", "response_tokens.instruct"} <= keys


def test_hf_only_projection_is_the_same_work_slower(easy):
    fast, slow = build_plan(easy, 8), build_plan(hf_only(easy), 8)
    assert [s["responses"] for s in fast["stages"]] == [s["responses"] for s in slow["stages"]]
    assert all("vLLM" not in s["runs_on"] for s in slow["stages"])
    assert slow["wall_hours"] > 10 * fast["wall_hours"]
    ev = next(s for s in slow["stages"] if s["name"] == "eval/es")
    assert ev["gpus"] == 1 and ev["runs_on"].startswith("HF")


def test_fewer_gpus_than_engines_is_planned_with_a_note(easy):
    plan = build_plan(easy, 4)
    assert any("backend.engines=8 but only 4 GPUs" in n for n in plan["notes"])
    assert all(s["gpus"] == 4 for s in plan["stages"])
    assert plan["wall_hours"] > build_plan(easy, 8)["wall_hours"]
    odd = build_plan(easy, 3)  # 3 processes cannot split GRPO's 256-sequence optimizer step
    assert any(n.startswith("train/grpo: on 3 processes the run would stop: config key 'grpo.micro_batch_size'")
               for n in odd["notes"])


def test_larger_models_shard_grpo_and_cost_more():
    specs = _paper_specs()
    plans = {n: build_plan(s, 8) for n, s in specs.items() if n.startswith("easy")}
    grpo = {n: next(s for s in p["stages"] if s["name"] == "train/grpo") for n, p in plans.items()}
    assert "(DDP)" in grpo["easy.yaml"]["runs_on"]
    assert "(FSDP)" in grpo["easy-llama-3.2-3b.yaml"]["runs_on"] and "(FSDP)" in grpo["easy-qwen2.5-7b.yaml"]["runs_on"]
    assert plans["easy.yaml"]["total_gpu_hours"] < plans["easy-qwen2.5-7b.yaml"]["total_gpu_hours"]
    # memory per GPU: the 7B masters leave the engines' GPUs; GPU 0's trainer copy is flagged
    notes = plans["easy-qwen2.5-7b.yaml"]["notes"]
    assert any("fp32 masters in pinned host memory" in n for n in notes)
    # The trainer's reference lives in host memory beside GPU engines: GPU 0 fits at 7B too.
    assert not any("gpu0_with_trainer needs" in n for n in notes)
    es7 = next(s for s in plans["easy-qwen2.5-7b.yaml"]["stages"] if s["name"] == "train/es")
    assert es7["memory_gib_per_gpu"]["gpu0_with_trainer"] < 80 < es7["memory_gib_per_gpu"]["trainer_host"] + 48
    assert plans["easy.yaml"]["notes"] == ["ES stages: backend.engines_per_gpu: auto -> 2 on NVIDIA H100 80GB "
                                           "(memory: 4 engines would leave 6 % of GPU 0: ES engines + trainer free (at least 10 %); 2 per GPU run the 32 members in the same 2 rounds as 3)"]
    hard = build_plan(specs["hard.yaml"], 8)
    assert any(a["key"] == "response_tokens.r1-distill" for a in hard["assumptions"])


def test_engine_memory_fraction_is_the_engines_default():
    from esreason.backends.vllm import VLLMEngineOptions

    assert tab.CONSTANTS["engine_memory_fraction"].value == VLLMEngineOptions().gpu_memory_utilization


def test_bad_input_is_one_clear_error(easy):
    with pytest.raises(UserError, match="--gpus"):
        build_plan(easy, 0)
    with pytest.raises(UserError, match="--nodes: expected an integer >= 1"):
        build_plan(easy, 8, nodes=0)
    with pytest.raises(UserError, match="unknown GPU type 'tpu'"):
        build_plan(easy, 8, "tpu")
    with pytest.raises(UserError, match="no throughput assumption for a model of 0.00087B.*--calibrate"):
        tab.size_class(870_000)  # the embedded default: a CPU model, outside the GPU table
    with pytest.raises(UserError, match="no known test size for task 'demo-add'"):
        tab.test_size("demo-add")


def test_cli_prints_the_same_object(capsys):
    from esreason.cli import main

    assert main(["experiment", "plan", str(EXPERIMENTS / "easy.yaml"), "--gpus", "8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == json.loads(json.dumps(build_plan(load_spec(EXPERIMENTS / "easy.yaml"), 8)))
    assert main(["experiment", "plan", str(EXPERIMENTS / "easy.yaml"), "--gpus", "8", "--hf-only"]) == 0
    text = capsys.readouterr().out
    assert "HF transformers sampler" in text and "assumptions:" in text and "GPU-hours" in text
    # compute as spent per training stage: the paper's Easy GRPO runs 7 forward-equivalents per token
    assert "compute as spent per training stage" in text
    assert "train/grpo" in text.split("compute as spent")[1] and "7 per token (sample 1, forward 1, backward 2" in text


def test_nodes_plan_grpo_on_every_gpu_of_every_node(easy):
    """`--nodes 2`: GRPO on 2 x 8 processes, ES and evaluation on one node. A 1.5B replica fits each GPU with
    DDP's margin, so the launcher keeps DDP and every GPU holds what it holds on one node."""
    one, two = build_plan(easy, 8), build_plan(easy, 8, nodes=2)
    grpo1, grpo2 = (next(s for s in p["stages"] if s["name"] == "train/grpo") for p in (one, two))
    assert (grpo2["gpus"], grpo2["gpus_held"], two["nodes"]) == (16, 16, 2) and "2 nodes" in grpo2["runs_on"]
    es1, es2 = (next(s for s in p["stages"] if s["name"] == "train/es") for p in (one, two))
    assert es1["gpus"] == es2["gpus"] == 8 and es1["wall_hours"] == es2["wall_hours"]
    assert "16 processes (DDP)" in grpo2["runs_on"]
    assert grpo2["memory"]["verdicts"]["h100"]["total_gib"] == grpo1["memory"]["verdicts"]["h100"]["total_gib"]
    assert grpo2["compute"] == grpo1["compute"]  # the same work, spread over more GPUs
    assert grpo2["terms_s"]["train"] < grpo1["terms_s"]["train"]  # each process trains on half as many responses


def test_periodic_heldout_evaluation_is_counted():
    """eval.every adds (T // every + 1) evaluations of eval.limit problems x eval.samples responses."""
    spec = load_spec(EXPERIMENTS / "easy.yaml", ["configs.es.eval.every=58", "configs.es.eval.tasks=[gpqa]",
                                                 "configs.es.eval.limit=100", "configs.es.eval.samples=4",
                                                 "configs.es.eval.ks=[1,4]"])
    by = {s["name"]: s for s in build_plan(spec, 8)["stages"]}
    assert by["train/es"]["responses"] == 232 * 32 * 64 + (232 // 58 + 1) * 100 * 4
    assert by["train/grpo"]["responses"] == 232 * 64 * 8  # GRPO's eval.every stays 0


def test_seeds_multiply_every_trained_method_and_not_the_base(easy):
    """`--set seeds=[0,1,2]` plans every seed of every trained method, not the one-seed plan."""
    import dataclasses

    one = build_plan(easy, 8)
    three = build_plan(dataclasses.replace(easy, seeds=(0, 1, 2)), 8)
    base = [s for s in three["stages"] if s["name"] == "eval/base"]
    assert len(base) == 1  # no training seed: evaluated once
    trained = [s for s in one["stages"] if s["name"] != "eval/base"]
    for seed in (0, 1, 2):
        names = [s["name"] for s in three["stages"] if s["name"].startswith(f"seed{seed}/")]
        assert names == [f"seed{seed}/{s['name']}" for s in trained]
    base_h = base[0]["gpu_hours"]
    assert three["total_gpu_hours"] == pytest.approx(base_h + 3 * (one["total_gpu_hours"] - base_h), abs=0.05)


def test_every_stage_lists_its_time_terms_and_its_wall_time_is_their_sum(easy):
    """The tail, entropy, start, checkpoint and checksum terms, per stage."""
    plan = build_plan(easy, 8)
    for s in plan["stages"]:
        terms = s["terms_s"]
        assert {"start", "decode", "tail"} <= set(terms), s["name"]
        assert terms["tail"] > 0 and terms["start"] > 0, s["name"]
        assert s["wall_hours"] * 3600 == pytest.approx(sum(terms.values()), abs=0.1 * len(terms) + 2)
        if s["name"].startswith("eval/"):
            assert terms["entropy"] > 0 and terms["mbpp"] > 0  # the Easy suites include MBPP
        elif s["name"].endswith("_es") or s["name"] == "train/es":
            assert terms["checksum"] > 0 and terms["checkpoint"] > 0 and terms["update"] > 0
        else:
            assert terms["train"] > 0 and terms["checkpoint"] > 0
    text = __import__("esreason.experiments.plan", fromlist=["render"]).render(plan)
    assert "time terms per stage (s)" in text and "tail" in text


def test_entropy_pass_forwards_prompt_and_response():
    """HotpotQA's long prompts cost the entropy pass more than a short-prompt task's: each prompt is
    forwarded once for its samples (the scorer's shared prompts), every response token once."""
    def entropy(task: str) -> float:
        spec = load_spec(EXPERIMENTS / "easy.yaml", [f"eval.in_domain=[{task}]", f"eval.held_out=[{task}]", "report.pairs=[]",
                                                             "eval.limit=1000"])
        ev = next(s for s in build_plan(spec, 8)["stages"] if s["name"] == "eval/base")
        return ev["terms_s"]["entropy"]

    mean = tab.RESPONSE_TOKENS["instruct"].value
    samples = load_spec(EXPERIMENTS / "easy.yaml", []).eval.samples
    ratio = ((tab.PROMPT_TOKENS["hotpotqa"].value + samples * mean) /
             (tab.PROMPT_TOKENS["gsm8k"].value + samples * mean))
    assert entropy("hotpotqa") / entropy("gsm8k") == pytest.approx(ratio, rel=0.02)


def test_expected_longest_matches_a_simulation():
    """plan_table.expected_longest against 20,000 simulated batches per case (lognormal lengths)."""
    import numpy as np

    rng = np.random.default_rng(0)
    for mean, cv, n, cap in ((250, 0.6, 1, 10_000), (250, 0.6, 64, 1024), (250, 0.6, 256, 10_000),
                             (4000, 0.5, 8, 8192)):
        s2 = np.log1p(cv * cv)
        draws = rng.lognormal(np.log(mean) - s2 / 2, np.sqrt(s2), size=(20_000, n))
        simulated = np.minimum(draws.max(axis=1), cap).mean()
        assert tab.expected_longest(mean, cv, n, cap) == pytest.approx(simulated, rel=0.02), (mean, cv, n, cap)
    assert tab.expected_longest(250, 0.6, 64, 1024) > 2 * 250  # the longest of 64 is far above the mean
    assert tab.expected_longest(250, 0.6, 10_000, 512) == pytest.approx(512, rel=1e-3)  # capped


def test_hf_only_charges_every_gpu_the_node_holds(easy):
    slow = build_plan(hf_only(easy), 8)
    ev = next(s for s in slow["stages"] if s["name"] == "eval/es")
    assert ev["gpus"] == 1 and ev["gpus_held"] == 8
    assert ev["gpu_hours"] == pytest.approx(8 * ev["wall_hours"], rel=0.01)
    assert any("shard it yourself" in n for n in slow["notes"])


def _write_responses(path: Path, lengths, greedy_lengths=()) -> None:
    path.mkdir(parents=True, exist_ok=True)
    rows = [{"problem_id": f"p{i}", "sample": 0, "greedy": False, "num_tokens": n} for i, n in enumerate(lengths)]
    rows += [{"problem_id": f"g{i}", "sample": -1, "greedy": True, "num_tokens": n} for i, n in enumerate(greedy_lengths)]
    (path / "responses.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_measured_lengths_replace_the_assumed_distribution(tmp_path, easy):
    """The tail from a run's own records (order statistics of its sampled lengths)."""
    import numpy as np

    from esreason.experiments.lengths import read_lengths

    rng = np.random.default_rng(1)
    lengths = [int(x) for x in rng.integers(20, 600, size=3000)]
    _write_responses(tmp_path / "eval" / "es" / "gsm8k", lengths[:2000], greedy_lengths=[5000] * 50)
    _write_responses(tmp_path / "eval" / "base" / "gsm8k", lengths[2000:])
    recorded = read_lengths(tmp_path)
    measured = recorded.eval
    assert recorded.train is None and len(measured.lengths) == 3000  # greedy rows left out
    assert measured.mean(10_000) == pytest.approx(np.mean(lengths))
    draws = np.array(lengths)[rng.integers(0, 3000, size=(20_000, 64))].max(axis=1)
    assert measured.longest(64, 10_000) == pytest.approx(draws.mean(), rel=0.01)
    assert measured.longest(64, 300) == pytest.approx(np.minimum(draws, 300).mean(), rel=0.01)

    plan = build_plan(easy, 8, lengths=recorded)
    by = {s["name"]: s for s in plan["stages"]}
    assert by["eval/es"]["tokens"] == round(EASY_PROBLEMS * 33 * np.mean(lengths))
    keys = {a["key"]: a for a in plan["assumptions"]}
    assert keys["response_tokens.measured.eval"]["source"].startswith("measured:")  # every stage: no training lengths
    assert "response_cv.instruct" not in keys  # the tail came from the records, not the lognormal
    default = {s["name"]: s for s in build_plan(easy, 8)["stages"]}
    assert by["train/es"]["terms_s"]["tail"] != default["train/es"]["terms_s"]["tail"]


def test_bad_lengths_input_is_one_clear_error(tmp_path):
    from esreason.experiments.lengths import read_lengths

    with pytest.raises(UserError, match="is not a directory"):
        read_lengths(tmp_path / "missing")
    with pytest.raises(UserError, match="no recorded lengths"):
        read_lengths(tmp_path)
    (tmp_path / "responses.jsonl").write_text('{"num_tokens": 3}\nnot json\n')
    with pytest.raises(UserError, match=r"responses.jsonl row 2: not a response record"):
        read_lengths(tmp_path)
    (tmp_path / "responses.jsonl").write_text('{"num_tokens": -1}\n')
    with pytest.raises(UserError, match=r"row 1: num_tokens must be an integer >= 0, got -1"):
        read_lengths(tmp_path)
