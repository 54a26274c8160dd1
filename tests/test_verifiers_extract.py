"""Answer extraction: last \\boxed{}, last <answer> block, last python fence, wrappers."""

from __future__ import annotations

import time

import pytest
from bounds import TERMINATES_WITHIN_S

from esreason.verifiers.extract import (code_blocks, last_answer_block, last_boxed, last_python_block,
                                        strip_latex_wrappers)


@pytest.mark.parametrize("text, expected", [
    ("The answer is \\boxed{42}.", "42"),
    ("first \\boxed{1}, on reflection \\boxed{2}", "2"),                 # two boxes: the last wins
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),                          # nested braces
    ("\\boxed{\\left\\{1,2\\right\\}}", "\\left\\{1,2\\right\\}"),      # escaped braces do not count
    ("\\boxed{\\text{(B)}}", "\\text{(B)}"),
    ("\\boxed{\\boxed{3}}", "\\boxed{3}"),                                # outer box closes last
    ("\\fbox{7}", "7"),
    ("so \\boxed 7$.", "7"),                                              # brace-less form
    ("\\boxed {5}", "5"),
    ("\\boxed{}", ""),
    ("the answer is 42", None),                                           # right answer, no box
    ("\\boxed{12", None),                                                 # truncated box
    ("\\boxedx{3}", None),                                                # another command
    ("\\boxed{1} then \\boxed{2", "1"),                                   # unclosed last box ignored
    ("escaped \\\\boxed{4}", "4"),                                        # doubled backslash still a box
])
def test_last_boxed(text, expected):
    assert last_boxed(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("<answer> Paris </answer>", " Paris "),
    ("<answer>a</answer> wait <answer>b</answer>", "b"),
    ("<ANSWER>x</Answer>", "x"),
    ("<answer> a <answer> b </answer>", " b "),
    ("<answer>unclosed", None),
    ("no tags", None),
    ("</answer> only", None),
])
def test_last_answer_block(text, expected):
    assert last_answer_block(text) == expected


def test_code_blocks_pair_in_order_and_drop_unclosed():
    text = "```python\nA\n```\ntext\n```bash\nls\n```\n```py\nB\n```\n```python\ntruncated"
    assert code_blocks(text) == [("python", "A\n"), ("bash", "ls\n"), ("py", "B\n")]
    assert last_python_block(text) == "B\n"


@pytest.mark.parametrize("text, expected", [
    ("```python\ndef f(): pass\n```", "def f(): pass\n"),
    ("```\nx = 1\n```", "x = 1\n"),                                     # unlabelled fence accepted
    ("```Python3\nx = 2\n```", "x = 2\n"),
    ("```python\nx = 1\n```\n```python\nx = 3\n```", "x = 3\n"),       # several: the last one
    ("```bash\nrm -rf /\n```", None),                                   # other language ignored
    ("def f(): pass", None),
])
def test_last_python_block(text, expected):
    assert last_python_block(text) == expected


def test_strip_latex_wrappers_nested():
    assert strip_latex_wrappers("\\text{\\textbf{B}} and \\mathrm{cm}") == "B and cm"
    assert strip_latex_wrappers("\\text{unclosed") == "\\text{unclosed"


def test_extractors_are_linear_on_adversarial_text():
    hostile = ["\\boxed{" * 50_000, "```" * 50_000 + "x", "<answer>" * 50_000 + "</answer>",
               "{" * 100_000 + "\\boxed{1}"]
    start = time.perf_counter()
    for text in hostile:
        last_boxed(text)
        last_python_block(text)
        last_answer_block(text)
    assert time.perf_counter() - start < TERMINATES_WITHIN_S  # quadratic scans of 350k characters never end
