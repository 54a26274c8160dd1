"""Fault injection on an experiment directory (docs/faults.md): experiment.yaml, experiment.json, a
method's done.json and final checkpoint, a composition's sequence.json x truncate / zero-fill /
delete / garble-one-byte; a rerun recovers the identical record, weights and evaluations."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import pytest

from fault_helpers import DAMAGES, damage, warnings_naming

from test_experiments import ES as ES3, GRPO as GRPO3  # noqa: E402  (their 3-update configs, here 2)

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

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


def done_records(out: Path) -> dict:
    return {m: {k: v for k, v in json.loads((out / "runs" / m / "done.json").read_text()).items()
                if k != "train_seconds"} for m in ("es", "es_grpo")}


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    from esreason.experiments.runner import run_experiment
    from esreason.experiments.spec import parse_spec

    out = tmp_path_factory.mktemp("exp-ref") / "exp"
    result = run_experiment(parse_spec(SPEC), out, progress=False, report=False, log=lambda *_: None)
    return out, stable(result.record), summaries(out), done_records(out)


@contextlib.contextmanager
def same_path_copy(ref_dir: Path):
    """A scratch copy of the reference at the reference's own path (stage 2's config names stage 1's
    checkpoint by absolute path, so a composition resumes only where it was trained)."""
    original = ref_dir.with_name(ref_dir.name + ".orig")
    ref_dir.rename(original)
    shutil.copytree(original, ref_dir)
    try:
        yield ref_dir
    finally:
        shutil.rmtree(ref_dir)
        original.rename(ref_dir)


CASES = [("experiment.yaml", None), ("experiment.json", None), ("runs/es/done.json", None),
         ("runs/es_grpo/sequence.json", "runs/es_grpo/done.json"),
         ("runs/es/checkpoints/step_2/model.safetensors", None)]


@pytest.mark.parametrize("kind", DAMAGES)
@pytest.mark.parametrize("name, also_delete", CASES, ids=[c[0].replace("/", ".") for c in CASES])
def test_a_rerun_over_a_damaged_experiment_file_recovers(ref, capsys, name, also_delete, kind):
    ref_dir, record0, summaries0, done0 = ref
    with same_path_copy(ref_dir) as out:
        damage(out / name, kind)
        if also_delete:  # sequence.json is read only while the composition is (re)trained
            (out / also_delete).unlink()
        record, err = run(out, capsys)
        assert "Traceback" not in err
        assert stable(record) == record0
        assert stable(json.loads((out / "experiment.json").read_text())) == record0
        assert summaries(out) == summaries0
        assert done_records(out) == done0
    # The damage is named where it is seen: not for experiment.json (never read back), a missing record
    # (rebuilt), nor a truncated experiment.yaml (still YAML, with the training keys: rewritten).
    unreadable = kind in ("zero", "garble") or (kind == "truncate" and name.endswith(".json"))
    if name != "experiment.json" and (unreadable or name.endswith(".safetensors")):
        assert warnings_naming(err, Path(name).name), err
