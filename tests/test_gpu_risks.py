"""What would break first on a GPU, checked without one.

The in-place self-check and its eager fallback (on a stand-in vLLM), the engine's model
directory (no weights, a stable path for vLLM's compile cache), the masters file kept out of
the loader's glob, GPU placement under RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES, the start
timeout, the NCCL group's fault settings and abort, and bf16 engines for the paper configs.
The real engine runs the self-check in ``pytest -m vllm`` (tests/test_vllm_worker.py).
"""

from __future__ import annotations

import logging
import os
import types
from pathlib import Path

import pytest
import torch

from esreason.errors import UserError

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the in-place self-check

def _probe(value: float):
    return [([1, 2, 3], [value, value, value])]


def test_inplace_check_passes_when_writes_are_seen_and_restored():
    from esreason.backends.inplace_check import inplace_update_check

    state = {"w": 0.0}
    ok = inplace_update_check(lambda: _probe(-state["w"]), lambda: state.update(w=1.0), lambda: state.update(w=0.0))
    assert ok is None


def test_inplace_check_names_invisible_writes_and_lost_restores():
    from esreason.backends.inplace_check import inplace_update_check

    frozen = inplace_update_check(lambda: _probe(-0.5), lambda: None, lambda: None)  # graphs kept old weights
    assert "not seen" in frozen
    state = {"w": 0.0}
    lost = inplace_update_check(lambda: _probe(-state["w"]), lambda: state.update(w=1.0), lambda: state.update(w=0.5))
    assert "after perturb + restore differs" in lost


class _FakeLLM:
    """A vllm.LLM stand-in: CUDA-graph mode serves the weights captured at start (writes unseen)."""

    starts: list[bool] = []

    def __init__(self, **kwargs):
        self.kwargs = kwargs
        self.eager = kwargs["enforce_eager"]
        _FakeLLM.starts.append(self.eager)
        self.weight = self.served = 0.0

    def get_tokenizer(self):
        return lambda text, add_special_tokens=True: {"input_ids": [1] + [ord(c) % 50 for c in text]}

    def collective_rpc(self, method, args=()):
        if method == "es_perturb":
            self.weight += args[1]
        elif method == "es_restore":
            self.weight = 0.0
        if self.eager:
            self.served = self.weight
        if method == "es_layout":  # one rank holding one whole tensor (vllm_worker.es_layout)
            return [{"rank": 0, "size": 1, "slots": [["w", None]], "tensors": {"w": [[1], [["w", 0, [1]]]]},
                     "master": False}]
        return [{"master": False, "elements": 1} if method == "es_setup" else None]

    def generate(self, prompts, params, use_tqdm=False):
        lp = types.SimpleNamespace(logprob=-1.0 - self.served)
        out = types.SimpleNamespace(token_ids=[7, 8], logprobs=[{7: lp}, {8: lp}], text="x")
        return [types.SimpleNamespace(outputs=[out]) for _ in prompts]


def test_engine_falls_back_to_eager_with_one_warning_when_graphs_miss_writes(monkeypatch, tmp_path, caplog):
    from esreason.backends import vllm as vb

    fake = types.SimpleNamespace(LLM=_FakeLLM, SamplingParams=lambda **kw: kw)
    monkeypatch.setattr(vb, "import_vllm", lambda: fake)
    monkeypatch.setenv("ESREASON_ENGINE_DIR", str(tmp_path))
    _FakeLLM.starts = []
    state = {"config.json": b"{}", "model.safetensors": b"weights"}
    with caplog.at_level(logging.WARNING, logger="esreason.backends.vllm"):
        engine = vb.VLLMEngine(vb.VLLMEngineOptions(enforce_eager=False), state)
    assert _FakeLLM.starts == [False, True] and engine.enforce_eager is True
    assert "not seen" in engine.inplace_check
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "enforce_eager=True" in warnings[0] and "\n" not in warnings[0]
    assert engine.llm.kwargs["load_format"] == "dummy"
    _FakeLLM.starts = []
    eager = vb.VLLMEngine(vb.VLLMEngineOptions(enforce_eager=True), state)  # eager: checked, no restart
    assert _FakeLLM.starts == [True] and eager.inplace_check is None

    class Lossy(_FakeLLM):  # restore loses the write even in eager mode: ES cannot run
        def collective_rpc(self, method, args=()):
            if method == "es_restore":
                self.weight += 0.5
                self.served = self.weight
                return [None]
            return super().collective_rpc(method, args)

    monkeypatch.setattr(fake, "LLM", Lossy)
    with pytest.raises(RuntimeError, match="eager mode: greedy output after perturb"):
        vb.VLLMEngine(vb.VLLMEngineOptions(enforce_eager=True), state)


