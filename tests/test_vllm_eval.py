"""Evaluation on engines (``--backend vllm``) without vLLM: teacher-forced entropy, fan-out, files, resume.

The real vLLM engine is exercised by the opt-in ``pytest -m vllm`` twin checks
(tests/test_vllm_eval_twin.py). Here the same :class:`EngineGenerator` runs over the HF
engine (:class:`HFEvalEngine`: our sampler, one seed per row), in process and as two Ray
actors, on the embedded default.
"""

from __future__ import annotations

import json
import os
import sys
import types

import numpy as np
import pytest

from esreason.errors import UserError

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py


@pytest.fixture(scope="module")
def demo():
    from esreason.backends.hf import load_model

    return load_model("demo")


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_teacher_forced_entropy_equals_the_sampler_on_its_responses(demo, tmp_path):
    """Score the responses the HF harness wrote; compare with the entropy it recorded while sampling."""
    from esreason import tasks
    from esreason.eval.harness import evaluate
    from esreason.backends.scoring import EntropyScorer

    model, tok = demo
    evaluate("demo", ["demo-add", "demo-sub"], output_dir=tmp_path / "hf", samples=4, limit=3,
             max_new_tokens=96, temperature=0.6, progress=False, ci_resamples=0, batch_size=8)
    prompts, responses, want = [], [], []
    for name in ("demo-add", "demo-sub"):
        by_id = {p.id: p for p in tasks.get(name).load("test", None, 3)}
        for row in _rows(tmp_path / "hf" / name / "responses.jsonl"):
            ids = tok(row["text"], add_special_tokens=False)["input_ids"]
            assert len(ids) == row["num_tokens"]  # the character tokenizer round-trips the text
            prompts.append(tok(tasks.render_prompt(tok, by_id[row["problem_id"]].messages),
                               add_special_tokens=False)["input_ids"])
            responses.append(ids)
            want.append(row["entropy_sum"])
    assert len(want) == 24 and sum(map(len, responses)) > 200
    scorer = EntropyScorer(model, tokens_per_forward=300, slice_tokens=7)  # several forwards and slices
    got = scorer.entropy_sums(prompts, responses, 0.6)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-5)
    # the pooled metric (sum of sums / sum of tokens) agrees as well; T = 1 for greedy rows differs
    assert sum(got) / sum(map(len, responses)) == pytest.approx(sum(want) / sum(map(len, responses)), rel=1e-6)
    assert not np.allclose(scorer.entropy_sums(prompts, responses, 0.0), want, rtol=1e-3)


