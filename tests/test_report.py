"""``esreason report``: tables, marks, changes, counts, fronts, LaTeX, figures and the CLI.

The fixture writes an experiment directory in the format of ``esreason experiment run``
with known numbers: per-problem rows ``mean + a * (+1, -1, +1, ...)`` whose task means
are the table below, summarised with the evaluation's own code
(:func:`esreason.eval.aggregate.summarize` + :class:`esreason.eval.harness.Summary`), so
``summary.json`` has exactly the harness's format. Expected marks, averages, changes and
counts below are worked out by hand from the table.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from esreason.errors import UserError

TASKS = ["demo-add", "demo-sub", "demo-countdown"]  # in-domain first, then held-out
N = 8  # problems per task
# Task means (percent) of pass@1, pass@16, pass@32.
PASS = {
    "base": {"demo-add": (50, 80, 85), "demo-sub": (30, 70, 82.004), "demo-countdown": (10, 40, 50)},
    "grpo": {"demo-add": (70, 78, 82), "demo-sub": (35, 65, 75), "demo-countdown": (12, 42, 48)},
    "es": {"demo-add": (60, 82, 86), "demo-sub": (32, 72, 82), "demo-countdown": (12, 45, 55)},
    "es_grpo": {"demo-add": (68, 81, 85), "demo-sub": (34, 70, 81), "demo-countdown": (12, 44, 52)},
    "grpo_es": {"demo-add": (66, 80, 86), "demo-sub": (33, 68, 79), "demo-countdown": (11, 43, 53)},
}
LABELS = {"base": "Base", "grpo": "GRPO", "es": "ES", "es_grpo": "ES→GRPO", "grpo_es": "GRPO→ES"}
KS = (1, 16, 32)


def _rows(method: str, task: str) -> list[dict]:
    p1, p16, p32 = (v / 100 for v in PASS[method][task])
    sign = [1 if i % 2 == 0 else -1 for i in range(N)]
    # es on demo-sub pass@32 has no spread, so its paired difference with base varies (not significant)
    a32 = 0.0 if (method, task) == ("es", "demo-sub") else 0.05
    rows = []
    for i in range(N):
        rows.append({"problem_id": f"{task}-{i}", "correct": 1.0, "pass@1": p1 + 0.05 * sign[i],
                     "pass@16": p16 + 0.05 * sign[i], "pass@32": p32 + a32 * sign[i],
                     "maj@16": p1 + 0.05 + 0.05 * sign[i], "maj@32": p1 + 0.06 + 0.05 * sign[i],
                     "maj@16_expected": p1, "greedy_acc": 1.0, "entropy": 0.3, "tokens": 20.0, "formatted": 1.0})
    return rows


def _write_eval(out: Path, method: str, tasks: list[str]) -> None:
    from esreason.eval.aggregate import metric_names, summarize
    from esreason.eval.bootstrap import Bootstrap
    from esreason.eval.harness import Summary
    from esreason.eval.records import Protocol

    tables = {t: _rows(method, t) for t in tasks}
    names = metric_names(KS, 32, True)
    estimates = summarize(tables, names, Bootstrap(200, 0.95, 0))
    summary = Summary(output_dir=out, model=method, tasks=tasks, names=names, ks=KS,
                      protocol=Protocol(samples=32, temperature=0.6, max_new_tokens=64, greedy=True, seed=0),
                      split="test", num_problems={t: N for t in tasks}, estimates=estimates,
                      bootstrap={"resamples": 200, "level": 0.95, "seed": 0, "method": "percentile"})
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary.as_dict()))
    for t, rows in tables.items():
        (out / t).mkdir(exist_ok=True)
        (out / t / "problems.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _write_metrics(path: Path, method: str, updates: int, start_entropy: float, drop: float) -> None:
    rows = [{"step": 0, "heldout/entropy": start_entropy, "heldout/pass@1": 0.2, "heldout/pass@16": 0.55}]
    for s in range(1, updates + 1):
        row = {"step": s, "reward/mean": 0.3 + 0.05 * s}
        if method == "es":
            row["accuracy/mean"] = 0.25 + 0.05 * s
        else:
            row.update({"kl": 0.01 * s, "entropy": 0.4})
        if s % 2 == 0:
            row.update({"heldout/entropy": start_entropy - drop * s, "heldout/pass@1": 0.2 + 0.01 * s,
                        "heldout/pass@16": 0.55 - 0.005 * s})
        rows.append(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the run's config: ES rollouts greedy, GRPO rollouts sampled at 1.0 (the reward panels' measures)
    temperature = 0.0 if method == "es" else 1.0
    (path.parent / "config.yaml").write_text(f"generation:\n  temperature: {temperature}\n")


def write_experiment(root: Path, methods: list[str] | None = None) -> Path:
    """An experiment directory with the known numbers of PASS (and training metrics)."""
    methods = list(PASS) if methods is None else methods
    root.mkdir(parents=True, exist_ok=True)
    spec = {}
    drops = {"grpo": 0.05, "es": 0.005}
    for m in methods:
        _write_eval(root / "eval" / m, m, TASKS)
        entry = {"kind": m, "label": LABELS[m], "checkpoint": "demo" if m == "base" else f"runs/{m}/ckpt",
                 "eval": f"eval/{m}", "training": []}
        if m in ("grpo", "es"):
            _write_metrics(root / "runs" / m / "metrics.jsonl", m, 4, 0.5, drops[m])
            entry["training"] = [{"method": m, "metrics": f"runs/{m}/metrics.jsonl", "updates": 4, "offset": 0}]
        elif m in ("es_grpo", "grpo_es"):
            first, second = m.split("_")
            _write_metrics(root / "runs" / m / "stage1" / "metrics.jsonl", first, 2, 0.5, drops[first])
            _write_metrics(root / "runs" / m / "stage2" / "metrics.jsonl", second, 2, 0.5 - 2 * drops[first],
                           drops[second])
            entry["training"] = [
                {"method": first, "metrics": f"runs/{m}/stage1/metrics.jsonl", "updates": 2, "offset": 0},
                {"method": second, "metrics": f"runs/{m}/stage2/metrics.jsonl", "updates": 2, "offset": 2}]
        spec[m] = entry
    (root / "experiment.json").write_text(json.dumps({
        "kind": "esreason-experiment", "version": 1, "name": "demo", "model": "demo", "train_task": "demo-add",
        "suites": {"in_domain": ["demo-add"], "held_out": ["demo-sub", "demo-countdown"]},
        "protocol": {"samples": 32, "ks": list(KS), "temperature": 0.6, "max_new_tokens": 64, "greedy": True,
                     "limit": N},
        "pairs": [["demo-add", "demo-sub"], ["demo-add", "demo-countdown"]], "methods": spec}))
    return root


@pytest.fixture
def exp_dir(tmp_path: Path) -> Path:
    return write_experiment(tmp_path / "exp")


# ---------------------------------------------------------------------- loading


def test_load_experiment_api(exp_dir: Path) -> None:
    from esreason.report import load_experiment

    exp = load_experiment(exp_dir)
    assert exp.tasks == TASKS and exp.in_domain == ["demo-add"] and exp.held_out == ["demo-sub", "demo-countdown"]
    assert exp.value("es", "demo-sub", "pass@16") == pytest.approx(0.72)
    lo, hi = exp.ci("grpo", "demo-add", "pass@1")
    assert lo < 0.70 < hi
    assert exp.value("es", "demo-sub", "no-such-metric") is None and exp.value("nope", "demo-sub", "pass@1") is None
    assert exp.by_role("es_grpo") == "es_grpo" and exp.eval_ks() == [1, 16, 32]
    held = exp.average("es", "pass@16", exp.held_out)  # not the summary's task set -> bootstrapped from problems
    assert held.value == pytest.approx((72 + 45) / 200) and held.low < held.value < held.high and held.n == 2
    assert exp.average("es", "nope") is None


# ---------------------------------------------------------------------- marks


def test_rank_marks_ties_and_second_best() -> None:
    from esreason.report.tables import rank_marks

    assert rank_marks({"a": 0.5, "b": 0.4, "c": 0.3}) == ({"a"}, {"b"})
    # equal at the displayed precision (82.0 vs 82.0) -> tied
    assert rank_marks({"a": 0.82004, "b": 0.82, "c": 0.7}) == ({"a", "b"}, {"c"})
    # second best is the second distinct value; ties there are all marked
    assert rank_marks({"a": 0.9, "b": 0.8, "c": 0.8, "d": 0.1}) == ({"a"}, {"b", "c"})
    assert rank_marks({"a": 0.5, "b": None}) == (set(), set())
    assert rank_marks({"a": 0.5, "b": 0.5, "c": 0.50001}) == (set(), set())  # all tie: nothing stands out


def test_pass_table_marks_and_averages(exp_dir: Path) -> None:
    from esreason.report import load_experiment
    from esreason.report.tables import AVERAGE_GROUP as AVG, metric_table

    exp = load_experiment(exp_dir)
    t = metric_table(exp, "pass")
    assert [g.key for g in t.groups] == TASKS + [AVG]
    assert [h for _, h in t.groups[0].columns] == ["@1", "@16", "@32"]
    assert t.get("es", AVG, "pass@1").value == pytest.approx((60 + 32 + 12) / 300)
    assert t.get("base", AVG, "pass@32").value == pytest.approx((85 + 82.004 + 50) / 300)
    # every interval is the report's own (problem bootstrap at its resample count), not the summary's
    from esreason.report.resample import RESAMPLES
    from esreason.report.stats import bootstrap_task_average

    data = {task: np.array([r["pass@16"] for r in _rows("grpo", task)]) for task in TASKS}
    ours = bootstrap_task_average(data, 0.95, RESAMPLES, 0)
    assert (t.get("grpo", AVG, "pass@16").low, t.get("grpo", AVG, "pass@16").high) == pytest.approx(ours)
    one = bootstrap_task_average({"demo-sub": data["demo-sub"]}, 0.95, RESAMPLES, 0)
    assert (t.get("grpo", "demo-sub", "pass@16").low, t.get("grpo", "demo-sub", "pass@16").high) == pytest.approx(one)
    own = exp.average_cell("grpo", "pass@16")  # the evaluation's 1,000-resample interval: close, not equal
    assert t.get("grpo", AVG, "pass@16").low == pytest.approx(own.low, abs=0.02)
    assert t.underline == {
        ("grpo", "demo-add", "pass@1"), ("es", "demo-add", "pass@16"), ("es", "demo-add", "pass@32"),
        ("grpo", "demo-sub", "pass@1"), ("es", "demo-sub", "pass@16"),
        ("es", "demo-sub", "pass@32"), ("base", "demo-sub", "pass@32"),  # 82.0 vs 82.0: tie
        ("grpo", "demo-countdown", "pass@1"), ("es", "demo-countdown", "pass@1"),  # 12.0 tie
        ("es", "demo-countdown", "pass@16"), ("es", "demo-countdown", "pass@32")}
    assert t.bold == {("grpo", AVG, "pass@1"), ("es", AVG, "pass@16"), ("es", AVG, "pass@32")}
    assert t.shade == {("es_grpo", AVG, "pass@1"), ("es_grpo", AVG, "pass@16"),
                       ("es_grpo", AVG, "pass@32"), ("grpo_es", AVG, "pass@32")}  # 72.7 tie for second


def test_maj_table_layout(exp_dir: Path) -> None:
    from esreason.report import load_experiment
    from esreason.report.tables import AVERAGE_GROUP as AVG, metric_table

    t = metric_table(load_experiment(exp_dir), "maj")
    assert [m for m, _ in t.groups[0].columns] == ["maj@16", "maj@32"]
    assert t.get("grpo", "demo-add", "maj@16").value == pytest.approx(0.75)
    assert ("grpo", AVG, "maj@32") in t.bold and ("es_grpo", AVG, "maj@32") in t.shade


# ---------------------------------------------------------------------- held-out change, below base


def test_heldout_change(exp_dir: Path) -> None:
    from esreason.report import load_experiment
    from esreason.report.tables import heldout_change_table

    t = heldout_change_table(load_experiment(exp_dir))
    assert t.rows == ["grpo", "es", "es_grpo", "grpo_es"]
    d = t.get("grpo", "pass", "pass@1")
    assert d.value == pytest.approx(((35 - 30) + (12 - 10)) / 200)
    # identical per-problem spread -> every paired difference is constant -> a point interval
    assert d.low == pytest.approx(d.value) and d.high == pytest.approx(d.value)
    assert t.get("grpo", "pass", "pass@32").value == pytest.approx(((75 - 82.004) + (48 - 50)) / 200)
    es32 = t.get("es", "pass", "pass@32")
    assert es32.value == pytest.approx(((82 - 82.004) + (55 - 50)) / 200)
    assert es32.low < es32.value < es32.high  # es/demo-sub has another spread than base
    assert t.get("es", "maj", "maj@16").value == pytest.approx(((32 - 30) + (12 - 10)) / 200)


def test_below_base_counts(exp_dir: Path) -> None:
    from esreason.report import load_experiment
    from esreason.report.tables import below_base

    b = below_base(load_experiment(exp_dir))
    counts = {(c["method"], c["scope"]): c for c in b.counts}
    g = counts[("grpo", "all")]
    assert (g["comparisons"], g["below"], g["significant"], g["tasks"], g["tasks_below_all_k"]) == (6, 5, 5, 3, 2)
    g = counts[("grpo", "held_out")]
    assert (g["comparisons"], g["below"], g["significant"], g["tasks_below_all_k"]) == (4, 3, 3, 1)
    e = counts[("es", "all")]
    assert (e["below"], e["significant"], e["tasks_below_all_k"]) == (1, 0, 0)  # 82.0 < 82.004, not significant
    tiny = next(c for c in b.comparisons if c.method == "es" and c.below)
    assert (tiny.task, tiny.k, tiny.test) == ("demo-sub", 32, "paired bootstrap")


def test_bootstrap_matches_evaluation(exp_dir: Path) -> None:
    from esreason.eval.bootstrap import Bootstrap
    from esreason.report.stats import bootstrap_task_average

    # The same method (percentile, problems resampled within each task, equal task weights), its own
    # draws: at many resamples both estimate the same interval, to Monte Carlo error.
    data = {t: [r["pass@16"] for r in _rows("es", t)] for t in TASKS}
    ours = bootstrap_task_average({t: np.array(v) for t, v in data.items()}, 0.95, 20000, 0)
    theirs = Bootstrap(20000, 0.95, 0).suite(data)
    assert ours == pytest.approx((theirs.low, theirs.high), abs=0.005)


# ---------------------------------------------------------------------- Pareto


def test_pareto_dominance() -> None:
    from esreason.report.pareto import dominates, front, panel

    assert dominates((0.5, 0.7), (0.4, 0.7)) and not dominates((0.4, 0.7), (0.5, 0.7))
    assert not dominates((0.5, 0.5), (0.5, 0.5))  # equal points: neither dominates
    assert not dominates((0.6, 0.4), (0.5, 0.5))
    assert front({"a": (0.5, 0.5), "b": (0.5, 0.5), "c": (0.4, 0.4), "d": (0.2, 0.9)}) == ["d", "a", "b"]
    p = panel("t", "t", 32, {"base": (0.1, 0.5), "grpo": (0.4, 0.3), "es": (0.2, 0.6), "es_grpo": (0.3, 0.55)},
              {"base": "base", "grpo": "grpo", "es": "es", "es_grpo": "es_grpo"})
    assert p.reference_front == ["es", "grpo"] and p.full_front == ["es", "es_grpo", "grpo"]
    assert p.added == ["es_grpo"] and p.dominated_by == {"base": ["es", "es_grpo"]}
    same = panel("t", "t", 32, {"es": (0.2, 0.6), "grpo": (0.4, 0.3), "es_grpo": (0.2, 0.6)},
                 {"es": "es", "grpo": "grpo", "es_grpo": "es_grpo"})
    assert "es_grpo" in same.full_front and same.added == []  # on the front, but no new trade-off


def test_pareto_average_panel(exp_dir: Path) -> None:
    from esreason.report import load_experiment
    from esreason.report.pareto import pareto_panels

    panels, _ = pareto_panels(load_experiment(exp_dir))
    avg = panels[-1]
    assert avg.label == "Average" and avg.k == 32
    assert avg.reference_front == ["es", "grpo"]
    # grpo_es (36.7, 72.7) is dominated by es_grpo (38.0, 72.7): equal y, larger x
    assert avg.full_front == ["es", "es_grpo", "grpo"] and avg.added == ["es_grpo"]
    assert set(avg.dominated_by) == {"base", "grpo_es"} and avg.dominated_by["grpo_es"] == ["es_grpo"]


# ---------------------------------------------------------------------- training curves


def test_training_curves_concatenate_stages(exp_dir: Path) -> None:
    from esreason.report import load_experiment
    from esreason.report.curves import training_curves

    c = training_curves(load_experiment(exp_dir))
    greedy, sampled = "reward/mean|greedy (temperature 0)", "reward/mean|sampled (temperature 1)"
    assert set(c.panels) == {greedy, sampled, "heldout/entropy", "heldout/pass@1", "heldout/pass@16"}
    line = next(s for s in c.panels["heldout/entropy"] if s.method == "es_grpo")
    assert line.xs == [0, 2, 2, 4] and line.boundaries == [2]
    assert line.ys == pytest.approx([0.5, 0.49, 0.49, 0.39])
    reward = next(s for s in c.panels[sampled] if s.method == "grpo")
    assert reward.xs == [1, 2, 3, 4]
    assert c.base == {"heldout/entropy": 0.5, "heldout/pass@1": 0.2, "heldout/pass@16": 0.55}


def test_training_reward_panels_never_mix_measures(exp_dir: Path, tmp_path: Path) -> None:
    """ES's greedy reward and GRPO's sampled reward never share an axis; a composition's
    stages go to the panels of their own measures; each panel's title and y label name the measure."""
    from esreason.report import load_experiment
    from esreason.report.curves import training_curves
    from esreason.report.plots import _panel_text

    c = training_curves(load_experiment(exp_dir))
    greedy, sampled = "reward/mean|greedy (temperature 0)", "reward/mean|sampled (temperature 1)"
    assert {s.method for s in c.panels[greedy]} == {"es", "es_grpo", "grpo_es"}
    assert {s.method for s in c.panels[sampled]} == {"grpo", "es_grpo", "grpo_es"}
    es_grpo_greedy = next(s for s in c.panels[greedy] if s.method == "es_grpo")
    es_grpo_sampled = next(s for s in c.panels[sampled] if s.method == "es_grpo")
    assert es_grpo_greedy.xs == [1, 2] and es_grpo_sampled.xs == [3, 4]  # stage 1 ES, stage 2 GRPO
    title, ylabel = _panel_text(greedy)
    assert "greedy (temperature 0)" in title and ylabel.startswith("mean reward, greedy")
    title, ylabel = _panel_text(sampled)
    assert "sampled (temperature 1)" in title and ylabel.startswith("mean reward, sampled")
    # a stage without its config.yaml is labelled as such, not silently merged
    (exp_dir / "runs" / "grpo" / "config.yaml").unlink()
    c = training_curves(load_experiment(exp_dir))
    unknown = [k for k in c.panels if "measure unknown" in k]
    assert len(unknown) == 1 and [s.method for s in c.panels[unknown[0]]] == ["grpo"]


