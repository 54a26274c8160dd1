"""Ray engine pool on CPU: bit-identical to the single-process run, fault tolerance, bad input.

Runs in the default suite: a local Ray instance with 2 CPUs (started once for this module),
HF engines on the embedded default.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from esreason.errors import UserError
from ray_helpers import tiny_es_cfg

import ray  # noqa: E402  (part of the dev extra: not skipped when missing)

from esreason.backends.engine import HFEngineOptions, policy_checksum, policy_state  # noqa: E402
from esreason.backends.ray_pool import RayEnginePool, check_address, import_ray  # noqa: E402

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py


@pytest.fixture(scope="module")
def demo_policy():
    from esreason.backends.hf import HFPolicy, load_model

    model, tok = load_model("demo")
    return HFPolicy(model, tok)


# ---------------------------------------------------------------- bad input (no cluster needed)


def test_missing_extra_names_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # makes `import ray` raise ImportError
    with pytest.raises(UserError, match=r"pip install 'esreason\[ray\]'"):
        import_ray()
    with pytest.raises(UserError, match=r"esreason\[ray\]"):
        RayEnginePool("hf", HFEngineOptions(), {}, 2)


def test_unreachable_address_is_a_user_error():
    with pytest.raises(UserError, match="cannot reach a Ray cluster at '127.0.0.1:1'"):
        check_address("127.0.0.1:1", timeout_s=2)
    with pytest.raises(UserError, match="backend.ray_address"):
        check_address("not-an-address")


def test_unreachable_address_through_the_config(demo_policy):
    from esreason.es_loop.select import build_evaluator

    cfg = tiny_es_cfg("backend.type=ray", "backend.engines=2", "backend.ray_address=ray://127.0.0.1:1")
    with pytest.raises(UserError, match="cannot reach a Ray cluster"):
        build_evaluator(cfg, demo_policy, None, None)


def test_a_token_protected_cluster_names_the_setting():
    """Ray's ConnectionError hides why; the reason is chained below it (the chain seen with Ray 2.60
    when a driver without RAY_AUTH_MODE=token joins a `ray start --head` cluster)."""
    from esreason.backends.ray_connect import connect_error

    try:
        try:
            raise RuntimeError("Failed to connect to GCS. Last connection error: Traceback (most recent call last):\n"
                               "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication "
                               "token is missing or incorrect.")
        except RuntimeError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from inner
    except ConnectionError as exc:
        err = connect_error("10.0.0.1:6379", exc)
    assert "\n" not in str(err)
    assert str(err).startswith("config key 'backend.ray_address': cannot connect to Ray at '10.0.0.1:6379': "
                               "Failed to connect to Ray cluster at 10.0.0.1:6379; the cluster uses token")
    assert "RAY_AUTH_MODE=token" in str(err)
    plain = connect_error("10.0.0.1:6379", ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379"))
    assert "RAY_AUTH_MODE" not in str(plain)


def test_more_engines_than_resources(ray_local, demo_policy):
    with pytest.raises(UserError, match=r"3 hf engines need 3 CPU .* the Ray cluster has 2"):
        RayEnginePool("hf", HFEngineOptions(), policy_state(demo_policy), 3, reference=demo_policy)
    assert ray_local.is_initialized()  # the pool did not stop a Ray instance it did not start


def _step_inputs(policy, population_seed: int, first_seed: int):
    """One ES step's inputs on 4 demo-add problems: prompts, golds, scorer, a population of 4 and
    one sampling seed per member."""
    from esreason import tasks, verifiers
    from esreason.backends.base import SamplingParams
    from esreason.es.population import draw_population

    task = tasks.get("demo-add")
    problems = task.load("train", None, 4)
    prompts = [tasks.render_prompt(policy.tokenizer, p.messages) for p in problems]
    params = [SamplingParams(max_new_tokens=48, temperature=0.7, seed=first_seed + i) for i in range(4)]
    return (prompts, [p.gold for p in problems], verifiers.get(task.verifier),
            draw_population(population_seed, 0, 4, "one_point"), params)


def test_two_engines_on_one_gpu_give_the_rewards_of_two_gpus(ray_local, demo_policy):
    """``engines_per_gpu`` placement through Ray's fractional GPUs: ray_local declares
    2 GPUs; engines of 1/2 GPU share one, engines of 1 GPU take one each. HF engines compute on the
    CPU, so this pins the pool's placement and that placement changes no result (the vLLM twin:
    tests/test_vllm_engines_per_gpu.py). Runs before the module's ``pooled`` engines take the CPUs."""
    prompts, golds, scorer, pop, params = _step_inputs(demo_policy, population_seed=5, first_seed=21)
    options = HFEngineOptions.from_config(tiny_es_cfg(), threads=1)
    placed, results = {}, {}
    for layout, kwargs in (("two GPUs", {"gpus": 1.0}), ("one GPU", {"gpus_if_declared": 0.5})):
        pool = RayEnginePool("hf", options, policy_state(demo_policy), 2, reference=demo_policy, **kwargs)
        try:
            placed[layout] = sorted(tuple(pool.engine_gpus[s.rank]) for s in pool.slots)
            assert pool.gpus == (1.0 if layout == "two GPUs" else 0.5)
            results[layout] = pool.evaluate(pop, 0.003, prompts, golds, scorer, params)
        finally:
            pool.close()
    assert placed["two GPUs"] == [("0",), ("1",)]
    assert placed["one GPU"][0] == placed["one GPU"][1] and len(placed["one GPU"][0]) == 1
    a, b = results["two GPUs"], results["one GPU"]
    np.testing.assert_array_equal(a.rewards, b.rewards)
    np.testing.assert_array_equal(a.correct, b.correct)
    assert a.tokens == b.tokens and a.tokens > 0


