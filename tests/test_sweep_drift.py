"""``esreason experiment sweep-drift``: a finished sweep's endpoints (here anchored ES at two lambdas,
two training seeds) evaluated against Base under an experiment file's protocol, at toy sizes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from esreason.cli import main

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

REPO = Path(__file__).resolve().parents[1]
TINY = ["train.batch_size=4", "train.max_steps=2", "generation.max_new_tokens=40", "generation.temperature=0.7",
        "checkpoint.every=2", "es.population_size=4"]


def test_sweep_drift_places_every_endpoint_against_base(tmp_path, capsys, tiny_model_dir):
    sweep = tmp_path / "anchor"
    sets = [a for s in TINY for a in ("--set", s)]
    assert main(["experiment", "sweep", "--config", str(REPO / "configs" / "demo" / "es.yaml"),
                 "--param", "es.anchor_decay", "--values", "0,100", "--reference", "0", "--checkpoints", "2",
                 "--seeds", "0,1", "--band-window", "1", "--output", str(sweep), "--no-progress", *sets]) == 0
    protocol = tmp_path / "protocol.yaml"
    protocol.write_text(yaml.safe_dump({
        "name": "p", "model": "demo", "task": "demo-add", "methods": ["base"],
        "eval": {"in_domain": ["demo-add"], "held_out": ["demo-sub"], "samples": 2, "ks": [1, 2],
                 "max_new_tokens": 40, "limit": 3, "ci_resamples": 0},
        "analysis": {"offtask": {"task": "demo-countdown", "limit": 4, "max_tokens": 12}}}))
    capsys.readouterr()
    assert main(["experiment", "sweep-drift", str(sweep), "--protocol", str(protocol), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    exp = sweep / "drift"
    record = json.loads((exp / "experiment.json").read_text())
    assert list(record["methods"]) == ["base", "v0", "v1"]
    assert record["methods"]["v1"]["label"] == "anchor_decay=100" and set(record["methods"]["v1"]["seeds"]) == {
        "0", "1"}
    assert set(record["offtask"]["methods"]) == {"v0", "v1"}
    table = json.loads((exp / "report" / "report.json").read_text())["tables"]["offtask_drift"]["rows"]
    for key in ("v0", "v1"):
        row = table[key]
        assert row["offtask_kl_per_token"]["value"] > 0 and row["relative_l2"] > 0
        assert row["offtask_kl_per_sequence"]["value"] > row["offtask_kl_per_token"]["value"]
        # two training seeds: the seed-level intervals (nothing is left without one), and per seed the
        # problem-only ones, narrower (evaluation noise only)
        assert row["offtask_kl_per_token"]["ci_low"] is not None and row["in_domain_gain_pass@1"]["ci_low"] is not None
        assert set(row["per_seed"]) == {"0", "1"}
        one = row["per_seed"]["0"]["offtask_kl_per_token"]
        both = row["offtask_kl_per_token"]
        assert one["ci_high"] - one["ci_low"] < both["ci_high"] - both["ci_low"]
    drift = (exp / "drift.md").read_text()
    assert "| anchor_decay=100 |" in drift and "| anchor_decay=100 (seed 1) |" in drift
    assert drift.strip() in printed
    assert (exp / "report" / "gain_vs_forgetting.png").is_file()

    other = tmp_path / "other.yaml"  # another start model: gains and drift would be measured from the wrong base
    other.write_text(protocol.read_text().replace("model: demo", f"model: {tiny_model_dir}"))
    assert main(["experiment", "sweep-drift", str(sweep), "--protocol", str(other), "--no-progress"]) == 2
    assert "is not the sweep's" in capsys.readouterr().err
