"""SST-2 for the supervised control of the estimator diagnostic (paper appendix "ES–ZO
Estimator Equivalence", objective "SST-2 supervised CE").

Source: GLUE SST-2 as distributed on the Hugging Face hub (``stanfordnlp/sst2``; fields
``sentence``, ``label`` with 0 = negative, 1 = positive), loaded with ``datasets``, or a
local JSONL/JSON/Parquet file (or a directory holding ``<split>.jsonl`` ...) with the same
fields, through :mod:`esreason.tasks.sources` (row-numbered errors, hub errors that say how
to pass a local copy).

Prompt and label verbaliser (MeZO's prompt-based SST-2, Malladi et al. 2023, which the
paper cites for ZO on SST-2):

    prompt  = "<sentence> It was"
    label 0 -> " terrible",  label 1 -> " great"

The paper does not give its template; this is our documented choice. The prompt is plain
text (no chat template); the tokenizer adds its BOS token if it has one. The objective is
the two-way classification cross-entropy over the verbaliser words (see
:func:`esreason.analysis.estimator.objectives.supervised_ce`). The GLUE test split has hidden labels
(-1) and is rejected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from esreason.analysis.estimator.objectives import SupervisedExample
from esreason.errors import UserError
from esreason.tasks.sources import RowReader, Source, load_rows

SST2_SOURCE = Source(hub_id="stanfordnlp/sst2", config=None,
                     splits={"train": "train", "validation": "validation"})
TEMPLATE = "{sentence} It was"
VERBALISER = (" terrible", " great")  # index = label: 0 negative, 1 positive


def sst2_examples(tokenizer: Any, split: str = "validation", data_path: str | Path | None = None,
                  limit: int | None = None) -> list[SupervisedExample]:
    """The first ``limit`` labelled SST-2 rows of ``split`` as verbalised supervised examples."""
    rows = load_rows("sst2", split, Path(data_path) if data_path is not None else None, SST2_SOURCE)
    if limit is not None:
        rows = rows[:limit]
    if not rows:
        raise UserError(f"SST-2 split {split!r} is empty" + (f" ({data_path})" if data_path else ""))
    candidates = tuple(tuple(tokenizer(v, add_special_tokens=False)["input_ids"]) for v in VERBALISER)
    if any(not c for c in candidates):
        raise UserError("the tokenizer maps an SST-2 verbaliser word to no tokens")
    out = []
    for row in rows:
        r = RowReader(row)
        label = r.integer("label")
        if label not in (0, 1):
            raise r.error("label", f"must be 0 (negative) or 1 (positive), got {label} "
                                   "(the GLUE test split has no labels; use train or validation)")
        prompt = TEMPLATE.format(sentence=r.text("sentence").strip())
        ids = tuple(tokenizer(prompt, add_special_tokens=True)["input_ids"])
        out.append(SupervisedExample(prompt_ids=ids, candidates=candidates, label=label))
    return out


__all__ = ["SST2_SOURCE", "TEMPLATE", "VERBALISER", "sst2_examples"]
