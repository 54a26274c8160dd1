"""Run-directory plumbing (DESIGN §1): atomic writes, metrics, manifests, hashes, progress,
verified checkpoints and damage-tolerant reads (:mod:`esreason.io.verify`, docs/faults.md).

Typical trainer use::

    run = RunDir(output)
    clean_stale_tmp(run.checkpoints_dir)                  # leftovers of a killed run
    latest = run.latest_checkpoint()                      # (step, path) | None
    write_manifest(run.path, build_manifest(cfg, seeds={"train.seed": 0}, model_dir=model))
    start = latest[0] if latest else -1                   # resume: drop rows logged after it
    with MetricsLogger(run.path, truncate_after=start if resume else None) as log:
        log.log(step, {"reward/mean": r})
        with atomic_directory(run.checkpoint_path(step)) as tmp:
            model.save_pretrained(tmp)                    # COMPLETE is written last
        run.prune_checkpoints(keep_last=3)
"""

from esreason.io.atomic import (COMPLETE_MARKER, atomic_directory, atomic_save_figure, atomic_write_bytes,
                                atomic_write_json,
                                atomic_write_text, clean_stale_tmp, remove_directory)
from esreason.io.hashing import hash_directory_safetensors, hash_state_dict, sha256_file
from esreason.io.manifest import build_manifest, write_manifest
from esreason.io.metrics import MetricsLogger, read_metrics, truncate_metrics
from esreason.io.progress import progress_bar
from esreason.io.rundir import RunDir

__all__ = ["COMPLETE_MARKER", "MetricsLogger", "RunDir", "atomic_directory", "atomic_save_figure", "atomic_write_bytes",
           "atomic_write_json", "atomic_write_text", "build_manifest", "clean_stale_tmp",
           "hash_directory_safetensors", "hash_state_dict", "progress_bar", "read_metrics", "remove_directory",
           "sha256_file", "truncate_metrics", "write_manifest"]
