"""An experiment with GRPO variants as methods, and one matched on rollouts, run on the embedded default at toy
sizes: experiment.json, every run's manifest and the report state rollouts and tokens beside FLOPs."""

from __future__ import annotations

import json

import pytest

from esreason.experiments.spec import parse_spec
from test_budget import spec_data  # noqa: E402  (ES N = 8, B = 4; GRPO B = 4, G = 2: FLOP-matched)

pytestmark = pytest.mark.heavy  # trains five runs: the fast subset (`--fast`) leaves this file out


def _run(tmp_path_factory, name, report, **over):
    from esreason.experiments.runner import run_experiment

    out = tmp_path_factory.mktemp(name) / "exp"
    spec = parse_spec(spec_data(**over))
    result = run_experiment(spec, out, progress=False, report=report, log=lambda *_: None)
    return out, result


@pytest.fixture(scope="module")
def variants_experiment(tmp_path_factory):
    return _run(tmp_path_factory, "variants", True, methods=["base", "es", "grpo", "dr_grpo", "dapo"],
                variants={"dapo": {"family": True, "config": {"grpo": {"mini_batches": 4}}}})


@pytest.fixture(scope="module")
def rollouts_experiment(tmp_path_factory):
    return _run(tmp_path_factory, "rollouts", False, methods=["es", "dapo"], match="rollouts", updates=1)


def _manifest_budget(run):
    return json.loads((run / "manifest.json").read_text())["budget"]


def test_grpo_variants_train_with_their_objective_and_are_flop_matched(variants_experiment):
    out, result = variants_experiment
    record = json.loads((out / "experiment.json").read_text())
    assert list(record["methods"]) == ["base", "es", "grpo", "dr_grpo", "dapo"]
    assert record["match"] == "flops" and record["budget"]["flops_equal"] is True
    flops = {m: record["methods"][m]["planned"]["flops"] for m in ("es", "grpo", "dr_grpo", "dapo")}
    assert len(set(flops.values())) == 1
    for name, loss in (("grpo", "grpo"), ("dr_grpo", "dr_grpo"), ("dapo", "dapo")):
        m = record["methods"][name]
        assert m["kind"] == "grpo" and m["objective"]["loss_type"] == loss
        trl = json.loads((out / "runs" / name / "manifest.json").read_text())["trainer"]["trl_args"]
        assert trl["loss_type"] == loss  # what TRL was given
    assert record["methods"]["dapo"]["family"] is True and "family" not in record["methods"]["dr_grpo"]
    assert record["methods"]["dr_grpo"]["objective"]["standardize_advantages"] is False


def test_every_run_manifest_and_method_states_rollouts_and_tokens_beside_flops(variants_experiment):
    out, _ = variants_experiment
    record = json.loads((out / "experiment.json").read_text())
    for name, per_update in (("es", 8 * 4), ("grpo", 4 * 2), ("dapo", 4 * 2)):
        b = _manifest_budget(out / "runs" / name)
        assert b["planned"]["rollouts"] == 2 * per_update and b["planned"]["flops"] == record["methods"][name][
            "planned"]["flops"]
        rows = [json.loads(x) for x in (out / "runs" / name / "metrics.jsonl").read_text().splitlines()]
        tokens = sum(r["tokens"] for r in rows if "tokens" in r)
        assert b["consumed"]["rollouts"] == 2 * per_update and b["consumed"]["tokens"] == tokens > 0
        assert b["consumed"]["updates"] == 2 and record["methods"][name]["consumed"] == b["consumed"]
        assert 0 < b["consumed"]["mean_length"] <= 16  # generation.max_new_tokens
        # compute as spent: the run's forward-equivalents per generated token times its tokens
        per_token = b["planned"]["compute"]["forward_equivalents_per_token"]
        assert per_token == {"es": 1, "grpo": 5, "dapo": 5}[name]  # DAPO: no reference, an old-policy forward
        assert b["consumed"]["flops_spent"] == 2.0 * b["planned"]["params"] * per_token * tokens


def test_the_report_names_every_variant_and_its_budget(variants_experiment):
    out, result = variants_experiment
    text = result.report.read_text()
    pass_table = text.split("## 1. Pass@K")[1].split("## 2.")[0]
    for label in ("| GRPO |", "| Dr. GRPO |", "| DAPO |", "| ES |"):
        assert label in pass_table
    budget = text.split("## Compute budget")[1].split("## ")[0]
    assert "Matched on **flops**" in budget and "planned FLOPs by the paper's formula equal: yes" in budget
    assert "planned FLOPs as spent equal: no" in budget  # ES 1 forward-equivalent per token, GRPO 5
    assert all(f"| {label} | 2 |" in budget for label in ("ES", "GRPO", "Dr. GRPO", "DAPO"))
    assert "| DAPO | dapo | token | 0.2 / 0.28 | 0 | yes | yes | 0.2 | 4 |" in budget
    assert "| DAPO | 1 | 1 | 2 | 0 | 1 | 0 | 5 | 4 | 4 |" in budget  # passes per token, as spent vs the paper's
    assert "| ES | 1 | 0 | 0 | 0 | 0 | 0 | 1 | 1 | 1 |" in budget
    report = json.loads((out / "report" / "report.json").read_text())
    findings = {f["id"]: f for f in report["findings"]}
    assert findings["es_beats_variant_passk:dapo"]["in_family"] is True  # variants.dapo.family
    assert findings["es_beats_variant_passk:dr_grpo"]["in_family"] is False  # a description
    assert findings["variant_beats_es_pass1:dr_grpo"]["test"] is None
    family = [f for f in report["findings"] if f["in_family"]]
    assert all(f["test"]["family_size"] == len(family) for f in family)
    assert report["budget"]["methods"]["dapo"]["consumed"]["rollouts"] == 16


def test_match_rollouts_trains_grpo_until_it_has_sampled_as_many_responses_as_es(rollouts_experiment):
    out, result = rollouts_experiment
    record = result.record
    assert record["match"] == "rollouts" and record["budget"]["rollouts_equal"] is True
    es, dapo = record["methods"]["es"], record["methods"]["dapo"]
    assert es["planned"]["updates"] == 1 and dapo["planned"]["updates"] == dapo["updates"] == 4  # 1 x 32 / 8
    assert es["consumed"]["rollouts"] == dapo["consumed"]["rollouts"] == 32
    assert dapo["planned"]["flops"] == 4 * es["planned"]["flops"]
    assert _manifest_budget(out / "runs" / "dapo")["consumed"]["updates"] == 4
    from esreason.report import build_report

    text = build_report(out, figures=False).markdown.read_text()
    assert "Matched on **rollouts**" in text and "planned rollouts equal: yes" in text
