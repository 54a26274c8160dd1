"""Placement of a pool's engines on a Ray cluster: one placement group per engine, one bundle.

An engine's bundle holds everything the engine uses: ``cpus`` CPUs and ``gpus`` GPUs (a fraction
with ``engines_per_gpu``). ``STRICT_PACK`` keeps a bundle's resources on one node, so an engine
never spans nodes. Ray is imported lazily, here and in :mod:`esreason.backends.ray_pool` only.
"""

from __future__ import annotations

from typing import Any


def engine_bundle(cpus: float, gpus: float) -> dict[str, float]:
    """The one bundle of an engine's placement group."""
    bundle = {"CPU": float(cpus)}
    if gpus:
        bundle["GPU"] = float(gpus)
    return bundle


def engine_placement_group(cpus: float, gpus: float) -> Any:
    """A placement group of one bundle (:func:`engine_bundle`), packed on one node."""
    from ray.util.placement_group import placement_group

    return placement_group([engine_bundle(cpus, gpus)], strategy="STRICT_PACK")
