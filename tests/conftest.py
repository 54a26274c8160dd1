"""Shared fixtures: everything on CPU, nothing from the network."""

from __future__ import annotations

import os

import pytest
import torch

# The CI machine has 2 cores shared by pytest and its subprocesses; one intra-op thread
# avoids oversubscription (measured: a sampling test file took 118 s with 2 threads, 7 s with 1).
torch.set_num_threads(1)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Memory traces of `esreason experiment plan` are cached on disk (esreason.experiments.memplan); the
# suite keeps its own cache, shared by the workers of one session and by no other session, so every
# session traces each shape afresh once.
os.environ["ESREASON_CACHE_DIR"] = os.path.join(
    os.environ.get("TMPDIR", "/tmp"), f"esreason-test-cache-{os.environ.get('PYTEST_XDIST_TESTRUNUID') or os.getpid()}")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# --- the fast subset: `python -m pytest --fast` --------------------------------------------------
# Test files whose module fixtures train runs, launch CLI subprocesses, start Ray or evaluate at
# the demo's size carry `pytestmark = pytest.mark.heavy`. `--fast` deselects them: the edit-test
# loop over everything else (README, "Tests"). The full run is still the README's command.


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true",
                     help="esreason: deselect test files marked heavy (the edit-test loop; README)")


#: Test files that take longest on one worker (measured, README "Tests"), started first: with test
#: files spread over workers (pytest-xdist, --dist loadfile) the suite's wall time is at least its
#: longest file, and a long file started last runs alone at the end. xdist hands out files in this
#: order only with --no-loadscope-reorder (addopts; its default reorders files by test count, which
#: started the two-test test_es_improves.py near the end). The ES run and its control are two files
#: so that they train at the same time, one per worker (tests/shared_results.py).
LONGEST_FIRST = ("test_es_improves.py", "test_es_control.py", "test_es_train.py", "test_grpo_run.py",
                 "test_grpo_multiprocess.py", "test_vllm_eval.py", "test_seeds.py", "test_ray_sharded.py")


def _longest_first(items: list) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def pytest_collection_modifyitems(config, items):
    _longest_first(items)
    if not config.getoption("--fast"):
        return
    keep = [item for item in items if item.get_closest_marker("heavy") is None]
    dropped = [item for item in items if item.get_closest_marker("heavy") is not None]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised tiny Llama (the embedded default's architecture, char tokenizer) saved as an HF directory.

    Small enough for fast tests (hidden 32, 2 layers); tied embeddings like the demo.
    """
    from esreason.embedded import TinyArch, build_model, build_tokenizer

    path = tmp_path_factory.mktemp("tiny_model")
    tok = build_tokenizer()
    model = build_model(tok, TinyArch(hidden=32, layers=2, heads=2, kv_heads=2, intermediate=64,
                                      max_positions=256), seed=0)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def ray_local():
    """One small local Ray instance per test module that asks for it (startup ~10 s): 2 CPUs and 2
    declared GPUs (Ray resources only, no device: engines placed on them compute on the CPU; the
    ``engines_per_gpu`` placement tests share one of them between two engines). ``address="local"``:
    a new instance, never a cluster another job started on this machine (Ray's default joins it)."""
    import ray

    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, logging_level="WARNING")
    yield ray
    ray.shutdown()
