"""The sampler's ``"cuda"`` decode loop (esreason.backends.leandecode): ATen calls and host reads per
step against transformers' ``generate``, and its outputs against ``generate`` and the ``"cpu"`` loop.

Why: on a GPU every ATen call of a launch-bound decode step costs a dispatch (and a kernel
launch unless it makes a view), and every host read stalls the launch queue. The counts come from
benchmarks/decode_ops.py (``torch.profiler`` on the CPU, the loop forced with ``loop="cuda"``): they
are deterministic for a given torch/transformers pair, so they are compared exactly, at a small shape
(Qwen2.5-1.5B's layer structure at 2 layers; the loop's own calls do not depend on depth, the model's
are the same in every engine).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from esreason.backends.base import SamplingParams
from esreason.backends.sampling import Sampler, chunk_generator
from esreason.errors import UserError
from test_sampling import LogitsEdit, model, prompts, tok  # noqa: F401 (the sampler tests' fixtures)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import decode_ops  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- operations per step --------------------------------------------------------------------------

@pytest.mark.parametrize("eos,padded,max_syncs", [("ignored", False, 0), ("live", True, 1)])
def test_cuda_loop_makes_no_more_calls_or_host_reads_per_step_than_generate(eos, padded, max_syncs):
    """As on the H100 (EOS ignored, equal-length prompts) and in production (EOS live, left padding).
    The sampler's CPU loop, were it run on CUDA, makes more ATen calls per step than ``generate`` in
    both settings (asserted as well, so the benchmark measures a difference)."""
    res = decode_ops.measure(4, 40, layers=2, eos=eos, padded=padded)
    lean, gen, old = res["sampler_cuda_loop"], res["generate"], res["sampler_cpu_loop"]
    for key in ("aten_ops", "top_level", "host_syncs"):
        assert lean[key] <= gen[key], (key, lean[key], gen[key])
    assert lean["host_syncs"] == max_syncs  # none without stop ids; the finished-row count with them
    assert old["aten_ops"] > gen["aten_ops"] and old["host_syncs"] == 2  # the loop CUDA ran before
    assert res["tokens_equal"]


def test_step_window_counts_whole_steps():
    """The profiled window holds exactly the forwards it names: a 2-layer step's count is the same over
    the last 32 steps of a 40- and of a 56-token run of the ``"cuda"`` loop (no prefill or tail inside)."""
    model, tok = decode_ops.build(layers=2)
    runs = decode_ops.engines(model, tok, decode_ops.prompts(3), "ignored")
    a, _ = decode_ops.per_step(model, runs["sampler_cuda_loop"], 40)
    b, _ = decode_ops.per_step(model, runs["sampler_cuda_loop"], 56)
    assert a == b and a["aten_ops"] > 100
    with pytest.raises(RuntimeError, match="fewer than"):
        window = decode_ops.StepWindow(model, 10, 32)
        runs["generate"](8)
        window.result()


# --- outputs -------------------------------------------------------------------------------------

def test_loop_choice_follows_the_device_and_can_be_forced(model, tok):
    assert Sampler(model, tok).loop == "cpu"
    assert Sampler(model, tok, device="cuda").loop == "cuda"  # a device object only; nothing runs
    assert Sampler(model, tok, loop="cuda").loop == "cuda"
    assert Sampler(model, tok, device="cuda", loop="cpu").loop == "cpu"
    with pytest.raises(UserError, match="loop must be"):
        Sampler(model, tok, loop="gpu")


def test_greedy_equals_generate_with_left_padding_and_eos(model, tok, prompts):
    enc = tok(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    assert len(set(enc["attention_mask"].sum(-1).tolist())) > 3  # padding varies
    with torch.inference_mode():
        out = model.generate(**enc, do_sample=False, max_new_tokens=24, pad_token_id=tok.pad_token_id)
    ref = [r[:r.index(tok.eos_token_id)] if tok.eos_token_id in r else r
           for r in out[:, enc["input_ids"].shape[1]:].tolist()]
    assert len({tuple(r) for r in ref}) == len(ref)
    gen = Sampler(model, tok, batch_size=16, loop="cuda").generate(prompts, SamplingParams(24))
    assert gen.token_ids == ref


def _both(model, tok, prompts, params, *, max_positions=None, **kw):
    out = []
    for loop in ("cpu", "cuda"):
        s = Sampler(model, tok, cache="dynamic", loop=loop, **kw)
        if max_positions is not None:
            s.max_positions = max_positions  # a short context: rows get different budgets
        out.append((s.generate(prompts, params), s.last_stats.forwards))
    return out


@pytest.mark.parametrize("params", [SamplingParams(20, compute_entropy=True),
                                    SamplingParams(20, temperature=0.8, top_p=0.9, seed=7, compute_entropy=True),
                                    SamplingParams(20, temperature=1.0, seed=3)])
@pytest.mark.parametrize("compact", [True, False])
def test_cuda_loop_equals_the_cpu_loop(model, tok, prompts, params, compact):
    """Same model calls on the same rows (``cache="dynamic"``), so the same bits: token ids, stop ids,
    entropy sums (float64 sums in the same order) and forward counts are compared exactly; with EOS at
    different steps per row, compaction, chunks of 4 (6 prompts: 4 + 2) and context-limited rows.
    Sampled rows see the same uniforms: a chunk's drawn at once are the numbers drawn B per step."""
    if params.temperature > 0:  # the "cuda" loop draws a chunk's uniforms as one [steps, B] tensor
        g = chunk_generator(params.seed, 0)
        assert torch.equal(torch.rand(9, 5, generator=chunk_generator(params.seed, 0)),
                           torch.stack([torch.rand(5, generator=g) for _ in range(9)]))  # = B per step
    lengths = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    wrapped = LogitsEdit(model, force_at={max(lengths) + 4: tok.eos_token_id})
    cases = [dict(), dict(max_positions=max(lengths) + 9)]  # the second cuts the long rows' budgets
    for case in cases:
        (a, fa), (b, fb) = _both(wrapped, tok, prompts, params, batch_size=4, compact=compact, **case)
        assert b.token_ids == a.token_ids and b.stop_ids == a.stop_ids and fb == fa
        assert b.entropy_sum == a.entropy_sum
        assert len({len(t) for t in a.token_ids}) > 2  # rows ended at different steps
        assert any(s == tok.eos_token_id for s in a.stop_ids) and None in a.stop_ids
    # ignore_eos: the loop needs no stop check at all
    (a, _), (b, _) = _both(wrapped, tok, prompts, SamplingParams(12, temperature=params.temperature, seed=1),
                           batch_size=4, compact=compact)
    assert b.token_ids == a.token_ids
    # share_prefix (evaluation): the prefill's cache rows are copied, then the same steps
    (a, _), (b, _) = _both(wrapped, tok, prompts[:3] * 3, params, batch_size=9, compact=compact, share_prefix=True)
    assert b.token_ids == a.token_ids and b.entropy_sum == a.entropy_sum

