"""The evaluation harness end to end: fake generator (exact numbers), resume, files, errors, tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esreason.backends.base import Generation, SamplingParams
from esreason.embedded import build_tokenizer
from esreason.errors import UserError
from esreason.eval import evaluate, evaluate_problems, pass_at_k
from esreason.eval.verify import score_batch
from esreason.tasks import get as get_task
from esreason.tasks import render_prompt

SAMPLES = 8


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def n_correct(index: int) -> int:
    """How many of the 8 samples of problem ``index`` the fake answers correctly."""
    return [0, 1, 3, 8, 5, 2, 0, 7, 4, 6][index % 10]


class FakeGenerator:
    """Canned responses for demo-add: problem i gets ``n_correct(i)`` correct samples (the first ones).

    Wrong samples answer gold + 1 + (sample % 2) (two wrong groups), or abstain when the sample
    index is 7; the call's seed is written into every response, so reproducibility is visible.
    Counts generate calls and rows.
    """

    identity = "fake-demo-add-v1"

    def __init__(self, tokenizer, problems) -> None:
        self.index = {render_prompt(tokenizer, p.messages): (i, int(p.gold)) for i, p in enumerate(problems)}
        self.calls: list[tuple[int, SamplingParams]] = []

    def generate(self, prompts, params: SamplingParams) -> Generation:
        self.calls.append((len(prompts), params))
        seen: dict[str, int] = {}
        texts = []
        for prompt in prompts:
            j = seen.get(prompt, 0)
            seen[prompt] = j + 1
            i, gold = self.index[prompt]
            if params.temperature == 0:
                answer = gold if n_correct(i) >= 4 else gold + 1
                texts.append(f"greedy \\boxed{{{answer}}}")
            elif j < n_correct(i):
                texts.append(f"s{params.seed % 997} \\boxed{{{gold}}}")
            elif j == 7:
                texts.append(f"s{params.seed % 997} no box")
            else:
                texts.append(f"s{params.seed % 997} \\boxed{{{gold + 1 + j % 2}}}")
        tokens = [[5] * (len(t) // 2) for t in texts]
        ent = [0.25 * len(t) for t in tokens] if params.compute_entropy else None
        return Generation(texts, tokens, ent)


@pytest.fixture
def problems():
    return get_task("demo-add").load("test", None, 10)


def run(out: Path, gen, tok, **kw):
    args = dict(samples=SAMPLES, ks=(1, 4, 8), greedy=True, limit=10, progress=False, ci_resamples=200,
                batch_size=24)
    args.update(kw)
    return evaluate((gen, tok), ["demo-add"], output_dir=out, **args)


def expected_maj(i: int, k: int) -> float:
    """Hand count of the fake's vote over its first k samples."""
    c = n_correct(i)
    votes: dict[str, int] = {}
    order: list[str] = []
    for j in range(k):
        key = "right" if j < c else (None if j == 7 else f"wrong{j % 2}")
        if key is None:
            continue
        if key not in votes:
            order.append(key)
        votes[key] = votes.get(key, 0) + 1
    if not votes:
        return 0.0
    best = max(votes.values())
    return float(next(key for key in order if votes[key] == best) == "right")


def test_end_to_end_numbers_and_files(tmp_path, tok, problems):
    gen = FakeGenerator(tok, problems)
    summary = run(tmp_path, gen, tok)
    cs = [n_correct(i) for i in range(10)]
    assert summary.value("pass@1", "demo-add") == pytest.approx(sum(cs) / 80)
    assert summary.value("pass@8", "demo-add") == pytest.approx(sum(c > 0 for c in cs) / 10)
    assert summary.value("pass@4", "demo-add") == pytest.approx(sum(pass_at_k(8, c, 4) for c in cs) / 10)
    assert summary.value("maj@4", "demo-add") == pytest.approx(sum(expected_maj(i, 4) for i in range(10)) / 10)
    assert summary.value("maj@8", "demo-add") == pytest.approx(sum(expected_maj(i, 8) for i in range(10)) / 10)
    assert summary.value("greedy_acc", "demo-add") == pytest.approx(sum(c >= 4 for c in cs) / 10)
    assert summary.value("entropy", "demo-add") == pytest.approx(0.25)
    # The single-task average is the task.
    assert summary.value("pass@1") == summary.value("pass@1", "demo-add")
    # 24-row batches hold 3 problems of 8 samples: 4 sampled calls + 4 greedy calls for 10 problems.
    assert [n for n, p in gen.calls if p.temperature > 0] == [24, 24, 24, 8]
    assert sum(p.temperature == 0 for _, p in gen.calls) == 4
    assert all(p.compute_entropy for _, p in gen.calls if p.temperature > 0)

    lines = [json.loads(x) for x in (tmp_path / "demo-add" / "responses.jsonl").read_text().splitlines()]
    assert len(lines) == 10 * (SAMPLES + 1)
    assert {"task", "problem_id", "sample", "greedy", "text", "num_tokens", "extracted", "correct", "reward",
            "reason", "vote", "entropy_sum"} <= set(lines[0])
    assert sum(x["greedy"] for x in lines) == 10
    first = [x for x in lines if x["problem_id"] == problems[2].id and not x["greedy"]]
    assert [x["correct"] for x in first] == [True] * 3 + [False] * 5
    assert first[7]["vote"] is None and first[7]["extracted"] is None

    data = json.loads((tmp_path / "summary.json").read_text())
    pass1 = data["tasks"]["demo-add"]["metrics"]["pass@1"]
    assert pass1["ci_low"] <= pass1["value"] <= pass1["ci_high"]
    assert data["protocol"]["samples"] == SAMPLES and data["ks"] == [1, 4, 8]
    assert "maj@4_expected" in data["metrics"] and "maj@8_expected" not in data["metrics"]
    assert "| demo-add | 10 |" in (tmp_path / "summary.md").read_text()
    table = [json.loads(x) for x in (tmp_path / "demo-add" / "problems.jsonl").read_text().splitlines()]
    assert [row["correct"] for row in table] == cs
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["protocol"]["temperature"] == 0.6 and manifest["model"]["identity"] == "fake-demo-add-v1"