# ---------------------------------------------------------------------- LaTeX


def test_latex_escaping_and_marks(exp_dir: Path) -> None:
    from esreason.report import load_experiment
    from esreason.report.latex import latex_escape, table_latex
    from esreason.report.tables import metric_table

    assert latex_escape("ES→GRPO") == r"ES$\to$GRPO"
    assert latex_escape("demo-add") == "demo-add"
    assert latex_escape("my_task 50% & #1 {x}") == r"my\_task 50\% \& \#1 \{x\}"
    tex = table_latex(metric_table(load_experiment(exp_dir), "pass"), "tab:x")
    assert r"\multicolumn{3}{c}{demo-add}" in tex and r"\cmidrule(lr){2-4}" in tex
    rows = {line.split(" & ")[0]: line for line in tex.splitlines() if " & " in line}
    assert r"\underline{70.0}" in rows["GRPO"] and r"\textbf{39.0}" in rows["GRPO"]
    assert r"\cellcolor{gray!35}38.0" in rows[r"ES$\to$GRPO"]
    assert r"\underline{82.0}" in rows["Base"]  # the displayed tie on demo-sub @32
    assert "colortbl" in tex.splitlines()[0] and tex.count("\\\\") == 1 + 1 + 5


# ---------------------------------------------------------------------- the whole report


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_build_report_writes_everything(exp_dir: Path) -> None:
    from esreason.report import build_report

    result = build_report(exp_dir)
    out = exp_dir / "report"
    assert result.out_dir == out and result.markdown == out / "report.md" and result.json_path == out / "report.json"
    for name in ("pairs_bars.png", "passk_profiles.png", "pareto.png", "training_curves.png"):
        w, h = _png_size(out / name)
        assert w > 300 and h > 200
    for name in ("pass_at_k.tex", "maj_at_k.tex", "heldout_change.tex", "below_base.tex", "pareto_fronts.tex"):
        assert (out / name).read_text().startswith("% requires")
    md = (out / "report.md").read_text()
    assert "![train-test pairs](pairs_bars.png)" in md and "**39.0**" in md and "*38.0*" in md
    assert "<u>70.0</u>" in md and "| ES→GRPO |" in md
    data = json.loads((out / "report.json").read_text())
    cell = data["tables"]["pass_at_k"]["rows"]["es"]["cells"]["demo-sub"]["pass@16"]
    assert cell["value"] == pytest.approx(0.72) and cell["ci_low"] < 0.72 < cell["ci_high"]
    assert data["tables"]["heldout_change"]["rows"]["grpo"]["cells"]["pass"]["pass@1"]["value"] == pytest.approx(0.035)
    assert data["tables"]["below_base"]["counts"][0]["method"] == "grpo"
    verdicts = {f.id: f.verdict for f in result.findings}
    holds, agrees = "holds", "not significant (point estimate in the claimed direction)"
    assert verdicts == {"es_improves_pass1": holds, "es_improves_passk": holds,  # Pass@16 and @32: one claim
                        "grpo_beats_es_pass1": holds, "es_beats_grpo_passk": holds,
                        "grpo_below_base": holds, "heldout_change": holds,
                        "pareto_added": agrees, "entropy": agrees}  # no interval: at best "agrees"
    assert result.finding("es_beats_grpo_passk").holds is True  # constant paired differences
    family = [f for f in data["findings"] if f["in_family"]]
    assert [f["id"] for f in family] == ["es_improves_pass1", "es_improves_passk", "grpo_beats_es_pass1",
                                         "es_beats_grpo_passk", "grpo_below_base", "heldout_change"]
    assert all(f["test"]["family_size"] == 6 and f["test"]["p_holm"] <= 0.05 for f in family)
    assert set(result.finding("es_improves_passk").values["views"]) == {"pass@16", "pass@32"}
    assert result.finding("entropy").holds is False
    assert [f["verdict"] for f in data["findings"]] == list(verdicts.values())  # report.json says the same
    assert f"| {agrees} |" in md and "| holds |" in md  # and report.md


