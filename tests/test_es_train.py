"""End-to-end ES runs on CPU: exactness, determinism, resume, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from esreason.config import load_config
from esreason.es_loop.run import run_es
from esreason.io.hashing import hash_directory_safetensors

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py


def small_cfg(model_dir, *extra):
    """A 4-update ES run. On the embedded default rewards vary across members, so updates
    are non-zero and resume/determinism checks compare real weight changes."""
    return load_config(None, [
        f"model={model_dir}", "task=demo-add", "train.limit=24", "train.batch_size=6",
        "train.max_steps=4", "es.population_size=4", "es.sigma=0.003", "es.alpha=0.002",
        "generation.max_new_tokens=40", "generation.temperature=0.7", "checkpoint.every=1",
        *extra])


@pytest.fixture(scope="module")
def demo_dir():
    from esreason.embedded import demo_model_dir

    return demo_model_dir()


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_hash(run: Path, step: int) -> str:
    return hash_directory_safetensors(run / "checkpoints" / f"step_{step}")


def test_alpha_zero_leaves_weights_bit_identical(demo_dir, tmp_path):
    res = run_es(small_cfg(demo_dir, "es.alpha=0"), tmp_path / "run", progress=False)
    assert res.steps == 4
    assert hash_directory_safetensors(res.final_checkpoint) == hash_directory_safetensors(demo_dir)
    assert all(m["update_norm"] == 0.0 for m in metrics(tmp_path / "run"))


def test_same_config_and_seed_give_the_same_run(demo_dir, tmp_path):
    a = run_es(small_cfg(demo_dir), tmp_path / "a", progress=False)
    b = run_es(small_cfg(demo_dir), tmp_path / "b", progress=False)
    ra = [m["reward/mean"] for m in metrics(tmp_path / "a")]
    rb = [m["reward/mean"] for m in metrics(tmp_path / "b")]
    assert ra == rb
    assert hash_directory_safetensors(a.final_checkpoint) == hash_directory_safetensors(b.final_checkpoint)
    assert hash_directory_safetensors(a.final_checkpoint) != hash_directory_safetensors(demo_dir)
    c = run_es(small_cfg(demo_dir, "train.seed=1"), tmp_path / "c", progress=False)
    assert hash_directory_safetensors(c.final_checkpoint) != hash_directory_safetensors(a.final_checkpoint)


def test_run_directory_contract(demo_dir, tmp_path):
    run = tmp_path / "run"
    run_es(small_cfg(demo_dir, "train.max_steps=2"), run, progress=False)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["config"]["es"]["population_size"] == 4
    # what actually evaluated the population (every stage records what ran)
    assert json.loads((run / "backend.json").read_text()) == {"type": "hf", "engine": "hf", "engines": 1,
                                                              "update": "replicated"}
    ck = run / "checkpoints" / "step_2"
    state = json.loads((ck / "es_state.json").read_text())
    assert state["step"] == 2
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(ck)
    AutoTokenizer.from_pretrained(ck)
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("reward/mean", "reward/std", "update_norm", "time/perturb", "time/generate",
                "time/reward", "time/restore", "time/update", "tokens_per_s"):
        assert key in rows[0]
    assert any((run / "tensorboard").iterdir())


def test_resume_after_kill_between_steps_is_bit_identical(demo_dir, tmp_path, monkeypatch):
    full = run_es(small_cfg(demo_dir), tmp_path / "full", progress=False)

    from esreason.es_loop.trainer import ESTrainer

    original = ESTrainer.step

    def dying_step(self, t):
        if t == 2:
            raise KeyboardInterrupt  # killed after update 2 was checkpointed
        return original(self, t)

    monkeypatch.setattr(ESTrainer, "step", dying_step)
    with pytest.raises(KeyboardInterrupt):
        run_es(small_cfg(demo_dir), tmp_path / "killed", progress=False)
    monkeypatch.setattr(ESTrainer, "step", original)
    resumed = run_es(small_cfg(demo_dir), tmp_path / "killed", resume=True, progress=False)
    assert hash_directory_safetensors(resumed.final_checkpoint) == hash_directory_safetensors(full.final_checkpoint)
    assert [m["reward/mean"] for m in metrics(tmp_path / "killed")] == \
        [m["reward/mean"] for m in metrics(tmp_path / "full")]


def test_resume_after_kill_during_checkpoint_write(demo_dir, tmp_path):
    full = run_es(small_cfg(demo_dir), tmp_path / "full", progress=False)
    run = tmp_path / "killed"
    # A child process that dies (os._exit: no cleanup handlers) half-way through writing
    # the checkpoint of update 3.
    script = textwrap.dedent(f"""
        import os, sys
        from esreason.backends import hf
        from esreason.config import load_config
        from esreason.es_loop.run import run_es
        original = hf.HFPolicy.save
        calls = []
        def save(self, directory):
            calls.append(directory)
            original(self, directory)
            if len(calls) == 3:
                os._exit(9)   # model files written, es_state.json not yet
        hf.HFPolicy.save = save
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_es_train import small_cfg
        run_es(small_cfg({str(demo_dir)!r}), {str(run)!r}, progress=False)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr[-2000:]
    assert not (run / "checkpoints" / "step_3").exists()
    assert list((run / "checkpoints").glob(".tmp*"))           # the torn write is left aside
    resumed = run_es(small_cfg(demo_dir), run, resume=True, progress=False)
    assert not list((run / "checkpoints").glob(".tmp*"))       # and cleaned on resume
    assert hash_directory_safetensors(resumed.final_checkpoint) == hash_directory_safetensors(full.final_checkpoint)
    assert [m["step"] for m in metrics(run)] == [1, 2, 3, 4]


