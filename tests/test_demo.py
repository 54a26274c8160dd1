"""`esreason demo --quick`: the five-method experiment, the report and the verdicts, end to end
through the CLI (smoke-sized; the full demo's numbers are in docs/experiments.md)."""

from __future__ import annotations

import json
import os

import pytest

from esreason.cli import main

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    """``esreason demo --quick`` with no ``--output``, run from a fresh working directory: it writes
    the default ``runs/demo-quick``."""
    cwd = tmp_path_factory.mktemp("demo")
    before = os.getcwd()
    os.chdir(cwd)
    try:
        rc = main(["demo", "--quick", "--no-progress"])
    finally:
        os.chdir(before)
    return cwd / "runs" / "demo-quick", rc


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
    assert "passk_profiles.png" in pngs  # the README's figure (docs/figures/demo-passk.png) is this one
    assert len(list((out / "report").glob("*.tex"))) >= 4
    for png in pngs:  # every figure the markdown links exists
        assert png in report


def test_quick_demo_prints_a_verdict_per_finding(quick_demo):
    out, _ = quick_demo
    text = (out / "verdicts.md").read_text()
    lines = [line for line in text.splitlines() if line[:1].isdigit()]
    assert len(lines) >= 6
    from esreason.report.verdicts import VERDICTS as words
    assert all(line.split(". ", 1)[1].split(":", 1)[0] in words for line in lines), lines
    assert "GRPO" in text and "Pass@" in text
    # one training seed: the verdicts say what their intervals cover
    assert "1 training seed: evaluation noise only" in text
    assert all("(interval covers: " in line for line in lines)
    # the family, its correction and the estimand are stated
    assert "Holm" in text and "family-wise" in text and "estimand" in text


def test_demo_seeds_option(tmp_path, capsys):
    from esreason.demo import _verdict, demo_spec
    from esreason.report.findings import Finding

    assert demo_spec(quick=True).seeds is None  # one seed: today's layout
    assert demo_spec(quick=True, seeds=3).seeds == (0, 1, 2)
    assert main(["demo", "--quick", "--seeds", "0", "--output", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "--seeds" in capsys.readouterr().err and not (tmp_path / "o").exists()
    f = Finding("x", "ES beats GRPO", "p", "inconclusive", "ES - GRPO: -1.0 pp", variance="2 training seeds × 8 problems",
                per_seed=[{"seed": "0", "diff": {"value": -0.01}, "verdict": "inconclusive"},
                          {"seed": "1", "diff": {"value": 0.02}, "verdict": "holds"}])
    assert _verdict(f) == ("inconclusive: ES beats GRPO — ES - GRPO: -1.0 pp (interval covers: 2 training seeds × 8 "
                           "problems; per seed (description): seed 0: -1.0 pp (inconclusive); seed 1: +2.0 pp "
                           "(holds))")
    f.decision = {"p_holm": 0.0123, "rank": 2, "family_size": 7}
    assert "; Holm p 0.012 (2 of 7)" in _verdict(f)


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


def test_default_outputs_differ_per_kind_of_demo():
    from pathlib import Path

    from esreason.demo import default_output

    assert default_output() == Path("runs/demo")
    assert default_output(quick=True) == Path("runs/demo-quick")
    assert default_output(seeds=3) == Path("runs/demo-seeds3")
    assert default_output(quick=True, seeds=3) == Path("runs/demo-quick-seeds3")


def test_full_demo_after_quick_demo_just_works(quick_demo, monkeypatch, capsys):
    """``esreason demo --quick`` then ``esreason demo``, no flag added, both exit 0: a quick run never
    blocks the full one. The full demo's spec is shortened here (the quick budgets with 4 updates
    instead of 2, so it differs from the quick spec the way the real full spec does); its default
    directory is ``runs/demo``."""
    import esreason.demo as demo

    out, rc = quick_demo
    assert rc == 0
    original = demo.demo_spec

    def short_full(quick=False, extra=(), seeds=1):
        return original(False, extra=demo.QUICK_OVERRIDES + ("updates=4",) + tuple(extra), seeds=seeds) \
            if not quick else original(True, extra=extra, seeds=seeds)

    monkeypatch.setattr(demo, "demo_spec", short_full)
    cwd = out.parent.parent
    monkeypatch.chdir(cwd)
    # The full demo into the quick one's directory is still refused, with the command that fixes it.
    assert main(["demo", "--output", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "different experiment" in err and f"rm -r {out}" in err and "--output" in err
    assert main(["demo", "--no-progress"]) == 0
    assert (cwd / "runs" / "demo" / "report" / "report.md").is_file()
    assert (cwd / "runs" / "demo-quick" / "report" / "report.md").is_file()
