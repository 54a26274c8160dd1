"""Run-directory plumbing: atomic writes and directories, metrics, hashes, manifest, progress, info."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from esreason.errors import UserError
from esreason.io import (COMPLETE_MARKER, MetricsLogger, RunDir, atomic_directory, atomic_write_json,
                         atomic_write_text, build_manifest, clean_stale_tmp, hash_directory_safetensors,
                         hash_state_dict, progress_bar, read_metrics, remove_directory, sha256_file,
                         truncate_metrics, write_manifest)
from esreason.io import atomic as atomic_mod
from esreason.io.manifest import git_state

SRC = str(Path(__file__).resolve().parents[1] / "src")


def tmp_entries(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".tmp-"))


def make_checkpoint(run: RunDir, step: int, payload: str = "w") -> Path:
    with atomic_directory(run.checkpoint_path(step)) as tmp:
        (tmp / "model.safetensors").write_text(payload)
        (tmp / "sub").mkdir()
        (tmp / "sub" / "x.json").write_text("{}")
    return run.checkpoint_path(step)


def run_py(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=env, timeout=120)


# ------------------------------------------------------------------ atomic files

def test_atomic_write_text_and_json(tmp_path):
    target = tmp_path / "a" / "b.json"
    atomic_write_json(target, {"x": np.float32(0.5), "n": np.int64(3), "p": Path("/m"), "t": torch.tensor(2.0)})
    assert json.loads(target.read_text()) == {"x": 0.5, "n": 3, "p": "/m", "t": 2.0}
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask       # not mkstemp's 0600
    atomic_write_text(target, "héllo\n")
    assert target.read_text(encoding="utf-8") == "héllo\n"
    assert tmp_entries(target.parent) == []


def test_atomic_write_failure_keeps_old_content(tmp_path, monkeypatch):
    target = tmp_path / "m.json"
    atomic_write_text(target, "old")
    with pytest.raises(TypeError, match="object"):
        atomic_write_json(target, {"bad": object()})

    def boom(*_a):
        raise OSError("disk full")

    monkeypatch.setattr(atomic_mod.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(target, "new")
    assert target.read_text() == "old"
    assert tmp_entries(tmp_path) == []


# ------------------------------------------------------------------ atomic directories

def test_atomic_directory_commits_with_marker_last(tmp_path):
    run = RunDir(tmp_path / "run")
    ck = make_checkpoint(run, 1)
    assert sorted(p.name for p in ck.iterdir()) == [COMPLETE_MARKER, "model.safetensors", "sub"]
    assert tmp_entries(run.checkpoints_dir) == []
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(ck.stat().st_mode) == 0o777 & ~umask           # not mkdtemp's 0700
    assert run.latest_checkpoint() == (1, ck)


def test_exception_inside_atomic_directory_leaves_nothing(tmp_path):
    final = tmp_path / "ck" / "step_3"
    with pytest.raises(RuntimeError, match="mid-save"):
        with atomic_directory(final) as tmp:
            (tmp / "model.safetensors").write_bytes(b"half")
            raise RuntimeError("mid-save")
    assert not final.exists()
    assert list((tmp_path / "ck").iterdir()) == []


KILLED_WRITER = """
    import os, sys
    from pathlib import Path
    from esreason.io.atomic import atomic_directory
    with atomic_directory(Path(sys.argv[1])) as tmp:
        (tmp / "model.safetensors").write_bytes(b"x" * 4096)
        os._exit(17)                       # killed mid-write: no cleanup code runs
