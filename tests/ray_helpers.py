"""Shared by the Ray pool tests: the tiny ES config they run (not a test module)."""

from __future__ import annotations


def tiny_es_cfg(*extra: str):
    """A 2-update ES run on 16 demo-add problems, N = 4, B = 4, sampled rollouts; ``extra`` are overrides."""
    from esreason.config import load_config

    return load_config(None, [
        "model=demo", "task=demo-add", "train.limit=16", "train.batch_size=4", "train.max_steps=2",
        "es.population_size=4", "es.sigma=0.003", "es.alpha=0.002", "generation.max_new_tokens=48",
        "generation.temperature=0.7", "checkpoint.every=0", *extra])