def test_fresh_run_refuses_to_overwrite(demo_dir, tmp_path):
    from esreason.errors import UserError

    run_es(small_cfg(demo_dir, "train.max_steps=1"), tmp_path / "r", progress=False)
    with pytest.raises(UserError, match="--resume"):
        run_es(small_cfg(demo_dir, "train.max_steps=1"), tmp_path / "r", progress=False)
    with pytest.raises(UserError, match="different config"):
        run_es(small_cfg(demo_dir, "train.max_steps=1", "es.sigma=0.1"), tmp_path / "r",
               resume=True, progress=False)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "esreason.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize("overrides, needle", [
    (["es.bogus=1"], "unknown config key 'es.bogus'"),
    (["es.sigma=abc"], "'es.sigma': expected a number"),
    (["es.sigma=0"], "'es.sigma': must be > 0"),
    (["es.population_size=1"], "'es.population_size': must be >= 2"),
    (["model=/nonexistent/model/dir"], "model path not found: /nonexistent/model/dir"),
    (["task=nope"], "unknown task 'nope'"),
])
def test_cli_bad_input_is_one_line_error(tmp_path, overrides, needle):
    """``esreason.cli.main`` in this process (a subprocess per case cost 2-7 s of interpreter and
    library start-up); the installed entry point itself: the next test."""
    from fault_helpers import run_cli

    args = ["train", "es", "--output", str(tmp_path / "r"), "--no-progress"]
    for o in overrides:
        args += ["--set", o]
    rc, err = run_cli(args)
    assert rc == 2
    err = err.strip()
    assert needle in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "r").exists()  # refused before anything was written


def test_cli_bad_input_from_the_command_line_exits_2_with_one_line(tmp_path):
    """The same through ``python -m esreason.cli``: the process's exit status and its whole stderr."""
    proc = _cli("train", "es", "--output", str(tmp_path / "r"), "--no-progress", "--set", "es.sigma=0")
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "'es.sigma': must be > 0" in err and "Traceback" not in err and len(err.splitlines()) == 1, err


def test_empty_dataset_is_a_clear_error(tmp_path, monkeypatch):
    from esreason.errors import UserError
    from esreason.tasks import registry
    from esreason.tasks.base import Task

    registry.get("demo-add")  # load the registry first
    monkeypatch.setitem(registry._TASKS, "empty-task",
                        Task(name="empty-task", verifier="math", loader=lambda split, path: [], splits=("train",)))
    with pytest.raises(UserError, match="task 'empty-task' split 'train' is empty"):
        run_es(load_config(None, ["task=empty-task"]), tmp_path / "r", progress=False)
    assert not (tmp_path / "r" / "metrics.jsonl").exists()   # nothing half-written


def test_periodic_heldout_evaluation_is_logged(demo_dir, tmp_path):
    cfg = small_cfg(demo_dir, "train.max_steps=2", "eval.every=2", "eval.tasks=[demo-add,demo-sub]",
                    "eval.limit=3", "eval.samples=2", "eval.ks=[1,2]")
    run_es(cfg, tmp_path / "r", progress=False)
    rows = metrics(tmp_path / "r")
    assert [r["step"] for r in rows] == [0, 1, 2]           # base model evaluated at step 0
    for row in (rows[0], rows[2]):
        for key in ("heldout/demo-add/pass@1", "heldout/demo-sub/pass@2", "heldout/demo-add/greedy_acc",
                    "heldout/demo-sub/entropy", "heldout/pass@1"):
            assert key in row, (key, sorted(row))
    assert "heldout/pass@1" not in rows[1]
