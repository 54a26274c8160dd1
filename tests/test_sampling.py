"""Tests of the KV-cache sampler (esreason.backends.sampling) and its token choice (topp).

The conftest tiny model is randomly initialised with std 0.02, which makes it repeat one
character forever; ``_diverse`` redraws its matrices with a larger scale so that greedy
outputs vary by prompt and by step and padding mistakes would show up.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from esreason.backends import topp
from esreason.backends.base import Generator, SamplingParams
from esreason.backends.kvcache import cache_keyword
from esreason.backends.sampling import Sampler
from esreason.embedded import safe_decode
from esreason.errors import UserError
from test_decode_pinned import entropy_rtol

QUESTIONS = ["1+1", "what is 12*7? think step by step", "hi", "a much longer question about 123456 and 7",
             "x", "Compute 99-17."]


def _diverse(model, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) * (1.5 / p.shape[1] ** 0.5))
    return model.eval()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny ops on 2 threads of a shared 2-core machine ran ~20x slower (spin-waiting)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    # AutoTokenizer, as esreason.backends.hf.load_model reads a model directory: the tiny model is a
    # llama directory, so it gets the character tokenizer as written (a qwen2 config.json would make
    # transformers 5.23 build a Qwen2Tokenizer that drops spaces and newlines; esreason.embedded.model)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = "a b\nc"
    assert tok.decode(tok(text, add_special_tokens=False)["input_ids"]) == text
    return tok


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return _diverse(AutoModelForCausalLM.from_pretrained(tiny_model_dir))


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
            for q in QUESTIONS]


class LogitsEdit(torch.nn.Module):
    """Wraps a causal LM and edits its last-position logits (to force EOS or favour an id).

    force_at: position -> token id; when a row's last fed position equals the key, that
        token gets +1e4 (so the token *generated* from that position is forced).
    force_call: (k, token id): every row's output of the k-th forward call (0 = prefill)
        is forced to that token.
    bias: [V] added to every row's logits.
    Row identity inside the batch does not matter (the sampler sorts and compacts rows).
    """

    def __init__(self, inner, force_at: dict[int, int] | None = None, bias: torch.Tensor | None = None,
                 force_call: tuple[int, int] | None = None):
        super().__init__()
        self.inner = inner
        self.force_at = force_at or {}
        self.bias = bias
        self.force_call = force_call
        self.calls = 0

    @property
    def config(self):
        return self.inner.config

    @property
    def generation_config(self):
        return self.inner.generation_config

    def get_input_embeddings(self):
        return self.inner.get_input_embeddings()

    def forward(self, **kwargs):
        out = self.inner(**kwargs)
        logits = out.logits.clone()  # [B, q, V]
        last_pos = kwargs["position_ids"][:, -1]  # [B]
        for p, tid in self.force_at.items():
            logits[last_pos == p, -1, tid] += 1e4
        if self.force_call is not None and self.force_call[0] == self.calls:
            logits[:, -1, self.force_call[1]] += 1e4
        self.calls += 1
        if self.bias is not None:
            logits = logits + self.bias
        kw = cache_keyword(self.inner)  # the updated cache, under the installed transformers' name
        return SimpleNamespace(logits=logits, **{kw: getattr(out, kw)})


def _hf_greedy(model, tok, prompts, max_new):
    enc = tok(prompts, add_special_tokens=False, padding=True, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**enc, do_sample=False, max_new_tokens=max_new, pad_token_id=tok.pad_token_id)
    rows = []
    for r in out[:, enc["input_ids"].shape[1]:].tolist():
        rows.append(r[:r.index(tok.eos_token_id)] if tok.eos_token_id in r else r)
    return rows


# --- correctness against transformers ----------------------------------------------------

@pytest.mark.parametrize("cache,compact", [("auto", True), ("dynamic", False)])
def test_greedy_equals_hf_generate_with_left_padding(model, tok, prompts, cache, compact):
    ref = _hf_greedy(model, tok, prompts, 24)
    assert len({len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts}) > 3  # padding varies
    assert len({tuple(r) for r in ref}) == len(ref)  # the model is not degenerate
    gen = Sampler(model, tok, batch_size=16, cache=cache, compact=compact).generate(prompts, SamplingParams(24))
    assert gen.token_ids == ref
    assert gen.texts == [safe_decode(tok, r) for r in ref]
    assert gen.entropy_sum is None


def test_greedy_bf16_equals_hf_generate(tiny_model_dir, tok, prompts):
    from transformers import AutoModelForCausalLM

    m = _diverse(AutoModelForCausalLM.from_pretrained(tiny_model_dir)).to(torch.bfloat16)
    ref = _hf_greedy(m, tok, prompts, 16)
    gen = Sampler(m, tok).generate(prompts, SamplingParams(16))
    assert gen.token_ids == ref


def _other_arch(name: str, vocab: int, tok):
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM)

    ids = dict(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    if name == "gpt2":  # learned absolute positions
        return GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=2, n_positions=128, **ids))
    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128, **ids)
    if name == "llama-gqa":  # grouped-query attention, preallocated cache
        return LlamaForCausalLM(LlamaConfig(**common))
    return MistralForCausalLM(MistralConfig(sliding_window=8, **common))  # keeps transformers' own cache


@pytest.mark.parametrize("arch", ["gpt2", "llama-gqa", "mistral-sliding-window"])
def test_greedy_equals_hf_generate_other_architectures(tok, prompts, arch):
    from esreason.backends.kvcache import preallocated_cache

    m = _diverse(_other_arch(arch, len(tok), tok))
    assert (preallocated_cache(m.config, 8) is None) == (arch == "mistral-sliding-window")
    ref = _hf_greedy(m, tok, prompts, 30)
    assert Sampler(m, tok).generate(prompts, SamplingParams(30)).token_ids == ref


def test_chunking_keeps_prompt_order(model, tok, prompts):
    params = SamplingParams(max_new_tokens=16)
    one = Sampler(model, tok, batch_size=64).generate(prompts, params)
    for kw in (dict(batch_size=2), dict(batch_size=4, sort_by_length=False), dict(batch_size=1)):
        assert Sampler(model, tok, **kw).generate(prompts, params).token_ids == one.token_ids, kw


def test_is_a_generator_and_restores_training_mode(model, tok, prompts):
    s = Sampler(model, tok)
    assert isinstance(s, Generator)
    model.train()
    try:
        s.generate(prompts[:2], SamplingParams(4))
        assert model.training
    finally:
        model.eval()
    assert s.generate([], SamplingParams(4)).token_ids == []


# --- sampling -----------------------------------------------------------------------------

def test_same_seed_same_output_other_seed_differs(model, tok, prompts):
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_p=0.95, seed=7, compute_entropy=True)
    a = Sampler(model, tok, batch_size=4).generate(prompts, params)
    b = Sampler(model, tok, batch_size=4).generate(prompts, params)
    assert a.token_ids == b.token_ids and a.texts == b.texts and a.entropy_sum == b.entropy_sum
    c = Sampler(model, tok, batch_size=4).generate(prompts, SamplingParams(24, 1.0, 0.95, seed=8))
    assert c.token_ids != a.token_ids
    greedy = Sampler(model, tok).generate(prompts, SamplingParams(24))
    assert a.token_ids != greedy.token_ids  # it really samples


def test_row_randomness_does_not_depend_on_other_rows_stopping(model, tok, prompts):
    """One uniform per (row, step): when other rows stop (and are compacted away), a row keeps
    its draws, so its response is a prefix-consistent continuation (ES common random numbers)."""
    lengths = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=11)
    free = Sampler(model, tok).generate(prompts, params, ignore_eos=True).token_ids
    wrapped = LogitsEdit(model, force_at={max(lengths) + 2: tok.eos_token_id})
    for compact in (True, False):
        gen = Sampler(wrapped, tok, compact=compact).generate(prompts, params).token_ids
        assert any(len(g) < 16 for g in gen) and any(len(g) == 16 for g in gen)
        assert all(f[:len(g)] == g for f, g in zip(free, gen))


def test_tiny_top_p_is_greedy(model, tok, prompts):
    greedy = Sampler(model, tok).generate(prompts, SamplingParams(20))
    nucleus = Sampler(model, tok).generate(prompts, SamplingParams(20, temperature=1.3, top_p=1e-6, seed=3))
    assert nucleus.token_ids == greedy.token_ids


def test_topp_sample_follows_the_truncated_distribution():
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    logp = probs.log().expand(2000, 5)
    u = (torch.arange(2000) + 0.5) / 2000  # a uniform grid: counts are exact up to rounding
    full = torch.bincount(topp.sample(logp, 1.0, u), minlength=5)
    assert torch.allclose(full.float() / 2000, probs, atol=1e-3)
    # top_p 0.75: nucleus {1: 0.4, 3: 0.3, 4: 0.15} (0.7 < 0.75 needs the third), renormalised.
    nuc = torch.bincount(topp.sample(logp, 0.75, u), minlength=5).float() / 2000
    expect = torch.tensor([0.0, 0.4, 0.0, 0.3, 0.15]) / 0.85
    assert torch.allclose(nuc, expect, atol=1e-3)
    # top_p exactly reached by the first two: 0.4 + 0.3 = 0.7 -> nucleus of two tokens
    nuc2 = torch.bincount(topp.sample(logp, 0.7, u), minlength=5).float() / 2000
    assert torch.allclose(nuc2, torch.tensor([0.0, 0.4, 0.0, 0.3, 0.0]) / 0.7, atol=1e-3)
    # NaN logits (a diverged model) still yield valid ids
    bad = torch.full((3, 5), float("nan"))
    for p in (1.0, 0.5):
        ids = topp.sample(bad, p, torch.rand(3))
        assert ((ids >= 0) & (ids < 5)).all()


def test_tiny_temperature_does_not_overflow():
    logits = torch.tensor([[0.0, 50.0, 49.0, -1e30]])
    lp = topp.scaled_log_probs(logits, 1e-6)
    assert torch.isfinite(lp[0, 1]) and topp.entropy(lp).item() == pytest.approx(0.0, abs=1e-6)
    assert topp.sample(lp, 0.9, torch.tensor([0.99])).item() == 1


# --- stopping -----------------------------------------------------------------------------

def test_rows_stop_at_eos_independently(model, tok, prompts):
    lengths = [len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    ref = Sampler(model, tok).generate(prompts, SamplingParams(12), ignore_eos=True).token_ids
    stop_pos = max(lengths) + 4  # rows stop after stop_pos - L + 1 tokens (the longest after 5)
    wrapped = LogitsEdit(model, force_at={stop_pos: tok.eos_token_id})
    for compact in (True, False):
        s = Sampler(wrapped, tok, compact=compact)
        gen = s.generate(prompts, SamplingParams(12), ignore_eos=False)
        expect = [r[:max(0, stop_pos - L + 1)] for r, L in zip(ref, lengths)]
        assert gen.token_ids == expect
        assert any(len(e) == 12 for e in expect) and any(len(e) < 12 for e in expect)
    # Every row stopped by EOS: the loop ends right after the last row stops.
    s = Sampler(LogitsEdit(model, force_call=(2, tok.eos_token_id)), tok)  # EOS as every 3rd token
    gen = s.generate(prompts, SamplingParams(50))
    assert gen.token_ids == [r[:2] for r in ref]
    assert s.last_stats.forwards == 3  # prefill + 2 decode steps
    # ignore_eos keeps going and keeps the EOS id in the output
    gen = Sampler(LogitsEdit(model, force_call=(2, tok.eos_token_id)), tok).generate(
        prompts, SamplingParams(5), ignore_eos=True)
    assert all(len(t) == 5 and t[2] == tok.eos_token_id for t in gen.token_ids)


def test_generation_config_eos_list_is_honoured(tiny_model_dir, tok, prompts):
    from transformers import AutoModelForCausalLM

    m = _diverse(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    ref = Sampler(m, tok).generate(prompts, SamplingParams(16)).token_ids
    stop = ref[0][3]  # a token the first row produces at step 3
    m.generation_config.eos_token_id = [tok.eos_token_id, stop]
    gen = Sampler(m, tok).generate(prompts, SamplingParams(16))
    assert gen.token_ids == [r[:r.index(stop)] if stop in r else r for r in ref]
    assert len(gen.token_ids[0]) <= 3


def test_max_new_tokens_and_context_limit(model, tok, caplog):
    base = tok.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    near = "Q:" + "7" * 245 + "\nA:"  # 250 tokens; the tiny model has 256 positions
    over = "Q:" + "7" * 300 + "\nA:"
    assert len(tok(near, add_special_tokens=False)["input_ids"]) == 250
    s = Sampler(model, tok)
    gen = s.generate([base], SamplingParams(9), ignore_eos=True)
    assert len(gen.token_ids[0]) == 9
    with caplog.at_level(logging.WARNING, logger="esreason.backends.sampling"):
        gen = s.generate([near, base, over], SamplingParams(20), ignore_eos=True)
    assert [len(t) for t in gen.token_ids] == [6, 20, 0]
    assert gen.texts[2] == ""
    assert s.last_stats.context_limited == 2
    assert "fill the model's context" in caplog.text
    assert s.generate([base], SamplingParams(0)).token_ids == [[]]


def test_unassigned_ids_decode_without_crash(tok, prompts):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=len(tok) + 16, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    m = _diverse(Qwen2ForCausalLM(cfg))
    unassigned = len(tok) + 5
    bias = torch.zeros(cfg.vocab_size)
    bias[unassigned] = 3.0
    gen = Sampler(LogitsEdit(m, bias=bias), tok).generate(prompts, SamplingParams(30, temperature=1.0, seed=1))
    flat = [i for t in gen.token_ids for i in t]
    assert unassigned in flat and any(i < len(tok) for i in flat)
    assert gen.texts == [safe_decode(tok, t) for t in gen.token_ids]
    bias[unassigned] = 1e4  # only unassigned ids: empty texts, full-length token lists
    gen = Sampler(LogitsEdit(m, bias=bias), tok).generate(prompts, SamplingParams(5))
    assert gen.texts == [""] * len(prompts) and all(t == [unassigned] * 5 for t in gen.token_ids)


# --- entropy ------------------------------------------------------------------------------

def _entropy_by_full_forward(model, tok, prompt: str, response: list[int], temperature: float) -> float:
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    x = torch.tensor([ids + response])
    with torch.inference_mode():
        logits = model(input_ids=x).logits[0].float()  # [T, V], no cache, no padding
    steps = logits[len(ids) - 1:len(ids) - 1 + len(response)] / temperature
    logp = torch.log_softmax(steps.double(), dim=-1)
    return float(-(logp.exp() * logp).sum())


@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.9), (0.0, 1.0)])
def test_entropy_sum_matches_full_forward(tiny_model_dir, tok, prompts, temperature, top_p):
    from transformers import AutoModelForCausalLM

    m = _diverse(AutoModelForCausalLM.from_pretrained(tiny_model_dir))
    params = SamplingParams(14, temperature=temperature, top_p=top_p, seed=5, compute_entropy=True)
    free = Sampler(m, tok, batch_size=4).generate(prompts, params)
    # Make a token the model emits naturally (at step 3 of the first long row) an extra EOS:
    # rows now stop there, at a step whose distribution has real entropy, which must not be
    # counted; the other rows run to max_new_tokens.
    row = next(t for t in free.token_ids if len(t) > 5)
    m.generation_config.eos_token_id = [tok.eos_token_id, row[3]]
    gen = Sampler(m, tok, batch_size=4).generate(prompts, params)
    assert gen.entropy_sum is not None
    assert any(len(g) < len(f) for g, f in zip(gen.token_ids, free.token_ids))
    assert len({len(t) for t in gen.token_ids}) > 1
    t_eff = temperature if temperature > 0 else 1.0
    for p, resp, h in zip(prompts, gen.token_ids, gen.entropy_sum):
        expect = _entropy_by_full_forward(m, tok, p, resp, t_eff)
        assert h == pytest.approx(expect, rel=1e-4, abs=1e-5)
    assert all(h > 0 for h, t in zip(gen.entropy_sum, gen.token_ids) if t)


# --- input validation ---------------------------------------------------------------------

@pytest.mark.parametrize("params,word", [
    (SamplingParams(max_new_tokens=-1), "max_new_tokens"),
    (SamplingParams(temperature=-0.5), "temperature"),
    (SamplingParams(temperature=float("nan")), "temperature"),
    (SamplingParams(top_p=0.0), "top_p"),
    (SamplingParams(top_p=1.5), "top_p"),
])
def test_bad_params_raise_user_error(model, tok, prompts, params, word):
    with pytest.raises(UserError, match=word):
        Sampler(model, tok).generate(prompts[:1], params)


def test_bad_inputs_raise_user_error(model, tok):
    with pytest.raises(UserError, match="batch_size"):
        Sampler(model, tok, batch_size=0)
    with pytest.raises(UserError, match="cache"):
        Sampler(model, tok, cache="static")
    s = Sampler(model, tok)
    with pytest.raises(UserError, match="single string"):
        s.generate("Q:hi\nA:", SamplingParams(2))
    with pytest.raises(UserError, match="prompt 1 is empty"):
        s.generate(["Q:hi\nA:", ""], SamplingParams(2))
    with pytest.raises(UserError, match="prompt 0 has token ids outside"):
        s.generate_ids([[1, 10_000]], SamplingParams(2))


# --- shared-prefix prefill ---------------------------------------------------------------

@pytest.mark.parametrize("cache", ["auto", "dynamic"])
def test_shared_prefix_prefill_gives_the_same_outputs(model, tok, prompts, cache):
    """Evaluation repeats each problem M times: prefilling each distinct prompt once and copying its
    logits and KV rows gives the outputs of prefilling every row, sampled and greedy. Token ids are
    compared exactly: the two prefills differ only in the GEMMs' row counts, which can move a logit by
    float32 rounding (a token flips only if a sampling boundary or an argmax tie lies within ~1e-7;
    odds ~1e-3 over these 480 steps). Entropy sums within the float32 bound of
    test_decode_pinned.entropy_rtol (measured here: ~1e-8 relative on this tiny model; bit-identical
    at the embedded default's shapes)."""
    rows = [p for p in prompts for _ in range(4)]  # each prompt 4 times, adjacent as in evaluation
    rows = rows[3:] + rows[:3]  # and one prompt split across the ends of the list
    fed: list[int] = []
    hook = model.register_forward_pre_hook(lambda m, args, kwargs: fed.append(kwargs["input_ids"].shape[0]),
                                           with_kwargs=True)
    try:
        for params in (SamplingParams(20, temperature=0.8, top_p=0.9, seed=5, compute_entropy=True),
                       SamplingParams(20, compute_entropy=True)):
            fed.clear()
            shared = Sampler(model, tok, batch_size=10, cache=cache, share_prefix=True).generate(rows, params)
            prefill_rows = fed[0]
            fed.clear()
            full = Sampler(model, tok, batch_size=10, cache=cache, share_prefix=False).generate(rows, params)
            assert fed[0] == 10 and prefill_rows < 10  # the first chunk's prefill fed only distinct prompts
            assert shared.token_ids == full.token_ids
            assert shared.entropy_sum == pytest.approx(full.entropy_sum, rel=entropy_rtol(20), abs=0.0)
            assert shared.texts == full.texts
            if params.temperature > 0:  # sampled rows of one prompt differ: copies are not one row repeated
                assert len({tuple(t) for t in shared.token_ids}) > len(prompts)
    finally:
        hook.remove()