"""


def test_killed_process_leaves_only_tmp_which_readers_ignore(tmp_path):
    run = RunDir(tmp_path / "run")
    make_checkpoint(run, 1, payload="v1")
    for step in (2, 1):                    # a new checkpoint, then an overwrite of the existing one
        proc = run_py(KILLED_WRITER, str(run.checkpoint_path(step)))
        assert proc.returncode == 17, proc.stderr
    assert not run.checkpoint_path(2).exists()
    assert (run.checkpoint_path(1) / "model.safetensors").read_text() == "v1"   # old copy intact
    leftovers = tmp_entries(run.checkpoints_dir)
    assert len(leftovers) == 2 and all(n.startswith(".tmp-new-") for n in leftovers)
    assert {n.rsplit("-", 1)[1] for n in leftovers} == {"step_1", "step_2"}
    assert run.latest_checkpoint() == (1, run.checkpoint_path(1))
    assert run.list_checkpoints() == [(1, run.checkpoint_path(1))]
    removed = clean_stale_tmp(run.checkpoints_dir)
    assert sorted(p.name for p in removed) == leftovers
    assert tmp_entries(run.checkpoints_dir) == []


@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "rename-aside"])
def test_replacing_an_existing_directory(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(atomic_mod, "_exchange", lambda a, b: False)
    final = tmp_path / "step_5"
    with atomic_directory(final) as tmp:
        (tmp / "only_in_old").write_text("1")
        (tmp / "w").write_text("old")
    with atomic_directory(final) as tmp:
        (tmp / "w").write_text("new")
    assert sorted(p.name for p in final.iterdir()) == [COMPLETE_MARKER, "w"]
    assert (final / "w").read_text() == "new"
    assert tmp_entries(tmp_path) == []


def test_exchange_swaps_when_available(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "f").write_text("A")
    (b / "f").write_text("B")
    if atomic_mod._exchange(a, b):
        assert ((a / "f").read_text(), (b / "f").read_text()) == ("B", "A")
    else:                                   # unsupported here: must not have touched anything
        assert ((a / "f").read_text(), (b / "f").read_text()) == ("A", "B")


def test_clean_stale_tmp_respects_live_writers_and_restores_old_copies(tmp_path):
    me = os.getpid()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".tmp-new-{sleeper.pid}-0123abcd-step_9"
        live.mkdir()
        dead = tmp_path / f".tmp-new-{me}-0123abcd-step_8"              # our pid but not in flight
        dead.mkdir()
        orphan_old = tmp_path / f".tmp-old-{me}-89abcdef-step_7"         # crash between the two renames
        orphan_old.mkdir()
        (orphan_old / COMPLETE_MARKER).write_text("complete\n")
        superseded_old = tmp_path / f".tmp-old-{me}-89abcdef-step_6"
        superseded_old.mkdir()
        (tmp_path / "step_6").mkdir()
        foreign = tmp_path / ".tmp-something"
        foreign.write_text("x")
        with atomic_directory(tmp_path / "step_10") as tmp:             # our own in-flight write
            removed = {p.name for p in clean_stale_tmp(tmp_path)}
            assert tmp.is_dir()
        assert removed == {dead.name, superseded_old.name, foreign.name}
        assert live.is_dir() and (tmp_path / "step_7" / COMPLETE_MARKER).is_file()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert {p.name for p in clean_stale_tmp(tmp_path)} == {live.name}
    assert tmp_entries(tmp_path) == []


def test_remove_directory_and_prune(tmp_path):
    run = RunDir(tmp_path)
    for s in (1, 2, 10, 3):
        make_checkpoint(run, s)
    assert [s for s, _ in run.list_checkpoints()] == [1, 2, 3, 10]
    deleted = run.prune_checkpoints(keep_last=2)
    assert deleted == [run.checkpoint_path(1), run.checkpoint_path(2)]
    assert [s for s, _ in run.list_checkpoints()] == [3, 10]
    assert tmp_entries(run.checkpoints_dir) == []
    remove_directory(run.checkpoint_path(99))                              # missing: no-op
    with pytest.raises(ValueError):
        run.prune_checkpoints(keep_last=0)


# ------------------------------------------------------------------ run dir

def test_rundir_layout_and_checkpoint_discovery(tmp_path):
    run = RunDir(tmp_path / "run")
    assert run.latest_checkpoint() is None and run.list_checkpoints() == []
    assert not run.path.exists()                                           # inspecting creates nothing
    assert (run.metrics_path.name, run.manifest_path.name) == ("metrics.jsonl", "manifest.json")
    assert run.checkpoint_path(7) == tmp_path / "run" / "checkpoints" / "step_7"
    assert run.eval_suite_dir("easy-heldout") == tmp_path / "run" / "eval" / "easy-heldout"
    assert os.fspath(run) == str(tmp_path / "run")
    make_checkpoint(run, 9)
    make_checkpoint(run, 10)
    (run.checkpoints_dir / "step_11").mkdir()                              # no COMPLETE marker
    (run.checkpoints_dir / "step_012").mkdir()                             # non-canonical name
    (run.checkpoints_dir / "step_012" / COMPLETE_MARKER).write_text("x")
    (run.checkpoints_dir / "step_13").write_text("a file")
    (run.checkpoints_dir / ".tmp-new-1-00000000-step_14").mkdir()
    assert run.latest_checkpoint() == (10, run.checkpoint_path(10))       # numeric, not lexicographic
    assert [s for s, _ in run.list_checkpoints()] == [9, 10]
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError):
            run.checkpoint_path(bad)
    for bad in ("../x", "a/b", "", ".tmp-x"):
        with pytest.raises(UserError, match="suite"):
            run.eval_suite_dir(bad)


# ------------------------------------------------------------------ metrics

def test_metrics_logger_lines_are_flushed_and_typed(tmp_path):
    with MetricsLogger(tmp_path, tensorboard=False) as log:
        log.log(1, {"reward/mean": 0.25, "n": np.int64(4), "loss": torch.tensor(1.5), "note": "warm",
                    "nan": float("nan")})
        first = (tmp_path / "metrics.jsonl").read_text()                # visible before close
        assert json.loads(first)["step"] == 1 and first.endswith("\n")
        log.log(2, {"reward/mean": 0.5})
        with pytest.raises(ValueError, match="step"):
            log.log(3, {"step": 3})
        with pytest.raises(TypeError):
            log.log(True, {})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["n"] == 4 and rows[0]["loss"] == 1.5 and rows[0]["note"] == "warm"
    assert rows[0]["nan"] != rows[0]["nan"]                               # NaN kept, not dropped
    assert read_metrics(tmp_path / "missing.jsonl") == []


def _uninterrupted(path: Path, steps) -> bytes:
    with MetricsLogger(path, tensorboard=False) as log:
        for s in steps:
            log.log(s, {"reward": s / 10, "tag": f"s{s}"})
    return (path / "metrics.jsonl").read_bytes()


def test_truncate_metrics_drops_later_rows_and_a_torn_line(tmp_path):
    reference = _uninterrupted(tmp_path / "full", range(1, 7))
    run = tmp_path / "resumed"
    _uninterrupted(run, range(1, 5))
    path = run / "metrics.jsonl"
    with open(path, "a") as fh:
        fh.write('{"step": 5, "rew')                                     # killed mid-line
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3, 4]       # torn tail skipped
    assert truncate_metrics(path, 2) == 3                                # rows 3, 4 and the torn line
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    with MetricsLogger(run, tensorboard=False) as log:                   # resume after checkpoint 2
        for s in range(3, 7):
            log.log(s, {"reward": s / 10, "tag": f"s{s}"})
    assert path.read_bytes() == reference                                # byte-identical to uninterrupted
    assert truncate_metrics(path, 100) == 0 and path.read_bytes() == reference
    assert truncate_metrics(tmp_path / "missing.jsonl", 3) == 0


def test_logger_repairs_torn_tail_and_truncate_after(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a"')
    with MetricsLogger(tmp_path, tensorboard=False) as log:               # appending after a torn line
        log.log(3, {"a": 3})
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    path.write_text('{"step": 1}\n{"step": 2}')                           # complete row, lost newline
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    with MetricsLogger(tmp_path, tensorboard=False, truncate_after=1) as log:
        log.log(2, {"b": 1})
    assert path.read_text() == '{"step": 1}\n{"step": 2, "b": 1}\n'


def test_corrupt_middle_line_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{oops\n{"step": 3}\n')
    with pytest.raises(UserError, match=r"metrics.jsonl:2"):
        read_metrics(path)
    path.write_text('{"step": 1}\n{"no_step": 1}\n')
    with pytest.raises(UserError, match=r":2: expected an object with an integer 'step'"):
        truncate_metrics(path, 5)


def test_tensorboard_scalars_and_purge_on_resume(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path) as log:
        for s in range(1, 6):
            log.log(s, {"reward": float(s), "flag": True, "note": "x", "n": np.float32(s)})
    with MetricsLogger(tmp_path, truncate_after=2) as log:               # resume from checkpoint 2
        for s in (3, 4):
            log.log(s, {"reward": 10.0 * s, "flag": False, "note": "y", "n": np.float32(s)})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["n", "reward"]              # no strings, no bools
    assert [(e.step, e.value) for e in acc.Scalars("reward")] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]


# ------------------------------------------------------------------ hashing

def test_hash_state_dict_sensitivity_and_order_independence():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, generator=g)
    b = torch.randn(4, generator=g).to(torch.bfloat16)
    base = hash_state_dict({"a": a, "b": b})
    assert base == hash_state_dict({"b": b.clone(), "a": a.clone()})            # order independent
    assert base == hash_state_dict({"a": a.t().contiguous().t(), "b": b})      # layout independent
    assert base == hash_state_dict({"a": a.t().clone().t(), "b": b})           # non-contiguous input
    flipped = b.view(torch.int16).clone()
    flipped[0] += 1                                                             # one bf16 ulp
    variants = {
        "dtype": {"a": a.double(), "b": b},
        "shape": {"a": a.reshape(3, 2), "b": b},
        "value": {"a": a, "b": flipped.view(torch.bfloat16)},
        "name": {"a": a, "c": b},
        "missing": {"a": a},
        "bf16->fp16 same bytes": {"a": a, "b": b.view(torch.int16).view(torch.float16)},
    }
    hashes = {k: hash_state_dict(v) for k, v in variants.items()}
    assert base not in hashes.values() and len(set(hashes.values())) == len(hashes)
    assert len(base) == 64 and int(base, 16) >= 0
    for odd in (torch.zeros(3, dtype=torch.bool), torch.zeros((), dtype=torch.float16), torch.zeros(0),
                torch.zeros(2, dtype=torch.float8_e4m3fn)):
        assert len(hash_state_dict({"x": odd})) == 64
    with pytest.raises(TypeError, match="'x'"):
        hash_state_dict({"x": [1.0]})


def test_hash_directory_safetensors_ignores_metadata_order_and_sharding(tmp_path):
    state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16), "e": torch.zeros(5)}
    one, other, shards = tmp_path / "one", tmp_path / "other", tmp_path / "shards"
    for d in (one, other, shards):
        d.mkdir()
    save_file(state, one / "model.safetensors")
    save_file(dict(reversed(list(state.items()))), other / "model.safetensors", metadata={"format": "pt", "x": "y"})
    save_file({"w": state["w"]}, shards / "model-00001-of-00002.safetensors")
    save_file({"b": state["b"], "e": state["e"]}, shards / "model-00002-of-00002.safetensors")
    h = hash_directory_safetensors(one)
    assert h == hash_directory_safetensors(other) == hash_directory_safetensors(shards) == hash_state_dict(state)
    assert sha256_file(one / "model.safetensors") == hashlib.sha256((one / "model.safetensors").read_bytes()).hexdigest()
    save_file({"w": state["w"] + 1}, other / "model.safetensors")
    assert hash_directory_safetensors(other) != h
    save_file({"e": state["e"]}, shards / "extra.safetensors")
    with pytest.raises(UserError, match="'e' is stored in both"):
        hash_directory_safetensors(shards)
    with pytest.raises(UserError, match="no \\*.safetensors"):
        hash_directory_safetensors(tmp_path / "nowhere")


# ------------------------------------------------------------------ manifest

def test_manifest_contents_and_round_trip(tmp_path, monkeypatch):
    import transformers

    model = tmp_path / "model"
    model.mkdir()
    save_file({"w": torch.ones(2)}, model / "model.safetensors")
    monkeypatch.setattr(sys, "argv", ["esreason", "train", "es", "--config", "x.yaml"])
    m = build_manifest({"es": {"sigma": 1e-3}}, seeds={"train.seed": 7}, model_dir=str(model),
                       datasets={"demo-add": "sha256:abc"})
    assert m["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert m["versions"]["transformers"] == transformers.__version__
    assert m["versions"]["esreason"] == "0.1.0" and "math-verify" in m["versions"]
    assert m["python"] == sys.version.split()[0]
    assert m["device"]["type"] in ("cpu", "cuda")
    assert m["model"]["sha256_tensors"] == hash_directory_safetensors(model)
    assert m["command"] == ["esreason", "train", "es", "--config", "x.yaml"]
    assert m["seeds"] == {"train.seed": 7} and m["datasets"] == {"demo-add": "sha256:abc"}
    assert m["created_utc"].endswith("+00:00")
    assert "git_sha" in m and "git_dirty" in m
    path = write_manifest(tmp_path / "run", m)
    assert json.loads(path.read_text()) == m
    hub = build_manifest({}, seeds={}, model_dir="Qwen/Qwen2.5-1.5B-Instruct", datasets=None)
    assert hub["model"] == {"path": "Qwen/Qwen2.5-1.5B-Instruct", "sha256_tensors": None}


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_git_state_inside_outside_and_without_git(tmp_path, monkeypatch):
    pkg = tmp_path / "repo" / "src" / "esreason"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("x = 1\n")
    assert git_state(pkg) == {"sha": None, "dirty": None}                 # not a repository
    repo = tmp_path / "repo"
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "init")
    sha = _git(repo, "rev-parse", "HEAD")
    assert git_state(pkg) == {"sha": sha, "dirty": False}
    (pkg / "__init__.py").write_text("x = 2\n")
    assert git_state(pkg) == {"sha": sha, "dirty": True}
    other = tmp_path / "repo" / "venv" / "site-packages" / "esreason"   # installed copy in a foreign repo
    other.mkdir(parents=True)
    assert git_state(other) == {"sha": None, "dirty": None}
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))              # git not installed
    assert git_state(pkg) == {"sha": None, "dirty": None}
    m = build_manifest({}, seeds={})
    assert m["git_sha"] is None and m["versions"]["torch"]


# ------------------------------------------------------------------ progress

def test_progress_bar_tty_rule_and_override(monkeypatch, capsys):
    monkeypatch.delenv("ESREASON_PROGRESS", raising=False)
    bar = progress_bar(total=3, desc="ES")                                # pytest's stderr is no TTY
    assert bar.disable
    bar.close()
    monkeypatch.setenv("ESREASON_PROGRESS", "1")
    bar = progress_bar(total=3, desc="ES")
    assert not bar.disable
    bar.update(2)
    bar.set_postfix(reward="0.500")
    bar.close()
    err = capsys.readouterr().err
    assert "ES" in err and "2/3" in err and "reward=0.500" in err
    assert progress_bar(total=3, desc="ES", disable=True).disable
    monkeypatch.setenv("ESREASON_PROGRESS", "0")
    assert progress_bar(total=3, desc="ES", disable=None).disable


# ------------------------------------------------------------------ info

def test_info_text_mentions_versions_device_and_embedded_model(monkeypatch):
    import transformers

    from esreason import info
    from esreason.embedded import demo_model_dir

    monkeypatch.setattr(info, "_LIBRARIES", info._LIBRARIES + (("esreason-no-such-dist", "esreason_no_such_mod"),))
    text = info.info_text()
    assert torch.__version__ in text and transformers.__version__ in text
    assert "esreason-no-such-dist not installed" in text
    assert ("cuda" if torch.cuda.is_available() else f"cpu ({os.cpu_count()} cores") in text
    demo = Path(demo_model_dir())                                         # shipped with the package
    n = sum(t.numel() for f in demo.glob("*.safetensors") for t in load_file(f).values())
    assert n > 0 and info.safetensors_parameter_count(demo) == n
    assert str(demo) in text and f"{n:,} parameters" in text


def test_info_reports_a_missing_embedded_model(monkeypatch, tmp_path):
    import esreason.embedded
    from esreason import info

    monkeypatch.setattr(esreason.embedded, "demo_model_dir", lambda: tmp_path / "demo")
    assert "missing: run `esreason pretrain-demo`" in info.info_text()


def test_parameter_count_matches_the_loaded_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    from esreason.info import safetensors_parameter_count

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert safetensors_parameter_count(Path(tiny_model_dir)) == sum(p.numel() for p in model.parameters())


def test_info_does_not_import_optional_stacks():
    proc = run_py("""
        import sys
        from esreason.info import run_info
        rc = run_info(None)
        heavy = sorted(m for m in ("trl", "vllm", "ray") if m in sys.modules)
        print("RC", rc, "HEAVY", heavy)
    """)
    assert proc.returncode == 0, proc.stderr
    assert "RC 0 HEAVY []" in proc.stdout and "torch" in proc.stdout


def test_tensorboard_purge_holds_when_the_writer_counter_crosses_a_digit(tmp_path, monkeypatch):
    """Event files opened in one second sort by a text counter (".10" before ".9"): the resumed
    writer must still be read last, or its purge is lost (seen in CI, where many writers ran
    in one process)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.summary.writer import event_file_writer

    monkeypatch.setattr(event_file_writer, "_global_uid", event_file_writer.AtomicCounter(9))
    with MetricsLogger(tmp_path) as log:
        for s in range(1, 4):
            log.log(s, {"reward": float(s)})
    with MetricsLogger(tmp_path, truncate_after=1) as log:
        log.log(2, {"reward": 20.0})
    names = sorted(p.name for p in (tmp_path / "tensorboard").iterdir())
    assert names[0].endswith(".9") and names[1].endswith(".10")
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("reward")] == [(1, 1.0), (2, 20.0)]
