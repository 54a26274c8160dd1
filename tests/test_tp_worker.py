"""Tensor-parallel ES engines without vLLM: the worker extension on stand-ins of every rank.

The ranks of a TP engine (tests/tp_standin.py: vLLM's per-rank shapes and layer attributes) must
together move exactly like :class:`HFPolicy`: each rank's shard of every tensor equals the HF
tensor's region after perturb, restore and update (merged q/k/v with replicated k/v heads,
gate/up, row-parallel o/down, vocabulary shards of a padded vocabulary, stacked experts); the
engine's combined checksum equals the reference's computed from the HF policy with the same
layout; the ranks' exports merge into the HF checkpoint the policy saves (per-expert tensors
included); and the sharded exact update composes with TP (rank r of every engine in its own group).
"""

from __future__ import annotations

import pytest
import torch

from esreason.backends.ckpt_layout import take_region
from esreason.backends.engine import policy_checksum
from esreason.backends.tp_checksum import combine, reference_checksum
from esreason.backends.tp_export import merge_rank_exports
from tp_standin import StandInWorker, standin_rank


def _config(arch: str):
    from transformers import LlamaConfig, Qwen2Config, Qwen3MoeConfig

    from esreason.embedded import build_tokenizer

    tok = build_tokenizer()
    common = dict(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=64, bos_token_id=tok.bos_token_id,
                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    if arch == "llama":
        return LlamaConfig(intermediate_size=96, tie_word_embeddings=True, **common), tok
    if arch == "qwen2":
        return Qwen2Config(intermediate_size=96, tie_word_embeddings=False, **common), tok
    return Qwen3MoeConfig(intermediate_size=96, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                          decoder_sparse_step=1, tie_word_embeddings=False, **common), tok


def _policy(arch: str, dtype: str, tmp_path):
    from transformers import AutoModelForCausalLM

    from esreason.backends.hf import HFPolicy, load_model

    cfg, tok = _config(arch)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "init")
    tok.save_pretrained(tmp_path / "init")
    policy = HFPolicy(*load_model(str(tmp_path / "init"), dtype))
    policy.save(tmp_path / "start")
    return policy, cfg


def _check_shards(workers, policy) -> None:
    params = dict(policy.params.params)
    for w in workers:
        for slot in w._es_slots:
            view = w._es_view(slot)
            want = params[slot.hf_name].detach()
            want = want if slot.region is None else take_region(want, slot.region).view(view.shape)
            assert torch.equal(view, want), (w._es_tp, slot.key)


@pytest.mark.parametrize("arch, tp, dtype", [("llama", 2, "float32"), ("llama", 4, "float32"),
                                             ("qwen2", 2, "bfloat16"), ("qwen3_moe", 2, "float32"),
                                             ("qwen3_moe", 1, "bfloat16")])
