"""HotpotQA (distractor setting, validation set) — multi-hop open QA, held-out suite.

Source (paper table "Licenses"): the official HotpotQA release,
``hotpot_dev_distractor_v1.json``: a JSON list of objects ``{"_id", "question",
"answer", "context": [[title, [sentence, ...]], ...], "supporting_facts": [[title,
sent_id], ...], "type", "level"}``. The Hugging Face ``hotpot_qa`` ``distractor``
layout is accepted too: ``id`` and ``context = {"title": [...], "sentences": [[...],
...]}`` (``supporting_facts = {"title": [...], "sent_id": [...]}``).

Prompt: the paper's "Prompt for Open Question Answering"; the user message is
(:func:`esreason.tasks.prompts.format_context`)::

    Context:
    <title 1>: <sentences of paragraph 1, joined by spaces>

    <title 2>: ...

    Question: <question>

with the ten paragraphs (two gold, eight distractors) in the release's order. Gold:
the answer string for the ``hotpotqa`` verifier (official normalisation, exact match).
"""

from __future__ import annotations

from typing import Any, Mapping

from esreason.tasks.base import Problem
from esreason.tasks.prompts import open_qa_messages
from esreason.tasks.sources import RowReader


def _sentences_ok(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and all(isinstance(s, str) for s in value)


def context_paragraphs(reader: RowReader) -> list[tuple[str, list[str]]]:
    """``[(title, sentences), ...]`` from the official list layout or the HF struct layout."""
    context = reader.raw("context")
    pairs: list[tuple[Any, Any]]
    if isinstance(context, Mapping):
        titles, sentences = context.get("title"), context.get("sentences")
        if not isinstance(titles, (list, tuple)) or not isinstance(sentences, (list, tuple)) \
                or len(titles) != len(sentences):
            raise reader.error("context", "must hold equal-length 'title' and 'sentences' lists")
        pairs = list(zip(titles, sentences))
    elif isinstance(context, (list, tuple)):
        pairs = []
        for i, entry in enumerate(context):
            if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                raise reader.error("context", f"entry {i} must be [title, [sentences]]")
            pairs.append((entry[0], entry[1]))
    else:
        raise reader.error("context", f"must be a list of [title, [sentences]] or "
                                      f"{{'title', 'sentences'}}, got {type(context).__name__}")
    if not pairs:
        raise reader.error("context", "is empty")
    out = []
    for i, (title, sentences) in enumerate(pairs):
        if not isinstance(title, str) or not title.strip():
            raise reader.error("context", f"paragraph {i} has no title")
        if not _sentences_ok(sentences):
            raise reader.error("context", f"paragraph {i} ({title!r}) must hold a list of sentence strings")
        out.append((title, list(sentences)))
    return out


def hotpotqa(reader: RowReader, task: str, split: str) -> Problem:
    question = reader.text("question")
    answer = reader.text("answer")
    paragraphs = context_paragraphs(reader)
    id_key = "_id" if reader.has("_id") else "id"
    pid = reader.row_id(id_key, f"{task}-{split}-{reader.row.index}")
    meta = {k: reader.row.data[k] for k in ("type", "level") if isinstance(reader.row.data.get(k), str)}
    return Problem(task=task, id=pid, messages=open_qa_messages(paragraphs, question), gold=answer.strip(),
                   meta=meta)