def test_rerun_resumes_and_is_reproducible(tmp_path, tok, problems):
    gen = FakeGenerator(tok, problems)
    run(tmp_path / "a", gen, tok, limit=4)
    first_calls = len(gen.calls)
    assert first_calls == 2 * 2  # problems 0-2 and 3, sampled + greedy each

    gen.calls.clear()
    again = run(tmp_path / "a", gen, tok, limit=4)
    assert gen.calls == []  # everything answered
    assert again.num_problems == {"demo-add": 4}

    # Extending the limit generates only the calls holding new problems; the file then equals
    # a fresh, uninterrupted run with the larger limit.
    more = run(tmp_path / "a", gen, tok, limit=10)
    # call 0 (problems 0-2) is skipped; call 1 (3-5) is regenerated whole, though problem 3 was answered
    assert [n for n, p in gen.calls if p.temperature > 0] == [24, 24, 8]
    fresh_gen = FakeGenerator(tok, problems)
    fresh = run(tmp_path / "b", fresh_gen, tok, limit=10)
    assert more.as_dict()["tasks"] == fresh.as_dict()["tasks"]

    def texts(path):
        rows = [json.loads(x) for x in (path / "demo-add" / "responses.jsonl").read_text().splitlines()]
        return sorted((r["problem_id"], r["greedy"], r["sample"], r["text"]) for r in rows)

    assert texts(tmp_path / "a") == texts(tmp_path / "b")


def test_torn_last_line_is_cut_and_the_problem_redone(tmp_path, tok, problems):
    gen = FakeGenerator(tok, problems)
    run(tmp_path, gen, tok, limit=3, greedy=False)
    path = tmp_path / "demo-add" / "responses.jsonl"
    whole = path.read_bytes()
    path.write_bytes(whole[:-15])  # the last line of problem 2 is torn
    gen.calls.clear()
    run(tmp_path, gen, tok, limit=3, greedy=False)
    assert len(gen.calls) == 1  # the call holding problem 2 again
    rows = [json.loads(x) for x in path.read_text().splitlines()]  # every line parses
    assert len(rows) == 3 * SAMPLES  # torn line cut; only problem 2's missing line appended (no duplicates)
    assert path.read_text().endswith("\n")
    assert sorted({(r["problem_id"], r["sample"]) for r in rows}) == sorted(
        {(p.id, j) for p in problems[:3] for j in range(SAMPLES)})


def test_protocol_mismatch_is_refused(tmp_path, tok, problems):
    gen = FakeGenerator(tok, problems)
    run(tmp_path, gen, tok, limit=2)
    with pytest.raises(UserError, match="temperature"):
        run(tmp_path, gen, tok, limit=2, temperature=1.0)
    with pytest.raises(UserError, match="samples"):
        run(tmp_path, gen, tok, limit=2, samples=4, ks=(1, 4))
    other = FakeGenerator(tok, problems)
    other.identity = "another-model"
    with pytest.raises(UserError, match="model"):
        run(tmp_path, other, tok, limit=2)
    # ks are a reporting choice: changing them reuses the responses.
    gen.calls.clear()
    summary = run(tmp_path, gen, tok, limit=2, ks=(1, 2))
    assert gen.calls == [] and "pass@2" in summary.names


def test_bad_input_raises_user_error(tmp_path, tok, problems):
    gen = FakeGenerator(tok, problems)
    with pytest.raises(UserError, match="k=16 exceeds"):
        run(tmp_path, gen, tok, ks=(1, 16))
    with pytest.raises(UserError, match="known tasks: .*demo-add"):
        evaluate((gen, tok), ["no-such-task"], output_dir=tmp_path, samples=2, progress=False)
    with pytest.raises(UserError, match="data directory not found"):
        run(tmp_path, gen, tok, data_dir=tmp_path / "missing")
    with pytest.raises(UserError, match="limit"):
        run(tmp_path, gen, tok, limit=0)
    with pytest.raises(UserError, match="samples"):
        run(tmp_path, gen, tok, samples=0, ks=(1,))
    with pytest.raises(UserError, match="split"):
        run(tmp_path, gen, tok, split="validation")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "demo-add").mkdir()
    (tmp_path / "junk" / "demo-add" / "responses.jsonl").write_text("{}\n")
    with pytest.raises(UserError, match="no manifest.json"):
        run(tmp_path / "junk", gen, tok)
    assert not (tmp_path / "manifest.json").exists()  # nothing was written by the failed calls