def test_ranks_move_exactly_like_the_hf_policy(arch, tp, dtype, tmp_path):
    from esreason.backends.hf import load_model

    policy, cfg = _policy(arch, dtype, tmp_path)
    workers = [StandInWorker(standin_rank(cfg, tp, r, getattr(torch, dtype))) for r in range(tp)]
    infos = [w.es_setup(str(tmp_path / "start")) for w in workers]
    assert [(i["tp_rank"], i["tp_size"]) for i in infos] == [(r, tp) for r in range(tp)]
    # every element once: the ranks' own elements add up to the model's (replicas counted on one rank)
    assert sum(i["elements"] for i in infos) == policy.params.num_parameters
    layouts = [w.es_layout() for w in workers]
    names = {s[0] for layout in layouts for s in layout["slots"]}
    assert names == {n for n, _ in policy.params.params}  # stacked experts: the HF in-memory tensors

    def checksum() -> str:
        return combine([w.es_checksum() for w in workers])

    start = reference_checksum(policy, layouts)
    assert checksum() == start
    if tp == 1:
        assert start == policy_checksum(policy)  # one rank: the plain HF digest
    _check_shards(workers, policy)

    for w in workers:
        w.es_perturb(17, 0.05)
    policy.perturb(17, 0.05)
    _check_shards(workers, policy)  # the shards of the perturbed tensors: TP-invariant directions
    for w in workers:
        w.es_restore()
    policy.restore()
    assert checksum() == start

    seeds, weights = [3, 9, 3], [0.7, -1.2, 0.4]
    norm = sum(w.es_update(seeds, weights, 0.01) ** 2 for w in workers) ** 0.5
    want = policy.apply_update(seeds, weights, 0.01)
    # ranks sum squares over their pieces in fp32, cut differently from the HF tensors' pieces
    assert norm == pytest.approx(want, rel=1e-5) and want > 0
    _check_shards(workers, policy)
    assert checksum() == reference_checksum(policy, layouts) != start

    out = tmp_path / "out"
    files = [f for w in workers for f in w.es_export(str(out))]
    if any(f.startswith("es-rank") for f in files):
        merge_rank_exports(out, layouts)
    assert not list(out.glob("es-rank*"))
    policy.save(tmp_path / "hf")
    from safetensors import safe_open

    def keys(path):
        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            return sorted(f.keys())

    assert keys(out) == keys(tmp_path / "hf")  # per-expert checkpoint tensors, as save_pretrained writes
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "hf" / "model.safetensors").read_bytes()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((tmp_path / "hf" / name).read_bytes())
    exported, _ = load_model(str(out), dtype)
    got = dict(exported.named_parameters())
    for name, p in policy.params.params:
        assert torch.equal(got[name], p), name
    if policy.params.master_state() is not None:
        assert policy.load_masters(out)  # the merged masters load into the policy by ES name


def test_sharded_update_composes_with_tensor_parallel_ranks(tmp_path):
    """Two TP = 2 engines (four stand-in ranks), each engine summing one of two member shards; rank r
    of each engine all-reduces with rank r of the other over a gloo group: both engines end with the
    shards of the HF policy's sharded update, bit for bit."""
    from concurrent.futures import ThreadPoolExecutor

    from esreason.backends.collective import host_store
    from esreason.es.sharded import Sharding

    policy, cfg = _policy("qwen2", "float32", tmp_path)
    engines = [[StandInWorker(standin_rank(cfg, 2, r)) for r in range(2)] for _ in range(2)]
    for ranks in engines:
        for w in ranks:
            w.es_setup(str(tmp_path / "start"))
    layouts = [w.es_layout() for w in engines[0]]
    store = host_store("127.0.0.1", timeout_s=60)
    seeds, weights = [3, 9, 4, 1], [0.7, -1.2, 0.4, 0.1]
    jobs = [(e, w) for e, ranks in enumerate(engines) for w in ranks]
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda job: job[1].es_join_group("127.0.0.1", store.port, "t/1", job[0], 2, 60), jobs))
        norms = list(pool.map(lambda job: job[1].es_update_sharded(seeds, weights, 0.01, 2, [job[0]]), jobs))
    want = policy.apply_update(seeds, weights, 0.01, Sharding.local(2))
    for e in range(2):
        assert (norms[2 * e] ** 2 + norms[2 * e + 1] ** 2) ** 0.5 == pytest.approx(want, rel=1e-5)
        _check_shards(engines[e], policy)
        assert combine([w.es_checksum() for w in engines[e]]) == reference_checksum(policy, layouts)


def test_a_rank_whose_vocabulary_shard_is_padding_holds_no_embedding_rows(tmp_path):
    """Vocabulary 100 padded to 128 over TP = 4: rank 3 holds rows 96..99 and 28 rows of padding;
    the layout covers each real row once."""
    policy, cfg = _policy("llama", "float32", tmp_path)
    workers = [StandInWorker(standin_rank(cfg, 4, r)) for r in range(4)]
    for w in workers:
        w.es_setup(str(tmp_path / "start"))
    rows = [s.region.rows for w in workers for s in w._es_slots if s.hf_name == "model.embed_tokens.weight"]
    assert rows == [(0, 32), (32, 64), (64, 96), (96, 100)]
