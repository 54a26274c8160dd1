"""`backend: auto` picks the batched population evaluator wherever it gives hf's checkpoints (a float32
Llama/Qwen2 model on the CPU, stacked member weights within the bound), hf everywhere else; the run
records the choice and why (RUN/backend.json). benchmarks/backend_auto.py measures the two side by side."""

from __future__ import annotations

import hashlib
import json

import pytest

pytestmark = pytest.mark.heavy  # trained runs (`--fast` leaves this file out)

SETTINGS = ["task=demo-add", "train.limit=8", "train.batch_size=4", "es.population_size=4", "train.max_steps=2",
            "generation.max_new_tokens=16", "checkpoint.every=1"]


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """A user's own small model directory: a randomly initialised Qwen2 (q/k/v biases, GQA) with the
    embedded default's tokenizer; nothing about it says 'demo'."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from esreason.embedded import build_tokenizer

    path = tmp_path_factory.mktemp("my-qwen2")
    tok = build_tokenizer()
    torch.manual_seed(3)
    model = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _sha(path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def variety(completions, **kwargs):
    """Distinct characters of a completion: a random model's responses differ in it (a reward with variance)."""
    return [len(set(c)) / 10 for c in completions]


def test_auto_picks_batched_for_a_small_local_qwen2_and_its_checkpoints_are_hfs(qwen_dir, tmp_path):
    from esreason import ESConfig, ESTrainer

    data = [{"prompt": f"<s>{i}+{i + 3}="} for i in range(8)]
    args = ESConfig(output_dir=str(tmp_path / "auto"), task="auto-variety", batch_size=4, population_size=4,
                    max_steps=2, max_new_tokens=16, checkpoint_every=1, sigma=0.05, alpha=0.05)
    assert args.backend == "auto"
    ESTrainer(str(qwen_dir), variety, data, args=args).train()  # the API's default backend
    ESTrainer(str(qwen_dir), variety, data, args=args.replace(output_dir=str(tmp_path / "hf"), backend="hf")).train()
    chosen = json.loads((tmp_path / "auto/backend.json").read_text())
    assert chosen["type"] == "batched" and "qwen2 model in float32 on the CPU" in chosen["auto"]
    assert json.loads((tmp_path / "hf/backend.json").read_text())["type"] == "hf"
    for step in (1, 2):
        assert _sha(tmp_path / f"auto/checkpoints/step_{step}") == _sha(tmp_path / f"hf/checkpoints/step_{step}")
    assert _sha(tmp_path / "auto/checkpoints/step_2") != _sha(qwen_dir)  # the run moved


def test_auto_keeps_hf_where_batched_would_not_give_the_same_checkpoints(qwen_dir, monkeypatch):
    from transformers import GPT2Config, GPT2LMHeadModel

    from esreason.backends.hf import load_model
    from esreason.config import load_config
    from esreason.es_loop import select

    cfg = load_config(None, [f"model={qwen_dir}", *SETTINGS, "backend.type=auto"])
    model, _ = load_model(str(qwen_dir), "float32", "cpu")
    assert select.choose_auto(cfg, model)[0] == "batched"
    assert select.choose_auto(load_config(None, ["device=cuda"]), model) == \
        ("hf", "device 'cuda': batched equals hf bit for bit only on the CPU")
    half, _ = load_model(str(qwen_dir), "bfloat16", "cpu")
    bf16 = load_config(None, ["dtype=bfloat16"])
    assert select.choose_auto(bf16, half) == ("hf", "dtype 'bfloat16': batched needs float32 weights")
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    kind, reason = select.choose_auto(cfg, gpt2)
    assert kind == "hf" and "supports model types llama, qwen2; this model is 'gpt2'" in reason
    params = sum(p.numel() for p in model.parameters())
    monkeypatch.setattr(select, "AUTO_BATCHED_MAX_PARAMS", params - 1)
    kind, reason = select.choose_auto(cfg, model)
    assert kind == "hf" and "M parameters: batched is faster only up to" in reason
    monkeypatch.setattr(select, "AUTO_BATCHED_MAX_PARAMS", params)
    monkeypatch.setattr(select, "AUTO_BATCHED_MAX_BYTES", 4 * params * 4 - 1)  # 4 members' fp32 copies, less 1
    kind, reason = select.choose_auto(cfg, model)
    assert kind == "hf" and "4 members' stacked weights" in reason
