"""The harness on the paper's ten benchmarks (fixture datasets, real loaders and verifiers)."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

import esreason.tasks.paper  # noqa: F401  (registers the paper tasks even where the registry does not list them)
from esreason.backends.base import Generation
from esreason.embedded import build_tokenizer
from esreason.errors import UserError
from esreason.eval import evaluate
from esreason.tasks import get as get_task
from esreason.tasks import render_prompt
from esreason.verifiers.countdown import Rejected, evaluate as countdown_eval

FIXTURES = Path(__file__).parent / "fixtures" / "datasets"
PAPER_TASKS = ("gsm8k", "math500", "aime24", "aime25", "amc23", "csqa", "gpqa", "hotpotqa", "countdown", "mbpp")
SAMPLES = 4
#: Correct samples per problem, by problem index (mod 4), and the resulting first-4 vote
#: (samples: c correct, then wrong answers, sample 3 abstains unless it is correct).
N_CORRECT = (4, 1, 0, 2)
MAJ4 = (1.0, 0.0, 0.0, 1.0)


def solve_countdown(target: int, numbers: list[int]) -> str:
    """An expression reaching ``target`` with every number once (brute force over shapes)."""
    def exprs(nums):
        if len(nums) == 1:
            yield str(nums[0])
            return
        for i in range(1, len(nums)):
            for left in exprs(nums[:i]):
                for right in exprs(nums[i:]):
                    for op in "+-*/":
                        yield f"({left}{op}{right})"

    for perm in itertools.permutations(numbers):
        for e in exprs(list(perm)):
            try:
                if countdown_eval(e, numbers) == target:
                    return e
            except (Rejected, ZeroDivisionError):
                continue
    raise AssertionError(f"fixture countdown problem {target} from {numbers} has no solution")


def right_and_wrong(problem) -> tuple[str, str]:
    """A correct and a formatted-but-wrong response for a problem of any paper family."""
    task = get_task(problem.task)
    gold = problem.gold
    if task.verifier == "math":
        return f"so \\boxed{{{gold}}}", "so \\boxed{987654321}"
    if task.verifier == "choice":
        letter = gold["answer"] if isinstance(gold, dict) else gold
        choices = gold.get("choices", "ABCD") if isinstance(gold, dict) else "ABCD"
        return f"\\boxed{{{letter}}}", f"\\boxed{{{next(c for c in choices if c != letter)}}}"
    if task.verifier == "hotpotqa":
        answer = gold if isinstance(gold, str) else gold[0]
        return f"<answer>{answer}</answer>", "<answer>certainly not this</answer>"
    if task.verifier == "countdown":
        nums = gold["numbers"]
        wrong = "+".join(map(str, nums)) if sum(nums) != gold["target"] else "*".join(map(str, nums))
        return f"<answer>{solve_countdown(gold['target'], nums)}</answer>", f"<answer>{wrong}</answer>"
    assert task.verifier == "mbpp"
    return (f"```python\n{problem.meta['reference_code']}\n```",
            "```python\ndef unrelated():\n    return None\n```")


class PaperFake:
    """Canned responses: problem i of each task gets N_CORRECT[i % 4] correct samples first."""

    identity = "paper-fake-v1"

    def __init__(self, tokenizer, problems) -> None:
        self.by_prompt = {}
        for group in problems.values():
            for i, p in enumerate(group):
                self.by_prompt[render_prompt(tokenizer, p.messages)] = (i, right_and_wrong(p))

    def generate(self, prompts, params) -> Generation:
        seen: dict[str, int] = {}
        texts = []
        for prompt in prompts:
            j = seen.get(prompt, 0)
            seen[prompt] = j + 1
            i, (right, wrong) = self.by_prompt[prompt]
            c = N_CORRECT[i % 4]
            if params.temperature == 0:
                texts.append(right if c >= 2 else wrong)
            else:
                texts.append(right if j < c else ("I am not sure." if j == 3 else wrong))
        return Generation(texts, [[7] * max(1, len(t) // 4) for t in texts],
                          [0.5] * len(texts) if params.compute_entropy else None)


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def test_all_paper_tasks_from_fixtures(tmp_path, tok):
    problems = {t: get_task(t).load("test", FIXTURES / t) for t in PAPER_TASKS}
    summary = evaluate((PaperFake(tok, problems), tok), list(PAPER_TASKS), output_dir=tmp_path, samples=SAMPLES,
                       ks=(1, 2, 4), greedy=True, data_dir=FIXTURES, progress=False, ci_resamples=100)
    means = {}
    for t in PAPER_TASKS:
        n = len(problems[t])
        cs = [N_CORRECT[i % 4] for i in range(n)]
        assert summary.num_problems[t] == n
        assert summary.value("pass@1", t) == pytest.approx(sum(cs) / (SAMPLES * n)), t
        assert summary.value("pass@4", t) == pytest.approx(sum(c > 0 for c in cs) / n), t
        assert summary.value("maj@4", t) == pytest.approx(sum(MAJ4[i % 4] for i in range(n)) / n), t
        assert summary.value("greedy_acc", t) == pytest.approx(sum(c >= 2 for c in cs) / n), t
        means[t] = summary.value("pass@1", t)
        lines = (tmp_path / t / "responses.jsonl").read_text().splitlines()
        assert len(lines) == n * (SAMPLES + 1)
    assert summary.value("pass@1") == pytest.approx(sum(means.values()) / len(means))  # tasks weigh equally
    # Vote keys per family: countdown by value, MBPP by the pass/fail vector.
    rows = [json.loads(x) for x in (tmp_path / "countdown" / "responses.jsonl").read_text().splitlines()]
    assert all(r["vote"].startswith("value:") for r in rows if r["formatted"])
    rows = [json.loads(x) for x in (tmp_path / "mbpp" / "responses.jsonl").read_text().splitlines()]
    assert {r["vote"] for r in rows if r["correct"]} <= {"tests:" + "1" * k for k in range(1, 10)}
    assert {r["vote"] for r in rows if r["formatted"] and not r["correct"]} <= {"tests:" + "0" * k for k in range(1, 10)}
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["tasks"]["gsm8k"]["data"] == str(FIXTURES / "gsm8k")


def test_bad_dataset_rows_and_missing_files_are_user_errors(tmp_path, tok):
    data = tmp_path / "data"
    shutil.copytree(FIXTURES / "gsm8k", data / "gsm8k")
    with open(data / "gsm8k" / "test.jsonl", "a") as fh:
        fh.write(json.dumps({"question": "no answer field"}) + "\n")
    problems = {"gsm8k": get_task("gsm8k").load("test", FIXTURES / "gsm8k")}
    fake = PaperFake(tok, problems)
    with pytest.raises(UserError, match=r"row 4: field 'answer' is missing"):
        evaluate((fake, tok), ["gsm8k"], output_dir=tmp_path / "o", samples=2, data_dir=data, progress=False)
    with pytest.raises(UserError, match=r"no data for task 'csqa'"):
        evaluate((fake, tok), ["csqa"], output_dir=tmp_path / "o", samples=2, data_dir=data, progress=False)
    assert not (tmp_path / "o").exists()


def test_tiny_model_runs_every_paper_task(tmp_path, tiny_model_dir):
    summary = evaluate(str(tiny_model_dir), list(PAPER_TASKS), output_dir=tmp_path, samples=2, ks=(1, 2),
                       max_new_tokens=6, limit=2, data_dir=FIXTURES, progress=False, ci_resamples=0,
                       batch_size=8)
    for t in PAPER_TASKS:
        assert summary.value("pass@1", t) is not None
        rows = [json.loads(x) for x in (tmp_path / t / "responses.jsonl").read_text().splitlines()]
        assert len(rows) == 2 * min(2, summary.num_problems[t])
        assert all(r["num_tokens"] <= 6 for r in rows)
