"""Every field of ``ESConfig`` and every parameter of ``ESTrainer`` and ``evaluate``, set to a
non-default value, takes effect.

- Each flat ``ESConfig`` field that stands for a YAML key reaches that key of the run config
  ``ESTrainer`` hands to the loop (the same :class:`esreason.config.RunConfig` ``esreason train es``
  builds); the key's own effect is tested in tests/test_keys_es.py (through ``ESConfig`` as well).
- The API's own fields and the trainer's and evaluate()'s parameters are tested here on tiny runs
  and evaluations of the session's tiny random model (tests/key_runs.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from key_runs import EVAL_ROWS, ROWS, es_run, record_sampler, text_reward
from test_keys_es import user_tasks  # noqa: F401  (a fixture)

pytestmark = pytest.mark.heavy  # trained runs: the fast subset (`--fast`) leaves this file out

#: A valid non-default value of each flat field, with the fields it needs beside it.
FLAT_VALUES: dict[str, tuple[object, dict]] = {
    "model": ("Qwen/Qwen2.5-0.5B-Instruct", {}), "task": ("demo-sub", {}), "data_path": ("data/x.jsonl", {}),
    "tasks_dir": ("my-tasks", {}), "data_dir": ("data", {}), "dtype": ("bfloat16", {}), "device": ("cuda:1", {}),
    "population_size": (8, {}), "sigma": (0.01, {}), "alpha": (0.002, {}), "shaping": ("rank", {}),
    "zscore_eps": (1e-3, {}), "estimator": ("two_point", {}), "format_reward": (0.0, {}),
    "restore": ("subtract", {}), "master_weights": ("fp32", {}), "sampling_seeds": ("independent", {}),
    "direction_cache_mb": (0, {}), "reward_control": ("shuffle", {}), "perturbation": ("lowrank", {}),
    "rank": (2, {"perturbation": "lowrank"}), "anchor_decay": (0.5, {}),
    "batch_size": (4, {}), "epochs": (3, {}), "max_steps": (None, {}), "seed": (7, {}), "split": ("test", {}),
    "limit": (10, {}), "stream_start": (3, {}),
    "temperature": (0.7, {}), "top_p": (0.9, {}), "max_new_tokens": (32, {}), "generation_batch_size": (8, {}),
    "checkpoint_every": (2, {}), "keep_last": (3, {}),
    "eval_every": (5, {}), "eval_tasks": (("demo-sub",), {}), "eval_samples": (4, {"eval_ks": (1, 4)}), "eval_temperature": (1.0, {}),
    "eval_max_new_tokens": (16, {}), "eval_ks": ((1, 4), {}), "eval_limit": (8, {}), "eval_greedy": (False, {}),
    "eval_split": ("train", {}),
    "backend": ("hf", {}), "engines": (2, {"backend": "ray"}),
    "engines_per_gpu": (2, {"backend": "ray", "engines": 2, "device": "cuda"}),
    "ray_address": ("127.0.0.1:6379", {"backend": "ray"}), "population_batch": (4, {"backend": "batched"}),
    "check_every": (5, {}), "backend_update": ("sharded", {"backend": "ray", "engines": 2}),
    "backend_engine": ("hf", {"backend": "ray"}),
    "tensor_parallel_size": (2, {"backend": "ray", "backend_engine": "vllm", "device": "cuda"}),
    "coverage_every": (1, {}), "coverage_prompts": (2, {}), "coverage_samples": (2, {}),
    "coverage_temperature": (0.5, {}),
    "wandb_project": ("p", {}), "wandb_entity": ("e", {}), "wandb_mode": ("offline", {}), "wandb_group": ("g", {}),
    "wandb_name": ("n", {}), "wandb_table_every": (3, {}), "wandb_table_rows": (2, {}),
}


def _flat_fields() -> list[str]:
    from esreason.api.config import FIELD_KEYS

    return list(FIELD_KEYS)


@pytest.mark.parametrize("field", _flat_fields())
def test_each_flat_field_reaches_the_run_config(field):
    from esreason import ESConfig, ESTrainer
    from esreason.api.config import FIELD_KEYS

    assert field in FLAT_VALUES, f"give the new field {field!r} a non-default value in FLAT_VALUES"
    value, beside = FLAT_VALUES[field]
    assert value != getattr(ESConfig(), field), f"{field}: {value!r} is the default"
    node = ESTrainer(args=ESConfig(**beside, **{field: value})).run_config  # what train() hands to the loop
    for part in FIELD_KEYS[field].split("."):
        node = getattr(node, part)
    assert node == value


# --------------------------------------------------------------------------- the API's own fields


def test_output_dir(tmp_path, monkeypatch, tiny_model_dir):
    run = es_run(tmp_path / "elsewhere", monkeypatch, tiny_model_dir)
    assert {p.name for p in (tmp_path / "elsewhere").iterdir()} >= {"config.yaml", "manifest.json", "metrics.jsonl",
                                                                     "checkpoints"}
    assert run.result.final_checkpoint == tmp_path / "elsewhere" / "checkpoints" / "step_1"


def half(completions, **kwargs):
    return [0.5] * len(completions)


def test_reward_weights_and_pass_threshold(tmp_path, monkeypatch, tiny_model_dir):
    """Two reward functions weighted 2 and 1: the members' reward is 2 * text_reward + 0.5, and a
    sample is correct when that reaches pass_threshold."""
    run = es_run(tmp_path / "r", monkeypatch, tiny_model_dir, trainer={"reward_funcs": [text_reward, half]},
                 reward_weights=(2.0, 1.0), pass_threshold=1.2)
    raw = [r for c in run.train_calls() for r in text_reward(c.texts, [0] * len(c.texts))]
    combined = [2 * r + 0.5 for r in raw]
    m = run.metrics[0]
    assert m["reward/mean"] == pytest.approx(sum(combined) / len(combined))
    assert m["accuracy/mean"] == pytest.approx(sum(c >= 1.2 for c in combined) / len(combined))
    assert 0 < m["accuracy/mean"] < 1  # the threshold splits these samples


# --------------------------------------------------------------------------- ESTrainer


def test_model_wins_over_args_model(tmp_path, monkeypatch, tiny_model_dir):
    from esreason import ESConfig, ESTrainer

    trainer = ESTrainer(model=str(tiny_model_dir), reward_funcs=text_reward, train_dataset=ROWS,
                        args=ESConfig(output_dir=str(tmp_path / "r"), max_steps=1, population_size=2, batch_size=2,
                                      max_new_tokens=4, backend="hf"))  # args.model: the embedded default
    result = trainer.train()
    assert json.loads((result.final_checkpoint / "config.json").read_text())["hidden_size"] == 32


def test_reward_funcs_score_the_members(tmp_path, monkeypatch, tiny_model_dir):
    run = es_run(tmp_path / "r", monkeypatch, tiny_model_dir)
    assert len(run.rewards) == 4  # one call per member
    assert run.metrics[0]["reward/mean"] == pytest.approx(sum(map(sum, run.rewards)) / 8)


def test_train_and_eval_dataset(tmp_path, monkeypatch, tiny_model_dir):
    run = es_run(tmp_path / "r", monkeypatch, tiny_model_dir, rows=ROWS[:4], eval_rows=EVAL_ROWS[:3], eval_every=1)
    assert {p for c in run.train_calls() for p in c.prompts} <= {r["prompt"] for r in ROWS[:4]}
    train = run.train_calls()
    held = {p for c in run.calls if c not in train for p in c.prompts}
    assert held == {r["prompt"] for r in EVAL_ROWS[:3]}


def test_args(tmp_path, monkeypatch, tiny_model_dir):
    run = es_run(tmp_path / "r", monkeypatch, tiny_model_dir, max_steps=2, population_size=2)
    assert run.result.steps == 2 and len(run.train_calls()) == 2 * 2


def test_processing_class_renders_the_prompts(tmp_path, monkeypatch, tiny_model_dir):
    """The tokenizer given renders conversational prompts with its own chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = "<<{% for m in messages %}{{ m['content'] }}{% endfor %}>>"
    rows = [{"prompt": [{"role": "user", "content": r["prompt"]}], "total": r["total"]} for r in ROWS[:2]]
    run = es_run(tmp_path / "r", monkeypatch, tiny_model_dir, rows=rows, trainer={"processing_class": tok})
    assert {p for c in run.train_calls() for p in c.prompts} == {f"<<{r['prompt']}>>" for r in ROWS[:2]}