def test_split_rows_covers_every_row_once():
    from esreason.backends.vllm_eval import split_rows

    assert split_rows(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_rows(2, 4) == [(0, 1), (1, 2)]
    assert split_rows(0, 2) == []


def test_heldout_on_pool_engines(ray_local):
    """(Runs before the module's evaluation engines take the 2 CPUs.) Held-out evaluation during ES on the pool's engines (HF engines here): the centre's
    responses, entropies scored on the driver by the trainer's policy."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.eval_pool import pool_generator, runs_on_vllm
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.ray_pool import build_ray_pool
    from esreason.backends.sampling import Sampler
    from esreason.backends.vllm_eval import sampler_generate_requests
    from esreason.backends.scoring import EntropyScorer
    from ray_helpers import tiny_es_cfg

    model, tok = load_model("demo")
    policy = HFPolicy(model, tok)
    pool = build_ray_pool(tiny_es_cfg("backend.type=ray", "backend.engines=1"), policy)
    try:
        assert not runs_on_vllm(pool)
        policy.apply_update([1, 2], [1.0, -1.0], 0.01)  # trainer and engines move together
        pool.after_update([1, 2], [1.0, -1.0], 0.01, 0)
        gen = pool_generator(pool, tok, EntropyScorer(model))
        prompts = ["<s>12+34=", "<s>7*8=", "<s>5+5="]
        params = SamplingParams(max_new_tokens=20, temperature=0.6, seed=4, compute_entropy=True)
        out = gen.generate(prompts, params)
    finally:
        pool.close()
    from esreason.backends.vllm import request_seeds

    ids = tok(prompts, add_special_tokens=False)["input_ids"]
    want = sampler_generate_requests(Sampler(model, tok), ids, request_seeds(4, 3), params)
    assert out.token_ids == want.token_ids
    np.testing.assert_allclose(out.entropy_sum, want.entropy_sum, rtol=2e-5)


def test_two_evaluation_engines_share_one_gpu(ray_local, demo):
    """``eval.engines_per_gpu``: two evaluation actors of half a declared GPU each
    land on one GPU id, each with half the memory reservation, and answer exactly as one engine.
    (Before the module's engines take the 2 CPUs; the fan-out test below checks one GPU each.)"""
    from esreason.backends.base import SamplingParams
    from esreason.backends.eval_pool import build_eval_generator
    from esreason.backends.vllm_eval import EvalEngineOptions

    prompts = ["<s>12+34=", "<s>7*8=", "<s>hello ", "<s>99-3=", "<s>5+5="]
    params = SamplingParams(max_new_tokens=24, temperature=0.7, seed=5, compute_entropy=True)
    one, _, _ = build_eval_generator("demo", engines=1, kind="hf", batch_size=8)
    want = one.generate(prompts, params)
    shared, _, info = build_eval_generator("demo", engines=2, kind="hf", batch_size=8, engines_per_gpu=2)
    try:
        got = shared.generate(prompts, params)
    finally:
        shared.close()
    ids = [tuple(e["gpu_ids"]) for e in info["engines"]]
    assert len(ids) == 2 and ids[0] == ids[1] and len(ids[0]) == 1, ids
    assert info["engines_per_gpu"] == 2
    # normal CPU priority unless the user set RAY_worker_niceness (Ray's own default: 15)
    assert [e["niceness"] for e in info["engines"]] == [os.nice(0) + int(os.environ.get("RAY_worker_niceness") or 0)] * 2
    assert got.token_ids == want.token_ids
    assert got.entropy_sum == pytest.approx(want.entropy_sum, rel=1e-12)
    with pytest.raises(UserError, match="--engines-per-gpu 2 needs --engines >= 2"):
        build_eval_generator("demo", engines=1, kind="hf", engines_per_gpu=2)
    assert EvalEngineOptions.gpu_memory_utilization / 2 == pytest.approx(0.3)


def test_an_engine_dying_mid_stream_fails_clearly_and_the_rerun_completes(ray_local, tmp_path, monkeypatch):
    """(Before the module's engines take the 2 CPUs.) One of two streaming engines is killed once the
    first problem is recorded: the evaluation stops with one error naming the engine, what was
    recorded stays, and the rerun (fresh engines) completes with exactly one row per (problem, sample)."""
    import ray

    from esreason.backends import eval_pool
    from esreason.eval import results
    from esreason.eval.harness import evaluate

    real_build = eval_pool.build_eval_generator
    built = []

    def build(model, **kw):
        out = real_build(model, kind="hf", **kw)
        built.append(out[0])
        return out

    monkeypatch.setattr(eval_pool, "build_eval_generator", build)
    real_append = results.ResponsesFile.append

    def append_then_kill(self, records):
        real_append(self, records)
        if len(built) == 1 and not getattr(built[0], "_killed", False):
            built[0]._killed = True
            ray.kill(built[0]._streams.actors[1], no_restart=True)

    monkeypatch.setattr(results.ResponsesFile, "append", append_then_kill)
    kw = dict(samples=2, limit=6, max_new_tokens=48, greedy=False, progress=False, ci_resamples=0, batch_size=4)
    with pytest.raises(RuntimeError, match="evaluation engine 1 died during the stream"):
        evaluate("demo", ["demo-add"], output_dir=tmp_path / "e", backend="vllm", engines=2, **kw)
    recorded = _rows(tmp_path / "e" / "demo-add" / "responses.jsonl")
    assert 2 <= len(recorded) < 12 and len(recorded) % 2 == 0
    monkeypatch.setattr(results.ResponsesFile, "append", real_append)
    evaluate("demo", ["demo-add"], output_dir=tmp_path / "e", backend="vllm", engines=2, **kw)
    rows = _rows(tmp_path / "e" / "demo-add" / "responses.jsonl")
    keys = [(r["problem_id"], r["sample"]) for r in rows]
    assert len(keys) == len(set(keys)) == 12
    assert all(r in rows for r in recorded)  # the recorded rows were kept as they were


@pytest.fixture(scope="module")
def engine_generators(ray_local):
    """{1: one in-process HF engine, 2: two HF engines as Ray actors} (each: generator, tokenizer, info)."""
    from esreason.backends.eval_pool import build_eval_generator

    gens = {e: build_eval_generator("demo", engines=e, kind="hf", batch_size=8) for e in (1, 2)}
    yield gens
    gens[2][0].close()


def test_ray_fanout_equals_one_engine(engine_generators, demo):
    """Two Ray actors give the same responses and entropies as one in-process engine: per-row seeds
    are drawn before the rows are split, so a row's response does not depend on E."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler

    model, tok = demo
    prompts = ["<s>12+34=", "<s>7*8=", "<s>hello ", "<s>99-3=", "<s>5+5="] * 2
    params = SamplingParams(max_new_tokens=24, temperature=0.7, seed=11, compute_entropy=True)
    (one, _, info1), (two, _, info2) = engine_generators[1], engine_generators[2]
    a, b = one.generate(prompts, params), two.generate(prompts, params)
    assert info1["identity"] == info2["identity"]
    assert sorted(tuple(e["gpu_ids"]) for e in info2["engines"]) == [("0",), ("1",)]  # one declared GPU each
    assert a.token_ids == b.token_ids and a.texts == b.texts
    assert a.entropy_sum == pytest.approx(b.entropy_sum, rel=1e-12)
    assert a.texts[0] != a.texts[5]  # same prompt, different request seeds
    # the same rows sampled in one batched call of the HF sampler with one seed: a different stream
    batched = Sampler(model, tok).generate(prompts, params)
    assert batched.token_ids != a.token_ids
    greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
    assert one.generate(prompts, greedy).texts == Sampler(model, tok).generate(prompts, greedy).texts


def test_eval_backend_files_resume_and_engine_count(engine_generators, tmp_path, monkeypatch):
    """``evaluate(backend='vllm')`` through the engine path (HF engines standing in for vLLM):
    the same files as the HF path, identical for 1 and 2 engines, and resumed after a kill."""
    from esreason.backends import eval_pool
    from esreason.eval.harness import evaluate

    def started(model, *, engines, **kw):  # the module's engines, kept open for the other tests
        gen, tok, info = engine_generators[engines]
        return types.SimpleNamespace(generate=gen.generate, identity=gen.identity), tok, info

    monkeypatch.setattr(eval_pool, "build_eval_generator", started)
    kw = dict(samples=3, limit=3, max_new_tokens=64, greedy=True, progress=False, ci_resamples=0, batch_size=4)
    hf = evaluate("demo", ["demo-add"], output_dir=tmp_path / "hf", **kw)
    s1 = evaluate("demo", ["demo-add"], output_dir=tmp_path / "e1", backend="vllm", engines=1, **kw)
    s2 = evaluate("demo", ["demo-add"], output_dir=tmp_path / "e2", backend="vllm", engines=2, **kw)
    f_hf, f1, f2 = (tmp_path / d / "demo-add" / "responses.jsonl" for d in ("hf", "e1", "e2"))
    r_hf, r1 = _rows(f_hf), _rows(f1)
    assert [sorted(r) for r in r_hf] == [sorted(r) for r in r1]  # same record format
    assert [(r["problem_id"], r["sample"], r["greedy"]) for r in r_hf] == \
        [(r["problem_id"], r["sample"], r["greedy"]) for r in r1]
    assert [r["text"] for r in r_hf if r["greedy"]] == [r["text"] for r in r1 if r["greedy"]]
    assert all(r["entropy_sum"] > 0 for r in r1 if not r["greedy"])
    manifest = json.loads((tmp_path / "e2" / "manifest.json").read_text())
    assert manifest["sampler"] == {"backend": "vllm", "engines": 2} and manifest["batch_size"] == 8
    assert manifest["model"]["identity"] == json.loads((tmp_path / "hf" / "manifest.json").read_text())[
        "model"]["identity"]
    assert set(s1.as_dict()) == set(hf.as_dict())
    # E = 2 makes calls of 2 x 4 rows: other call seeds than E = 1, the same rows within a call
    kw2 = {**kw, "batch_size": 8}
    evaluate("demo", ["demo-add"], output_dir=tmp_path / "e1b", backend="vllm", engines=1, **kw2)
    assert _rows(tmp_path / "e1b" / "demo-add" / "responses.jsonl") == _rows(f2)
    # a kill after the first problem: the rerun completes the file with the same responses
    full = f2.read_text().splitlines()
    f2.write_text("\n".join(full[:4]) + "\n")
    (tmp_path / "e2" / "summary.json").unlink()
    again = evaluate("demo", ["demo-add"], output_dir=tmp_path / "e2", backend="vllm", engines=2, **kw)
    assert sorted(f2.read_text().splitlines()) == sorted(full)
    assert again.value("pass@1") == s2.value("pass@1")


def test_streamed_over_two_ray_engines_equals_calls(engine_generators, tmp_path, monkeypatch):
    """The streamed schedule over two Ray actors: each engine its whole share at
    once, problems recorded as they complete; the same rows and files as the call path."""
    from esreason.backends import eval_pool
    from esreason.eval.harness import evaluate

    class Kept:  # the module's engines, kept open for the other tests (the harness closes its generator)
        def __init__(self, gen):
            self._gen = gen

        def __getattr__(self, name):
            return getattr(self._gen, name)

        def close(self):
            pass

    def started(model, *, engines, **kw):
        gen, tok, info = engine_generators[engines]
        return Kept(gen), tok, info

    monkeypatch.setattr(eval_pool, "build_eval_generator", started)
    kw = dict(samples=3, limit=4, max_new_tokens=64, greedy=True, progress=False, ci_resamples=0, batch_size=4)
    tasks = ["demo-add", "demo-sub"]
    evaluate("demo", tasks, output_dir=tmp_path / "calls", backend="vllm", engines=2, schedule="calls", **kw)
    evaluate("demo", tasks, output_dir=tmp_path / "stream", backend="vllm", engines=2, **kw)
    for task in tasks:
        a = _rows(tmp_path / "calls" / task / "responses.jsonl")
        b = _rows(tmp_path / "stream" / task / "responses.jsonl")
        assert [(r["problem_id"], r["greedy"], r["sample"], r["text"]) for r in a] == \
            [(r["problem_id"], r["greedy"], r["sample"], r["text"]) for r in b]
    total = json.loads((tmp_path / "stream" / "summary.json").read_text())["timings"]["total"]
    assert total["schedule"] == "stream" and [e["engine"] for e in total["engines"]] == [0, 1]
    assert sum(e["groups"] for e in total["engines"]) == 8 and all(e["groups"] == 4 for e in total["engines"])
    calls = json.loads((tmp_path / "calls" / "summary.json").read_text())["timings"]["total"]
    assert calls["schedule"] == "calls" and len(calls["engines"]) == 2  # the call path's engine counters


def test_bad_backend_input_is_one_line(tmp_path, monkeypatch):
    from esreason.eval.harness import evaluate

    kw = dict(output_dir=tmp_path / "x", samples=2, limit=1, progress=False)
    with pytest.raises(UserError, match="engines=2 needs backend 'vllm'"):
        evaluate("demo", ["demo-add"], engines=2, **kw)
    with pytest.raises(UserError, match="backend must be 'hf' or 'vllm', got 'tpu'"):
        evaluate("demo", ["demo-add"], backend="tpu", **kw)
    with pytest.raises(UserError, match="--engines must be an integer >= 1"):
        evaluate("demo", ["demo-add"], backend="vllm", engines=0, **kw)
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(UserError, match=r"esreason\[vllm\]"):
        evaluate("demo", ["demo-add"], backend="vllm", **kw)
    assert not (tmp_path / "x" / "demo-add").exists()


def test_cli_backend_flags(tmp_path, capsys):
    from esreason.cli import main

    code = main(["eval", "--model", "demo", "--tasks", "demo-add", "--output", str(tmp_path / "o"),
                 "--samples", "2", "--limit", "1", "--engines", "3", "--no-progress"])
    assert code != 0 and "engines=3 needs backend 'vllm'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--model", "demo", "--tasks", "demo-add", "--output", str(tmp_path / "o"),
              "--backend", "tpu"])


def test_experiment_file_refuses_engines_without_vllm():
    from esreason.config import ConfigError
    from esreason.experiments.spec import parse_spec

    data = {"name": "t", "model": "demo", "task": "demo-add", "updates": 2, "methods": ["base"],
            "eval": {"in_domain": ["demo-add"], "held_out": ["demo-sub"], "samples": 2, "ks": [1, 2], "engines": 2}}
    with pytest.raises(ConfigError, match="'eval.engines': 2 engines need eval.backend: vllm"):
        parse_spec(data)
    data["eval"]["backend"] = "vllm"
    assert parse_spec(data).eval.engines == 2
