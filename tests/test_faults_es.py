"""Fault injection on an ES run directory (docs/faults.md): every file kind x truncate / zero-fill /
delete / garble-one-byte either recovers to the bit-identical result or is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from fault_helpers import demo_dir  # noqa: F401  (a fixture)
from fault_helpers import (DAMAGES, copy_run, damage, extended_run, one_line_error, reference_run, run_cli,
                           warnings_naming)

from esreason.io.hashing import hash_directory_safetensors
from esreason.io.verify import select_checkpoint

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

#: every file of an ES checkpoint of the embedded default (test_checkpoint_file_list_is_complete checks it)
CKPT_FILES = ("COMPLETE", "chat_template.jinja", "config.json", "es_state.json", "generation_config.json",
              "model.safetensors", "tokenizer.json", "tokenizer_config.json")
TIME_KEYS = ("time/", "tokens_per_s")


def sets(model_dir: Path, steps: int = 2, *extra: str) -> list[str]:
    """A 2-update ES run (population 4, 4 prompts per update), a checkpoint after every update."""
    over = [f"model={model_dir}", "task=demo-add", "train.limit=8", "train.batch_size=4", f"train.max_steps={steps}",
            "es.population_size=4", "es.sigma=0.003", "es.alpha=0.002", "generation.max_new_tokens=40",
            "generation.temperature=0.7", "checkpoint.every=1", *extra]
    return [a for o in over for a in ("--set", o)]


def train(model_dir: Path, out: Path, *extra_args: str, steps: int = 2, over: tuple[str, ...] = ()) -> tuple[int, str]:
    return run_cli(["train", "es", *sets(model_dir, steps, *over), "--output", str(out), "--no-progress",
                    *extra_args])


def final(run: Path, step: int = 2) -> str:
    return hash_directory_safetensors(run / "checkpoints" / f"step_{step}")


def rows(run: Path) -> list[dict]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.append({k: v for k, v in row.items() if not k.startswith(TIME_KEYS)})
    return out


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference_run(train, tmp_path_factory, "es-ref")


def test_checkpoint_file_list_is_complete(ref):
    assert tuple(sorted(p.name for p in (ref / "checkpoints" / "step_2").iterdir())) == CKPT_FILES
    manifest = json.loads((ref / "checkpoints" / "step_2" / "COMPLETE").read_text())
    assert sorted(manifest["files"]) == sorted(set(CKPT_FILES) - {"COMPLETE"})


@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("name", CKPT_FILES)
def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(ref, tmp_path, capsys, name, kind):
    """The resume decision for every (file, damage): step 1, one warning naming the file and the step."""
    from esreason.es_loop.run import load_es_state

    run = copy_run(ref, tmp_path / "run")
    damage(run / "checkpoints" / "step_2" / name, kind)
    step, path, state = select_checkpoint(run / "checkpoints", load_es_state)
    assert (step, state["step"]) == (1, 1)
    err = capsys.readouterr().err
    assert len(warnings_naming(err, f"step_2/{name}")) == 1 and "resuming from step 1" in err


@pytest.mark.parametrize("name, kind", [("model.safetensors", k) for k in DAMAGES])
def test_resume_past_a_damaged_checkpoint_is_bit_identical(ref, demo_dir, tmp_path, name, kind):
    run = copy_run(ref, tmp_path / "run")
    damage(run / "checkpoints" / "step_2" / name, kind)
    rc, err = train(demo_dir, run, "--resume")
    assert rc == 0, err
    assert len(warnings_naming(err, f"step_2/{name}")) == 1
    assert final(run) == final(ref)
    assert rows(run) == rows(ref)  # no rows of the abandoned step, none twice


def test_tensorboard_has_no_rows_of_abandoned_steps(ref, demo_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = copy_run(ref, tmp_path / "run")
    damage(run / "checkpoints" / "step_2" / "model.safetensors", "garble")
    assert train(demo_dir, run, "--resume")[0] == 0
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("reward/mean")
    assert [e.step for e in events] == [1, 2]
    assert [e.value for e in events] == pytest.approx([r["reward/mean"] for r in rows(ref)])


@pytest.mark.parametrize("kind", DAMAGES)
def test_damaged_tensorboard_events_are_not_read(ref, demo_dir, tmp_path, kind):
    run = copy_run(ref, tmp_path / "run")
    for events in (run / "tensorboard").glob("events.*"):
        damage(events, kind)
    rc, err = train(demo_dir, run, "--resume")
    assert rc == 0 and "Traceback" not in err, err
    assert final(run) == final(ref) and rows(run) == rows(ref)


def test_no_intact_checkpoint_is_a_one_line_error(ref, demo_dir, tmp_path):
    run = copy_run(ref, tmp_path / "run")
    damage(run / "checkpoints" / "step_2" / "model.safetensors", "truncate")
    damage(run / "checkpoints" / "step_1" / "es_state.json", "zero")
    rc, err = train(demo_dir, run, "--resume")
    one_line_error(rc, err, "step_2/model.safetensors")


def test_resume_from_picks_a_checkpoint(ref, demo_dir, tmp_path):
    run = copy_run(ref, tmp_path / "run")
    rc, err = train(demo_dir, run, "--resume-from", "step_1")
    assert rc == 0, err
    assert final(run) == final(ref) and rows(run) == rows(ref)
    one_line_error(*train(demo_dir, run, "--resume-from", "step_7"), "step_7")
    damage(run / "checkpoints" / "step_1" / "model.safetensors", "garble")
    one_line_error(*train(demo_dir, run, "--resume-from", "step_1"), "step_1/model.safetensors")


@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("name", ["config.yaml", "manifest.json"])
def test_damaged_config_or_manifest_is_rebuilt_from_the_other(ref, demo_dir, tmp_path, name, kind):
    run = copy_run(ref, tmp_path / "run")
    damage(run / name, kind)
    rc, err = train(demo_dir, run, "--resume")
    assert rc == 0, err
    assert len(warnings_naming(err, name)) == 1
    assert yaml.safe_load((run / "config.yaml").read_text()) == yaml.safe_load((ref / "config.yaml").read_text())
    assert json.loads((run / "manifest.json").read_text())["config"] == json.loads(
        (ref / "manifest.json").read_text())["config"]
    assert final(run) == final(ref) and rows(run) == rows(ref)


def test_both_config_copies_damaged_is_a_one_line_error(ref, demo_dir, tmp_path):
    run = copy_run(ref, tmp_path / "run")
    damage(run / "config.yaml", "garble")
    damage(run / "manifest.json", "truncate")
    one_line_error(*train(demo_dir, run, "--resume"), "config.yaml")


@pytest.mark.parametrize("kind", DAMAGES)
def test_damaged_metrics_continue_with_the_lost_rows_named(ref, demo_dir, tmp_path, kind):
    run = copy_run(ref, tmp_path / "run")
    damage(run / "metrics.jsonl", kind)
    rc, err = train(demo_dir, run, "--resume")
    assert rc == 0, err
    assert final(run) == final(ref)
    assert len(warnings_naming(err, "metrics.jsonl")) == 1
    kept = rows(run) if (run / "metrics.jsonl").exists() else []
    steps = [r["step"] for r in kept]
    assert steps == sorted(set(steps))  # what is left: no duplicate or out-of-order rows
    assert all(r in rows(ref) for r in kept)


def test_a_longer_run_by_resume_equals_a_run_started_longer(ref, demo_dir, tmp_path):
    run, longer = extended_run(train, ref, demo_dir, tmp_path)
    assert rows(run) == rows(longer)
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["max_steps"] == 3
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["train"]["max_steps"] == 3
    assert manifest["extended"] == [{"at_step": 2, "keys": {"train.max_steps": [2, 3]}}]
    # shorter, or any other change, is refused as before
    one_line_error(*train(demo_dir, run, "--resume", steps=2), "train.max_steps")
    one_line_error(*train(demo_dir, run, "--resume", steps=3, over=("es.sigma=0.004",)), "es.sigma")


def test_an_epoch_based_run_can_be_extended_by_epochs(demo_dir, tmp_path):
    base = ["train.max_steps=null"]
    run, longer = tmp_path / "run", tmp_path / "longer"
    epochs = [a for o in base for a in ("--set", o)]
    assert run_cli(["train", "es", *sets(demo_dir, 2), *epochs, "--set", "train.epochs=1", "--set",
                    "train.limit=4", "--output", str(run), "--no-progress"])[0] == 0
    rc, err = run_cli(["train", "es", *sets(demo_dir, 2), *epochs, "--set", "train.epochs=2", "--set",
                       "train.limit=4", "--output", str(run), "--no-progress", "--resume"])
    assert rc == 0, err
    assert run_cli(["train", "es", *sets(demo_dir, 2), *epochs, "--set", "train.epochs=2", "--set",
                    "train.limit=4", "--output", str(longer), "--no-progress"])[0] == 0
    assert final(run, 2) == final(longer, 2) and rows(run) == rows(longer)


def test_evaluating_a_damaged_checkpoint_is_a_one_line_error(ref, tmp_path):
    run = copy_run(ref, tmp_path / "run")
    damage(run / "checkpoints" / "step_2" / "model.safetensors", "garble")
    rc, err = run_cli(["eval", "--model", str(run / "checkpoints" / "step_2"), "--tasks", "demo-add", "--samples",
                       "1", "--limit", "1", "--max-new-tokens", "4", "--output", str(tmp_path / "eval"),
                       "--no-progress"])
    one_line_error(rc, err, "step_2/model.safetensors")
    assert not (tmp_path / "eval").exists()
