"""Weights & Biases logging: ``logging.wandb`` and ``--wandb PROJECT``.

One small experiment (ES->GRPO, one update each, W&B offline: ``WANDB_MODE=offline``) leaves an ES
run, a GRPO run and the experiment's own run in W&B's offline files; the tests read those files
(the ``.wandb`` transaction log and the table JSON files) and check the logged keys, the
completions tables, the group and the attached configs. Without wandb installed the key fails
with one line naming the extra.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from esreason.config import RunConfig, build, load_config, to_dict
from esreason.errors import UserError

pytestmark = pytest.mark.heavy  # a trained experiment: the fast subset (`--fast`) leaves this file out

PROJECT = "esreason-test"
WANDB = {"project": PROJECT, "table_every": 1, "table_rows": 2}
ES = {"model": "demo", "task": "demo-add", "es": {"population_size": 4, "sigma": 2e-3, "alpha": 1e-3},
      "train": {"batch_size": 4, "limit": 8, "seed": 0}, "generation": {"max_new_tokens": 24},
      "checkpoint": {"every": 1},
      "eval": {"every": 1, "limit": 2, "samples": 2, "ks": [1, 2]},  # held-out entropy at updates 0 and 1
      "logging": {"wandb": WANDB}}
GRPO = {"model": "demo", "task": "demo-add", "grpo": {"num_generations": 2, "micro_batch_size": 8},
        "train": {"batch_size": 4, "limit": 8, "seed": 0}, "generation": {"max_new_tokens": 24},
        "checkpoint": {"every": 1}, "logging": {"wandb": WANDB}}
SPEC = {"name": "wandbexp", "model": "demo", "task": "demo-add", "updates": 2, "methods": ["es_grpo"],
        "configs": {"es": ES, "grpo": GRPO},
        "eval": {"in_domain": ["demo-add"], "held_out": ["demo-sub"], "samples": 1, "ks": [1],
                 "max_new_tokens": 16, "limit": 1, "ci_resamples": 0, "greedy": False}}


# --------------------------------------------------------------------------- reading W&B's offline files


def _records(path: Path) -> list[Any]:
    """The records of a ``.wandb`` file: W&B's LevelDB-style log (7-byte header ``:W&B`` + magic +
    version; 32 KiB blocks of chunks ``crc32 u32, length u16, type u8`` with 1 full, 2 first, 3
    middle, 4 last; a block tail under 7 bytes is padding), each record a ``wandb_internal_pb2.Record``.
    wandb >= 0.2x has no Python reader of its own (the Go core writes the file)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B transaction log"
    pos, block, buf, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the end of the block
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def read_wandb(run_dir: Path) -> dict[str, Any]:
    """The one offline W&B run under ``run_dir/wandb``: its run record (project, group, name, job type,
    config), history rows ({key: value}) and completions tables (the JSON files W&B wrote)."""
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, f"expected one offline W&B run in {run_dir / 'wandb'}, found {runs}"
    (log,) = runs[0].glob("run-*.wandb")
    info: dict[str, Any] = {"history": [], "tables": []}
    for rec in _records(log):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            r = rec.run
            info.update(project=r.project, group=r.run_group, name=r.display_name, job_type=r.job_type,
                        config={i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "config":
            info.setdefault("config_updates", {}).update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "history":
            info["history"].append({"/".join(i.nested_key) or i.key: json.loads(i.value_json)
                                    for i in rec.history.item})
    for table in sorted((runs[0] / "files" / "media" / "table").glob("completions_*.table.json")):
        info["tables"].append(json.loads(table.read_text()))
    return info


@pytest.fixture(scope="module")
def experiment(tmp_path_factory):
    """The ES->GRPO experiment with W&B offline; every W&B directory inside tmp."""
    from esreason.experiments.runner import run_experiment
    from esreason.experiments.spec import parse_spec

    root = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        for var in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
            mp.setenv(var, str(root / "home"))
        spec = parse_spec(SPEC)
        out = root / "exp"
        run_experiment(spec, out, progress=False, report=False, log=lambda *_: None)
    return out


# --------------------------------------------------------------------------- runs with logging.wandb


def test_es_run_logs_update_metrics_heldout_entropy_and_a_completions_table(experiment):
    from esreason import tasks, verifiers

    run = experiment / "runs" / "es_grpo" / "stage1_es"
    w = read_wandb(run)
    assert (w["project"], w["group"], w["job_type"]) == (PROJECT, "wandbexp", "es")  # the experiment's group
    assert w["name"] == "es_grpo/stage1_es"
    assert w["config"]["es"]["population_size"] == 4 and w["config"]["logging"]["wandb"]["project"] == PROJECT
    rows = {json.loads(line)["step"]: json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()}
    logged = {}
    for h in w["history"]:
        logged.setdefault(h["_step"], {}).update(h)
    assert sorted(logged) == sorted(rows) == [0, 1]  # update 0: held-out only; update 1: the update's row
    for key in ("reward/mean", "reward/std", "reward/max", "update_norm", "time/step", "heldout/demo-add/entropy"):
        assert logged[1][key] == rows[1][key], key  # the same number as metrics.jsonl (and TensorBoard)
    assert logged[0]["heldout/demo-add/entropy"] == rows[0]["heldout/demo-add/entropy"]
    assert logged[1]["completions/_type"] == "table-file" and logged[1]["completions/nrows"] == 2
    (table,) = w["tables"]
    assert table["columns"] == ["step", "prompt", "completion", "reward"]
    assert len(table["data"]) == 2
    # each row's reward is the verifier's score of its completion against its prompt's gold answer
    problems = {p.messages[-1]["content"]: p for p in tasks.get("demo-add").load("train", None, 8)}
    score = verifiers.get(tasks.get("demo-add").verifier, format_reward=0.1)
    for step, prompt, completion, reward in table["data"]:
        assert step == 1 and prompt in problems
        assert reward == score(completion, problems[prompt].gold).reward


def test_grpo_run_forwards_report_to_trl_and_logs_our_rows_and_a_completions_table(experiment):
    run = experiment / "runs" / "es_grpo" / "stage2_grpo"
    w = read_wandb(run)
    assert (w["project"], w["group"], w["job_type"]) == (PROJECT, "wandbexp", "grpo")
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["trainer"]["trl_args"]["report_to"] == ["wandb"]
    keys = set().union(*w["history"])
    assert {"train/reward", "train/loss", "train/global_step"} <= keys  # TRL's metrics via WandbCallback
    assert {"reward/mean", "accuracy/mean", "update"} <= keys  # our metrics.jsonl row
    assert w["config_updates"]["num_generations"] == 2  # TrainingArguments, added by transformers' callback
    assert w["config"]["grpo"]["num_generations"] == 2  # our run config, attached at init
    (table,) = w["tables"]
    assert table["columns"] == ["step", "prompt", "completion", "reward"] and len(table["data"]) == 2
    assert all(isinstance(r[3], float) and 0.0 <= r[3] <= 1.0 and r[1] for r in table["data"])


def test_experiment_groups_its_stages_and_attaches_its_config(experiment):
    w = read_wandb(experiment)
    assert (w["project"], w["group"], w["job_type"]) == (PROJECT, "wandbexp", "experiment")
    assert w["config"]["experiment"]["methods"] == ["es_grpo"]
    assert w["config"]["experiment"]["configs"]["es"]["es"]["population_size"] == 4


def test_es_table_and_logging_leave_the_trajectory_unchanged(experiment, tmp_path):
    from esreason.es_loop.run import run_es
    from esreason.io.hashing import hash_directory_safetensors

    stage = experiment / "runs" / "es_grpo" / "stage1_es"
    data = yaml.safe_load((stage / "config.yaml").read_text())
    data["logging"]["wandb"]["project"] = None  # the same run without W&B
    run_es(build(RunConfig, data), tmp_path / "plain", progress=False)
    assert (hash_directory_safetensors(tmp_path / "plain" / "checkpoints" / "step_1")
            == hash_directory_safetensors(stage / "checkpoints" / "step_1"))


# --------------------------------------------------------------------------- without wandb; flags; identity


def test_without_wandb_the_key_fails_with_one_line_naming_the_extra(monkeypatch, tmp_path, capsys):
    from esreason.cli import main
    from esreason.grpo.config import GRPORunConfig
    from esreason.grpo.run import run_grpo

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    config = Path(__file__).resolve().parents[1] / "configs" / "demo" / "es.yaml"
    code = main(["train", "es", "--config", str(config), "--wandb", PROJECT, "--output", str(tmp_path / "es"),
                 "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "pip install 'esreason[wandb]'" in err and "logging.wandb" in err
    assert not (tmp_path / "es" / "metrics.jsonl").exists()
    with pytest.raises(UserError, match=r"pip install 'esreason\[wandb\]'"):
        run_grpo(build(GRPORunConfig, {"logging": {"wandb": {"project": PROJECT}}}), tmp_path / "grpo")
    assert not (tmp_path / "grpo" / "metrics.jsonl").exists()


def test_wandb_flag_sets_the_project_on_every_training_command():
    from esreason.cli import build_parser
    from esreason.config_logging import wandb_sets

    parser = build_parser()
    for argv in (["train", "es"], ["train", "grpo"], ["train", "sequence", "--config", "x.yaml"],
                 ["experiment", "run", "x.yaml"]):
        assert parser.parse_args([*argv, "--wandb", "123"]).wandb == "123"
    args = parser.parse_args(["train", "es", "--wandb", "123"])
    assert load_config(None, wandb_sets(args)).logging.wandb.project == "123"  # a string, not YAML's int
    assert load_config(None, wandb_sets(parser.parse_args(["train", "es"]))).logging.wandb.project is None


def test_logging_is_not_part_of_a_runs_identity(tmp_path):
    """A run written before the section existed (no ``logging`` in config.yaml) resumes with W&B on,
    and an experiment's method fingerprint does not change when W&B is switched on."""
    from esreason.config_logging import with_wandb
    from esreason.es_loop.resume import check_resume_config
    from esreason.experiments.runner import fingerprint
    from esreason.experiments.spec import parse_spec

    cfg = load_config(None, ["train.max_steps=2"])
    old = to_dict(cfg)
    del old["logging"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    assert check_resume_config(tmp_path, with_wandb(cfg, project=PROJECT)).extended == {}
    with pytest.raises(UserError, match="es.sigma"):  # other keys are still compared
        check_resume_config(tmp_path, load_config(None, ["train.max_steps=2", "es.sigma=0.01"]))
    spec = parse_spec({**SPEC, "configs": {"es": {**ES, "logging": {}}, "grpo": {**GRPO, "logging": {}}}})
    on = parse_spec(SPEC)
    assert fingerprint(spec.methods[0], spec) == fingerprint(on.methods[0], on)


def test_online_without_a_login_is_one_line(monkeypatch, tmp_path):
    """wandb.init's own errors (no API key here) become one UserError line naming the key, not a traceback."""
    from esreason.io.wandb_log import start_run

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "cfg"))
    cfg = load_config(None, [f"logging.wandb.project={PROJECT}", "logging.wandb.mode=online"])
    with pytest.raises(UserError, match=r"config key 'logging.wandb': .*wandb login") as info:
        start_run(cfg.logging.wandb, tmp_path / "run", {}, job_type="es")
    assert "\n" not in str(info.value)
