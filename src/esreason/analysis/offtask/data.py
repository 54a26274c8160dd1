"""The off-task set: rows of (context tokens, scored tokens), built once per experiment and kept.

Three sources (:class:`~esreason.analysis.offtask.settings.OfftaskSettings`):

- ``task``: the test prompts of a task no method trains on, rendered as the evaluation renders them
  and tokenised without special tokens (as the sampler does); the base model samples one response
  per prompt (``temperature``, ``seed``, at most ``max_tokens``). The scored tokens are the response
  *and* the stop token when the model stopped, because choosing to stop is part of the base
  model's distribution over responses.
- ``file``: JSONL ``{"text"}`` / ``{"prompt", "response"}`` lines or a ``.txt`` file (one text per
  non-empty line).
- ``dataset``: a hub dataset's text column (``datasets.load_dataset``, imported only here).

A text is tokenised with special tokens; its first token is the context, the next ``max_tokens``
are scored. Rows with nothing to score are skipped; no row at all is an error.

Stored as ``EXP/offtask/set.jsonl`` (one row per line: id, prompt_ids, response_ids) beside
``set.json`` (the settings, the row and token counts, the file's sha256): every method is scored on
the same tokens, and a rerun with the same settings reuses them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from esreason.analysis.offtask.settings import OfftaskSettings
from esreason.errors import UserError

SET_FILE, SET_META = "set.jsonl", "set.json"


@dataclass(frozen=True)
class Row:
    """One scored sequence: ``prompt_ids`` (context, >= 1 token) and ``response_ids`` (scored tokens)."""

    id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]


def _text_rows(texts: Iterator[tuple[str, str, str | None]], tokenizer: Any, s: OfftaskSettings) -> list[Row]:
    """Rows from (id, text, response or None) items; the first ``limit`` rows with something to score."""
    rows: list[Row] = []
    for rid, text, response in texts:
        if response is None:
            ids = tokenizer(text, add_special_tokens=True)["input_ids"]
            prompt, scored = ids[:1], ids[1:1 + s.max_tokens]
        else:
            prompt = tokenizer(text, add_special_tokens=True)["input_ids"]
            scored = tokenizer(response, add_special_tokens=False)["input_ids"][:s.max_tokens]
        if prompt and scored:
            rows.append(Row(rid, tuple(prompt), tuple(scored)))
        if len(rows) == s.limit:
            break
    return rows


def _file_texts(path: Path) -> Iterator[tuple[str, str, str | None]]:
    if path.suffix != ".jsonl":
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if line.strip():
                yield f"line{i}", line, None
        return
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{i}: not JSON ({exc.msg})") from None
        if isinstance(obj, dict) and isinstance(obj.get("text"), str):
            if obj["text"].strip():
                yield str(obj.get("id", f"line{i}")), obj["text"], None
        elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str) and isinstance(obj.get("response"), str):
            yield str(obj.get("id", f"line{i}")), obj["prompt"], obj["response"]
        else:
            raise UserError(f"{path}:{i}: expected an object with 'text', or 'prompt' and 'response' strings")


def _dataset_texts(s: OfftaskSettings) -> Iterator[tuple[str, str, str | None]]:
    try:
        import datasets
    except ImportError:
        raise UserError("config key 'analysis.offtask.dataset': needs the 'datasets' package "
                        "(pip install datasets), or name a local file with analysis.offtask.file") from None
    try:
        ds = datasets.load_dataset(s.dataset, s.dataset_config, split=s.split)
    except Exception as exc:  # noqa: BLE001 -- the hub's errors vary by version; reported in one line
        raise UserError(f"config key 'analysis.offtask.dataset': cannot load {s.dataset!r} "
                        f"({s.dataset_config}, split {s.split}): {str(exc).splitlines()[0] if str(exc) else exc}"
                        ) from None
    if s.column not in ds.column_names:
        raise UserError(f"config key 'analysis.offtask.column': {s.dataset!r} has no column {s.column!r} "
                        f"(columns: {', '.join(ds.column_names)})")
    for i, text in enumerate(ds[s.column]):
        if isinstance(text, str) and text.strip():
            yield f"{s.split}-{i}", text, None


def _sampled_rows(s: OfftaskSettings, model: Any, tokenizer: Any) -> list[Row]:
    """The base model's responses to the task's first ``limit`` test prompts."""
    from esreason import tasks
    from esreason.backends.base import SamplingParams
    from esreason.backends.sampling import Sampler

    problems = tasks.get(s.task).load(s.split, None, s.limit)
    prompts = [tasks.problem_prompt(tokenizer, p) for p in problems]
    ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    gen = Sampler(model, tokenizer, batch_size=s.batch_size).generate_ids(
        ids, SamplingParams(max_new_tokens=s.max_tokens, temperature=s.temperature, seed=s.seed))
    rows = []
    for p, prompt, toks, stop in zip(problems, ids, gen.token_ids, gen.stop_ids or [None] * len(ids)):
        scored = list(toks) + ([int(stop)] if stop is not None else [])
        if scored:
            rows.append(Row(p.id, tuple(prompt), tuple(scored)))
    return rows


def build_rows(s: OfftaskSettings, model: Any, tokenizer: Any) -> list[Row]:
    """The off-task rows of ``s`` (``model`` samples them for a ``task`` source)."""
    if s.source == "task":
        rows = _sampled_rows(s, model, tokenizer)
    elif s.source == "file":
        rows = _text_rows(_file_texts(Path(str(s.file))), tokenizer, s)
    else:
        rows = _text_rows(_dataset_texts(s), tokenizer, s)
    if not rows:
        raise UserError(f"analysis.offtask: the {s.source} {getattr(s, s.source)!r} gave no row with a token to score")
    return rows


def settings_record(s: OfftaskSettings, model: str) -> dict[str, Any]:
    """What the set depends on (compared on a rerun)."""
    return {"base_model": model, **asdict(s)}


def save_set(out: Path, rows: list[Row], record: dict[str, Any]) -> dict[str, Any]:
    """Write ``set.jsonl`` and ``set.json`` (atomically) into ``out``; returns the meta record."""
    from esreason.io.atomic import atomic_write_json, atomic_write_text

    text = "".join(json.dumps({"id": r.id, "prompt_ids": list(r.prompt_ids), "response_ids": list(r.response_ids)})
                   + "\n" for r in rows)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / SET_FILE, text)
    meta = {"kind": "esreason-offtask-set", "version": 1, "settings": record, "rows": len(rows),
            "tokens": sum(len(r.response_ids) for r in rows), "sha256": hashlib.sha256(text.encode()).hexdigest()}
    atomic_write_json(out / SET_META, meta)
    return meta


def load_set(out: Path, record: dict[str, Any]) -> tuple[list[Row], dict[str, Any]] | None:
    """The stored set when it was built from ``record`` and is intact; None otherwise."""
    meta_path, path = out / SET_META, out / SET_FILE
    if not (meta_path.is_file() and path.is_file()):
        return None
    try:
        meta = json.loads(meta_path.read_text())
        text = path.read_text()
    except (OSError, ValueError):
        return None
    if meta.get("settings") != json.loads(json.dumps(record)) or \
            hashlib.sha256(text.encode()).hexdigest() != meta.get("sha256"):
        return None
    rows = [json.loads(line) for line in text.splitlines()]
    return [Row(r["id"], tuple(r["prompt_ids"]), tuple(r["response_ids"])) for r in rows], meta
