"""``esreason experiment run`` with ``analysis.offtask``: the off-task set and every method's token KL
are written beside the evaluations, reused on a rerun, and reach the report (toy sizes)."""

from __future__ import annotations

import json

import pytest

from esreason.experiments.spec import parse_spec
from test_experiments import ES, spec_data  # the toy experiment of the runner tests

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py


def test_experiment_measures_offtask_kl_of_every_method_and_reuses_it(tmp_path):
    from esreason.embedded import demo_model_dir
    from esreason.experiments.runner import run_experiment

    # sampled rollouts long enough to finish an answer: rewards differ between members, so ES moves
    es = {**ES, "generation": {"max_new_tokens": 40, "temperature": 0.7}, "es": {**ES["es"], "alpha": 2e-3}}
    data = spec_data(methods=["base", "grpo", "es"], configs={"es": es},
                     checkpoints={"grpo": {"path": str(demo_model_dir()), "label": "GRPO (ckpt)"}},
                     analysis={"offtask": {"task": "demo-countdown", "limit": 6, "max_tokens": 16}})
    spec = parse_spec(data)
    out = tmp_path / "exp"
    run_experiment(spec, out, progress=False, report=True, log=lambda *_: None)
    record = json.loads((out / "experiment.json").read_text())
    index = record["offtask"]
    assert index["direction"] == "KL(base || tuned)" and index["rows"] == 6 and index["source"] == "task"
    assert set(index["methods"]) == {"grpo", "es"} and "offtask" in record["timings"]
    es = json.loads((out / index["methods"]["es"]["file"]).read_text())
    same = json.loads((out / index["methods"]["grpo"]["file"]).read_text())  # the base model's own weights
    assert len(es["rows"]) == 6 and es["mean_token_kl"] > 0 and es["relative_l2"] > 0
    assert es["mean_sequence_kl"] == pytest.approx(sum(r["kl_sum"] for r in es["rows"]) / 6)
    assert same["mean_token_kl"] == pytest.approx(0.0, abs=1e-6) and same["relative_l2"] == 0.0
    assert es["sha256_tensors"] == record["methods"]["es"]["sha256_tensors"]

    files = [out / "offtask" / n for n in ("set.jsonl", "set.json", "es.json", "grpo.json")]
    stamps = [f.stat().st_mtime_ns for f in files]
    run_experiment(spec, out, progress=False, report=False, log=lambda *_: None)
    assert [f.stat().st_mtime_ns for f in files] == stamps  # nothing recomputed

    report = json.loads((out / "report" / "report.json").read_text())
    row = report["tables"]["offtask_drift"]["rows"]["es"]
    assert row["offtask_kl_per_token"]["value"] == pytest.approx(es["mean_token_kl"])
    assert row["offtask_kl_per_token"]["ci_low"] <= es["mean_token_kl"] <= row["offtask_kl_per_token"]["ci_high"]
    seq = row["offtask_kl_per_sequence"]
    assert seq["value"] == pytest.approx(es["mean_sequence_kl"]) and seq["ci_low"] <= seq["value"] <= seq["ci_high"]
    assert (out / "report" / "gain_vs_forgetting.png").is_file()

    # other settings: a new set, and every method scored again on it
    more = parse_spec({**data, "analysis": {"offtask": {"task": "demo-countdown", "limit": 4, "max_tokens": 16}}})
    run_experiment(more, out, progress=False, report=False, log=lambda *_: None)
    assert json.loads((out / "offtask" / "set.json").read_text())["rows"] == 4
    assert len(json.loads((out / "offtask" / "es.json").read_text())["rows"]) == 4
