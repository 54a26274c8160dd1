"""`esreason demo --quick`: the five-method experiment, the report and the verdicts, end to end
through the CLI (smoke-sized; the full demo's numbers are in docs/experiments.md)."""

from __future__ import annotations

import json

import pytest

from esreason.cli import main


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo"
    rc = main(["demo", "--quick", "--output", str(out), "--no-progress"])
    return out, rc


def test_quick_demo_runs_all_five_methods_and_writes_the_report(quick_demo, capsys):
    out, rc = quick_demo
    assert rc == 0
    record = json.loads((out / "experiment.json").read_text())
    assert list(record["methods"]) == ["base", "grpo", "es", "es_grpo", "grpo_es"]
    for name in ("grpo", "es", "es_grpo", "grpo_es"):
        assert (out / "runs" / name / "done.json").is_file()
    seq = json.loads((out / "runs" / "es_grpo" / "sequence.json").read_text())
    assert seq["split"] == [1, 1] and seq["stage2_start_matches_stage1_final"] is True
    report = (out / "report" / "report.md").read_text()
    for needle in ("Pass@", "Maj@", "Pareto", "below", "held-out", "ES→GRPO", "GRPO→ES"):
        assert needle in report, needle
    pngs = sorted(p.name for p in (out / "report").glob("*.png"))
    assert len(pngs) >= 4, pngs
    assert len(list((out / "report").glob("*.tex"))) >= 4
    for png in pngs:  # every figure the markdown links exists
        assert png in report


def test_quick_demo_prints_a_verdict_per_finding(quick_demo):
    out, _ = quick_demo
    text = (out / "verdicts.md").read_text()
    lines = [line for line in text.splitlines() if line[:1].isdigit()]
    assert len(lines) >= 6
    words = ("holds", "direction agrees, not significant", "inconclusive", "contradicted", "not tested")
    assert all(line.split(". ", 1)[1].split(":", 1)[0] in words for line in lines), lines
    assert "GRPO" in text and "Pass@" in text


def test_rerunning_the_demo_resumes_without_training(quick_demo, capsys):
    out, _ = quick_demo
    metrics = {p: p.read_text() for p in (out / "runs").rglob("metrics.jsonl")}
    assert main(["demo", "--quick", "--output", str(out), "--no-progress"]) == 0
    assert {p: p.read_text() for p in (out / "runs").rglob("metrics.jsonl")} == metrics
    assert "done in" in capsys.readouterr().out


def test_demo_output_that_is_a_file_is_a_one_line_error(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["demo", "--quick", "--output", str(f), "--no-progress"]) == 2
    assert "not a directory" in capsys.readouterr().err
