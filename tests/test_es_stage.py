"""An ES stage of ``experiment run`` / ``train sequence`` runs in a child process on a GPU
(esreason.experiments.es_stage), so the stage after it starts with nothing of the ES stage held by
the runner process: no CUDA context, no cached blocks, no model.

The CPU twin asks for the GPU's path with ``ESREASON_ES_PROCESS=child``: an ES -> GRPO sequence on
the embedded default, where the ES stage must not run in this (the runner's) process at all and the
GRPO stage must start with no more models alive here than before the ES stage.
"""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from esreason.config import load_config
from esreason.errors import UserError
from esreason.experiments import es_stage

pytestmark = pytest.mark.heavy  # child processes and two training stages (~1 min): `--fast` leaves it out

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "configs" / "demo"


@pytest.mark.parametrize("device,env,expected", [
    ("cuda", {}, "child"), ("cuda:0", {}, "child"), ("cpu", {}, "inprocess"),
    ("cpu", {"ESREASON_ES_PROCESS": "child"}, "child"), ("cuda", {"ESREASON_ES_PROCESS": "inprocess"}, "inprocess"),
])
def test_on_a_gpu_the_es_stage_runs_in_a_child_process(device, env, expected):
    assert es_stage.es_process(SimpleNamespace(device=device), env) == expected


def test_a_bad_process_choice_is_one_line():
    with pytest.raises(UserError, match="ESREASON_ES_PROCESS='thread': expected one of child, inprocess"):
        es_stage.es_process(SimpleNamespace(device="cpu"), {"ESREASON_ES_PROCESS": "thread"})


def _live_models() -> int:
    import warnings

    from transformers import PreTrainedModel

    gc.collect()
    with warnings.catch_warnings():  # isinstance() on every live object touches deprecated module aliases
        warnings.simplefilter("ignore")
        return sum(1 for o in gc.get_objects() if isinstance(o, PreTrainedModel))


def test_the_stage_after_es_starts_with_nothing_of_it_in_the_runner_process(tmp_path, monkeypatch):
    from esreason.es_loop import run as es_run
    from esreason.experiments import launch
    from esreason.experiments.sequence import plan_sequence, run_sequence

    monkeypatch.setenv("ESREASON_ES_PROCESS", "child")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(es_run, "run_es", lambda *a, **k: pytest.fail("the ES stage ran in the runner process"))
    before = _live_models()
    seen: dict[str, int] = {}
    real_grpo = launch.train_grpo

    def grpo_stage(cfg, out, **kw):
        seen["models_alive"] = _live_models()  # what the runner process holds as the next stage starts
        return real_grpo(cfg, out, **kw)

    monkeypatch.setattr(launch, "train_grpo", grpo_stage)
    es = ["es.population_size=4", "train.batch_size=4", "train.limit=16", "generation.max_new_tokens=48",
          "checkpoint.every=1"]
    grpo = ["grpo.num_generations=4", "train.batch_size=2", "train.limit=16", "grpo.micro_batch_size=8",
            "generation.max_new_tokens=24", "eval.every=0", "checkpoint.every=1"]
    import yaml

    from esreason.config import merge, parse_overrides, read_yaml

    def mapping(name, over):
        return yaml.safe_load(yaml.safe_dump(merge(read_yaml(DEMO / name), parse_overrides(over))))

    plan = plan_sequence({"stages": ["es", "grpo"], "total_updates": 2, "es": mapping("es.yaml", es),
                          "grpo": mapping("grpo.yaml", grpo)})
    out = tmp_path / "seq"
    result = run_sequence(plan, out, progress=False)
    assert [r.updates for r in result.stages] == [1, 1]
    es_dir = result.stages[0].run_dir
    record = json.loads((es_dir / "launch" / es_stage.LAUNCH_FILE).read_text())
    assert record["parent_pid"] == os.getpid() and record["pid"] != os.getpid()  # ES ran in a child
    assert record["command"][1:5] == ["-m", "esreason.cli", "train", "es"]
    assert load_config(es_dir / "launch" / es_stage.CONFIG_FILE) == plan.stages[0].config  # the config it ran
    assert (es_dir / "checkpoints" / "step_1" / "model.safetensors").is_file()
    assert seen["models_alive"] == before  # the GRPO stage started with no model of the ES stage alive here
