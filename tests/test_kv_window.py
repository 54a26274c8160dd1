"""The sampler's KV cache: contiguous buffers grown in blocks, attention over the width, same tokens;
glibc's malloc thresholds for CPU decode loops."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from esreason.backends.kvcache import WINDOW_BLOCK, PreallocatedLayer, grown, window


def test_window_rounds_up_to_a_block_within_the_capacity():
    assert [window(e, 100) for e in (1, 16, 17, 32, 33)] == [16, 16, 32, 32, 48]
    assert window(95, 100) == 96 and window(97, 100) == 100 and window(100, 100) == 100
    with pytest.raises(RuntimeError, match="capacity 100 exceeded"):
        window(101, 100)
    assert WINDOW_BLOCK == 16


def test_grown_keeps_the_written_positions_and_zeros_the_rest():
    buf = torch.arange(2 * 1 * 4 * 3, dtype=torch.float32).view(2, 1, 4, 3)
    out = grown(buf, 3, 8)
    assert out.shape == (2, 1, 8, 3) and out.is_contiguous()
    assert torch.equal(out[:, :, :3], buf[:, :, :3]) and not out[:, :, 3:].any()
    assert grown(buf[:, :, :0], 5, 16).shape == (2, 1, 16, 3)  # nothing written yet: zeros


def test_layer_buffers_stay_contiguous_and_report_their_width_to_the_mask():
    layer = PreallocatedLayer(capacity=40)
    k = torch.randn(3, 2, 13, 4)
    assert layer.get_mask_sizes(13) == (16, 0)  # before the prefill's update: the width after it
    keys, values = layer.update(k, k + 1)
    assert keys.shape == (3, 2, 16, 4) and keys.is_contiguous() and values.is_contiguous()
    assert torch.equal(keys[:, :, :13], k) and not keys[:, :, 13:].any()
    assert layer.get_seq_length() == 13
    for step in range(3):  # 14, 15, 16 positions: still one block
        keys, _ = layer.update(torch.full((3, 2, 1, 4), float(step)), torch.zeros(3, 2, 1, 4))
    assert keys.shape[-2] == 16 and layer.get_mask_sizes(1) == (32, 0)
    keys, _ = layer.update(torch.ones(3, 2, 1, 4), torch.ones(3, 2, 1, 4))  # the 17th position widens
    assert keys.shape == (3, 2, 32, 4) and keys.is_contiguous()
    assert torch.equal(keys[:, :, :13], k) and torch.equal(keys[:, :, 15], torch.full((3, 2, 4), 2.0))
    layer.reorder_cache(torch.tensor([2, 0]))  # compaction: rows 2 and 0, one gather
    assert layer.keys.shape == (2, 2, 32, 4) and layer.keys.is_contiguous()
    assert torch.equal(layer.keys[0, :, :13], k[2]) and torch.equal(layer.keys[1, :, :13], k[0])
    with pytest.raises(RuntimeError, match="capacity 40 exceeded"):
        layer.update(torch.zeros(2, 2, 24, 4), torch.zeros(2, 2, 24, 4))


def test_windowed_cache_gives_the_tokens_of_transformers_own_cache():
    """Greedy and sampled, compaction on: the width-16 windows with masked zeros give the token ids of
    transformers' DynamicCache (exact attention over the written positions), rows of several lengths."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.hf import load_model
    from esreason.backends.sampling import Sampler
    from esreason.tasks import get, render_prompt

    model, tok = load_model("demo")
    prompts = [render_prompt(tok, p.messages) for t in ("demo-add", "demo-sub3") for p in get(t).load("test", None, 12)]
    for params in (SamplingParams(max_new_tokens=48, temperature=0.0),
                   SamplingParams(max_new_tokens=48, temperature=0.8, seed=3)):
        auto = Sampler(model, tok, batch_size=24, cache="auto").generate(prompts, params)
        dyn = Sampler(model, tok, batch_size=24, cache="dynamic").generate(prompts, params)
        assert auto.token_ids == dyn.token_ids
        assert max(len(t) for t in auto.token_ids) > WINDOW_BLOCK  # the windows grew during the call


_FAULTS = textwrap.dedent("""
    import resource, sys, torch
    torch.set_num_threads(1)
    from esreason.backends import host_malloc
    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler
    from esreason.embedded import build_model, build_tokenizer
    from esreason.tasks import get, render_prompt
    applied = host_malloc.tune() if sys.argv[1] == "tune" else False
    tok = build_tokenizer()
    model = build_model(tok)
    prompts = [render_prompt(tok, p.messages) for p in get("demo-add").load("test", None, 32) for _ in range(16)]
    sampler = Sampler(model, tok, batch_size=512)
    params = SamplingParams(max_new_tokens=32, temperature=1.0, seed=0)
    sampler.generate(prompts, params)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    sampler.generate(prompts, params)  # the second call: what a decode loop's steady state costs
    print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_malloc_thresholds_keep_freed_decode_buffers_mapped():
    """A 512-row decode call (32 tokens, a fresh model) faults fresh pages for the buffers glibc maps and
    unmaps at every step; with the thresholds freed buffers stay in the heap. Measured here: 1.3k-2.0k
    minor faults tuned, 8k-23k plain, so the assertion keeps a 2x margin. ESREASON_MALLOC=default
    turns the tuning off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    run = lambda mode, extra: subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True,
                                             env={**env, **extra}, check=True).stdout.split()
    applied, tuned = run("tune", {})
    _, plain = run("plain", {})
    assert applied == "True"
    assert 2 * int(tuned) < int(plain), (tuned, plain)


def test_esreason_malloc_default_turns_the_tuning_off(monkeypatch):
    """In this process: with ``ESREASON_MALLOC=default`` :func:`tune` never reaches ``mallopt``."""
    from esreason.backends import host_malloc

    monkeypatch.setattr(host_malloc, "_applied", None)  # as in a fresh process
    monkeypatch.setenv("ESREASON_MALLOC", "default")
    monkeypatch.setattr(host_malloc.ctypes, "CDLL", lambda *a: pytest.fail("mallopt reached"))
    assert host_malloc.tune() is False and host_malloc._applied is False


def test_loading_a_model_for_the_cpu_applies_the_thresholds(monkeypatch):
    """In this process (the thresholds are what every CPU test worker runs with anyway); glibc only."""
    import platform

    from esreason.backends import host_malloc
    from esreason.backends.hf import load_model

    monkeypatch.setattr(host_malloc, "_applied", None)  # as in a fresh process
    monkeypatch.delenv("ESREASON_MALLOC", raising=False)
    load_model("demo")
    assert host_malloc._applied is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
