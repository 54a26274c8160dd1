"""The report's Pass@K profiles: every K from 1 to M through the unbiased estimator, the tables' Ks marked.

The fixture is an experiment directory whose per-problem correct counts are chosen by hand (M = 8
samples, protocol Ks 1, 4, 8), with ``problems.jsonl`` and ``summary.json`` written by the
evaluation's own code, so the profile must (a) have every K = 1..8, (b) equal the mean over problems
of ``pass_at_k(8, c, K)`` (computed here directly from the counts), (c) pass through the table's value
at every tabulated K, and (d) be what the figure draws.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from esreason.eval.metrics import pass_at_k

M = 8
KS = (1, 4, 8)
TASKS = ["demo-add", "demo-sub"]
# correct counts c per problem, per method and task (and per training seed for "es_seeds")
COUNTS = {
    "base": {"demo-add": [0, 1, 2, 8, 3], "demo-sub": [0, 0, 1, 5, 2]},
    "es": {"demo-add": [1, 1, 3, 8, 4], "demo-sub": [0, 2, 1, 6, 2]},
}
SEED_COUNTS = [{"demo-add": [1, 0, 3, 7, 4], "demo-sub": [0, 2, 2, 6, 1]},
               {"demo-add": [2, 1, 2, 8, 5], "demo-sub": [1, 1, 0, 7, 3]}]
# A float64 mean over 5 problems (or 2 tasks, 2 seeds) of values in [0, 1] in another summation order
# differs by a few ulps of 1 (2.2e-16 each); 1e-12 leaves room and still catches any wrong K or c.
TOL = 1e-12


def _expected(counts: dict[str, list[int]], tasks: list[str]) -> dict[int, float]:
    """The estimator, straight from the counts: equal-weight mean over tasks of the problem means."""
    return {k: float(np.mean([np.mean([pass_at_k(M, c, k) for c in counts[t]]) for t in tasks]))
            for k in range(1, M + 1)}


def _write_eval(out: Path, counts: dict[str, list[int]]) -> None:
    from esreason.eval.aggregate import summarize
    from esreason.eval.bootstrap import Bootstrap
    from esreason.eval.harness import Summary
    from esreason.eval.records import Protocol

    names = [f"pass@{k}" for k in KS]
    tables = {t: [{"correct": float(c), **{f"pass@{k}": pass_at_k(M, c, k) for k in KS}} for c in cs]
              for t, cs in counts.items()}
    summary = Summary(output_dir=out, model="m", tasks=list(counts), names=names, ks=KS,
                      protocol=Protocol(samples=M, temperature=0.6, max_new_tokens=16, greedy=False, seed=0),
                      split="test", num_problems={t: len(cs) for t, cs in counts.items()},
                      estimates=summarize(tables, names, Bootstrap(100, 0.95, 0)),
                      bootstrap={"resamples": 100, "level": 0.95, "seed": 0, "method": "percentile"})
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary.as_dict()))
    for t, rows in tables.items():
        (out / t).mkdir(exist_ok=True)
        (out / t / "problems.jsonl").write_text(
            "".join(json.dumps({"problem_id": f"{t}-{i}", **r}) + "\n" for i, r in enumerate(rows)))


def _experiment(root: Path, seeds: bool = False) -> Path:
    methods = {}
    for m, counts in COUNTS.items():
        _write_eval(root / "eval" / m, counts)
        methods[m] = {"kind": m, "label": m.upper(), "eval": f"eval/{m}", "training": []}
    if seeds:
        runs = {}
        for s, counts in enumerate(SEED_COUNTS):
            _write_eval(root / "eval" / "es_seeds" / f"seed{s}", counts)
            runs[str(s)] = {"eval": f"eval/es_seeds/seed{s}", "training": []}
        methods["es_seeds"] = {"kind": "es", "label": "ES (2 seeds)", "seeds": runs}
    (root / "experiment.json").write_text(json.dumps({
        "kind": "esreason-experiment", "version": 1, "name": "profiles", "model": "demo", "train_task": "demo-add",
        "suites": {"in_domain": ["demo-add"], "held_out": ["demo-sub"]},
        "protocol": {"samples": M, "ks": list(KS), "temperature": 0.6}, "pairs": [], "methods": methods}))
    return root


def test_estimator_table_is_the_estimator():
    from esreason.report.passk_profiles import counts_profile, estimator_table

    table = estimator_table(M)
    assert table.shape == (M + 1, M)
    assert all(table[c, k - 1] == pass_at_k(M, c, k) for c in range(M + 1) for k in range(1, M + 1))
    counts = [0, 1, 2, 8, 3]
    assert np.allclose(counts_profile(counts, M), [np.mean([pass_at_k(M, c, k) for c in counts])
                                                  for k in range(1, M + 1)], rtol=0, atol=TOL)


def test_profiles_have_every_k_and_equal_the_estimator(tmp_path):
    from esreason.report.load import load_experiment
    from esreason.report.passk_profiles import AVERAGE_LABEL, passk_profiles

    exp = load_experiment(_experiment(tmp_path / "exp"))
    profiles, notes = passk_profiles(exp)
    assert not notes
    assert list(profiles) == TASKS + [AVERAGE_LABEL]
    for label, group in [(t, [t]) for t in TASKS] + [(AVERAGE_LABEL, TASKS)]:
        for m in COUNTS:
            p = profiles[label][m]
            assert p.samples == M and list(p.values) == list(range(1, M + 1))  # every K, not only 1, 4, 8
            want = _expected(COUNTS[m], group)
            assert all(abs(p.values[k] - want[k]) <= TOL for k in want), (label, m)
            assert sorted(p.marks) == list(KS)  # the tables' Ks are the marks ...
            assert all(abs(p.values[k] - c.value) <= TOL for k, c in p.marks.items())  # ... on the line
            assert all(c.low is not None and c.high is not None for c in p.marks.values())
    # Pass@K rises with K where some problem is neither always nor never solved
    assert all(b > a for a, b in zip(list(profiles["demo-add"]["base"].values.values()),
                                     list(profiles["demo-add"]["base"].values.values())[1:]))


def test_seeded_method_profile_is_the_mean_of_its_seeds(tmp_path):
    from esreason.report.load import load_experiment
    from esreason.report.passk_profiles import AVERAGE_LABEL, passk_profiles

    exp = load_experiment(_experiment(tmp_path / "exp", seeds=True))
    profiles, _ = passk_profiles(exp)
    for label, group in [("demo-sub", ["demo-sub"]), (AVERAGE_LABEL, TASKS)]:
        p = profiles[label]["es_seeds"]
        per_seed = [_expected(c, group) for c in SEED_COUNTS]
        assert len(p.seeds) == 2 and all(list(s) == list(range(1, M + 1)) for s in p.seeds)
        assert all(abs(p.seeds[i][k] - per_seed[i][k]) <= TOL for i in range(2) for k in range(1, M + 1))
        assert all(abs(p.values[k] - (per_seed[0][k] + per_seed[1][k]) / 2) <= TOL for k in range(1, M + 1))
        assert all(abs(p.values[k] - c.value) <= TOL for k, c in p.marks.items())  # the pooled table's values


def test_without_counts_the_profile_falls_back_to_the_tabulated_ks(tmp_path):
    from esreason.report.load import load_experiment
    from esreason.report.passk_profiles import passk_profiles

    root = _experiment(tmp_path / "exp")
    (root / "eval" / "es" / "demo-sub" / "problems.jsonl").unlink()
    profiles, notes = passk_profiles(load_experiment(root))
    p = profiles["demo-sub"]["es"]
    assert p.samples is None and list(p.values) == list(KS)
    assert profiles["demo-add"]["es"].samples == M  # other tasks keep every K
    assert any("ES on demo-sub" in n and "tabulated K only" in n for n in notes)


def test_report_figure_draws_every_k_and_json_has_them(tmp_path, monkeypatch):
    from esreason.report import build_report, plots

    drawn = {}
    save = plots._save

    def keep(fig, path):
        drawn[Path(path).name] = fig
        return save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    result = build_report(_experiment(tmp_path / "exp"))
    data = json.loads(result.json_path.read_text())
    avg = data["passk_profiles"]["Average (all tasks)"]["base"]
    assert [int(k) for k in avg["pass_at_k"]] == list(range(1, M + 1)) and avg["samples"] == M
    assert [int(k) for k in avg["marks"]] == list(KS)

    fig = drawn["passk_profiles.png"]
    axes = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == TASKS + ["Average (all tasks)"]
    ax = axes[0]
    assert ax.get_xscale() == "log"
    lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == M]  # the profiles (errorbar markers: 3 points)
    assert len(lines) == len(COUNTS)
    want = {m: _expected(COUNTS[m], ["demo-add"]) for m in COUNTS}
    for line, m in zip(lines, COUNTS):
        assert list(line.get_xdata()) == list(range(1, M + 1))
        assert np.allclose(line.get_ydata(), [100 * want[m][k] for k in range(1, M + 1)], rtol=0, atol=100 * TOL)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2", "4", "8"]
    assert "markers: the table's K" in result.markdown.read_text()


@pytest.mark.parametrize("ks,ticks", [({1, 2, 3, 4}, [1, 2, 4]), (set(range(1, 33)), [1, 2, 4, 8, 16, 32]),
                                      (set(range(1, 51)), [1, 2, 4, 8, 16, 32, 50])])
def test_k_ticks(ks, ticks):
    from esreason.report.plots import _k_ticks

    assert _k_ticks(ks) == ticks
