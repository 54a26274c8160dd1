"""The tail measured: every ES update records its responses' lengths per member, the run's manifest
their distribution, and ``experiment plan --lengths RUN`` plans with them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from esreason.config import load_config
from esreason.errors import UserError
from esreason.es_loop.lengths import length_metrics, summary


def test_length_metrics_per_update_and_member():
    lengths = np.array([[10, 64, 30], [64, 64, 5]])  # N = 2 members x B = 3 prompts, cap 64
    m = length_metrics(lengths, 64)
    assert m["length/at_cap"] == pytest.approx(3 / 6)
    assert m["length/member_at_cap"] == pytest.approx([1 / 3, 2 / 3])
    assert m["length/member_max"] == [64, 64] and m["length/member_mean"] == [pytest.approx(104 / 3, abs=0.01), 44.33]
    assert (m["length/p50"], m["length/max"]) == (30, 64) and m["length/mean"] == pytest.approx(237 / 6)
    assert m["length/responses"] == lengths.tolist()
    assert length_metrics(None, 64) == {}  # an evaluator that reports no lengths: no keys
    rows = [{"step": 1, **m}, {"step": 2, "reward/mean": 0.5}, {"step": 3, **length_metrics(np.full((2, 3), 7), 64)}]
    s = summary(rows, 64)
    assert (s["updates"], s["responses"], s["max"]) == (2, 12, 64) and s["at_cap"] == pytest.approx(3 / 12)
    assert s["per_update"] == {"step": [1, 3], "mean": [39.5, 7.0], "at_cap": [0.5, 0.0],
                               "worst_member_at_cap": [pytest.approx(2 / 3, abs=1e-6), 0.0]}
    assert summary([{"step": 1}], 64) is None


@pytest.fixture(scope="module")
def es_run(tmp_path_factory):
    """Two ES updates on the demo at a 12-token cap: most of its answers run to the cap."""
    from esreason.es_loop.run import run_es

    out = tmp_path_factory.mktemp("lengths") / "run"
    cfg = load_config(None, ["model=demo", "task=demo-add", "train.limit=8", "train.batch_size=4", "train.max_steps=2",
                             "es.population_size=4", "generation.max_new_tokens=12", "checkpoint.every=0",
                             "backend.type=hf"])
    run_es(cfg, out, progress=False)
    return out


def test_the_run_records_lengths_in_metrics_and_manifest(es_run):
    rows = [json.loads(x) for x in (es_run / "metrics.jsonl").read_text().splitlines()]
    assert all(np.array(r["length/responses"]).shape == (4, 4) for r in rows)
    assert all(sum(map(sum, r["length/responses"])) == r["tokens"] for r in rows)
    manifest = json.loads((es_run / "manifest.json").read_text())["response_lengths"]
    every = np.concatenate([np.ravel(r["length/responses"]) for r in rows])
    assert (manifest["cap"], manifest["updates"], manifest["responses"]) == (12, 2, 32)
    assert manifest["at_cap"] == pytest.approx((every >= 12).mean()) and manifest["at_cap"] > 0.5
    assert manifest["per_update"]["at_cap"] == [pytest.approx(r["length/at_cap"]) for r in rows]


def test_plan_takes_the_recorded_lengths(es_run, tmp_path):
    """ES stages plan with the ES run's lengths (here most at a 12-token cap, so the tail of a 2,048-token
    cap plan is short), evaluation stages with the evaluation's sampled rows."""
    from esreason.experiments.lengths import read_lengths
    from esreason.experiments.plan import build_plan
    from esreason.experiments.spec import load_spec

    recorded = read_lengths(es_run)
    assert recorded.eval is None and len(recorded.train.lengths) == 32 and max(recorded.train.lengths) == 12
    spec = load_spec("configs/experiments/easy.yaml", ["methods=[base,es]"])
    default = {s["name"]: s for s in build_plan(spec, 8)["stages"]}
    plan = build_plan(spec, 8, lengths=recorded)
    by = {s["name"]: s for s in plan["stages"]}
    keys = {a["key"]: a for a in plan["assumptions"]}
    assert keys["response_tokens.measured.train"]["source"].startswith("measured: 32 ES training responses in 1 run")
    assert by["train/es"]["tokens"] == pytest.approx(232 * 32 * 64 * np.mean(recorded.train.lengths), abs=1)
    assert by["train/es"]["terms_s"]["tail"] < default["train/es"]["terms_s"]["tail"] / 10
    assert by["train/es"]["limit"]["inference_s"] < default["train/es"]["limit"]["inference_s"]
    # with an evaluation's responses beside the run, the evaluation stages take those
    (tmp_path / "eval").mkdir()
    (tmp_path / "eval" / "responses.jsonl").write_text("".join(json.dumps({"num_tokens": n}) + "\n" for n in (100, 300)))
    (tmp_path / "runs" / "es").mkdir(parents=True)
    (tmp_path / "runs" / "es" / "metrics.jsonl").write_bytes((es_run / "metrics.jsonl").read_bytes())
    both = read_lengths(tmp_path)
    assert both.for_stage("es")[0] == "train" and both.for_stage("eval")[0] == "eval"
    assert both.for_stage("grpo") == ("eval", both.eval)
    mixed = {s["name"]: s for s in build_plan(spec, 8, lengths=both)["stages"]}
    problems = 1319 + 1221 + 7405 + 1000 + 198 + 257  # the Easy suites: 32 samples + 1 greedy each
    assert mixed["eval/base"]["tokens"] == problems * 33 * 200 and mixed["train/es"]["tokens"] == by["train/es"]["tokens"]


def test_bad_recorded_lengths_are_one_clear_error(tmp_path):
    from esreason.experiments.lengths import read_lengths

    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "length/responses": [[3, -1]]}) + "\n")
    with pytest.raises(UserError, match=r"metrics.jsonl update 1: length/responses must be lists of integers >= 0"):
        read_lengths(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.1}) + "\n")
    with pytest.raises(UserError, match="no recorded lengths under"):
        read_lengths(tmp_path)