def test_answer_fn_gives_maj_at_k(tmp_path, monkeypatch, tiny_model_dir):
    run = es_run(tmp_path / "r", monkeypatch, tiny_model_dir, eval_rows=EVAL_ROWS[:2], eval_every=1,
                 trainer={"answer_fn": lambda text: text[:1] or None})
    assert "heldout/maj@2" in run.metrics[0]
    plain = es_run(tmp_path / "p", monkeypatch, tiny_model_dir, eval_rows=EVAL_ROWS[:2], eval_every=1)
    assert "heldout/maj@2" not in plain.metrics[0]


# --------------------------------------------------------------------------- evaluate


def exact(completions, total, **kwargs):
    return [float(str(t) in c) for c, t in zip(completions, total)]


@pytest.fixture(scope="module")
def evals(tmp_path_factory, tiny_model_dir):
    """``evals(name, model=tiny, **kw)``: evaluate() once per module and name, its sampler calls recorded."""
    cache: dict[str, tuple] = {}
    root = tmp_path_factory.mktemp("evaluate")

    def get(key: str, model=None, **kw):
        from esreason import evaluate

        if key not in cache:
            args = {"n": 2, "k": [1, 2], "max_new_tokens": 4, "output_dir": root / key, **kw}
            if "task" not in args:
                args.setdefault("dataset", EVAL_ROWS)
                args.setdefault("reward_funcs", exact)
            dataset = args.pop("dataset", None)
            with pytest.MonkeyPatch.context() as mp:
                calls = record_sampler(mp)
                result = evaluate(str(tiny_model_dir) if model is None else model, dataset, **args)
            cache[key] = (result, calls, root / key)
        return cache[key]
    return get


