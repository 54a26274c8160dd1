"""Every shell command in the README is checked: `esreason` commands parse against the CLI (a renamed
flag or sub-command fails here), the cheap CPU ones run, the rest are run by the tests named below,
and the README's figure is the one the demo's report writes."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

#: esreason commands the suite runs elsewhere, and where (heavy, or needing a GPU run's outputs).
RUN_ELSEWHERE = {
    "esreason demo": "tests/test_demo.py runs `esreason demo --quick` (the same code path, small sizes)",
    "esreason train es --config examples/custom_task/es.yaml": "tests/test_examples.py (run_cli.sh)",
    "esreason experiment run configs/experiments/easy.yaml": "GPU: parsed here; the runner is tests/test_experiments.py",
    "esreason report runs/experiments/easy": "needs the experiment's outputs; tests/test_report.py",
    "esreason eval --model runs/demo": "needs the demo's checkpoints; tests/test_eval_command.py",
    "esreason eval --model Qwen/": "GPU and the hub: parsed here; tests/test_vllm_eval.py runs --backend vllm on CPU",
}
#: esreason commands cheap enough to run here (seconds), with the working directory they need.
RUN_HERE = ("esreason experiment plan", "esreason tasks")


def readme_commands() -> list[str]:
    """Every command line of the README's bash blocks (continuations joined, comments dropped)."""
    text = README.read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(" ".join(shlex.quote(w) for w in words))
    return out


def _esreason(cmd: str) -> list[str]:
    words = shlex.split(cmd)
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value prefixes
        words.pop(0)
    assert words[0] == "esreason", cmd
    return words[1:]


def test_every_readme_command_is_known():
    for cmd in readme_commands():
        first = shlex.split(cmd)[0]
        assert first in ("esreason", "pip", "python", "git"), f"README command of an unknown kind: {cmd}"
        if first == "python" and "pytest" not in cmd:
            script = shlex.split(cmd)[1]
            assert (REPO / script).is_file(), f"README runs {script}, which does not exist"


@pytest.mark.parametrize("cmd", [c for c in readme_commands() if "esreason" in shlex.split(c)[0:1]])
def test_esreason_commands_parse_against_the_cli(cmd):
    from esreason.cli import build_parser

    try:
        build_parser().parse_args(_esreason(cmd))
    except SystemExit as exc:  # argparse's usage error: a renamed flag or command
        pytest.fail(f"README command does not parse: {cmd} (exit {exc.code})")
    if not cmd.startswith(RUN_HERE):
        assert any(cmd.startswith(k) for k in RUN_ELSEWHERE), f"say where this README command runs: {cmd}"


@pytest.mark.parametrize("cmd", [c for c in readme_commands() if c.startswith(RUN_HERE)])
def test_cheap_readme_commands_run(cmd, tmp_path):
    """Run from a copy of the example (its data is written by make_data.py) so the tree stays clean."""
    example = tmp_path / "examples" / "custom_task"
    shutil.copytree(REPO / "examples" / "custom_task", example, ignore=shutil.ignore_patterns("data", "__pycache__"))
    subprocess.run([sys.executable, str(example / "make_data.py")], check=True, capture_output=True)
    shutil.copytree(REPO / "configs", tmp_path / "configs")
    out = subprocess.run([sys.executable, "-m", "esreason.cli", *_esreason(cmd)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, f"{cmd}\n{out.stderr[-2000:]}"


def test_the_readme_figure_is_what_the_demo_report_writes():
    """docs/figures/demo-passk.png is runs/demo/report/passk_profiles.png of a full `esreason demo`
    (`cp runs/demo/report/passk_profiles.png docs/figures/demo-passk.png`); the report still names its
    Pass@K figure so, and tests/test_demo.py checks that the demo's report writes every figure it names."""
    from esreason.report.plots import file_names

    assert "docs/figures/demo-passk.png" in README.read_text()
    assert (REPO / "docs" / "figures" / "demo-passk.png").is_file()
    assert file_names()["profiles"] == "passk_profiles.png"
