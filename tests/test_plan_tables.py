"""The plan tables of the README, docs/planning.md and docs/gpu-layout.md equal the plan command's output.

The rows come from scripts/plan_tables.py, scripts/memory_table.py and scripts/plan_variants.py,
which run ``esreason experiment plan configs/experiments/X.yaml --gpus G [--hf-only] [--set ...] --json``
in process. A change to a plan term, a throughput constant or a shipped config that is not followed
by regenerating the docs (run the three scripts, paste their rows) fails here, naming the rows.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"_esreason_script_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def tables():
    cwd = os.getcwd()
    os.chdir(REPO)  # the scripts name configs/experiments/*.yaml relative to the repository
    try:
        pt, mt, pv = _script("plan_tables"), _script("memory_table"), _script("plan_variants")
        mt.plan = pt.plan  # one plan per experiment for every table
        pv._plan_tables = lambda: pt
        yield {"README.md": pt.readme_rows(),
               "docs/planning.md": pt.planning_rows() + pv.sensitivity_rows() + pv.limit_rows() + pv.anchor_rows()
               + mt.rows()
               + pv.host_rows(),
               "docs/gpu-layout.md": pv.engines_per_gpu_rows()}
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize("doc", ["README.md", "docs/planning.md", "docs/gpu-layout.md"])
def test_docs_tables_are_the_plan_commands_output(tables, doc):
    text = (REPO / doc).read_text()
    missing = [row for row in tables[doc] if row not in text.splitlines()]
    assert not missing, (f"{doc} does not hold these rows of the plan's output (regenerate with "
                         f"`python scripts/plan_tables.py`, `python scripts/memory_table.py` and "
                         f"`python scripts/plan_variants.py`):\n" + "\n".join(missing))
