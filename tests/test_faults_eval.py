"""Fault injection on an evaluation directory (docs/faults.md): every file x truncate / zero-fill /
delete / garble-one-byte; a rerun recovers the identical responses and summary or refuses in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fault_helpers import DAMAGES, copy_run, damage, one_line_error, run_cli, warnings_naming

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

TASK = "demo-add"
FILES = ("manifest.json", f"{TASK}/responses.jsonl", f"{TASK}/problems.jsonl", "summary.json", "summary.md")


def evaluate(out: Path) -> tuple[int, str]:
    return run_cli(["eval", "--model", "demo", "--tasks", TASK, "--samples", "2", "--k", "1,2", "--limit", "3",
                    "--max-new-tokens", "24", "--greedy", "--bootstrap", "0", "--output", str(out),
                    "--no-progress"])


def responses(out: Path) -> list[tuple]:
    rows = [json.loads(x) for x in (out / TASK / "responses.jsonl").read_text().splitlines()]
    return sorted((r["problem_id"], r["greedy"], r["sample"], r["text"]) for r in rows)


def summary(out: Path) -> dict:
    data = json.loads((out / "summary.json").read_text())
    data.pop("timings")
    return data


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    out = tmp_path_factory.mktemp("eval-ref") / "eval"
    rc, err = evaluate(out)
    assert rc == 0, err
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == sorted(FILES)
    return out


def test_the_reference_has_one_row_per_problem_sample_and_one_greedy_row(ref):
    keys = [r[:3] for r in responses(ref)]
    assert len(keys) == len(set(keys)) == 3 * (2 + 1)


@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("name", FILES)
def test_a_rerun_over_a_damaged_file_recovers_or_refuses_in_one_line(ref, tmp_path, name, kind):
    out = copy_run(ref, tmp_path / "eval")
    damage(out / name, kind)
    rc, err = evaluate(out)
    if name == "manifest.json":  # the protocol of the stored responses cannot be checked: refused
        one_line_error(rc, err, "manifest.json")
        return
    assert rc == 0, err
    assert "Traceback" not in err
    assert responses(out) == responses(ref)  # exactly one row per (problem_id, sample) + one greedy row
    assert summary(out) == summary(ref)
    assert (out / TASK / "problems.jsonl").read_bytes() == (ref / TASK / "problems.jsonl").read_bytes()
    if name.endswith("responses.jsonl") and kind == "garble":
        assert len(warnings_naming(err, "responses.jsonl")) == 1


def test_the_report_refuses_a_damaged_summary_in_one_line(ref, tmp_path):
    from esreason.errors import UserError
    from esreason.report.load import read_problems

    out = copy_run(ref, tmp_path / "eval")
    damage(out / TASK / "problems.jsonl", "garble")
    with pytest.raises(UserError, match="problems.jsonl"):
        read_problems(out / TASK / "problems.jsonl")