def responses(out: Path) -> list[dict]:
    return [json.loads(line) for f in out.glob("*/responses.jsonl") for line in f.read_text().splitlines()]


def sampled_texts(out: Path) -> list[str]:
    return [r["text"] for r in responses(out) if not r["greedy"]]


def test_evaluate_model(evals, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base, _, out = evals("base")
    pair = (AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir))
    same, _, pair_out = evals("pair", model=pair)
    assert sampled_texts(pair_out) == sampled_texts(out)  # the same model in memory
    demo, _, demo_out = evals("demo", model="demo")
    assert sampled_texts(demo_out) != sampled_texts(out)


def test_evaluate_dataset_and_reward_funcs(evals):
    result, calls, _ = evals("base")
    assert {p for c in calls for p in c.prompts} == {r["prompt"] for r in EVAL_ROWS}
    ones, _, _ = evals("ones", reward_funcs=lambda completions, **kw: [1.0] * len(completions))
    assert ones["pass@1"] == 1.0 and result["num_problems"] == len(EVAL_ROWS)


def test_evaluate_task_split_limit_and_data_dir(evals, user_tasks, tmp_path):
    by_task, _, _ = evals("task", task="keys-file")
    assert by_task["num_problems"] == 4  # its test split
    assert evals("split", task="keys-file", split="train")[0]["num_problems"] == 6
    assert evals("limit", task="keys-file", limit=3)[0]["num_problems"] == 3
    (tmp_path / "keys-file").mkdir()
    (tmp_path / "keys-file" / "test.jsonl").write_text(json.dumps({"a": 1, "b": 1, "total": 2}) + "\n")
    _, calls, _ = evals("data_dir", task="keys-file", data_dir=tmp_path)
    assert {p for c in calls for p in c.prompts} == {"1+1="}


def test_evaluate_tasks_dir(evals, user_tasks):
    assert evals("tasks_dir", task="keys-dir", tasks_dir=user_tasks / "keys-dir")[0]["num_problems"] == 2


def test_evaluate_n_and_k(evals):
    result, _, out = evals("n", n=3, k=[1, 3])
    assert result["samples"] == 3 and len(sampled_texts(out)) == 3 * len(EVAL_ROWS)
    assert "pass@3" in result and "pass@2" not in result


def test_evaluate_pass_threshold(evals):
    low = evals("threshold", reward_funcs=half, pass_threshold=0.5)[0]
    assert low["pass@1"] == 1.0 and evals("half", reward_funcs=half)[0]["pass@1"] == 0.0


def test_evaluate_answer_fn(evals):
    assert "maj@2" in evals("answer_fn", answer_fn=lambda text: text[:1] or None)[0]
    assert "maj@2" not in evals("base")[0]


def test_evaluate_reward_weights(evals):
    result = evals("weights", reward_funcs=[exact, half], reward_weights=[0.0, 2.0])[0]
    assert result["pass@1"] == 1.0  # 0 * exact + 2 * 0.5 = 1.0 for every sample


def test_evaluate_name_registers_and_seeds(evals):
    _, _, out = evals("name", name="keys-named", temperature=1.0)
    assert {r["task"] for r in responses(out)} == {"keys-named"}
    _, _, other = evals("name-default", temperature=1.0)
    assert sampled_texts(out) != sampled_texts(other)  # the name seeds the samples


def test_evaluate_temperature_top_p_seed_and_max_new_tokens(evals):
    greedy = sampled_texts(evals("cold", temperature=0.0)[2])
    hot = sampled_texts(evals("hot", temperature=1.0)[2])
    assert greedy != hot and greedy[0::2] == greedy[1::2]  # at temperature 0 both samples of a problem agree
    assert sampled_texts(evals("nucleus", temperature=1.0, top_p=1e-6)[2]) == greedy
    assert sampled_texts(evals("seed", temperature=1.0, seed=3)[2]) != hot
    _, calls, out = evals("short", max_new_tokens=2)
    assert {c.params.max_new_tokens for c in calls} == {2} and max(r["num_tokens"] for r in responses(out)) == 2


