"""The paper's benchmark tasks, registered by name (imported by the task registry).

Paper, appendix "Datasets and Setting Rationale": Easy setting — GSM8K train/test,
held-out CommonsenseQA, HotpotQA, Countdown, GPQA Diamond, MBPP; Hard setting —
DeepScaleR Preview (training), AIME 2024, AIME 2025, AMC 2023, MATH-500, held-out
GPQA, MBPP, CommonsenseQA, Countdown. Every task evaluates on its ``test`` split;
``test`` reads the split the paper evaluates on (CommonsenseQA ``validation``,
HotpotQA distractor ``validation``, GPQA ``train`` — the only one published).

A loader reads the rows (:mod:`esreason.tasks.sources`: local file/directory or the
hub), converts each with its family's converter (which validates every field) and
checks that ids are unique. Verifiers are referenced by name only; vote keys import
their normalisers lazily so importing this module stays cheap. :func:`export_split`
copies a split (from the hub or a local file) to the ``<dir>/<task>/<split>.jsonl``
layout the loaders read. Prompts, sources and layouts: docs/tasks.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Hashable

from esreason.errors import UserError
from esreason.tasks import choice_sets, countdown, hotpotqa, math_sets, mbpp
from esreason.tasks.base import Problem, Task
from esreason.tasks.registry import register
from esreason.tasks.sources import RawRow, RowReader, Source, check_unique_ids, load_rows

Converter = Callable[[RowReader, str, str], Problem]

# --------------------------------------------------------------------------- vote keys


def math_vote_key(answer: str | None) -> Hashable | None:
    """Maj@K key for math answers: :func:`esreason.verifiers.math.normalize_math_answer`."""
    if answer is None or not answer.strip():
        return None
    from esreason.verifiers.math import normalize_math_answer

    return normalize_math_answer(answer)


def math_equivalent(a: str, b: str) -> bool:
    """Grouping of math answers for voting: :func:`esreason.verifiers.math.math_equivalent`."""
    from esreason.verifiers.math import math_equivalent as equivalent

    return equivalent(a, b)


def choice_vote_key(answer: str | None) -> Hashable | None:
    """Maj@K key for multiple choice: the upper-cased letter."""
    if answer is None or not answer.strip():
        return None
    return answer.strip().upper()


def hotpotqa_vote_key(answer: str | None) -> Hashable | None:
    """Maj@K key for HotpotQA: the official answer normalisation."""
    if answer is None:
        return None
    from esreason.verifiers.hotpotqa import normalize_answer

    key = normalize_answer(answer)
    return key or None


def identity_vote_key(answer: str | None) -> Hashable | None:
    """Countdown / MBPP: the evaluation harness groups these by verdict, not by this key."""
    return answer


# --------------------------------------------------------------------------- sources

SOURCES: dict[str, Source] = {
    "gsm8k": Source("openai/gsm8k", "main", {"train": "train", "test": "test"}),
    "math500": Source("HuggingFaceH4/MATH-500", None, {"test": "test"}),
    "aime24": Source("math-ai/aime24", None, {"test": "test"}),
    "aime25": Source("math-ai/aime25", None, {"test": "test"}),
    "amc23": Source("math-ai/amc23", None, {"test": "test"}),
    "deepscaler": Source("agentica-org/DeepScaleR-Preview-Dataset", None, {"train": "train"}),
    "csqa": Source("tau/commonsense_qa", None, {"train": "train", "test": "validation"}),
    "gpqa": Source("Idavidrein/gpqa", "gpqa_diamond", {"test": "train"},
                   note="gated dataset: accept its terms on huggingface.co/datasets/Idavidrein/gpqa and log in "
                        "with `hf auth login`"),
    "hotpotqa": Source("hotpotqa/hotpot_qa", "distractor", {"test": "validation"},
                       local_names={"test": ("hotpot_dev_distractor_v1.json",)}),
    "countdown": Source("HuggingFaceTB/Countdown-Task-GOLD", "test", {"test": "test"}),
    "mbpp": Source("google-research-datasets/mbpp", "sanitized", {"test": "test"}),
}


def read_problems(name: str, split: str, data_path: Path | None,
                  convert: Converter) -> tuple[list[RawRow], list[Problem]]:
    """Raw rows of ``split`` and their problems (each row validated, ids checked unique)."""
    rows = load_rows(name, split, data_path, SOURCES[name])
    problems = [convert(RowReader(row), name, split) for row in rows]
    check_unique_ids([(p.id, row) for p, row in zip(problems, rows)])
    return rows, problems


def make_loader(name: str, convert: Converter) -> Callable[[str, Path | None], list[Problem]]:
    """``loader(split, data_path)`` for task ``name`` (see :func:`read_problems`)."""

    def load(split: str, data_path: Path | None) -> list[Problem]:
        return read_problems(name, split, data_path, convert)[1]

    load.__name__ = f"load_{name}"
    return load


def export_split(name: str, split: str, out_dir: str | Path, data_path: str | Path | None = None) -> tuple[Path, int]:
    """Copy one split's raw rows to ``out_dir/<name>/<split>.jsonl`` — the layout the loaders read.

    Reads from the hub (``data_path`` None; run it on a machine with hub access) or from
    a local file/directory (e.g. the official HotpotQA JSON, a Parquet download).
    Every row is converted once first, so a source that would fail to load fails here.
    Returns the written path and the number of rows.
    """
    from esreason.io.atomic import atomic_write_text

    if name not in SOURCES:
        raise UserError(f"no paper dataset named {name!r}; known: {', '.join(sorted(SOURCES))}")
    rows, _ = read_problems(name, split, Path(data_path) if data_path is not None else None, _CONVERTERS[name])
    target = Path(out_dir) / name / f"{split}.jsonl"
    target.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(target, "".join(json.dumps(dict(r.data), ensure_ascii=False) + "\n" for r in rows))
    return target, len(rows)


# --------------------------------------------------------------------------- registration

_MATH = dict(verifier="math", vote_key=math_vote_key, equivalent=math_equivalent)

_TASKS: tuple[tuple[str, Converter, dict, str], ...] = (
    ("gsm8k", math_sets.gsm8k, _MATH, "GSM8K grade-school math word problems (openai/gsm8k, main)"),
    ("math500", math_sets.math500, _MATH, "MATH-500 competition math (HuggingFaceH4/MATH-500)"),
    ("aime24", math_sets.aime24, _MATH, "AIME 2024 (math-ai/aime24)"),
    ("aime25", math_sets.aime25, _MATH, "AIME 2025 (math-ai/aime25)"),
    ("amc23", math_sets.amc23, _MATH, "AMC 2023 (math-ai/amc23)"),
    ("deepscaler", math_sets.deepscaler, _MATH,
     "DeepScaleR Preview math RL training data (agentica-org/DeepScaleR-Preview-Dataset)"),
    ("csqa", choice_sets.csqa, dict(verifier="choice", vote_key=choice_vote_key),
     "CommonsenseQA, 5-way multiple choice (tau/commonsense_qa validation)"),
    ("gpqa", choice_sets.gpqa, dict(verifier="choice", vote_key=choice_vote_key),
     "GPQA Diamond, 4-way science multiple choice, choices shuffled per question (Idavidrein/gpqa)"),
    ("hotpotqa", hotpotqa.hotpotqa, dict(verifier="hotpotqa", vote_key=hotpotqa_vote_key),
     "HotpotQA distractor validation, multi-hop QA over 10 paragraphs (official release)"),
    ("countdown", countdown.countdown, dict(verifier="countdown", vote_key=identity_vote_key),
     "Countdown arithmetic puzzles with the dataset's own messages (HuggingFaceTB/Countdown-Task-GOLD test)"),
    ("mbpp", mbpp.mbpp, dict(verifier="mbpp", vote_key=identity_vote_key),
     "MBPP sanitized test, Python functions checked by running their tests (google-research-datasets/mbpp)"),
)

_CONVERTERS: dict[str, Converter] = {name: convert for name, convert, _, _ in _TASKS}

for _name, _convert, _kw, _desc in _TASKS:
    register(Task(name=_name, loader=make_loader(_name, _convert), splits=tuple(SOURCES[_name].splits),
                  description=_desc, **_kw))
