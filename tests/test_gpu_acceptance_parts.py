"""The parts of the GPU acceptance (benchmarks/gpu_acceptance*.py) that decide what its one try on a
GPU can tell us, checked on the CPU in seconds:

- the 1.5B-shape model directory gets the tokenizer class the CPU twin gets from ``AutoTokenizer``
  (a ``qwen2`` directory would get transformers 5.23's ``Qwen2Tokenizer``, which drops spaces and
  newlines of the character vocabulary);
- the budget: a section whose estimate exceeds the time left is not started and says so with its
  estimate; a child is stopped, with what it started, when the time left at its start runs out;
- parity with ``generate``: greedy token ids on left-padded prompts of several lengths are exactly
  equal on the CPU for both decode loops, with EOS stopping both and ignored by both (and
  ``min_new_tokens``, the old way of ignoring EOS, is shown to give other ids).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_acceptance_clock as clock  # noqa: E402
import gpu_acceptance_local as local  # noqa: E402
import gpu_acceptance_parity as parity  # noqa: E402
import gpu_acceptance_preflight as preflight  # noqa: E402


# --------------------------------------------------------------------------- the tokenizer on every path


def test_the_shape_model_directory_gets_the_cpu_twins_tokenizer_class(tmp_path):
    from transformers import AutoTokenizer

    from esreason.embedded import build_tokenizer

    tok = build_tokenizer()
    shape = tmp_path / "shape"  # the GPU run's model directory: the 1.5B config (no weights needed here)
    local.shape_config(False, tok).save_pretrained(shape)
    tok.save_pretrained(shape)
    twin = local.build_embedded_model(tmp_path / "embedded")["path"]  # the CPU twin's model directory
    gpu_tok, twin_tok = AutoTokenizer.from_pretrained(shape), AutoTokenizer.from_pretrained(twin)
    assert type(gpu_tok) is type(twin_tok)
    text = "12 + 30 = 42\nso \\boxed{42}"
    assert gpu_tok.decode(gpu_tok(text, add_special_tokens=False)["input_ids"]) == text  # spaces, newlines kept
    assert gpu_tok(text)["input_ids"] == twin_tok(text)["input_ids"]
    assert json.loads((shape / "config.json").read_text())["model_type"] == "llama"


def test_the_shape_model_has_qwen2_5_1_5b_shapes():
    from esreason.embedded import build_tokenizer
    from esreason.io.architectures import architecture

    cfg = local.shape_config(False, build_tokenizer())
    qwen = architecture("Qwen/Qwen2.5-1.5B-Instruct")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "tie_word_embeddings"):
        assert getattr(cfg, key) == qwen[key], key
    assert cfg.attention_bias  # Qwen2's q/k/v biases (and an o_proj bias Qwen2 does not have)


# --------------------------------------------------------------------------- the budget


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_section_that_does_not_fit_is_not_started_with_its_estimate(tmp_path):
    now = FakeClock()
    budget = clock.Budget(100.0, t0=now.t, now=now)
    rec = clock.Recorder(tmp_path / "r.json", {"head": 1}, budget)
    ran: list[str] = []

    def work(name: str, seconds: float, ok: bool = True):
        def fn():
            ran.append(name)
            now.t += seconds
            return {"ok": ok}
        return fn

    rec.section("a", 30, work("a", 50))                   # fits (100 s left), takes 50
    rec.section("b", 60, work("b", 1))                    # 50 s left < 60: not started
    rec.section("c", 10, work("c", 5, ok=False))          # fits, fails
    rec.section("d", 1, work("d", 1), missing="needs x")  # its module did not import
    saved = json.loads((tmp_path / "r.json").read_text())
    assert ran == ["a", "c"] and saved["order"] == ["a", "b", "c", "d"] and saved["head"] == 1
    assert saved["b"] == {"status": "not started", "estimate_s": 60, "left_s": 50.0, "ok": False,
                          "reason": "its estimate (60 s) exceeds the time left (50 s)"}
    assert [saved[k]["status"] for k in "acd"] == ["done", "failed", "skipped"] and saved["d"]["reason"] == "needs x"
    assert saved["not_started"] == ["b"] and saved["failed"] == ["c"] and saved["skipped"] == ["d"]
    assert saved["ok"] is False and saved["total_s"] == 55.0


def test_no_budget_leaves_nothing_out(tmp_path):
    rec = clock.Recorder(None, {}, clock.Budget(None))
    assert rec.section("a", 1e9, lambda: {"ok": True})["status"] == "done" and rec.result["ok"]


def test_a_child_and_what_it_started_are_stopped_when_the_time_left_at_its_start_runs_out(tmp_path):
    """The child starts a grandchild and both sleep for 10 minutes; the budget leaves 3 s."""
    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
            f"open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(600)")
    budget = clock.Budget(3.0)
    records: list[dict] = []
    with pytest.raises(clock.SectionError, match="stopped at the deadline") as exc:
        clock.run_child([sys.executable, "-c", code], budget, "sleeper", tmp_path / "logs", records)
    assert exc.value.stopped
    (rec,) = records
    assert rec["stopped_at_deadline"] and rec["timeout_s"] <= 3.0 and rec["ended_s"] < 60  # not the 600 s sleep
    assert rec["started_s"] + rec["timeout_s"] <= 3.0 + 1e-6
    gpid = int(pid_file.read_text())
    for _ in range(100):  # SIGKILL of the group: the grandchild is gone (or a zombie awaiting its reaper)
        try:
            state = Path(f"/proc/{gpid}/stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            break
        if state == "Z":
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {gpid} still running")
    with pytest.raises(clock.SectionError, match="budget of 3 s is spent"):  # nothing starts once it is spent
        clock.run_child([sys.executable, "-c", "pass"], clock.Budget(3.0, t0=time.time() - 4), "late",
                        tmp_path / "logs", records)
    assert len(records) == 1


def test_the_script_start_is_read_from_the_environment():
    assert clock.script_t0({"ESREASON_ACCEPTANCE_T0": "1700000000.5"}) == 1700000000.5
    assert clock.script_t0({}) is None and clock.script_t0({"ESREASON_ACCEPTANCE_T0": "x"}) is None


def test_a_section_is_skipped_only_for_a_module_it_needs():
    pre = {"imports": {"datasets": {"error": "ImportError: pyarrow too old"}, "math_verify": {"version": "0.9"}}}
    assert "needs datasets" in preflight.missing(pre, "grpo") and "pyarrow too old" in preflight.missing(pre, "grpo")
    assert preflight.missing(pre, "eval") is None and preflight.missing({}, "grpo") is None


# --------------------------------------------------------------------------- parity with generate


@pytest.fixture(scope="module")
def embedded():
    from esreason.backends.hf import load_model

    before = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops on a shared 2-core machine
    model, tok = load_model("demo")
    yield model, tok, parity.chat_prompts(tok, 12)
    torch.set_num_threads(before)


@pytest.mark.parametrize("loop", ["cpu", "cuda"])
@pytest.mark.parametrize("eos", [True, False])
def test_greedy_ids_equal_generate_on_padded_prompts_exactly_on_the_cpu(embedded, loop, eos):
    model, tok, prompts = embedded
    r = parity.compare(model, tok, prompts, 64, eos=eos, loop=loop)
    assert len(r["prompt_tokens"]) > 2  # several prompt lengths: generate left-pads them
    assert r["token_agreement"] == 1.0 and r["rows_identical_share"] == 1.0 and r["tokens"][0] == r["tokens"][1]
    assert r["decode_loop"]["loop"] == loop
    if eos:  # the pretrained model ends its answers: EOS really stopped rows, in both
        assert 0 < r["rows_ending_at_eos"] and r["tokens"][0] < len(prompts) * 64
    else:
        assert r["tokens"] == [len(prompts) * 64] * 2
    if loop == "cuda":  # the label says the cuda loop ignores the cache setting
        assert "ignores cache" in r["decode_loop"]["cache"]


def test_min_new_tokens_is_not_ignoring_eos(embedded):
    """generate's min_new_tokens masks EOS out of the logits; the sampler's ignore_eos keeps it. Where
    EOS is the argmax (the pretrained model ends every answer) the two give other ids."""
    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler

    model, tok, prompts = embedded
    sampler = Sampler(model, tok, batch_size=len(prompts))
    ours = sampler.generate(prompts, SamplingParams(64, temperature=0.0), ignore_eos=True).token_ids
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.inference_mode():
        out = model.generate(**enc, do_sample=False, max_new_tokens=64, min_new_tokens=64, pad_token_id=tok.pad_token_id)
    masked = out[:, enc["input_ids"].shape[1]:].tolist()
    assert parity.agreement(ours, masked)["token_agreement"] < 1.0
    assert parity.agreement(ours, parity.generate_ids(model, tok, prompts, 64, None, sampler.pad_id))[
        "token_agreement"] == 1.0


def test_agreement_counts_tokens_up_to_each_rows_first_difference():
    r = parity.agreement([[1, 2, 3, 4], [5, 6], [7]], [[1, 2, 9, 4], [5, 6, 8], [7]])
    assert r["token_agreement"] == (2 + 2 + 1) / (4 + 3 + 1) and r["first_difference_at"] == [2, 2, None]
    assert r["rows_identical_share"] == pytest.approx(1 / 3)


def test_padded_prompts_have_several_lengths():
    from esreason.embedded import build_tokenizer

    tok = build_tokenizer()
    lengths = {len(tok(p, add_special_tokens=False)["input_ids"]) for p in parity.padded_prompts(tok, 16)}
    assert len(lengths) >= 4