def test_engine_model_dir_holds_no_weights_and_is_stable(tmp_path):
    from esreason.backends.vllm import engine_model_dir

    state = {"config.json": b"{}", "tokenizer.json": b"t", "model.safetensors": b"w",
             "es_master/master.safetensors": b"m"}
    a = engine_model_dir(state, tmp_path)
    assert sorted(p.name for p in a.rglob("*")) == ["config.json", "tokenizer.json"]
    assert engine_model_dir({**state, "model.safetensors": b"other weights"}, tmp_path) == a  # compile cache key
    assert engine_model_dir({**state, "config.json": b'{"x": 1}'}, tmp_path) != a


# ---------------------------------------------------------------- the masters file

def test_masters_live_below_the_checkpoint_and_legacy_files_still_load(tiny_model_dir, tmp_path):
    from esreason.backends.hf import LEGACY_MASTER_FILE, MASTER_FILE, HFPolicy, load_model
    from esreason.io.hashing import hash_directory_safetensors

    policy = HFPolicy(*load_model(str(tiny_model_dir), "bfloat16"))
    policy.apply_update([1, 2], [1.0, -1.0], 1e-3)
    policy.save(tmp_path / "ck")
    assert [p.name for p in (tmp_path / "ck").glob("*.safetensors")] == ["model.safetensors"]  # vLLM's glob
    assert (tmp_path / "ck" / MASTER_FILE).is_file()
    hash_directory_safetensors(tmp_path / "ck")  # one name, one tensor (the old layout stored each twice)
    want = policy.params.master_state()
    for layout in ("current", "legacy"):
        if layout == "legacy":
            (tmp_path / "ck" / MASTER_FILE).rename(tmp_path / "ck" / LEGACY_MASTER_FILE)
        again = HFPolicy(*load_model(str(tmp_path / "ck"), "bfloat16"))
        assert again.load_masters(tmp_path / "ck")
        assert all(torch.equal(again.params.master_state()[n], t) for n, t in want.items()), layout


# ---------------------------------------------------------------- placement, start-up, NCCL, dtype

def test_gpu_placement_follows_ray_gpu_ids_when_ray_does_not_set_it():
    from esreason.backends.engine_env import pin_visible_gpu

    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    assert pin_visible_gpu(env, [5]) is None and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
    assert pin_visible_gpu(env, [5]) == "5" and env["CUDA_VISIBLE_DEVICES"] == "5"
    assert pin_visible_gpu(env, []) is None  # an actor without a GPU


def test_engine_start_timeout_covers_compilation_and_can_be_set():
    from esreason.backends.engine_env import VLLM_START_TIMEOUT_S, engine_start_timeout

    assert engine_start_timeout("vllm", {}) == VLLM_START_TIMEOUT_S >= 1800
    assert engine_start_timeout("hf", {}) == 300
    assert engine_start_timeout("vllm", {"ESREASON_ENGINE_START_TIMEOUT_S": "3600"}) == 3600
    with pytest.raises(UserError, match="ESREASON_ENGINE_START_TIMEOUT_S"):
        engine_start_timeout("vllm", {"ESREASON_ENGINE_START_TIMEOUT_S": "soon"})