def test_library_entry_matches_the_harness(tmp_path, tok, problems):
    gen = FakeGenerator(tok, problems)
    summary = run(tmp_path, gen, tok)
    flat = evaluate_problems(FakeGenerator(tok, problems), tok, problems, samples=SAMPLES, temperature=0.6,
                             max_new_tokens=2048, ks=(1, 4, 8), seed=0, rows_per_call=24)
    for name in summary.names:
        assert flat[f"demo-add/{name}"] == pytest.approx(summary.value(name, "demo-add"))
        assert flat[name] == pytest.approx(summary.value(name))
    assert flat["num_problems"] == 10 and flat["time/generate_s"] >= 0


def test_library_entry_averages_tasks_equally(tok):
    add = get_task("demo-add").load("test", None, 2)
    sub = get_task("demo-sub").load("test", None, 6)

    class RightOnAddOnly:
        def generate(self, prompts, params):
            gold = {render_prompt(tok, p.messages): p for p in add + sub}
            texts = [f"\\boxed{{{gold[x].gold}}}" if gold[x].task == "demo-add" else "x" for x in prompts]
            return Generation(texts, [[1] for _ in texts], None)

    flat = evaluate_problems(RightOnAddOnly(), tok, add + sub, samples=2, temperature=0.6, max_new_tokens=8,
                             ks=None, seed=0, greedy=False)
    assert flat["demo-add/pass@1"] == 1.0 and flat["demo-sub/pass@1"] == 0.0
    assert flat["pass@1"] == 0.5            # tasks weigh equally (problem-weighted would be 0.25)
    assert flat["entropy"] is None          # the generator measured none
    assert flat["demo-sub/formatted"] == 0.0


def test_score_batch_deduplicates_and_keeps_order():
    calls = []

    def scorer(text, gold):
        from esreason.verifiers.base import Verdict

        calls.append((text, gold))
        return Verdict(float(text == gold), text == gold, text, "")

    texts = ["1", "2", "1", "1", "3", "1"]
    golds = ["1", "1", "1", "2", "2", "2"]
    groups = [0, 0, 0, 1, 1, 1]
    for workers in (1, 4):
        calls.clear()
        verdicts = score_batch(scorer, texts, golds, groups, workers)
        assert [v.correct for v in verdicts] == [True, False, True, False, False, False]
        assert sorted(calls) == sorted([("1", "1"), ("2", "1"), ("1", "2"), ("3", "2")])


def test_tiny_model_end_to_end_is_reproducible(tmp_path, tiny_model_dir):
    kw = dict(samples=4, max_new_tokens=12, limit=3, greedy=True, progress=False, ci_resamples=50,
              batch_size=8, ks=(1, 4))
    a = evaluate(str(tiny_model_dir), ["demo-add", "demo-countdown"], output_dir=tmp_path / "a", **kw)
    b = evaluate(str(tiny_model_dir), ["demo-add", "demo-countdown"], output_dir=tmp_path / "b", **kw)
    for task in ("demo-add", "demo-countdown"):
        ra = (tmp_path / "a" / task / "responses.jsonl").read_text()
        assert ra == (tmp_path / "b" / task / "responses.jsonl").read_text()
        rows = [json.loads(x) for x in ra.splitlines()]
        assert len(rows) == 3 * 5
        assert all(0 <= r["num_tokens"] <= 12 for r in rows)
    entropy = a.value("entropy", "demo-add")
    assert entropy is not None and 0 < entropy < 5.0  # nats; the char vocabulary is ~100 tokens
    assert a.as_dict()["tasks"] == b.as_dict()["tasks"]
    assert json.loads((tmp_path / "a" / "manifest.json").read_text())["model"]["identity"].startswith("sha256:")
    # The trainers' entry point, given the same sampler settings (the harness prefills each prompt
    # once for its samples: share_prefix), reproduces the harness exactly.
    from esreason.backends.hf import load_model
    from esreason.backends.sampling import Sampler

    model, tokenizer = load_model(str(tiny_model_dir))
    problems = [p for t in ("demo-add", "demo-countdown") for p in get_task(t).load("test", None, 3)]
    flat = evaluate_problems(Sampler(model, tokenizer, batch_size=8, share_prefix=True), tokenizer, problems, samples=4,
                             temperature=0.6, max_new_tokens=12, ks=(1, 4), seed=0, greedy=True, rows_per_call=8)
    for name in a.names:
        for task in ("demo-add", "demo-countdown"):
            assert flat[f"{task}/{name}"] == pytest.approx(a.value(name, task), abs=1e-12)
