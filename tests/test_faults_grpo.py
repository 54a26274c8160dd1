"""Fault injection on a GRPO run directory (docs/faults.md): the HF checkpoint step_N and TRL's
checkpoint-M it pairs with, every file x truncate / zero-fill / delete / garble-one-byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fault_helpers import demo_dir  # noqa: F401  (a fixture)
from fault_helpers import (DAMAGES, copy_run, damage, extended_run, one_line_error, reference_run, run_cli,
                           warnings_naming)

from esreason.io.hashing import hash_directory_safetensors

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py


def sets(model_dir: Path, steps: int = 2) -> list[str]:
    """B = 4 prompts x G = 4 responses, 2 updates, a checkpoint (and TRL state) after each."""
    over = [f"model={model_dir}", "task=demo-add", "train.limit=8", "train.batch_size=4", f"train.max_steps={steps}",
            "grpo.num_generations=4", "grpo.micro_batch_size=16", "grpo.learning_rate=1e-4",
            "generation.max_new_tokens=40", "checkpoint.every=1", "eval.every=0"]
    return [a for o in over for a in ("--set", o)]


def train(model_dir: Path, out: Path, *args: str, steps: int = 2) -> tuple[int, str]:
    return run_cli(["train", "grpo", *sets(model_dir, steps), "--output", str(out), "--no-progress", *args])


def final(run: Path, step: int = 2) -> str:
    return hash_directory_safetensors(run / "checkpoints" / f"step_{step}")


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference_run(train, tmp_path_factory, "grpo-ref")


def newest_files(run: Path) -> list[Path]:
    """Every file of the newest checkpoint: RUN/checkpoints/step_2 and the TRL checkpoint it names."""
    ckpt = run / "checkpoints" / "step_2"
    trl = run / json.loads((ckpt / "grpo_state.json").read_text())["trl_checkpoint"]
    return sorted(p for d in (ckpt, trl) for p in d.rglob("*") if p.is_file())


def test_the_trl_checkpoint_is_recorded_with_checksums(ref):
    state = json.loads((ref / "checkpoints" / "step_2" / "grpo_state.json").read_text())
    trl = ref / state["trl_checkpoint"]
    assert sorted(state["trl_files"]) == sorted(p.relative_to(trl).as_posix() for p in trl.rglob("*") if p.is_file())
    assert {"optimizer.pt", "trainer_state.json"} <= set(state["trl_files"])


@pytest.mark.parametrize("kind", DAMAGES)
def test_every_damaged_file_of_the_newest_checkpoint_falls_back(ref, tmp_path, capsys, kind):
    from esreason.grpo.run import find_resume_point

    files = [p.relative_to(ref) for p in newest_files(ref)]
    assert len(files) >= 10
    for i, rel in enumerate(files):
        run = copy_run(ref, tmp_path / f"run{i}")
        damage(run / rel, kind)
        point = find_resume_point(run)
        assert point.step == 1, rel
        err = capsys.readouterr().err
        assert len(warnings_naming(err, rel.as_posix())) == 1 and "resuming from step 1" in err, (rel, err)


def test_resume_past_a_damaged_optimizer_state_is_bit_identical(ref, demo_dir, tmp_path):
    run = copy_run(ref, tmp_path / "run")
    damage(run / "trl" / "checkpoint-2" / "optimizer.pt", "garble")
    rc, err = train(demo_dir, run, "--resume")
    assert rc == 0, err
    assert len(warnings_naming(err, "checkpoint-2/optimizer.pt")) == 1
    assert final(run) == final(ref)
    steps = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


def test_no_intact_checkpoint_and_resume_from_are_one_line(ref, demo_dir, tmp_path):
    run = copy_run(ref, tmp_path / "run")
    damage(run / "checkpoints" / "step_2" / "model.safetensors", "zero")
    damage(run / "checkpoints" / "step_1" / "grpo_state.json", "delete")
    one_line_error(*train(demo_dir, run, "--resume"), "step_2/model.safetensors")
    one_line_error(*train(demo_dir, run, "--resume-from", "step_1"), "step_1/grpo_state.json")


def test_a_longer_run_by_resume_equals_a_run_started_longer(ref, demo_dir, tmp_path):
    run, _ = extended_run(train, ref, demo_dir, tmp_path)
    one_line_error(*train(demo_dir, run, "--resume", "--set", "grpo.lr_scheduler=linear", steps=4),
                   "grpo.lr_scheduler")