def test_nccl_group_raises_instead_of_killing_and_is_aborted_when_dropped(monkeypatch):
    import torch.distributed as dist

    from esreason.backends import collective

    seen: dict = {}

    class FakeNCCL:
        class Options:
            _timeout = None

        def __init__(self, store, rank, world, options):
            seen["env"] = {k: os.environ.get(k) for k in collective.NCCL_FAULT_ENV}
            self.aborted = False

        def abort(self):
            self.aborted = True

    monkeypatch.setattr(dist, "ProcessGroupNCCL", FakeNCCL, raising=False)
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    store = collective.host_store("127.0.0.1", 5)
    spec = collective.GroupSpec("127.0.0.1", int(store.port), "g", 0, 2, 5.0)
    group = collective.EngineGroup(spec, "cuda:0")  # a device object needs no GPU
    assert seen["env"] == collective.NCCL_FAULT_ENV  # blocking wait: a timeout raises, the engine lives
    assert "TORCH_NCCL_BLOCKING_WAIT" not in os.environ  # only while our group was built
    pg = group.pg
    group.close()
    assert pg.aborted and group.pg is None


def test_paper_es_configs_run_bf16_engines_with_fp32_masters():
    from esreason.backends.vllm import VLLMEngineOptions
    from esreason.backends.vllm_worker import master_enabled
    from esreason.config import load_config

    paths = sorted((ROOT / "configs").glob("easy/es-*.yaml")) + sorted((ROOT / "configs").glob("hard/es-*.yaml"))
    assert paths
    from esreason.experiments.memplan import GPU_MEMORY_GIB
    from esreason.experiments.memplan_engines import resolve

    for path in paths:  # engines_per_gpu: auto resolved as a run on an H100 resolves it
        options = VLLMEngineOptions.from_config(resolve(load_config(path), GPU_MEMORY_GIB["h100"][1]))
        assert options.dtype == "bfloat16", path
        assert master_enabled(options.master_weights, torch.bfloat16), path


# ---------------------------------------------------------------- the trainer's memory beside vLLM engines

@pytest.mark.parametrize("backend, device, want", [
    ("vllm", "cuda", ("cpu", "cuda")), ("ray", "cuda", ("cpu", "cuda")),
    ("hf", "cuda", ("cuda", None)), ("vllm", "cpu", ("cpu", None)), ("ray", "cpu", ("cpu", None))])
def test_the_reference_lives_in_host_memory_beside_gpu_engines(backend, device, want):
    from esreason.config import load_config
    from esreason.es_loop.run import reference_placement

    cfg = load_config(None, [f"backend.type={backend}", f"device={device}"])
    assert reference_placement(cfg) == want


def test_host_reference_draws_update_directions_on_its_noise_device(tiny_model_dir, monkeypatch):
    """Plumbing on CPU (the cross-device equality is scripts/gpu-check.sh's `host_reference`)."""
    import esreason.es.update as update_mod
    from esreason.backends.engine import policy_noise_domain
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.es.noise import generator_domain

    plain = HFPolicy(*load_model(str(tiny_model_dir), "bfloat16"), direction_cache_mb=0)
    host = HFPolicy(*load_model(str(tiny_model_dir), "bfloat16"), direction_cache_mb=0, noise_device="cpu")
    drawn: list = []
    original = update_mod.direction_block
    monkeypatch.setattr(update_mod, "direction_block",
                        lambda *a, device="cpu": drawn.append(str(device)) or original(*a, device=device))
    for policy in (plain, host):
        policy.apply_update([1, 2, 3], [0.5, -1.0, 0.25], 1e-2)
    assert drawn and set(drawn) == {"cpu"}
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(plain.params.params, host.params.params))
    elsewhere = HFPolicy(*load_model(str(tiny_model_dir), "bfloat16"), noise_device="meta")
    assert policy_noise_domain(elsewhere) == generator_domain("meta") != policy_noise_domain(plain)
    with pytest.raises(RuntimeError, match="updated only"):
        elsewhere.perturb(1, 0.1)  # a host-resident reference never evaluates members
