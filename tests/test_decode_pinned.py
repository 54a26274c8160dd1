"""Decode outputs pinned to saved token ids: the sampler and the batched population decoder.

``tests/fixtures/pinned_decode.json`` holds the token ids (and entropy sums, as hex floats) that the sampler (cache ``auto`` and ``dynamic``, greedy and top-p, chunked, with
compaction) and the population-batched decoder produced on the embedded default *before*
the cache keyword was made version-dependent (transformers 5.23.0, torch 2.13.0 CPU).
Whatever name the installed transformers gives the cache (``past_key_values`` up to 5.23,
``cache`` from 5.24), outputs must stay the same.

What is exact and what is not: the fixture was written on one CPU and is read on
others. Token ids are exact by contract (the same weights, prompts and seeds choose the same
tokens), so they are compared exactly. The entropy sums are float32 arithmetic whose last bits
depend on the CPU's kernels (AVX-512, AVX2 and the default ATen path sum in different orders:
measured on an AVX-512 Xeon, relative differences up to 2.3e-6 against the fixture), so they are
compared with :func:`entropy_rtol`, a bound derived from float32's unit roundoff and the length
of the longest chain of sums behind each value. The same file is checked on 5.20.2
(``scripts/compat-env.sh``) and on the newest release (``.ci/run``'s newest-transformers block).

Regenerate only for an intended change of outputs: ``python tests/test_decode_pinned.py``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

FIXTURE = Path(__file__).parent / "fixtures" / "pinned_decode.json"
CASES = [f"sampler-{c}-{m}" for c in ("auto", "dynamic") for m in ("greedy", "topp")] + \
    [f"population-member{i}" for i in range(4)]


def compute() -> dict[str, Any]:
    """Run every pinned case on the embedded default; {case: {"token_ids": ..., "entropy": ...}}."""
    from esreason import tasks
    from esreason.backends.base import SamplingParams
    from esreason.backends.batched import BatchedEvaluator
    from esreason.backends.hf import HFPolicy, load_model
    from esreason.backends.sampling import Sampler

    torch.set_num_threads(1)
    model, tok = load_model("demo")
    problems = tasks.get("demo-add").load("train", limit=7)
    prompts = [tasks.render_prompt(tok, p.messages) for p in problems]
    out: dict[str, Any] = {}

    def record(name: str, gen: Any) -> None:
        ent = None if gen.entropy_sum is None else [float(e).hex() for e in gen.entropy_sum]
        out[name] = {"token_ids": gen.token_ids, "entropy": ent}

    greedy = SamplingParams(max_new_tokens=40, compute_entropy=True)
    topp = SamplingParams(max_new_tokens=40, temperature=0.8, top_p=0.9, seed=3, compute_entropy=True)
    for cache in ("auto", "dynamic"):
        sampler = Sampler(model, tok, batch_size=3, cache=cache)  # 7 prompts: chunks of 3, 3, 1
        record(f"sampler-{cache}-greedy", sampler.generate(prompts, greedy))
        record(f"sampler-{cache}-topp", sampler.generate(prompts, topp))
    policy = HFPolicy(model, tok)
    ev = BatchedEvaluator(policy, Sampler(model, tok, batch_size=4), population_batch=0)
    seeds, sigmas = [11, 11, 17, 17], [0.02, -0.02, 0.02, -0.02]
    params = [SamplingParams(max_new_tokens=32, temperature=0.9, top_p=0.95, seed=s) for s in (1, 1, 2, 2)]
    for i, gen in enumerate(ev.generate_population(seeds, sigmas, prompts[:5], params)):
        record(f"population-member{i}", gen)
    return out


#: float32 unit roundoff (2**-24).
FP32_U = 2.0 ** -24


def entropy_rtol(max_new_tokens: int) -> float:
    """Relative tolerance for an entropy sum over ``max_new_tokens`` generated tokens.

    Standard error analysis of recursive summation: a sum of n float32 terms carries a relative
    error of at most about n * u (u = 2**-24), whatever order the kernel chooses. Behind one
    token's entropy lie the model's reductions (the longest is the MLP's down projection over
    ``intermediate_size`` = 384 terms; 4 layers of them add, they do not multiply, to first
    order) and the softmax/entropy over the 100-token vocabulary; the sum over tokens adds
    ``max_new_tokens`` more. A different kernel order can move each by up to that bound, so:
    rtol = (4 * 384 + 100 + max_new_tokens) * u, about 1e-4 for 40 tokens; ~40x above the
    largest difference measured across kernel paths (2.3e-6), and far below any change of
    behaviour (one token more or less moves a sum by ~0.1 relative).
    """
    return (4 * 384 + 100 + max_new_tokens) * FP32_U


@pytest.fixture(scope="module")
def computed() -> dict[str, Any]:
    return compute()


def test_fixture_covers_the_cases(computed):
    saved = json.loads(FIXTURE.read_text())
    assert sorted(saved) == sorted(computed) == sorted(CASES)
    assert sum(len(t) for case in saved.values() for t in case["token_ids"]) > 500  # not empty responses


@pytest.mark.parametrize("case", CASES)
def test_outputs_match_saved(computed, case):
    """Token ids exactly; entropy sums within :func:`entropy_rtol` (kernel-dependent rounding)."""
    saved = json.loads(FIXTURE.read_text())[case]
    assert computed[case]["token_ids"] == saved["token_ids"], case
    if saved["entropy"] is None:
        assert computed[case]["entropy"] is None, case
        return
    got = [float.fromhex(h) for h in computed[case]["entropy"]]
    want = [float.fromhex(h) for h in saved["entropy"]]
    assert got == pytest.approx(want, rel=entropy_rtol(40), abs=0.0), case


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(compute(), separators=(",", ":")) + "\n")
    print(f"wrote {FIXTURE}", file=sys.stderr)