def test_missing_pieces_degrade_with_notes(tmp_path: Path) -> None:
    from esreason.report import build_report

    root = write_experiment(tmp_path / "exp", ["base", "grpo", "es"])
    (root / "eval" / "es" / "demo-countdown" / "problems.jsonl").unlink()
    (root / "runs" / "grpo" / "metrics.jsonl").unlink()
    summary = json.loads((root / "eval" / "grpo" / "summary.json").read_text())
    del summary["tasks"]["demo-countdown"]
    (root / "eval" / "grpo" / "summary.json").write_text(json.dumps(summary))
    result = build_report(root, tmp_path / "out")
    notes = "\n".join(result.notes)
    assert "demo-countdown" in notes and "runs/grpo/metrics.jsonl" in notes and "no es_grpo method" in notes
    avg = result.tables["pass_at_k"]["rows"]["grpo"]["cells"]["__average__"]
    assert avg == {}  # no average over fewer tasks
    change = result.tables["heldout_change"]["rows"]["es"]["cells"]["pass"]["pass@16"]
    assert change["value"] == pytest.approx(((72 - 70) + (45 - 40)) / 200) and change["ci_low"] is None
    assert result.finding("pareto_added").holds is None
    assert (tmp_path / "out" / "training_curves.png").is_file()  # ES still has training metrics
    # a rerun without figures removes the earlier PNGs, so the directory matches report.md
    build_report(root, tmp_path / "out", figures=False)
    assert not list((tmp_path / "out").glob("*.png")) and (tmp_path / "out" / "pass_at_k.tex").is_file()


