"""Fault injection on an experiment directory (docs/faults.md): experiment.yaml, experiment.json, a
method's done.json and final checkpoint, a composition's sequence.json x truncate / zero-fill /
delete / garble-one-byte; a rerun recovers the identical record, weights and evaluations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fault_helpers import DAMAGES, copy_run, damage, warnings_naming

from test_experiments import ES as ES3, GRPO as GRPO3  # noqa: E402  (their 3-update configs, here 2)

ES = {**ES3, "train": {**ES3["train"], "max_steps": 2}}
GRPO = {**GRPO3, "train": {**GRPO3["train"], "max_steps": 2}}
SPEC = {"name": "t", "model": "demo", "task": "demo-add", "updates": 2, "methods": ["base", "es", "es_grpo"],
        "configs": {"es": ES, "grpo": GRPO},
        "eval": {"in_domain": ["demo-add"], "held_out": ["demo-sub"], "samples": 2, "ks": [1, 2],
                 "max_new_tokens": 16, "limit": 2, "ci_resamples": 0}}


def run(out: Path, capsys) -> tuple[dict, str]:
    from esreason.experiments.runner import run_experiment
    from esreason.experiments.spec import parse_spec

    result = run_experiment(parse_spec(SPEC), out, progress=False, report=False, log=lambda *_: None)
    return result.record, capsys.readouterr().err


def stable(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "timings"}


def summaries(out: Path) -> dict:
    got = {}
    for path in sorted(out.glob("eval/*/summary.json")):
        data = json.loads(path.read_text())
        data.pop("timings")
        got[path.parent.name] = data
    return got


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    from esreason.experiments.runner import run_experiment
    from esreason.experiments.spec import parse_spec

    out = tmp_path_factory.mktemp("exp-ref") / "exp"
    result = run_experiment(parse_spec(SPEC), out, progress=False, report=False, log=lambda *_: None)
    return out, result.record


CASES = [("experiment.yaml", None), ("experiment.json", None), ("runs/es/done.json", None),
         ("runs/es_grpo/sequence.json", "runs/es_grpo/done.json"),
         ("runs/es/checkpoints/step_2/model.safetensors", None)]


@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("name, also_delete", CASES, ids=[c[0].replace("/", ".") for c in CASES])
def test_a_rerun_over_a_damaged_experiment_file_recovers(ref, tmp_path, capsys, name, also_delete, kind):
    ref_dir, ref_record = ref
    out = copy_run(ref_dir, tmp_path / "exp")
    damage(out / name, kind)
    if also_delete:  # sequence.json is read only while the composition is (re)trained
        (out / also_delete).unlink()
    record, err = run(out, capsys)
    assert "Traceback" not in err
    assert stable(record) == stable(ref_record)
    assert json.loads((out / "experiment.json").read_text())["methods"] == ref_record["methods"]
    assert summaries(out) == summaries(ref_dir)
    for method in ("es", "es_grpo"):
        done = json.loads((out / "runs" / method / "done.json").read_text())
        want = json.loads((ref_dir / "runs" / method / "done.json").read_text())
        assert done["sha256_tensors"] == want["sha256_tensors"] and done["checkpoint"] == want["checkpoint"]
    if name != "experiment.json" and (kind != "delete" or name.endswith(".safetensors")):
        assert warnings_naming(err, Path(name).name), err  # the damage is named (a missing record is rebuilt)
