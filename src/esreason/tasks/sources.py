"""Where the paper's benchmark rows come from: local files or the Hugging Face hub.

Paper, appendix "Datasets and Setting Rationale" (tables "Datasets and splits" and
"Licenses") names one distributed source per benchmark. :class:`Source` records it
(hub id, config, and which hub split each of our split names reads), and
:func:`load_rows` returns the raw rows, from

1. ``data_path`` when given (see :func:`resolve_local` for the lookup):
   a ``.jsonl``, ``.json`` or ``.parquet`` file, or a directory holding one; or
2. ``datasets.load_dataset(hub_id, config, split=...)`` otherwise (imported lazily).
   When the hub cannot be reached (offline machine, gated dataset without a
   token) the error is a :class:`~esreason.errors.UserError` naming the dataset
   and saying how to pass a local copy instead.

Every row then goes through :class:`RowReader`, whose accessors raise a
``UserError`` naming the file (or hub dataset), the row number and the field when
a field is missing or has the wrong type. Row numbers are 1-based: the line
number in a JSONL file, the element number in a JSON list or Parquet table, the
row number in a hub split.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from esreason.errors import UserError

#: File types read from local paths, in lookup order within a directory.
EXTENSIONS = (".jsonl", ".json", ".parquet")


@dataclass(frozen=True)
class Source:
    """One benchmark's distributed source (paper table "Licenses").

    hub_id/config: ``datasets.load_dataset(hub_id, config, ...)`` arguments.
    splits: our split name -> the hub split it reads (e.g. GPQA ``test`` -> ``train``,
        the only split ``Idavidrein/gpqa`` publishes).
    local_names: extra file names (without directory) accepted inside a data
        directory for a split, e.g. the official HotpotQA release file.
    note: appended to the hub error message (e.g. "gated: accept the terms ...").
    """

    hub_id: str
    config: str | None
    splits: Mapping[str, str]
    local_names: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    note: str = ""

    def hub_split(self, split: str) -> str:
        if split not in self.splits:
            raise UserError(f"dataset {self.hub_id} has no split {split!r}; known: {', '.join(self.splits)}")
        return self.splits[split]


@dataclass(frozen=True)
class RawRow:
    """One source row with where it came from (for error messages)."""

    origin: str   # file path or "hub:<id>[<config>]/<split>"
    number: int   # 1-based row number (line number for JSONL)
    index: int    # 0-based position among the rows actually read
    data: Mapping[str, Any]


# --------------------------------------------------------------------------- local files


def resolve_local(task: str, split: str, data_path: Path, source: Source) -> Path:
    """The file to read for ``split`` from a user-given ``data_path``.

    - ``data_path`` is a file: it is read as the requested split, whatever its name.
    - ``data_path`` is a directory: the first existing of ``<split>.jsonl``,
      ``<split>.json``, ``<split>.parquet``, then the same three names for the hub
      split name (``validation.jsonl`` for CommonsenseQA's ``test``), then the
      source's extra names (``hotpot_dev_distractor_v1.json`` for HotpotQA).
    """
    if not data_path.exists():
        raise UserError(f"task {task!r}: data path not found: {data_path}")
    if data_path.is_file():
        if data_path.suffix not in EXTENSIONS:
            raise UserError(f"task {task!r}: data file {data_path} must end in "
                            f"{', '.join(EXTENSIONS)}")
        return data_path
    names = [split + ext for ext in EXTENSIONS]
    hub_split = source.splits.get(split)
    if hub_split is not None and hub_split != split:
        names += [hub_split + ext for ext in EXTENSIONS]
    names += list(source.local_names.get(split, ()))
    for name in names:
        candidate = data_path / name
        if candidate.is_file():
            return candidate
    raise UserError(f"task {task!r}: no file for split {split!r} in {data_path} (looked for {', '.join(names)})")


def _jsonl_rows(path: Path, text: str) -> Iterator[tuple[int, Any]]:
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield lineno, json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path} row {lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None


def read_file(path: Path) -> list[RawRow]:
    """Rows of a JSONL, JSON (a list of objects, or JSON lines) or Parquet file."""
    origin = str(path)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            records = pq.read_table(path).to_pylist()
        except (OSError, pa.ArrowException) as exc:
            raise UserError(f"{path}: cannot read Parquet ({str(exc).splitlines()[0]})") from None
        numbered: list[tuple[int, Any]] = list(enumerate(records, start=1))
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"{path}: cannot read ({exc})") from None
        if path.suffix == ".json":
            try:
                whole = json.loads(text)
            except json.JSONDecodeError:
                whole = None  # JSON lines saved as .json (datasets' to_json does this)
            if isinstance(whole, list):
                numbered = list(enumerate(whole, start=1))
            elif isinstance(whole, dict):
                numbered = [(1, whole)]
            else:
                numbered = list(_jsonl_rows(path, text))
        else:
            numbered = list(_jsonl_rows(path, text))
    rows = []
    for number, record in numbered:
        if not isinstance(record, dict):
            raise UserError(f"{origin} row {number}: expected a JSON object, got {type(record).__name__}")
        rows.append(RawRow(origin, number, len(rows), record))
    return rows


# --------------------------------------------------------------------------- hub


def hub_origin(source: Source, hub_split: str) -> str:
    config = f"[{source.config}]" if source.config else ""
    return f"hub:{source.hub_id}{config}/{hub_split}"


def read_hub(task: str, split: str, source: Source) -> list[RawRow]:
    """Rows of the hub split; UserError (naming the dataset) when the hub is unreachable."""
    hub_split = source.hub_split(split)
    what = f"{source.hub_id}" + (f" (config {source.config!r})" if source.config else "") + f" split {hub_split!r}"
    advice = (f"pass a local copy instead: the task's data option (training `data_path`, evaluation "
              f"`--data-dir D` with D/{task}/{split}.jsonl), see docs/tasks.md")
    try:
        import datasets
        from datasets.exceptions import DatasetsError
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError as exc:
        raise UserError(f"task {task!r}: loading {what} needs the `datasets` package ({exc}); {advice}") from None
    try:
        ds = datasets.load_dataset(source.hub_id, source.config, split=hub_split)
    except (ConnectionError, FileNotFoundError, DatasetsError, HfHubHTTPError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        note = f" ({source.note})" if source.note else ""
        raise UserError(f"task {task!r}: cannot load {what} from the Hugging Face hub: {first}{note}; "
                        f"{advice}") from None
    origin = hub_origin(source, hub_split)
    return [RawRow(origin, i + 1, i, dict(r)) for i, r in enumerate(ds)]


def load_rows(task: str, split: str, data_path: Path | None, source: Source) -> list[RawRow]:
    """Raw rows of ``split``: from ``data_path`` (file or directory) or from the hub."""
    source.hub_split(split)  # unknown split -> UserError before touching files
    if data_path is None:
        return read_hub(task, split, source)
    return read_file(resolve_local(task, split, data_path, source))


# --------------------------------------------------------------------------- validation


class RowReader:
    """Typed access to one row's fields; every failure names origin, row and field."""

    def __init__(self, row: RawRow) -> None:
        self.row = row

    @property
    def where(self) -> str:
        return f"{self.row.origin} row {self.row.number}"

    def error(self, key: str, problem: str) -> UserError:
        return UserError(f"{self.where}: field {key!r} {problem}")

    def has(self, key: str) -> bool:
        return self.row.data.get(key) is not None

    def raw(self, key: str) -> Any:
        if key not in self.row.data or self.row.data[key] is None:
            raise self.error(key, "is missing")
        return self.row.data[key]

    def text(self, key: str, *, allow_empty: bool = False) -> str:
        """A string field (non-blank unless ``allow_empty``)."""
        value = self.raw(key)
        if not isinstance(value, str):
            raise self.error(key, f"must be a string, got {type(value).__name__}")
        if not allow_empty and not value.strip():
            raise self.error(key, "is empty")
        return value

    def integer(self, key: str) -> int:
        """An integer field (a float with an integral value is accepted; bools are not)."""
        value = self.raw(key)
        if isinstance(value, bool):
            raise self.error(key, f"must be an integer, got {value!r}")
        if isinstance(value, float) and math.isfinite(value) and value.is_integer():
            return int(value)
        if not isinstance(value, int):
            raise self.error(key, f"must be an integer, got {type(value).__name__} {value!r}"[:200])
        return value

    def int_list(self, key: str, *, min_len: int = 1) -> list[int]:
        value = self.raw(key)
        if (not isinstance(value, (list, tuple)) or len(value) < min_len
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
            raise self.error(key, f"must be a list of at least {min_len} integers, got {value!r}"[:200])
        return [int(v) for v in value]

    def str_list(self, key: str, *, min_len: int = 1, allow_empty_items: bool = False) -> list[str]:
        value = self.raw(key)
        if (not isinstance(value, (list, tuple)) or len(value) < min_len
                or not all(isinstance(v, str) and (allow_empty_items or v.strip()) for v in value)):
            raise self.error(key, f"must be a list of at least {min_len} non-empty strings, got {value!r}"[:200])
        return list(value)

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self.raw(key)
        if not isinstance(value, Mapping):
            raise self.error(key, f"must be an object, got {type(value).__name__}")
        return value

    def answer_text(self, key: str) -> str:
        """A short answer stored as a string, an integer or a float (``27.0`` -> ``"27"``)."""
        value = self.raw(key)
        if isinstance(value, bool):
            raise self.error(key, f"must be a string or a number, got {value!r}")
        if isinstance(value, int):
            return str(value)
        if isinstance(value, float):
            if not math.isfinite(value):
                raise self.error(key, f"must be finite, got {value!r}")
            return str(int(value)) if value.is_integer() else repr(value)
        if isinstance(value, str) and value.strip():
            return value.strip()
        raise self.error(key, f"must be a non-empty string or a number, got {value!r}"[:200])

    def row_id(self, key: str | None, fallback: str) -> str:
        """The dataset's id field as a string, or ``fallback`` when the source has none."""
        if key is None or key not in self.row.data or self.row.data[key] is None:
            return fallback
        value = self.row.data[key]
        if isinstance(value, bool) or not isinstance(value, (str, int)) or not str(value).strip():
            raise self.error(key, f"must be a non-empty string or integer id, got {value!r}"[:200])
        return str(value).strip()


def check_unique_ids(ids: list[tuple[str, RawRow]]) -> None:
    """UserError naming both rows when two problems of one load share an id."""
    seen: dict[str, RawRow] = {}
    for pid, row in ids:
        if pid in seen:
            first = seen[pid]
            raise UserError(f"{row.origin} row {row.number}: duplicate problem id {pid!r} "
                            f"(also row {first.number})")
        seen[pid] = row