def _expected_niceness(asked: int) -> int:
    """What an actor of ray_local reports when it asks for ``asked``: workers start at the raylet's
    niceness, inherited from this process (ray_local started it), and ``nice()`` adds to it."""
    return max(-20, min(19, os.nice(0) + asked))


def test_users_ray_worker_niceness_wins(ray_local, demo_policy, monkeypatch):
    """A user's RAY_worker_niceness reaches the engines, although this Ray instance was started
    without it (the setting travels with each actor). Before the module's ``pooled`` engines take the CPUs."""
    monkeypatch.setenv("RAY_worker_niceness", "5")
    pool = RayEnginePool("hf", HFEngineOptions(), policy_state(demo_policy), 1, reference=demo_policy)
    try:
        assert ray.get(pool.slots[0].actor.niceness.remote()) == _expected_niceness(5)
        assert pool.engine_niceness == {pool.slots[0].rank: _expected_niceness(5)}
    finally:
        pool.close()


# ---------------------------------------------------------------- the engine itself (no Ray)


def test_hf_engine_state_transfer_keeps_bf16_masters(tiny_model_dir):
    """An engine rebuilt from checkpoint files holds the same bits (weights and fp32 masters),
    evaluates a member like the policy, and moves with it."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.engine import HFEngine
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.sampling import Sampler

    model, tok = load_model(str(tiny_model_dir), "bfloat16")
    policy = HFPolicy(model, tok)
    policy.apply_update([1, 2], [1.0, -0.5], 1e-4)  # masters now hold what bf16 weights cannot
    engine = HFEngine(HFEngineOptions(dtype="bfloat16"), policy_state(policy))
    assert engine.checksum() == policy_checksum(policy)
    params = SamplingParams(max_new_tokens=8, temperature=0.7, seed=3)
    out = engine.run_member(5, 11, 0.01, ["<s>1+2=", "<s>3+4="], params)
    policy.perturb(11, 0.01)
    want = Sampler(model, tok).generate(["<s>1+2=", "<s>3+4="], params)
    policy.restore()
    assert (out.index, out.texts, out.num_tokens) == (5, want.texts, want.num_tokens)
    assert engine.apply_update([4], [1.0], 1e-4) == policy.apply_update([4], [1.0], 1e-4)
    assert engine.checksum() == policy_checksum(policy)


# ---------------------------------------------------------------- exactness


@pytest.fixture(scope="module")
def pooled(ray_local):
    """A 2-engine pool built from the config (``backend.type: ray``) around a fresh demo policy.

    Shared by the tests below (engine start-up dominates their time): the training test first,
    then a drifted engine, then a killed one.
    """
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.es_loop.select import build_evaluator

    cfg = tiny_es_cfg("backend.type=ray", "backend.engines=2", "backend.check_every=1")
    model, tok = load_model(cfg.model)
    policy = HFPolicy(model, tok, restore=cfg.es.restore, master_weights=cfg.es.master_weights,
                      direction_cache_mb=cfg.es.direction_cache_mb)
    pool = build_evaluator(cfg, policy, None, tok)
    assert isinstance(pool, RayEnginePool) and len(pool.slots) == 2
    from esreason.es_loop.select import describe_evaluator

    record = describe_evaluator(cfg, pool)  # RUN/backend.json: what actually started
    assert (record["type"], record["engine"], record["engines"], record["update"]) == ("ray", "hf", 2, "replicated")
    assert len(record["hosts"]) == 2 and "?" not in record["hosts"]
    yield cfg, policy, pool
    pool.close()


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_ray_run_is_bit_identical_to_single_process(pooled, tmp_path):
    from esreason import tasks, verifiers
    from esreason.backends.sampling import Sampler
    from esreason.es_loop.run import run_es
    from esreason.es_loop.trainer import ESTrainer
    from esreason.io import MetricsLogger, RunDir
    from esreason.io.hashing import hash_directory_safetensors

    ref = run_es(tiny_es_cfg(), tmp_path / "hf", progress=False)  # the single-process reference

    cfg, policy, pool = pooled  # the same wiring as run_es, with the Ray pool as evaluator
    task = tasks.get(cfg.task)
    problems = task.load(cfg.train.split, None, cfg.train.limit)
    prompts = [tasks.render_prompt(policy.tokenizer, p.messages) for p in problems]
    scorer = verifiers.get(task.verifier, format_reward=cfg.es.format_reward)
    with MetricsLogger(tmp_path / "ray") as logger:
        trainer = ESTrainer(cfg, policy, Sampler(policy.model, policy.tokenizer), problems, prompts, scorer,
                            RunDir(tmp_path / "ray"), logger, evaluator=pool)
        res = trainer.train(progress=False)

    m_ref, m_ray = _metrics(tmp_path / "hf"), _metrics(tmp_path / "ray")
    for key in ("reward/mean", "reward/std", "accuracy/mean", "format/mean", "update_norm", "tokens",
                "length/responses"):  # the engines report every response's length, as the reference does
        assert [m[key] for m in m_ray] == [m[key] for m in m_ref], key
    assert len(m_ref) == 2 and all(m["update_norm"] > 0 for m in m_ref)  # real updates happened
    assert hash_directory_safetensors(res.final_checkpoint) == hash_directory_safetensors(ref.final_checkpoint)
    assert pool.stats.checks == 3 and pool.stats.rebroadcasts == 0  # start-up + after each update
    assert set(pool.checksums().values()) == {policy_checksum(policy)}  # engines moved with the trainer


def test_drifted_engine_is_rebroadcast(pooled):
    _, policy, pool = pooled
    assert set(pool.checksums().values()) == {policy_checksum(policy)}
    drifted = pool.slots[1]
    ray.get(drifted.actor.apply_update.remote([7], [1.0], 1e-3))  # this engine alone moves
    before = pool.stats.rebroadcasts
    assert pool.check_consistency(step=0) == [drifted.rank]
    assert pool.stats.rebroadcasts == before + 1
    assert set(pool.checksums().values()) == {policy_checksum(policy)}


def test_pool_engines_run_at_normal_priority(pooled):
    """Ray starts its workers at nice 15 unless RAY_worker_niceness says otherwise; beside any busy
    process such an engine gets a few per cent of a core. The pool's engines run at normal priority
    (0), or at the user's RAY_worker_niceness when set; the run's backend.json records it."""
    from esreason.es_loop.select import describe_evaluator

    cfg, _, pool = pooled
    want = _expected_niceness(int(os.environ.get("RAY_worker_niceness") or 0))
    assert ray.get([s.actor.niceness.remote() for s in pool.slots]) == [want] * len(pool.slots)
    assert describe_evaluator(cfg, pool)["niceness"] == [want] * len(pool.slots)


def test_killed_engine_mid_step_gives_the_same_result(pooled):
    _, demo_policy, pool = pooled
    from esreason.backends.sampling import Sampler
    from esreason.es_loop.evaluate import evaluate_population

    prompts, golds, scorer, pop, params = _step_inputs(demo_policy, population_seed=3, first_seed=11)
    expected = evaluate_population(demo_policy, Sampler(demo_policy.model, demo_policy.tokenizer), pop, 0.003,
                                   prompts, golds, scorer, params)

    victim = pool.slots[1]
    killed = []

    def killing_scorer(text, gold):
        if not killed:  # first response back: the other engine still has members in flight
            ray.kill(victim.actor, no_restart=True)
            killed.append(victim.rank)
        return scorer(text, gold)

    got = pool.evaluate(pop, 0.003, prompts, golds, killing_scorer, params)
    assert killed and pool.stats.lost_engines == 1 and pool.stats.rerun_members >= 1
    assert victim not in pool.slots
    np.testing.assert_array_equal(got.rewards, expected.rewards)
    np.testing.assert_array_equal(got.correct, expected.correct)
    np.testing.assert_array_equal(got.formatted, expected.formatted)
    assert got.tokens == expected.tokens
