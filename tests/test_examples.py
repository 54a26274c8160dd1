"""examples/ runs as a user runs it: the custom task through the Python API and through the CLI."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # trained runs and CLI subprocesses (`--fast` leaves this file out)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_task"


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # the `esreason` console script of this environment
    return {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", "")}


def _run(cmd: list[str], cwd: Path) -> str:
    r = subprocess.run(cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, f"{cmd}: exit {r.returncode}\n{r.stderr[-4000:]}"
    return r.stdout


def _hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def example(tmp_path_factory) -> Path:
    """A copy of examples/custom_task as a fresh clone has it (its committed data included): its scripts
    write runs/ beside themselves."""
    root = tmp_path_factory.mktemp("example") / "custom_task"
    shutil.copytree(EXAMPLE, root, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    return root


def test_train_py_is_short_and_the_api_run_equals_the_cli_run(example, tmp_path):
    assert len((EXAMPLE / "train.py").read_text().splitlines()) <= 40
    printed = _run([sys.executable, "train.py"], example)  # as docs/custom-tasks.md runs it: in its directory
    scores = json.loads(printed.strip().splitlines()[-1])
    assert set(scores) == {"pass@1", "pass@8", "maj@8"} and all(0 <= v <= 1 for v in scores.values())
    assert (example / "runs/mine/model/config.json").exists()  # trainer.save_model
    _run(["bash", "run_cli.sh", str(tmp_path / "cli")], example)
    for step in (5, 10):
        assert _hash(example / f"runs/mine/checkpoints/step_{step}/model.safetensors") == \
            _hash(tmp_path / f"cli/es/checkpoints/step_{step}/model.safetensors")
    assert (tmp_path / "cli/grpo/checkpoints/step_10/model.safetensors").exists()
    summary = json.loads((tmp_path / "cli/eval-es/summary.json").read_text())
    assert summary["tasks"]["carry-add"]["num_problems"] == 64 and "maj@8" in summary["metrics"]


def test_analyze_takes_the_user_task(example, tmp_path):
    """`analyze threshold --sweep` evaluates thresholded checkpoints on the user's task (found with --tasks-dir)."""
    _run(["esreason", "train", "es", "--config", "es.yaml", "--tasks-dir", ".", "--output", str(tmp_path / "es"),
          "--set", "train.max_steps=2", "--set", "checkpoint.every=0", "--no-progress"], example)
    _run(["esreason", "analyze", "threshold", "--base", "demo", "--tuned", str(tmp_path / "es/checkpoints/step_2"),
          "--sweep", "1e-3", "--tasks", "carry-add", "--tasks-dir", ".", "--samples", "2", "--limit", "4",
          "--max-new-tokens", "64", "--out", str(tmp_path / "sweep")], example)
    written = sorted(p.name for p in (tmp_path / "sweep").iterdir())
    assert written and any("carry-add" in p.read_text() for p in (tmp_path / "sweep").rglob("*.md"))


def test_the_example_experiment_runs_and_reports(example, tmp_path):
    _run(["esreason", "experiment", "run", "experiment.yaml", "--output", str(tmp_path / "exp"), "--no-progress",
          "--set", "updates=2", "--set", "eval.limit=16"], example)
    report = (tmp_path / "exp/report/report.md").read_text()
    assert "trained on: `carry-add`" in report and "held-out tasks: demo-add" in report
    assert "| GRPO |" in report and "| ES |" in report
