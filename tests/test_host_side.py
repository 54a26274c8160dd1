"""The host side of a GPU node: one start-state copy per node, one engine start timeout, engines and
`esreason eval` in the model's own dtype."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from esreason.backends.engine import remove_shared_state, shared_state_dir, shared_state_root, state_key


def _state(tag: bytes = b"a") -> dict[str, bytes]:
    return {"model.safetensors": tag * 1000, "config.json": b"{}", "es_master/master.safetensors": tag * 10}


def test_engines_of_a_node_share_one_start_state_copy(tmp_path, monkeypatch):
    import esreason.backends.engine as engine

    writes = []
    real = engine.write_state
    monkeypatch.setattr(engine, "write_state", lambda state, d: writes.append(d) or real(state, d))
    state = _state()
    dirs = {shared_state_dir(state, tmp_path) for _ in range(8)}  # eight engines on one node
    assert len(dirs) == 1 and len(writes) == 1
    (d,) = dirs
    assert (d / "model.safetensors").read_bytes() == state["model.safetensors"]
    assert (d / "es_master" / "master.safetensors").is_file()
    # exactly one copy on the node: the directory and its lock, no staging leftovers
    assert sorted(p.name for p in shared_state_root(tmp_path).iterdir()) == sorted([d.name, d.name + ".lock"])
    other = shared_state_dir(_state(b"b"), tmp_path)  # another state (a re-broadcast): its own copy
    assert other != d and len(writes) == 2
    remove_shared_state(state, tmp_path)
    assert not d.exists() and other.exists()
    remove_shared_state(state_key(_state(b"b")), tmp_path)
    assert not any(shared_state_root(tmp_path).iterdir())


def test_a_half_written_state_is_never_used(tmp_path, monkeypatch):
    import esreason.backends.engine as engine

    state = _state()
    real = engine.write_state

    def dies(st, d):
        real({"config.json": b"{}"}, d)  # a writer killed midway
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "write_state", dies)
    with pytest.raises(KeyboardInterrupt):
        shared_state_dir(state, tmp_path)
    monkeypatch.setattr(engine, "write_state", real)
    d = shared_state_dir(state, tmp_path)  # the next engine writes it whole
    assert (d / "model.safetensors").read_bytes() == state["model.safetensors"] and (d / ".complete").is_file()


def test_every_engine_kind_reads_one_start_timeout_setting(monkeypatch):
    import inspect

    from esreason.backends import eval_pool
    from esreason.backends.engine_env import engine_start_timeout

    monkeypatch.setenv("ESREASON_ENGINE_START_TIMEOUT_S", "42")
    assert engine_start_timeout("vllm", os.environ) == 42 and engine_start_timeout("hf", os.environ) == 42
    # the evaluation pool has no limit of its own: None means the shared setting
    assert inspect.signature(eval_pool.build_eval_generator).parameters["start_timeout_s"].default is None
    src = inspect.getsource(eval_pool.build_eval_generator)
    assert "engine_start_timeout(kind, os.environ)" in src


def test_engines_and_eval_take_the_models_own_dtype(tmp_path):
    from esreason.backends.hf import model_dtype, resolve_dtype
    from esreason.cli import build_parser

    assert model_dtype("Qwen/Qwen2.5-1.5B-Instruct") == "bfloat16"  # the architecture table, no hub
    assert model_dtype("demo") == "float32"  # the embedded default is saved in fp32
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "torch_dtype": "bfloat16"}))
    assert model_dtype(str(d)) == "bfloat16" and resolve_dtype(str(d), "float32") == "float32"
    (d / "config.json").write_text(json.dumps({"model_type": "qwen2", "dtype": "float16"}))
    assert resolve_dtype(str(d), "auto") == "float16"
    args = build_parser().parse_args(["eval", "--model", "demo", "--tasks", "demo-add", "--output", str(tmp_path / "o")])
    assert args.dtype == "auto"
    import inspect

    from esreason.backends import eval_pool

    assert inspect.signature(eval_pool.build_eval_generator).parameters["dtype"].default == "auto"
