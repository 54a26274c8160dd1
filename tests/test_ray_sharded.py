"""The Ray pool's sharded update on CPU (backend.update=sharded): HF engines, a gloo group.

Each of two engines sums half the population and the engines all-reduce int64 block sums;
the trainer's policy sums every shard itself in a background thread. They must hold the same
bits after every update, survive a lost engine, and train like the replicated update.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import ray  # part of the dev extra

from esreason.backends.engine import policy_checksum
from esreason.backends.ray_pool import RayEnginePool
from esreason.errors import UserError
from ray_helpers import tiny_es_cfg

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py


def _policy(cfg):
    from esreason.backends.hf import HFPolicy, load_model

    model, tok = load_model(cfg.model)
    return HFPolicy(model, tok, restore=cfg.es.restore, master_weights=cfg.es.master_weights,
                    direction_cache_mb=cfg.es.direction_cache_mb)


def _train(cfg, policy, evaluator, out: Path):
    from esreason import tasks, verifiers
    from esreason.backends.sampling import Sampler
    from esreason.es_loop.trainer import ESTrainer
    from esreason.io import MetricsLogger, RunDir

    task = tasks.get(cfg.task)
    problems = task.load(cfg.train.split, None, cfg.train.limit)
    prompts = [tasks.render_prompt(policy.tokenizer, p.messages) for p in problems]
    scorer = verifiers.get(task.verifier, format_reward=cfg.es.format_reward)
    with MetricsLogger(out) as logger:
        trainer = ESTrainer(cfg, policy, Sampler(policy.model, policy.tokenizer), problems, prompts, scorer,
                            RunDir(out), logger, evaluator=evaluator)
        trainer.train(progress=False)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_sharded_needs_the_ray_backend():
    with pytest.raises(UserError, match="backend.update.*needs backend.type=ray"):
        tiny_es_cfg("backend.update=sharded")
    with pytest.raises(UserError, match="backend.update"):
        tiny_es_cfg("backend.type=ray", "backend.update=halved")


def test_sharded_pool_trains_with_engines_identical_to_the_trainer(ray_local, tmp_path):
    from esreason.es_loop.select import build_evaluator
    from esreason.es.sharded import Sharding

    cfg = tiny_es_cfg("backend.type=ray", "backend.engines=2", "backend.check_every=1", "backend.update=sharded")
    policy = _policy(cfg)
    pool = build_evaluator(cfg, policy, None, policy.tokenizer)
    try:
        assert isinstance(pool, RayEnginePool) and pool.owns_update
        sharded = _train(cfg, policy, pool, tmp_path / "sharded")
        # after every update each engine (half the shards + all-reduce) == the trainer (all shards)
        assert pool.stats.checks == 3 and pool.stats.rebroadcasts == 0
        assert set(pool.checksums().values()) == {policy_checksum(policy)}
        assert pool.sharded.generation == 1 and pool.sharded.failures == 0

        # the fault path: an engine dies between evaluation and the update; the survivor's
        # collective fails, it is re-loaded from the trainer's centre, and the update stands
        victim = pool.slots[1]
        ray.kill(victim.actor, no_restart=True)
        norm = pool.apply_update([5, 6, 7, 8], [1.0, -0.5, 0.25, -0.75], 0.002, step=2)
        assert norm > 0 and pool.sharded.failures == 1 and pool.stats.lost_engines == 1
        assert set(pool.checksums().values()) == {policy_checksum(policy)}
        # the next update: a fresh group over the live engines (a replacement when it fits)
        pool.apply_update([9, 10, 11, 12], [0.5, -1.0, 1.0, -0.5], 0.002, step=3)
        assert pool.sharded.generation >= 2 and pool.sharded.failures == 1
        assert set(pool.checksums().values()) == {policy_checksum(policy)}
    finally:
        pool.close()

    # the reference's arithmetic is the local sharded update (2 shards), not the replicated one
    fresh, replicated = _policy(cfg), _policy(cfg)
    fresh.apply_update([1, 2, 3, 4], [1.0, -1.0, 0.5, -0.5], 0.002, Sharding.local(2))
    n_rep = replicated.apply_update([1, 2, 3, 4], [1.0, -1.0, 0.5, -0.5], 0.002)
    n_sh = _policy(cfg).apply_update([1, 2, 3, 4], [1.0, -1.0, 0.5, -0.5], 0.002, Sharding.local(2))
    assert math.isclose(n_sh, n_rep, rel_tol=1e-5)

    # and it trains like the replicated update: same first-step rewards, same-size updates
    ref = _train(tiny_es_cfg(), _policy(cfg), None, tmp_path / "replicated")
    assert sharded[0]["reward/mean"] == ref[0]["reward/mean"]
    assert math.isclose(sharded[0]["update_norm"], ref[0]["update_norm"], rel_tol=1e-5)
    assert all(m["update_norm"] > 0 for m in sharded)


def test_an_engine_lost_while_the_group_forms_is_dropped(ray_local):
    """The live engine's join times out (5 s here) waiting for its dead peer; the pool drops the
    dead one, forms a group of one and the update still equals the trainer's."""
    from esreason.backends.engine import HFEngineOptions, policy_state

    cfg = tiny_es_cfg()
    policy = _policy(cfg)
    pool = RayEnginePool("hf", HFEngineOptions(threads=1), policy_state(policy), 2, reference=policy,
                         check_every=1, update="sharded", collective_timeout_s=5)
    try:
        ray.kill(pool.slots[1].actor, no_restart=True)  # before the first group forms
        pool.apply_update([1, 2, 3, 4], [1.0, -0.5, 0.5, -1.0], 0.002, step=0)
        assert pool.stats.lost_engines == 1 and pool.sharded.failures == 0
        assert pool.sharded.members is not None and len(pool.sharded.members) == 1
        assert set(pool.checksums().values()) == {policy_checksum(policy)}
    finally:
        pool.close()


def test_a_pool_of_two_engines_writes_one_start_state_copy_and_removes_it(ray_local):
    # the engines of a node share one copy of the start state (one per engine would fill the disk at scale)
    from esreason.backends.engine import policy_state, shared_state_root, state_key
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.ray_pool import build_ray_pool
    from esreason.config import load_config
    from esreason.embedded import demo_model_dir

    model, tok = load_model(str(demo_model_dir()))
    policy = HFPolicy(model, tok)
    key = state_key(policy_state(policy))
    pool = build_ray_pool(load_config(None, ("model=demo", "backend.type=ray", "backend.engines=2")), policy)
    (own,) = pool._state_keys
    assert own.startswith(key + "-")  # the content key and this pool's nonce (tests/test_engine_host_memory.py)
    copy = shared_state_root() / own
    try:
        assert (copy / ".complete").is_file() and (copy / "model.safetensors").is_file()
        staging = [p for p in shared_state_root().iterdir() if p.name.startswith(f".{copy.name}")]
        assert not staging  # both engines read the one complete copy
    finally:
        pool.close()
    assert not copy.exists()
