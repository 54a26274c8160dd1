"""Run-directory plumbing: atomic writes, metrics, manifests, hashes, progress."""

from esreason.io.atomic import atomic_directory, atomic_write_json, atomic_write_text, clean_stale_tmp
from esreason.io.hashing import hash_directory_safetensors, hash_state_dict, sha256_file
from esreason.io.manifest import build_manifest, write_manifest
from esreason.io.metrics import MetricsLogger, read_metrics, truncate_metrics
from esreason.io.progress import progress_bar
from esreason.io.rundir import RunDir

__all__ = ["MetricsLogger", "RunDir", "atomic_directory", "atomic_write_json", "atomic_write_text",
           "build_manifest", "clean_stale_tmp", "hash_directory_safetensors", "hash_state_dict",
           "progress_bar", "read_metrics", "sha256_file", "truncate_metrics", "write_manifest"]
