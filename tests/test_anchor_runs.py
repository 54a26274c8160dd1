"""Anchored ES in whole runs: theta_0 kept in the run directory across a resume, and the Ray pool's
sharded update with every engine bit-identical to the trainer (HF engines on CPU, a gloo group)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from esreason.errors import UserError
from esreason.es_loop.run import run_es
from esreason.io.hashing import hash_directory_safetensors
from test_es_train import small_cfg  # the 4-update ES run of the other end-to-end tests

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

#: c = alpha * lambda = 0.002 * 50 = 0.1: every update removes a tenth of the distance to theta_0, so
#: an anchor other than the start model changes the weights' bits within one update.
ANCHOR = "es.anchor_decay=50"


@pytest.fixture(scope="module")
def demo_dir():
    from esreason.embedded import demo_model_dir

    return demo_model_dir()


def _die_at(monkeypatch, step):
    from esreason.es_loop.trainer import ESTrainer

    original = ESTrainer.step

    def dying_step(self, t):
        if t == step:
            raise KeyboardInterrupt  # killed after update `step` was checkpointed
        return original(self, t)

    monkeypatch.setattr(ESTrainer, "step", dying_step)
    return original


def test_resumed_anchored_run_equals_the_uninterrupted_one_and_anchors_to_the_start_model(
        demo_dir, tmp_path, monkeypatch):
    from safetensors import safe_open

    from esreason.backends.hf import ANCHOR_FILE
    from esreason.es_loop.trainer import ESTrainer
    from esreason.io.verify import checksum_manifest

    full = run_es(small_cfg(demo_dir, ANCHOR), tmp_path / "full", progress=False)
    plain = run_es(small_cfg(demo_dir), tmp_path / "plain", progress=False)
    assert hash_directory_safetensors(full.final_checkpoint) != hash_directory_safetensors(plain.final_checkpoint)
    assert not (tmp_path / "plain" / "anchor").exists()  # nothing kept without anchored ES

    # theta_0 on disk is the start model, bit for bit
    with safe_open(str(demo_dir / "model.safetensors"), framework="pt") as start, \
            safe_open(str(tmp_path / "full" / "anchor" / ANCHOR_FILE), framework="pt") as kept:
        assert set(kept.keys()) <= set(start.keys()) and kept.keys()
        assert all(torch.equal(kept.get_tensor(k), start.get_tensor(k).float()) for k in kept.keys())

    original = _die_at(monkeypatch, 2)
    with pytest.raises(KeyboardInterrupt):
        run_es(small_cfg(demo_dir, ANCHOR), tmp_path / "killed", progress=False)
    monkeypatch.setattr(ESTrainer, "step", original)
    shutil.copytree(tmp_path / "killed", tmp_path / "wrong-anchor")
    resumed = run_es(small_cfg(demo_dir, ANCHOR), tmp_path / "killed", resume=True, progress=False)
    assert hash_directory_safetensors(resumed.final_checkpoint) == hash_directory_safetensors(full.final_checkpoint)
    rows = [json.loads(x) for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]

    # The control: a resume anchored to the checkpoint it resumed from (what "theta_0 = the loaded
    # model" would do) ends elsewhere, so the equality above is evidence that the start model was used.
    wrong = tmp_path / "wrong-anchor"
    kept = wrong / "anchor" / ANCHOR_FILE
    from safetensors.torch import load_file, save_file

    step2 = load_file(str(wrong / "checkpoints" / "step_2" / "model.safetensors"))
    save_file({k: step2[k] for k in load_file(str(kept))}, str(kept))
    (wrong / "anchor" / "COMPLETE").write_text(checksum_manifest(wrong / "anchor"))
    other = run_es(small_cfg(demo_dir, ANCHOR), wrong, resume=True, progress=False)
    assert hash_directory_safetensors(other.final_checkpoint) != hash_directory_safetensors(full.final_checkpoint)


def test_an_anchored_run_without_its_start_weights_does_not_resume(demo_dir, tmp_path, monkeypatch):
    from esreason.es_loop.trainer import ESTrainer

    original = _die_at(monkeypatch, 1)
    with pytest.raises(KeyboardInterrupt):
        run_es(small_cfg(demo_dir, ANCHOR), tmp_path / "run", progress=False)
    monkeypatch.setattr(ESTrainer, "step", original)
    (tmp_path / "run" / "anchor" / "es_anchor" / "anchor.safetensors").write_bytes(b"damaged")
    with pytest.raises(UserError, match=r"without its start weights.*anchor\.safetensors"):
        run_es(small_cfg(demo_dir, ANCHOR), tmp_path / "run", resume=True, progress=False)


def test_sharded_ray_pool_with_anchor_keeps_every_engine_identical_to_the_trainer(ray_local, tmp_path):
    """Two HF engines each sum half the population, all-reduce, then pull toward theta_0 (which came
    with their start state); the trainer's reference sums all shards and pulls the same way. After
    every update, after a lost engine's recovery and in a replacement engine, the bits agree."""
    import ray

    from esreason.backends.engine import policy_checksum
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.es_loop.select import build_evaluator
    from ray_helpers import tiny_es_cfg
    from test_ray_sharded import _train

    cfg = tiny_es_cfg("backend.type=ray", "backend.engines=2", "backend.check_every=1", "backend.update=sharded",
                      "es.anchor_decay=100")  # c = 0.2 per update
    model, tok = load_model(cfg.model)
    policy = HFPolicy(model, tok, anchor_decay=cfg.es.anchor_decay)
    pool = build_evaluator(cfg, policy, None, policy.tokenizer)
    try:
        rows = _train(cfg, policy, pool, tmp_path / "sharded")
        assert all(r["update_norm"] > 0 for r in rows)
        assert pool.stats.checks == 3 and pool.stats.rebroadcasts == 0  # identical after every update
        assert set(pool.checksums().values()) == {policy_checksum(policy)}
        ray.kill(pool.slots[1].actor, no_restart=True)  # lost before an update: the survivor is re-loaded
        pool.apply_update([5, 6, 7, 8], [1.0, -0.5, 0.25, -0.75], 0.002, step=2)
        assert pool.sharded.failures == 1
        repaired = pool.stats.rebroadcasts  # the recovery's re-loads
        pool.apply_update([9, 10, 11, 12], [0.5, -1.0, 1.0, -0.5], 0.002, step=3)  # a replacement joins
        assert pool.stats.replaced_engines == 1
        # equal without a repair: the re-loaded survivor and the replacement pulled toward the same theta_0
        assert pool.stats.rebroadcasts == repaired
        assert set(pool.checksums().values()) == {policy_checksum(policy)}
    finally:
        pool.close()
    # the same updates without the anchor end elsewhere: the pull took part in what the engines agreed on
    model2, tok2 = load_model(cfg.model)
    unanchored = HFPolicy(model2, tok2)
    _train(tiny_es_cfg(), unanchored, None, tmp_path / "plain")
    assert policy_checksum(unanchored) != policy_checksum(policy)