def test_bad_input_is_a_user_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from esreason.cli import main
    from esreason.report import build_report, load_experiment

    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert str(empty / "experiment.json") in capsys.readouterr().err
    root = write_experiment(tmp_path / "exp", ["base", "es"])
    (root / "eval" / "es" / "summary.json").unlink()
    with pytest.raises(UserError, match=r"eval/es/summary\.json"):
        load_experiment(root)
    root = write_experiment(tmp_path / "exp2", ["base", "es"])
    with pytest.raises(UserError, match="--pareto-k 7"):
        build_report(root, pareto_k=7)
    spec = json.loads((root / "experiment.json").read_text())
    spec["protocol"]["ks"] = "1,16"
    (root / "experiment.json").write_text(json.dumps(spec))
    assert main(["report", str(root)]) == 2
    assert "protocol.ks" in capsys.readouterr().err


def test_cli_report(exp_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from esreason.cli import main

    assert main(["report", str(exp_dir), "--out", str(tmp_path / "r"), "--pareto-k", "16", "--large-k", "32",
                 "--no-figures"]) == 0
    assert "report:" in capsys.readouterr().out
    data = json.loads((tmp_path / "r" / "report.json").read_text())
    assert not list((tmp_path / "r").glob("*.png")) and data["figures"] == {}
    assert data["pareto"][0]["k"] == 16 and data["tables"]["below_base"]["ks"] == [32]
    counts = {(c["method"], c["scope"]): c["comparisons"] for c in data["tables"]["below_base"]["counts"]}
    assert counts[("grpo", "held_out")] == 2 and counts[("grpo", "all")] == 3  # tasks x one K


def test_roles_and_base_only(tmp_path: Path) -> None:
    from esreason.report import build_report, load_experiment
    from esreason.report.tables import metric_table

    root = write_experiment(tmp_path / "exp", ["base", "grpo", "es"])
    spec = json.loads((root / "experiment.json").read_text())
    spec["methods"]["grpo"].update({"kind": "checkpoint", "label": "GRPO (released)", "training": []})
    (root / "experiment.json").write_text(json.dumps(spec))
    exp = load_experiment(root)
    assert exp.methods["grpo"].role == "grpo"  # the key decides the role of a released checkpoint
    assert ("grpo", "demo-add", "pass@1") in metric_table(exp, "pass").underline

    only = write_experiment(tmp_path / "only", ["base"])
    result = build_report(only, figures=False)
    assert set(result.tables) == {"pass_at_k", "maj_at_k"}
    assert all(f.holds is None for f in result.findings)
    md = (only / "report" / "report.md").read_text()
    assert "_Not available (needs a base method, a trained method and a K > 1)._" in md
    assert "## 7. Held-out change vs base\n\nPaper Table tab:rq2-heldout-change" in md


# ---------------------------------------------------------------------- minimum detectable difference


def test_mdd_formula() -> None:
    from esreason.report.power import Z_SUM, mdd_from_sd

    assert Z_SUM == pytest.approx(2.8016, abs=1e-4)  # z_0.975 + z_0.80
    assert mdd_from_sd(0.5, 100) == pytest.approx(Z_SUM * 0.05)
    assert mdd_from_sd(0.5, 100, paired=False) == pytest.approx(Z_SUM * 0.05 * np.sqrt(2))
    assert mdd_from_sd(0.5, 1) is None and mdd_from_sd(float("nan"), 10) is None
    # 4x the problems halves the MDD
    assert mdd_from_sd(0.3, 400) == pytest.approx(mdd_from_sd(0.3, 100) / 2)


def test_mdd_per_task_in_report(exp_dir: Path) -> None:
    from esreason.report import build_report
    from esreason.report.load import load_experiment
    from esreason.report.power import Z_SUM, task_mdds

    exp = load_experiment(exp_dir)
    rows = {r.task: r for r in task_mdds(exp)}
    assert list(rows) == TASKS
    sd_base = float(np.std([0.05 * (1 if i % 2 == 0 else -1) for i in range(N)], ddof=1))
    for t in TASKS:
        r = rows[t]
        assert r.n == N and r.base == pytest.approx(PASS["base"][t][0] / 100)
        assert r.unpaired == pytest.approx(Z_SUM * np.sqrt(2) * sd_base / np.sqrt(N))
        # every method's rows are base + a constant: the paired differences have no spread
        assert set(r.paired) == {"grpo", "es", "es_grpo", "grpo_es"}
        assert r.paired_max == pytest.approx(0.0, abs=1e-9)
    # a method whose per-problem differences vary: the paired MDD is 2.80 * sd(d) / sqrt(n)
    path = exp_dir / "eval" / "es" / "demo-add" / "problems.jsonl"
    es_rows = [json.loads(x) for x in path.read_text().splitlines()]
    bumps = [0.1 * (i % 3) for i in range(N)]
    for row, b in zip(es_rows, bumps):
        row["pass@1"] += b
    path.write_text("".join(json.dumps(r) + "\n" for r in es_rows))
    r = {x.task: x for x in task_mdds(load_experiment(exp_dir))}["demo-add"]
    assert r.paired["es"] == pytest.approx(Z_SUM * float(np.std(bumps, ddof=1)) / np.sqrt(N))
    assert r.paired_max == r.paired["es"]
    result = build_report(exp_dir, figures=False)
    data = json.loads(result.json_path.read_text())
    assert [t["task"] for t in data["mdd"]["tasks"]] == TASKS and data["mdd"]["power"] == 0.8
    # per-task Pass@1 change vs base with its paired interval (GRPO on demo-add: 70 - 50, no spread)
    grpo_add = data["pass1_change_vs_base"]["grpo"]["demo-add"]
    assert grpo_add["value"] == pytest.approx(0.20) and grpo_add["ci_low"] == pytest.approx(0.20)
    assert set(data["pass1_change_vs_base"]) == {"grpo", "es", "es_grpo", "grpo_es"}
    md = result.markdown.read_text()
    assert "minimum detectable Pass@1 difference" in md and "demo-sub (held-out)" in md
    assert "Pass@1 change vs Base on each task" in md and "+20.0 [+20.0, +20.0]" in md
    pareto = result.finding("pareto_added")
    assert pareto is not None and "{" not in pareto.evidence and "on the full front: " in pareto.evidence


def test_trailing_mean_stays_inside_a_stage():
    from esreason.report.curves import Series, trailing_mean

    s = Series("es_grpo", "ES→GRPO", xs=[1, 2, 3, 4, 5, 6], ys=[1.0, 3.0, 5.0, 0.1, 0.3, 0.5], boundaries=[3])
    # stage 1 is updates 1-3 (ES), stage 2 starts at offset 3: its first row is update 4
    assert trailing_mean(s, window=2) == pytest.approx([1.0, 2.0, 4.0, 0.1, 0.2, 0.4])
    plain = Series("es", "ES", xs=[1, 2, 3, 4], ys=[0.0, 1.0, 2.0, 3.0])
    assert trailing_mean(plain, window=3) == pytest.approx([0.0, 0.5, 1.0, 2.0])
    assert trailing_mean(plain, window=1) == plain.ys
    with pytest.raises(ValueError):
        trailing_mean(plain, window=0)
