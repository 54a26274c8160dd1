"""The embedded default: tokenizer, synthetic families, shipped weights, pretraining."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from esreason import tasks, verifiers
from esreason.embedded import build_tokenizer, demo_model_dir, safe_decode
from esreason.io import hash_directory_safetensors
from esreason.tasks.synthetic import demo_problems, solution_text


def test_tokenizer_keeps_every_character_through_autotokenizer(tmp_path):
    body = "Q:12 + 3\nA:a  b c \\boxed{7}"
    text = f"<s>{body}</s>"
    tok = build_tokenizer()
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(body) + 2 and tok.unk_token_id not in ids   # one id per character
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    # saved next to the shipped model config, AutoTokenizer must give the same ids
    # (a qwen2 config would make transformers build a Qwen2Tokenizer that drops whitespace)
    loaded = AutoTokenizer.from_pretrained(demo_model_dir())
    assert loaded(text, add_special_tokens=False)["input_ids"] == ids
    assert safe_decode(tok, ids) == body
    assert safe_decode(tok, [*ids, 5000, 100]) == body          # unassigned ids are dropped


def test_chat_template_drops_system_and_ends_at_assistant_turn():
    tok = build_tokenizer()
    msgs = [{"role": "system", "content": "long instructions"}, {"role": "user", "content": "1+2"}]
    assert tasks.render_prompt(tok, msgs) == "<s>Q:1+2\nA:"


def test_rendered_prompts_render_each_item_on_first_use_exactly_as_render_prompt(monkeypatch):
    tok = build_tokenizer()
    problems = tasks.get("demo-add").load("train")
    calls = []
    real = tasks.base.render_prompt
    monkeypatch.setattr(tasks.base, "render_prompt", lambda t, m: calls.append(m) or real(t, m))
    prompts = tasks.RenderedPrompts(tok, problems)
    assert len(prompts) == len(problems) and not calls           # nothing rendered up front
    for i in (5, 19999, -1, 5):
        assert prompts[i] == real(tok, problems[i].messages)
    assert len(calls) == 2                                      # 5 and 19999 (= -1) once each
    assert prompts[3:6] == [real(tok, p.messages) for p in problems[3:6]]
    with pytest.raises(IndexError):
        prompts[len(problems)]


@pytest.mark.parametrize("family", ["demo-add", "demo-sub", "demo-countdown", "demo-sub3"])
def test_synthetic_families_are_deterministic_disjoint_and_correct(family):
    test, train = demo_problems(family, "test"), demo_problems(family, "train")
    assert len(test) == 500 and len(train) == 20000
    assert [p.messages for p in test[:20]] == [p.messages for p in demo_problems(family, "test")[:20]]
    assert not {p.messages[-1]["content"] for p in test} & {p.messages[-1]["content"] for p in train}
    task = tasks.get(family)
    score = verifiers.get(task.verifier)
    for p in test[:200]:  # every reference solution verifies
        v = score(solution_text(p), p.gold)
        assert v.correct and v.reward == 1.0, (p.messages, solution_text(p), v)


def test_demo_sub3_never_uses_a_demo_sub_question():
    """demo-sub3 (held-out, not pretrained on) shares no question with demo-sub, which the
    embedded default was pretrained on; it is the short end of the same skill."""
    seen = {p.messages[-1]["content"] for split in ("train", "test") for p in demo_problems("demo-sub", split)}
    for split in ("train", "test"):
        problems = demo_problems("demo-sub3", split)
        assert not {p.messages[-1]["content"] for p in problems} & seen
        assert all(len(str(p.meta["a"])) == 3 and 2 <= len(str(p.meta["b"])) <= 3 for p in problems)


def test_synthetic_task_rejects_a_data_path(tmp_path):
    from esreason.errors import UserError

    with pytest.raises(UserError, match="generated synthetically"):
        tasks.get("demo-add").load("test", tmp_path)


def test_shipped_model_loads_and_answers_in_format():
    from esreason.backends.base import SamplingParams
    from esreason.backends.hf import load_model
    from esreason.backends.sampling import Sampler

    model = AutoModelForCausalLM.from_pretrained(demo_model_dir())
    assert model.config.model_type == "llama"
    assert sum(p.numel() for p in model.parameters()) == 867_968
    record = json.loads((demo_model_dir() / "training.json").read_text())
    assert record["config"]["steps"] == 310

    model, tok = load_model("demo")
    problems = demo_problems("demo-add", "test")[:40]
    gen = Sampler(model, tok).generate([tasks.render_prompt(tok, p.messages) for p in problems],
                                       SamplingParams(max_new_tokens=64))
    score = verifiers.get("math")
    verdicts = [score(t, p.gold) for t, p in zip(gen.texts, problems)]
    assert sum(v.formatted for v in verdicts) >= 36          # the format is learned
    assert 0.4 <= sum(v.correct for v in verdicts) / 40 < 1.0  # moderate: room for ES


def test_pretrain_quick_is_reproducible(tmp_path):
    from esreason.cli import main as cli_main

    def pretrain_main(argv):
        return cli_main(["pretrain-demo", *argv])

    assert pretrain_main(["--quick", "--output", str(tmp_path / "a")]) == 0
    assert pretrain_main(["--quick", "--output", str(tmp_path / "b")]) == 0
    assert hash_directory_safetensors(tmp_path / "a") == hash_directory_safetensors(tmp_path / "b")
    assert pretrain_main(["--quick", "--seed", "1", "--output", str(tmp_path / "c")]) == 0
    assert hash_directory_safetensors(tmp_path / "c") != hash_directory_safetensors(tmp_path / "a")
    AutoModelForCausalLM.from_pretrained(tmp_path / "a")


def test_pretrain_demo_through_the_cli_takes_its_options(tmp_path, capsys):
    """`esreason pretrain-demo --output DIR ...` (its options used to be swallowed by the top parser)."""
    from esreason.cli import main as cli_main

    assert cli_main(["pretrain-demo", "--quick", "--output", str(tmp_path / "a")]) == 0
    assert hash_directory_safetensors(tmp_path / "a")  # a model was written where asked
    with pytest.raises(SystemExit) as exc:
        cli_main(["pretrain-demo", "--help"])
    assert exc.value.code == 0 and "--steps" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli_main(["pretrain-demo", "--steps", "x"])
    assert exc.value.code == 2
