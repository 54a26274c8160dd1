"""Every ES stage of the plan against plain batched inference of the same sequences, and the low-rank
members-in-one-batch mode priced beside it (esreason.experiments.plan_limit)."""

from __future__ import annotations

import dataclasses

import pytest

from esreason.experiments import plan_table as tab
from esreason.experiments import plan_terms
from esreason.experiments.plan import _Ctx, build_plan
from esreason.experiments.plan_render import render
from esreason.experiments.spec import load_spec

UPDATES = 232


def _plan(*sets: str) -> dict:
    return build_plan(load_spec("configs/experiments/easy.yaml", ["methods=[es]", *sets]), 8, "h100")


def _es(plan: dict) -> dict:
    return next(s for s in plan["stages"] if s["name"] == "train/es")


@pytest.fixture(scope="module")
def shipped() -> dict:
    return _plan("configs.es.backend.engines_per_gpu=1", "configs.es.backend.update=sharded")


def test_plain_inference_is_one_call_per_engine_with_one_tail(shipped):
    lim = _es(shipped)["limit"]
    ctx = _Ctx(load_spec("configs/experiments/easy.yaml", ["methods=[es]"]), 8, "h100")
    # 32 x 64 sequences on 8 engines: 256 rows each, one call that waits for the longest of all 2,048
    decode, tail = plan_terms.call_s(ctx, 256, tab.prompt_tokens("gsm8k").value, 2048, 32 * 64, False)
    assert (lim["inference_engines"], lim["inference_rows_per_engine"]) == (8, 256)
    assert lim["inference_s"] == pytest.approx(decode + tail, rel=1e-3)
    # the planned update per update: the stage's decode, tail and update terms over its updates
    t = _es(shipped)["terms_s"]
    assert lim["update_s"] == pytest.approx((t["decode"] + t["tail"] + t["update"]) / UPDATES, rel=2e-3)
    assert lim["ratio"] == pytest.approx(lim["update_s"] / lim["inference_s"], rel=1e-3)
    # four members one after another per engine, each waiting for its own longest row: far from the limit
    assert lim["ratio"] > 2


def test_lowrank_batch_prices_the_cited_lora_overhead(shipped, monkeypatch):
    lim = _es(shipped)["limit"]
    overhead = next(a for a in shipped["assumptions"] if a["key"] == "lora_token_overhead")
    assert overhead["label"] == "cited" and "vllm-project/vllm#11267" in overhead["source"]
    assert lim["lowrank_batch_s"] > lim["inference_s"] * (1 + overhead["value"])  # + adapters and the apply
    assert lim["lowrank_ratio"] == pytest.approx(lim["lowrank_batch_s"] / lim["inference_s"], rel=1e-3)
    # the named parameter takes effect: without LoRA's overhead, only the adapter loads and the update remain
    monkeypatch.setitem(tab.CONSTANTS, "lora_token_overhead",
                        dataclasses.replace(tab.CONSTANTS["lora_token_overhead"], value=0.0))
    free = _es(_plan("configs.es.backend.engines_per_gpu=1", "configs.es.backend.update=sharded"))["limit"]
    assert 1.0 < free["lowrank_ratio"] < 1.05
    assert free["inference_s"] == lim["inference_s"] and free["update_s"] == lim["update_s"]
    # each engine loads its 4 members' adapters every update: 1 s each adds 4 s
    monkeypatch.setitem(tab.CONSTANTS, "lora_adapter_load_s",
                        dataclasses.replace(tab.CONSTANTS["lora_adapter_load_s"], value=1.0))
    slow = _es(_plan("configs.es.backend.engines_per_gpu=1", "configs.es.backend.update=sharded"))["limit"]
    assert slow["lowrank_batch_s"] == pytest.approx(free["lowrank_batch_s"] + 4 * (1.0 - 0.01), abs=2e-3)


def test_more_engines_per_gpu_move_the_update_toward_the_limit(shipped):
    k2 = _es(_plan("configs.es.backend.engines_per_gpu=2", "configs.es.backend.engines=16",
                   "configs.es.backend.update=replicated"))["limit"]
    assert k2["inference_s"] == _es(shipped)["limit"]["inference_s"]  # the limit does not depend on the layout
    assert k2["engines_per_gpu"] == 2 and k2["ratio"] < _es(shipped)["limit"]["ratio"]


def test_hf_backends_compare_with_their_own_decode():
    from esreason.experiments.plan import hf_only

    plan = build_plan(hf_only(load_spec("configs/experiments/easy.yaml", ["methods=[es]"])), 8, "h100")
    stage = next(s for s in plan["stages"] if s["name"] == "train/es")
    lim = stage["limit"]
    assert lim["lowrank_batch_s"] is None and lim["lowrank_ratio"] is None
    assert lim["ratio"] == pytest.approx(lim["update_s"] / lim["inference_s"], rel=1e-3) and lim["ratio"] > 1


def test_the_text_plan_shows_every_es_stages_ratio():
    text = render(build_plan(load_spec("configs/experiments/easy.yaml", []), 8, "h100"))
    block = text.split("ES update vs plain batched inference of the same sequences", 1)[1].split("total:")[0]
    for name in ("train/es ", "train/es_grpo/stage1_es", "train/grpo_es/stage2_es"):
        assert name in block
    assert "low-rank members in one batch" in block and "train/grpo " not in block


def test_an_engines_share_beyond_max_num_seqs_adds_decode_not_tails():
    """One in-process engine (backend.type: vllm) holds all 2,048 sequences: vLLM decodes 256 at a time
    and refills slots as rows end, so the other 1,792 add decode steps, and the call still waits for
    one tail."""
    from esreason.experiments.plan_limit import MAX_NUM_SEQS

    spec = load_spec("configs/experiments/easy.yaml", ["methods=[es]", "configs.es.backend.type=vllm",
                                                       "configs.es.backend.engines=1"])
    lim = _es(build_plan(spec, 1, "h100"))["limit"]
    ctx = _Ctx(spec, 1, "h100")
    decode, tail = plan_terms.call_s(ctx, MAX_NUM_SEQS, tab.prompt_tokens("gsm8k").value, 2048, 32 * 64, False)
    assert (lim["inference_engines"], lim["inference_rows_per_engine"]) == (1, 2048)
    assert lim["inference_s"] == pytest.approx(decode * 2048 / MAX_NUM_SEQS + tail, rel=1e-3)
