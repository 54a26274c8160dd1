"""Every documented key has a test that exercises it (the registry: tests/documented_keys.py).

The keys are generated from the code (the config dataclasses, ``FIELD_KEYS``, the task-file
schema, the signatures of the API's entry points), so a new key, field or parameter fails here
until a test that sets it and checks its effect is registered in ``EXERCISED``.
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

from documented_keys import EXERCISED, FLAT_FIELD_TEST, documented_keys, exercised

TESTS = Path(__file__).resolve().parent


def test_every_key_has_an_exercising_test():
    missing = sorted(documented_keys() - set(exercised()))
    assert not missing, ("keys without a test that sets them and checks the effect (write one and register it "
                         "in tests/documented_keys.py, EXERCISED): " + ", ".join(missing))


def test_the_registry_names_only_keys_that_exist():
    stale = sorted(set(exercised()) - documented_keys())
    assert not stale, "tests/documented_keys.py registers keys that are no longer keys: " + ", ".join(stale)


@lru_cache(maxsize=None)
def _functions(file: str) -> frozenset[str]:
    tree = ast.parse((TESTS / file).read_text(encoding="utf-8"))
    return frozenset(node.name for node in tree.body if isinstance(node, ast.FunctionDef))


def test_every_registered_test_exists():
    absent = [test for test in [*EXERCISED, FLAT_FIELD_TEST]
              if not (TESTS / test.split("::")[0]).is_file() or test.split("::")[1] not in _functions(
                  test.split("::")[0])]
    assert not absent, "tests/documented_keys.py names tests that do not exist: " + ", ".join(absent)


def test_the_key_list_is_generated_from_the_code():
    """A few keys of each kind, so a generator that silently lost a kind fails."""
    keys = documented_keys()
    for key in ("es:es.sigma", "es:backend.engines_per_gpu", "es:logging.wandb.table_rows", "grpo:grpo.beta",
                "grpo:checkpoint.save_dtype", "sequence:stages", "experiment:eval.tensor_parallel_size",
                "experiment:plan.runaway_share", "sweep:sweep.band_window", "ESConfig:sigma", "ESConfig:output_dir",
                "taskfile:prompt.chat", "taskfile:dataset.splits", "ESTrainer:answer_fn",
                "ESTrainer.train:resume_from_checkpoint", "GRPOComparator:overrides", "evaluate:ci_resamples"):
        assert key in keys, key
    assert len([k for k in keys if k.startswith("ESConfig:")]) == len(__import__("dataclasses").fields(
        __import__("esreason").ESConfig))
