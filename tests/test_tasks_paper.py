"""The paper's benchmark tasks: loading, validation, prompt rendering, registration.

Fixtures under tests/fixtures/datasets/<task>/ are written for this project in each
source's schema (no network: conftest sets HF_DATASETS_OFFLINE=1).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import esreason.tasks.paper as paper
from esreason import tasks
from esreason.errors import UserError
from esreason.tasks.base import render_prompt
from esreason.tasks.choice_sets import GPQA_COLUMNS, gpqa_order

FIXTURES = Path(__file__).parent / "fixtures" / "datasets"
ALL_TASKS = ("gsm8k", "math500", "aime24", "aime25", "amc23", "deepscaler", "csqa", "gpqa", "hotpotqa",
             "countdown", "mbpp")
EVAL_SPLIT = {name: ("train" if name == "deepscaler" else "test") for name in ALL_TASKS}

# The appendix "Prompt Templates" texts, typed here independently of the module.
MATH_SYS = "Please reason step by step, and put your final answer within \\boxed{}."
CHOICE_SYS = ("Please reason step by step to solve the following multiple-choice question. Put your final "
              "choice letter inside \\boxed{}, e.g., \\boxed{C}.")
QA_SYS = ("Answer the question using the provided context. Keep the final answer short, and put it inside "
          "<answer> </answer> tags.")
MBPP_SYS = ("You are a Python programming assistant. Write clean, correct Python code that passes the given "
            "tests. The function name and signature must match exactly as specified in the test cases. The final "
            "code block must not include the tests; do not include the tests in your answer. Do not include "
            "explanations or text outside the code block. Output exactly one Python markdown code block "
            "containing only the final solution code.")
SYSTEM_OF = {"gsm8k": MATH_SYS, "math500": MATH_SYS, "aime24": MATH_SYS, "aime25": MATH_SYS, "amc23": MATH_SYS,
             "deepscaler": MATH_SYS, "csqa": CHOICE_SYS, "gpqa": CHOICE_SYS, "hotpotqa": QA_SYS, "mbpp": MBPP_SYS}


def load(name: str, split: str | None = None, path: Path | None = None):
    return tasks.get(name).load(split or EVAL_SPLIT[name], path if path is not None else FIXTURES / name)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# --------------------------------------------------------------------------- registration


def test_every_paper_task_is_registered_with_its_verifier_and_splits():
    expected = {"gsm8k": ("math", ("train", "test")), "math500": ("math", ("test",)),
                "aime24": ("math", ("test",)), "aime25": ("math", ("test",)), "amc23": ("math", ("test",)),
                "deepscaler": ("math", ("train",)), "csqa": ("choice", ("train", "test")),
                "gpqa": ("choice", ("test",)), "hotpotqa": ("hotpotqa", ("test",)),
                "countdown": ("countdown", ("test",)), "mbpp": ("mbpp", ("test",))}
    for name, (verifier, splits) in expected.items():
        task = tasks.get(name)
        assert (task.verifier, task.splits) == (verifier, splits), name
        assert task.description
    for suite in ("easy-indomain", "easy-heldout", "hard-math", "hard-heldout"):
        for name in tasks.suite(suite):
            assert tasks.get(name).name == name


# --------------------------------------------------------------------------- loading + prompts


@pytest.mark.parametrize("name", ALL_TASKS)
def test_fixture_loads_with_verbatim_system_prompt_and_renders(name):
    from esreason.embedded import build_tokenizer

    problems = load(name)
    assert 3 <= len(problems) <= 5
    assert len({p.id for p in problems}) == len(problems)
    tok = build_tokenizer()
    for p in problems:
        assert p.task == name
        assert all(set(m) == {"role", "content"} for m in p.messages)
        assert p.messages[-1]["role"] == "user" and p.messages[-1]["content"].strip()
        if name in SYSTEM_OF:
            assert p.messages[0] == {"role": "system", "content": SYSTEM_OF[name]}
            assert len(p.messages) == 2
        text = render_prompt(tok, p.messages)
        assert text.startswith("<s>Q:") and text.endswith("\nA:")
        # the demo template drops system messages and shows the user turn
        assert p.messages[-1]["content"][:20] in text


def test_problem_ids_are_stable_dataset_ids_or_indices():
    assert [p.id for p in load("math500")] == ["test/prealgebra/9001.json", "test/algebra/9002.json",
                                               "test/number_theory/9003.json"]
    assert [p.id for p in load("gsm8k")] == ["gsm8k-test-0", "gsm8k-test-1", "gsm8k-test-2"]
    assert [p.id for p in load("gsm8k", "train")][0] == "gsm8k-train-0"
    assert [p.id for p in load("aime24")] == ["60", "61", "62"]
    assert [p.id for p in load("mbpp")] == ["9001", "9002", "9003"]
    assert [p.id for p in load("gpqa")][0] == "recFixture0001"
    assert [p.id for p in load("hotpotqa")][0] == "5fx000000000000000000001"


def test_math_golds():
    # GSM8K: text after '####', commas removed
    assert [p.gold for p in load("gsm8k")] == ["1250", "27", "1260000"]
    assert [p.gold for p in load("gsm8k", "train")] == ["108", "80", "11"]
    assert load("gsm8k")[0].messages[1]["content"] == read_jsonl(FIXTURES / "gsm8k/test.jsonl")[0]["question"]
    assert [p.gold for p in load("math500")] == ["\\frac{19}{12}", "7", "13"]
    # AIME 2024 keeps the answer in 'solution': boxed, boxed inside text, or a bare integer
    assert [p.gold for p in load("aime24")] == ["99", "24", "24"]
    assert [p.gold for p in load("aime25")] == ["9", "7", "391"]
    # AMC 2023 answers are floats in the source
    assert [p.gold for p in load("amc23")] == ["55", "28", "0.75"]
    assert [p.gold for p in load("deepscaler", "train")] == ["17", "5\\sqrt{2}", "12"]


def test_choice_prompt_layout_and_csqa_gold():
    p = load("csqa")[1]
    assert p.messages[1]["content"] == ("What do people usually do when they feel cold?\n\n(A) open a window\n"
                                        "(B) put on a sweater\n(C) eat ice\n(D) take off shoes\n(E) turn on a fan")
    assert p.gold == {"answer": "B", "choices": "ABCDE"}
    assert p.meta["question_concept"] == "cold"


def test_csqa_original_release_layout_gives_the_same_problem(tmp_path):
    rows = read_jsonl(FIXTURES / "csqa/validation.jsonl")
    original = [{"answerKey": r["answerKey"], "id": r["id"],
                 "question": {"question_concept": r["question_concept"], "stem": r["question"],
                              "choices": [{"label": lab, "text": txt}
                                          for lab, txt in zip(r["choices"]["label"], r["choices"]["text"])]}}
                for r in rows]
    a = load("csqa")
    b = load("csqa", path=write_jsonl(tmp_path / "dev_rand_split.jsonl", original))
    assert [(p.id, p.messages, p.gold) for p in a] == [(p.id, p.messages, p.gold) for p in b]


def _shown_choices(problem) -> dict[str, str]:
    return dict(re.findall(r"^\(([A-D])\) (.*)$", problem.messages[1]["content"], flags=re.M))


def test_gpqa_gold_letter_points_at_the_correct_answer():
    rows = read_jsonl(FIXTURES / "gpqa/test.jsonl")
    problems = load("gpqa")
    for row, p in zip(rows, problems):
        shown = _shown_choices(p)
        assert sorted(shown.values()) == sorted(row[c] for c in GPQA_COLUMNS)
        assert shown[p.gold["answer"]] == row["Correct Answer"]
        assert p.gold["choices"] == "ABCD"
        assert p.meta["choice_order"][ord(p.gold["answer"]) - ord("A")] == "Correct Answer"
        assert p.messages[1]["content"].startswith(row["Question"] + "\n\n(A) ")


def test_gpqa_shuffle_is_deterministic_and_independent_of_row_order(tmp_path):
    rows = read_jsonl(FIXTURES / "gpqa/test.jsonl")
    first = {p.id: (p.messages, p.gold) for p in load("gpqa")}
    again = {p.id: (p.messages, p.gold) for p in load("gpqa")}
    reordered = {p.id: (p.messages, p.gold)
                 for p in load("gpqa", path=write_jsonl(tmp_path / "test.jsonl", rows[::-1]))}
    assert first == again == reordered
    # the correct answer is not parked at one letter: over many questions every letter occurs
    letters = {"ABCD"[gpqa_order(f"question number {i}").index(0)] for i in range(40)}
    assert letters == set("ABCD")


def test_hotpotqa_context_rendering():
    p = load("hotpotqa")[0]
    assert p.messages[1]["content"] == (
        "Context:\n"
        "Mara Ellison: Mara Ellison was an engineer. She invented the folding kayak and was born in Pinebrook.\n\n"
        "Pinebrook: Pinebrook is a small town beside Lake Verdant. It has a ferry.\n\n"
        "Copper Hill: Copper Hill is a mining village.\n\n"
        "Question: Which lake is next to the town where the inventor of the folding kayak was born?")
    assert p.gold == "Lake Verdant"
    assert p.meta == {"type": "bridge", "level": "medium"}


def test_hotpotqa_hf_layout_renders_identically(tmp_path):
    official = json.loads((FIXTURES / "hotpotqa/hotpot_dev_distractor_v1.json").read_text())
    hf_rows = [{"id": r["_id"], "question": r["question"], "answer": r["answer"], "type": r["type"],
                "level": r["level"],
                "supporting_facts": {"title": [t for t, _ in r["supporting_facts"]],
                                     "sent_id": [s for _, s in r["supporting_facts"]]},
                "context": {"title": [t for t, _ in r["context"]], "sentences": [s for _, s in r["context"]]}}
               for r in official]
    a = load("hotpotqa")
    b = load("hotpotqa", path=write_jsonl(tmp_path / "validation.jsonl", hf_rows))
    assert [(p.id, p.messages, p.gold) for p in a] == [(p.id, p.messages, p.gold) for p in b]


def test_countdown_uses_the_dataset_messages_unchanged():
    rows = read_jsonl(FIXTURES / "countdown/test.jsonl")
    problems = load("countdown")
    for row, p in zip(rows, problems):
        assert list(p.messages) == row["prompt"]
        assert p.gold == {"target": row["target"], "numbers": row["nums"]}
        assert p.meta["prompt_source"] == "prompt"


def test_countdown_messages_column_and_tinyzero_fallback(tmp_path):
    conv = [{"role": "system", "content": "S"}, {"role": "user", "content": "reach 10 with [2, 5]"},
            {"role": "assistant", "content": "<answer>2*5</answer>"}]
    path = write_jsonl(tmp_path / "test.jsonl", [{"messages": conv, "target": 10, "nums": [2, 5]},
                                                 {"target": 24, "nums": [4, 6, 1]}])
    with_messages, bare = load("countdown", path=path)
    assert list(with_messages.messages) == conv[:2]
    assert bare.messages[1]["content"].startswith("Using the numbers [4, 6, 1], create an equation that equals 24.")
    assert "<answer> </answer>" in bare.messages[1]["content"]
    assert bare.meta["prompt_source"] == "tinyzero"
    assert bare.gold == {"target": 24, "numbers": [4, 6, 1]}


def test_mbpp_public_tests_are_shown_and_all_tests_are_scored():
    rows = read_jsonl(FIXTURES / "mbpp/test.jsonl")
    problems = load("mbpp")
    for row, p in zip(rows, problems):
        assert p.messages[1]["content"] == f"Task: {row['prompt']}\nTest Cases: {row['test_list'][0]}"
        for hidden in row["test_list"][1:]:
            assert hidden not in p.messages[1]["content"]
        assert p.gold["tests"] == row["test_list"]
        assert p.meta["public_tests"] == row["test_list"][:1]
    assert problems[1].gold["setup"] == "import math"
    assert problems[0].gold["setup"] == ""


# --------------------------------------------------------------------------- golds fit the verifiers


def test_golds_are_accepted_by_their_verifiers():
    from esreason import verifiers

    def check(name, response, expect=True):
        p = load(name)[0]
        verdict = verifiers.get(tasks.get(name).verifier)(response(p), p.gold)
        assert verdict.correct is expect, (name, verdict.reason)

    check("gsm8k", lambda p: f"so \\boxed{{{p.gold}}}")
    check("amc23", lambda p: "\\boxed{55}")
    check("csqa", lambda p: f"\\boxed{{{p.gold['answer']}}}")
    check("gpqa", lambda p: f"\\boxed{{{p.gold['answer']}}}")
    check("gpqa", lambda p: "\\boxed{E}", expect=False)   # E is not a GPQA letter
    check("hotpotqa", lambda p: "<answer>lake verdant</answer>")
    check("countdown", lambda p: "<answer>3*7+25</answer>")


def test_mbpp_gold_runs_the_reference_solution():
    from esreason import verifiers

    p = load("mbpp")[1]
    verdict = verifiers.get("mbpp")(f"```python\n{p.meta['reference_code']}\n```", p.gold)
    assert verdict.correct, verdict.reason
    assert verdict.extra["passed"] == [True, True]


def test_vote_keys():
    assert tasks.get("gsm8k").vote_key("1,000") == "1000"
    assert tasks.get("gsm8k").vote_key(None) is None
    assert tasks.get("math500").equivalent("1,000", "1000") is True
    assert tasks.get("csqa").vote_key(" b ") == "B"
    assert tasks.get("gpqa").vote_key(None) is None
    assert tasks.get("hotpotqa").vote_key("The Lake Verdant.") == "lake verdant"
    assert tasks.get("countdown").vote_key("3*7+25") == "3*7+25"


# --------------------------------------------------------------------------- file formats and lookup


def test_parquet_and_json_lines_saved_as_json(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = read_jsonl(FIXTURES / "aime25/test.jsonl")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "test.parquet")
    (tmp_path / "lines.json").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ref = [(p.id, p.messages, p.gold) for p in load("aime25")]
    assert [(p.id, p.messages, p.gold) for p in load("aime25", path=tmp_path)] == ref   # dir -> test.parquet
    assert [(p.id, p.messages, p.gold) for p in load("aime25", path=tmp_path / "lines.json")] == ref


def test_directory_lookup_prefers_our_split_name_then_the_hub_split(tmp_path):
    rows = read_jsonl(FIXTURES / "csqa/validation.jsonl")
    write_jsonl(tmp_path / "validation.jsonl", rows)
    write_jsonl(tmp_path / "test.jsonl", rows[:1])
    assert len(load("csqa", path=tmp_path)) == 1
    (tmp_path / "test.jsonl").unlink()
    assert len(load("csqa", path=tmp_path)) == 3


def test_limit_keeps_the_first_problems():
    assert [p.id for p in tasks.get("mbpp").load("test", FIXTURES / "mbpp", limit=2)] == ["9001", "9002"]


# --------------------------------------------------------------------------- bad input


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(UserError, match=re.escape(str(missing))):
        load("gsm8k", path=missing)


def test_directory_without_the_split_lists_what_it_looked_for(tmp_path):
    with pytest.raises(UserError, match=r"no file for split 'test'.*test\.jsonl.*validation\.jsonl"):
        load("csqa", path=tmp_path)


def test_unknown_split_and_wrong_extension(tmp_path):
    with pytest.raises(UserError, match="no split 'validation'"):
        tasks.get("gsm8k").load("validation", FIXTURES / "gsm8k")
    bad = tmp_path / "data.csv"
    bad.write_text("question,answer\n")
    with pytest.raises(UserError, match=r"must end in \.jsonl"):
        load("gsm8k", path=bad)


@pytest.mark.parametrize("name, field, value, match", [
    ("gsm8k", "answer", None, "field 'answer' is missing"),
    ("gsm8k", "question", 7, "field 'question' must be a string"),
    ("gsm8k", "answer", "no final line", "field 'answer' has no '#### <answer>' line"),
    ("csqa", "answerKey", "", "field 'answerKey' is missing or empty"),
    ("csqa", "answerKey", "F", "field 'answerKey' 'F' is not one of the choice labels ABCDE"),
    ("csqa", "choices", {"label": ["A", "B"], "text": ["x"]}, "field 'choices' must hold equal-length"),
    ("gpqa", "Incorrect Answer 2", None, "field 'Incorrect Answer 2' is missing"),
    ("hotpotqa", "context", [["Title only"]], r"field 'context' entry 0 must be \[title, \[sentences\]\]"),
    ("countdown", "nums", [3, "7"], "field 'nums' must be a list of at least 2 integers"),
    ("countdown", "target", True, "field 'target' must be an integer"),
    ("countdown", "prompt", [{"role": "robot", "content": "hi"}], "field 'prompt' message 0 has role 'robot'"),
    ("mbpp", "test_list", [], "field 'test_list' must be a list of at least 1"),
    ("amc23", "answer", [1], "field 'answer' must be a non-empty string or a number"),
])
def test_bad_row_names_file_row_and_field(tmp_path, name, field, value, match):
    source = FIXTURES / name
    if name == "hotpotqa":
        rows = json.loads((source / "hotpot_dev_distractor_v1.json").read_text())
    else:
        rows = read_jsonl(next(source.glob("*.jsonl")))
    if value is None:
        del rows[1][field]
    else:
        rows[1][field] = value
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))   # a JSON list: the bad row is element 2
    with pytest.raises(UserError, match=re.escape(str(path)) + " row 2: " + match):
        load(name, path=path)


def test_jsonl_row_number_is_the_line_number(tmp_path):
    rows = read_jsonl(FIXTURES / "aime25/test.jsonl")
    del rows[2]["problem"]
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n" + json.dumps(rows[2]) + "\n")
    with pytest.raises(UserError, match=re.escape(f"{path} row 4: field 'problem' is missing")):
        load("aime25", path=path)
    path.write_text(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(UserError, match=re.escape(f"{path} row 2: invalid JSON")):
        load("aime25", path=path)
    path.write_text("[1, 2]\n")
    with pytest.raises(UserError, match="row 1: expected a JSON object"):
        load("aime25", path=path)


def test_duplicate_ids_are_rejected(tmp_path):
    rows = read_jsonl(FIXTURES / "aime25/test.jsonl")
    rows[2]["id"] = rows[0]["id"]
    path = write_jsonl(tmp_path / "test.jsonl", rows)
    with pytest.raises(UserError, match=r"row 3: duplicate problem id '0' \(also row 1\)"):
        load("aime25", path=path)


def test_unreachable_hub_names_the_dataset_and_the_local_option(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match=r"openai/gsm8k \(config 'main'\) split 'test'.*hub.*data_path.*--data-dir"):
        tasks.get("gsm8k").load("test")


def test_sources_cover_every_task():
    assert set(paper.SOURCES) == set(ALL_TASKS)
    assert paper.SOURCES["gpqa"].hub_split("test") == "train"
    assert paper.SOURCES["csqa"].hub_split("test") == "validation"
    assert paper.SOURCES["hotpotqa"].hub_split("test") == "validation"


def test_export_split_writes_the_layout_the_loader_reads(tmp_path):
    path, n = paper.export_split("hotpotqa", "test", tmp_path, data_path=FIXTURES / "hotpotqa")
    assert (path, n) == (tmp_path / "hotpotqa" / "test.jsonl", 3)
    exported = load("hotpotqa", path=tmp_path / "hotpotqa")
    assert [(p.id, p.messages, p.gold) for p in exported] == [(p.id, p.messages, p.gold) for p in load("hotpotqa")]
    with pytest.raises(UserError, match="no paper dataset named 'demo-add'"):
        paper.export_split("demo-add", "test", tmp_path)
    bad = tmp_path / "bad.jsonl"
    write_jsonl(bad, [{"question": "q"}])
    with pytest.raises(UserError, match="row 1: field 'answer' is missing"):
        paper.export_split("gsm8k", "test", tmp_path / "out", data_path=bad)
    assert not (tmp_path / "out" / "gsm8k" / "test.jsonl").exists()


def test_importing_the_task_module_loads_no_heavy_library():
    import subprocess
    import sys

    code = ("import sys, esreason.tasks.paper; "
            "print([m for m in ('datasets', 'pyarrow', 'torch', 'esreason.verifiers.math') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
