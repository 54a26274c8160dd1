"""Multiple-choice benchmarks: CommonsenseQA and GPQA Diamond (held-out suites).

Both use the paper's "Prompt for Multiple-Choice Reasoning"; the user message is the
question, a blank line, and one ``(L) text`` line per choice
(:func:`esreason.tasks.prompts.format_choices`). The gold is the ``choice``
verifier's mapping ``{"answer": letter, "choices": valid letters}``.

CommonsenseQA (``tau/commonsense_qa``, validation split — the test split has no
labels): ``id``, ``question``, ``question_concept``, ``choices`` = ``{"label": [...],
"text": [...]}``, ``answerKey``. The labels (A–E) are shown as given. The original
release's JSONL layout (``question`` = ``{"stem", "choices": [{"label", "text"}],
"question_concept"}``) is accepted too.

GPQA (``Idavidrein/gpqa``, config ``gpqa_diamond``; ``train`` is the only split on
the hub): ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``, ``Record ID``.
The source always stores the correct answer first, so the four answers are shuffled
per question, deterministically: ``random.Random(seed)`` with ``seed`` = the first 8
bytes of ``sha256("esreason/gpqa/" + Question)``. The order depends only on the
question text (not on row order, file format or id), so a local copy and the hub
give the same prompts. ``meta["choice_order"]`` lists the source column shown at
A, B, C, D; the gold letter is where ``Correct Answer`` landed.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any, Mapping

from esreason.tasks.base import Problem
from esreason.tasks.prompts import choice_messages
from esreason.tasks.sources import RowReader

GPQA_LETTERS = "ABCD"
GPQA_COLUMNS = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


# --------------------------------------------------------------------------- CommonsenseQA


def _csqa_choices(reader: RowReader, choices: Any, key: str) -> list[tuple[str, str]]:
    """(label, text) pairs from the HF struct-of-lists or the original list-of-objects layout."""
    if isinstance(choices, Mapping):
        labels, texts = choices.get("label"), choices.get("text")
        if not isinstance(labels, (list, tuple)) or not isinstance(texts, (list, tuple)) or len(labels) != len(texts):
            raise reader.error(key, "must hold equal-length 'label' and 'text' lists")
        pairs = list(zip(labels, texts))
    elif isinstance(choices, (list, tuple)) and all(isinstance(c, Mapping) for c in choices):
        pairs = [(c.get("label"), c.get("text")) for c in choices]
    else:
        raise reader.error(key, f"must be {{'label': [...], 'text': [...]}} or a list of "
                                f"{{'label', 'text'}} objects, got {type(choices).__name__}")
    if len(pairs) < 2:
        raise reader.error(key, f"must hold at least 2 choices, got {len(pairs)}")
    out = []
    for label, text in pairs:
        if not isinstance(label, str) or len(label.strip()) != 1 or not label.strip().isalpha():
            raise reader.error(key, f"has a label that is not one letter: {label!r}")
        if not isinstance(text, str) or not text.strip():
            raise reader.error(key, f"has an empty or non-string text for label {label!r}")
        out.append((label.strip().upper(), text.strip()))
    letters = [label for label, _ in out]
    if len(set(letters)) != len(letters):
        raise reader.error(key, f"repeats a label: {letters}")
    return out


def csqa(reader: RowReader, task: str, split: str) -> Problem:
    question = reader.raw("question")
    if isinstance(question, Mapping):  # original release: question = {stem, choices, question_concept}
        stem = question.get("stem")
        if not isinstance(stem, str) or not stem.strip():
            raise reader.error("question.stem", "is missing or empty")
        choices = _csqa_choices(reader, question.get("choices"), "question.choices")
        concept = question.get("question_concept")
    else:
        stem = reader.text("question")
        choices = _csqa_choices(reader, reader.raw("choices"), "choices")
        concept = reader.row.data.get("question_concept")
    key = reader.raw("answerKey")
    if not isinstance(key, str) or not key.strip():
        raise reader.error("answerKey", "is missing or empty (the CommonsenseQA test split is unlabelled; "
                                        "use the validation split)")
    letters = "".join(label for label, _ in choices)
    if key.strip().upper() not in letters:
        raise reader.error("answerKey", f"{key!r} is not one of the choice labels {letters}")
    pid = reader.row_id("id", f"{task}-{split}-{reader.row.index}")
    meta = {"question_concept": concept} if isinstance(concept, str) else {}
    return Problem(task=task, id=pid, messages=choice_messages(stem, choices),
                   gold={"answer": key.strip().upper(), "choices": letters}, meta=meta)


# --------------------------------------------------------------------------- GPQA


def gpqa_seed(question: str) -> int:
    """The shuffle seed of one GPQA question (depends on its text only)."""
    return int.from_bytes(hashlib.sha256(("esreason/gpqa/" + question).encode("utf-8")).digest()[:8], "big")


def gpqa_order(question: str) -> list[int]:
    """Positions of ``GPQA_COLUMNS`` shown at A, B, C, D (a permutation of 0..3)."""
    order = list(range(len(GPQA_COLUMNS)))
    random.Random(gpqa_seed(question)).shuffle(order)
    return order


def gpqa(reader: RowReader, task: str, split: str) -> Problem:
    question = reader.text("Question")
    answers = [reader.text(col).strip() for col in GPQA_COLUMNS]
    order = gpqa_order(question)
    choices = [(GPQA_LETTERS[pos], answers[src]) for pos, src in enumerate(order)]
    gold_letter = GPQA_LETTERS[order.index(0)]
    pid = reader.row_id("Record ID", f"{task}-{split}-{reader.row.index}")
    meta: dict[str, Any] = {"choice_order": [GPQA_COLUMNS[i] for i in order]}
    for key in ("Subdomain", "High-level domain"):
        if isinstance(reader.row.data.get(key), str):
            meta[key] = reader.row.data[key]
    return Problem(task=task, id=pid, messages=choice_messages(question, choices),
                   gold={"answer": gold_letter, "choices": GPQA_LETTERS}, meta=meta)
