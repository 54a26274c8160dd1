"""The paper's four prompt templates (appendix "Prompt Templates"), verbatim.

Each template is a system message plus a user message; :func:`esreason.tasks.base.render_prompt`
renders them with the model's own chat template ("The following messages are
rendered with each model's official chat template"). The LaTeX source breaks the
system texts over several lines; those are soft line breaks, so the sentences are
joined with single spaces here. The MBPP user message has a hard break (``\\\\``)
between ``Task:`` and ``Test Cases:``, so it is a newline.

Where the paper leaves the user text open ("{Question and labeled choices}",
"{Context and question}") this module fixes the layout; docs/tasks.md shows it.
Countdown has no template here: the paper uses "the role/content messages
distributed with the dataset" (see :mod:`esreason.tasks.countdown`).
"""

from __future__ import annotations

from typing import Sequence

Message = dict[str, str]

MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."

CHOICE_SYSTEM = ("Please reason step by step to solve the following multiple-choice question. "
                 "Put your final choice letter inside \\boxed{}, e.g., \\boxed{C}.")

OPEN_QA_SYSTEM = ("Answer the question using the provided context. "
                  "Keep the final answer short, and put it inside <answer> </answer> tags.")

MBPP_SYSTEM = ("You are a Python programming assistant. "
               "Write clean, correct Python code that passes the given tests. "
               "The function name and signature must match exactly as specified in the test cases. "
               "The final code block must not include the tests; do not include the tests in your answer. "
               "Do not include explanations or text outside the code block. "
               "Output exactly one Python markdown code block containing only the final solution code.")


def _chat(system: str, user: str) -> tuple[Message, ...]:
    return ({"role": "system", "content": system}, {"role": "user", "content": user})


def math_messages(question: str) -> tuple[Message, ...]:
    """Prompt for Mathematical Reasoning: the question is the whole user message."""
    return _chat(MATH_SYSTEM, question.strip())


def format_choices(question: str, choices: Sequence[tuple[str, str]]) -> str:
    """``question``, a blank line, then one ``(L) text`` line per choice."""
    lines = [f"({label}) {text.strip()}" for label, text in choices]
    return question.strip() + "\n\n" + "\n".join(lines)


def choice_messages(question: str, choices: Sequence[tuple[str, str]]) -> tuple[Message, ...]:
    """Prompt for Multiple-Choice Reasoning with the labelled choices under the question."""
    return _chat(CHOICE_SYSTEM, format_choices(question, choices))


def format_context(paragraphs: Sequence[tuple[str, Sequence[str]]], question: str) -> str:
    """``Context:``, one ``Title: sentences`` paragraph per context entry (blank line
    between paragraphs), then ``Question: ...``.

    Sentences are stripped and joined with single spaces (HotpotQA stores most
    sentences with their leading space; stripping makes both conventions equal).
    """
    blocks = []
    for title, sentences in paragraphs:
        text = " ".join(s.strip() for s in sentences if s.strip())
        blocks.append(f"{title.strip()}: {text}")
    return "Context:\n" + "\n\n".join(blocks) + f"\n\nQuestion: {question.strip()}"


def open_qa_messages(paragraphs: Sequence[tuple[str, Sequence[str]]], question: str) -> tuple[Message, ...]:
    """Prompt for Open Question Answering: context paragraphs, then the question."""
    return _chat(OPEN_QA_SYSTEM, format_context(paragraphs, question))


def mbpp_messages(task: str, public_tests: Sequence[str]) -> tuple[Message, ...]:
    """Prompt for MBPP Code Generation: ``Task: ...`` newline ``Test Cases: ...`` (one test per line)."""
    tests = "\n".join(t.strip() for t in public_tests)
    return _chat(MBPP_SYSTEM, f"Task: {task.strip()}\nTest Cases: {tests}")