def test_evaluate_greedy(evals):
    result, calls, out = evals("greedy", greedy=True)
    assert "greedy_acc" in result and any(r["greedy"] for r in responses(out))
    assert "greedy_acc" not in evals("base")[0]


def test_evaluate_output_dir(evals, tiny_model_dir):
    from esreason import evaluate

    result, _, out = evals("base")
    assert result["output_dir"] == str(out) and (out / "summary.json").is_file()
    assert evaluate(str(tiny_model_dir), EVAL_ROWS[:1], reward_funcs=exact, n=1, k=[1], max_new_tokens=2,
                    ci_resamples=0)["output_dir"] is None  # the default: a temporary directory, removed


def test_evaluate_batch_size(evals):
    _, calls, _ = evals("batch", batch_size=4)
    assert max(r for c in calls for r in c.forward_rows) == 4  # 6 problems x 2 samples, 4 rows at a time
    assert max(r for c in evals("base")[1] for r in c.forward_rows) == 12


def test_evaluate_dtype(evals):
    import torch

    seen = []
    from esreason.backends import hf

    original = hf.load_model

    def load_model(spec, dtype="float32", device="cpu", run_device=None):
        model, tok = original(spec, dtype, device, run_device)
        seen.append(next(model.parameters()).dtype)
        return model, tok

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf, "load_model", load_model)
        evals("bf16", dtype="bfloat16")
    assert seen == [torch.bfloat16]


def test_evaluate_device_reaches_the_loader(monkeypatch, tiny_model_dir):
    """``device='cuda'`` needs a GPU; evaluate() hands it to the loader that places the model."""
    from esreason import evaluate
    from esreason.backends import hf

    asked = []

    def load_model(spec, dtype="float32", device="cpu", run_device=None):
        asked.append(device)
        raise RuntimeError("stop: no GPU here")

    monkeypatch.setattr(hf, "load_model", load_model)
    with pytest.raises(RuntimeError, match="stop: no GPU here"):
        evaluate(str(tiny_model_dir), EVAL_ROWS, reward_funcs=exact, n=1, k=[1], device="cuda")
    assert asked == ["cuda"]


def test_evaluate_ci_resamples(evals):
    assert evals("base")[0]["ci"] and evals("no-ci", ci_resamples=0)[0]["ci"] == {}


def test_evaluate_processing_class(evals, tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = "<<{% for m in messages %}{{ m['content'] }}{% endfor %}>>"
    chat = [{"prompt": [{"role": "user", "content": r["prompt"]}], "total": r["total"]} for r in EVAL_ROWS[:2]]
    _, calls, _ = evals("processing_class", model=AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                        dataset=chat, reward_funcs=exact, processing_class=tok)
    assert {p for c in calls for p in c.prompts} == {f"<<{r['prompt']}>>" for r in EVAL_ROWS[:2]}


def test_evaluate_progress(evals, monkeypatch):
    """A progress bar is shown on a terminal (tqdm's rule: esreason.io.progress_bar); progress=True asks for it."""
    from esreason.eval import harness

    asked = []
    original = harness.progress_bar

    def progress_bar(*args, **kwargs):
        asked.append(kwargs.get("disable"))
        return original(*args, **kwargs)

    monkeypatch.setattr(harness, "progress_bar", progress_bar)
    evals("progress", progress=True)
    assert None in asked  # shown where stderr is a terminal
    asked.clear()
    evals("quiet")
    assert asked and set(asked) == {True}


def test_reward_weights_and_pass_threshold_without_reward_funcs_are_refused(tmp_path, user_tasks):
    """They combine and judge reward functions; a registered task scores with its own verifier, so given
    without reward_funcs they would do nothing: one line instead."""
    from esreason import ESConfig, ESTrainer, GRPOComparator, evaluate
    from esreason.errors import UserError

    for changed in ({"reward_weights": (2.0,)}, {"pass_threshold": 0.5}):
        with pytest.raises(UserError, match=r"^reward_weights / pass_threshold: .*'keys-file' scores with its own"):
            ESTrainer(args=ESConfig(output_dir=str(tmp_path), task="keys-file", **changed))
        with pytest.raises(UserError, match=r"^reward_weights / pass_threshold: "):
            GRPOComparator(task="keys-file", **changed)
        with pytest.raises(UserError, match=r"reward_weights / pass_threshold go with a dataset"):
            evaluate("demo", task="keys-file", **changed)
