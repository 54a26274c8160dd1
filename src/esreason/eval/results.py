"""Evaluation files: ``responses.jsonl`` (append-only, resumable), ``manifest.json``,
``problems.jsonl``, ``summary.json`` and ``summary.md``.

Layout of an output directory::

    OUT/manifest.json              protocol, model identity, tasks, versions (build_manifest)
    OUT/<task>/responses.jsonl     one line per response (SampleRecord), flushed per line
    OUT/<task>/problems.jsonl      one line per problem: its metrics (rewritten each run)
    OUT/summary.json               per task and averaged: every metric with its CI
    OUT/summary.md                 the same as a Markdown table

``responses.jsonl`` is only ever appended to. A killed run can leave a torn last line:
it is cut off before appending (and skipped when reading). A problem counts as answered
once all M sampled lines (and the greedy line, when the protocol has one) are present;
a later line for the same (problem, sample, greedy) replaces an earlier one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from esreason.errors import UserError
from esreason.eval.bootstrap import Estimate
from esreason.eval.records import ProblemRecord, Protocol, SampleRecord
from esreason.io.atomic import atomic_write_json, atomic_write_text

RESPONSES_FILE = "responses.jsonl"
PROBLEMS_FILE = "problems.jsonl"
SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"
MANIFEST_FILE = "manifest.json"
MANIFEST_KIND = "esreason-eval"


# --------------------------------------------------------------------------- responses.jsonl


def repair_tail(path: Path) -> int:
    """Cut a partially written last line off ``path``; returns the bytes removed."""
    if not path.exists():
        return 0
    size = path.stat().st_size
    if size == 0:
        return 0
    with open(path, "rb+") as fh:
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return 0
        block = 1 << 16
        pos = size
        while pos > 0:
            start = max(0, pos - block)
            fh.seek(start)
            chunk = fh.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                fh.truncate(keep)
                return size - keep
            pos = start
        fh.truncate(0)
        return size


def _parse_record(raw: bytes) -> SampleRecord | None:
    try:
        return SampleRecord.from_dict(json.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError, AttributeError):
        return None


def scan_responses(path: Path) -> tuple[list[SampleRecord], list[int]]:
    """(records of every complete valid line, line numbers of damaged complete lines); a torn last line is skipped."""
    if not path.exists():
        return [], []
    lines = path.read_bytes().split(b"\n")
    lines.pop()  # the torn last line, or b"" after a final newline
    records, damaged = [], []
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        rec = _parse_record(raw)
        if rec is None:
            damaged.append(lineno)
        else:
            records.append(rec)
    return records, damaged


def read_responses(path: Path) -> list[SampleRecord]:
    """All complete lines of a responses file (a torn last line is skipped).

    A complete line that is not a valid record raises UserError naming the file and line.
    """
    records, damaged = scan_responses(path)
    if damaged:
        raise UserError(f"{path}: line {damaged[0]} is not a response record; "
                        f"rerun the evaluation into the same --output to repair it")
    return records


class ResponsesFile:
    """One task's ``responses.jsonl``: what is answered already, and appending new answers.

    Opening it repairs the file (docs/faults.md): damaged lines are dropped with a one-line
    warning, and a repeated (problem, greedy, sample) keeps its last line, so the file holds
    exactly one line per response; the dropped responses are sampled again (same seeds).
    """

    def __init__(self, path: str | Path, protocol: Protocol) -> None:
        self.path = Path(path)
        self.protocol = protocol
        self._by_problem: dict[str, dict[tuple[bool, int], SampleRecord]] = {}
        records, damaged = scan_responses(self.path)
        for rec in records:
            self._by_problem.setdefault(rec.problem_id, {})[(rec.greedy, rec.sample)] = rec
        kept = sum(len(v) for v in self._by_problem.values())
        if damaged or kept != len(records):
            if damaged:
                from esreason.io.verify import warn

                warn(f"{self.path}: {len(damaged)} damaged line(s) (first: line {damaged[0]}) dropped; "
                     "their responses are sampled again")
            atomic_write_text(self.path, "".join(r.to_json() + "\n" for v in self._by_problem.values()
                                                 for r in v.values()))

    def check_fingerprints(self, fingerprints: Mapping[str, str]) -> None:
        """UserError when a stored problem's messages or gold differ from the current one."""
        for pid, lines in self._by_problem.items():
            want = fingerprints.get(pid)
            if want is None:
                continue
            for rec in lines.values():
                if rec.fingerprint and rec.fingerprint != want:
                    raise UserError(f"{self.path}: problem {pid!r} differs from the one answered before "
                                    f"(dataset changed?); use another --output")

    def is_complete(self, problem_id: str) -> bool:
        lines = self._by_problem.get(problem_id, {})
        if any((False, j) not in lines for j in range(self.protocol.samples)):
            return False
        return not self.protocol.greedy or (True, 0) in lines

    def record(self, problem_id: str) -> ProblemRecord:
        """The stored record of an answered problem."""
        lines = self._by_problem[problem_id]
        samples = [lines[(False, j)] for j in range(self.protocol.samples)]
        greedy = lines.get((True, 0)) if self.protocol.greedy else None
        return ProblemRecord(samples[0].task, problem_id, samples, greedy)

    def append(self, records: Iterable[ProblemRecord]) -> None:
        """Append the lines of ``records`` not stored yet (one write + flush per line) and remember them.

        A problem answered in part before (a resumed run) gets only its missing lines, so the
        file never holds two lines for one (problem, greedy, sample).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        repair_tail(self.path)
        from esreason.io.metrics import append_line

        with open(self.path, "ab", buffering=0) as fh:  # a row that fills the disk is cut back (DiskFull)
            for rec in records:
                for line in rec.lines():
                    if (line.greedy, line.sample) in self._by_problem.get(line.problem_id, {}):
                        continue
                    append_line(fh, self.path, line.to_json())
                    self._by_problem.setdefault(line.problem_id, {})[(line.greedy, line.sample)] = line
            os.fsync(fh.fileno())


    def rewrite_in_order(self, problem_ids: Sequence[str]) -> None:
        """Rewrite the file (atomically) with the problems in ``problem_ids`` order, each problem's
        samples in sample order and its greedy line last; problems not listed keep their lines after
        them. The streamed path appends problems as engines finish them; this makes the finished file
        independent of that order."""
        order = list(dict.fromkeys(problem_ids)) + [p for p in self._by_problem if p not in set(problem_ids)]
        lines = []
        for pid in order:
            stored = self._by_problem.get(pid, {})
            lines += [stored[k] for k in sorted(stored, key=lambda k: (k[0], k[1]))]
        text = "".join(r.to_json() + "\n" for r in lines)
        if not self.path.exists() or self.path.read_text(encoding="utf-8") != text:
            atomic_write_text(self.path, text)


# --------------------------------------------------------------------------- manifest


def check_manifest(out_dir: Path, current: Mapping[str, Any]) -> dict[str, Any] | None:
    """The stored manifest, after checking it matches ``current`` (protocol, split, model).

    Returns None when there is none. UserError when the directory holds another
    evaluation, or responses without a manifest.
    """
    path = out_dir / MANIFEST_FILE
    if not path.exists():
        leftovers = sorted(out_dir.glob(f"*/{RESPONSES_FILE}")) if out_dir.is_dir() else []
        if leftovers:
            raise UserError(f"{out_dir} has responses ({leftovers[0]}) but no {MANIFEST_FILE}; "
                            f"cannot tell how they were sampled — use another --output")
        return None
    from esreason.io.verify import DamagedFile, read_json

    try:
        stored = read_json(path)
    except DamagedFile as exc:
        raise UserError(f"{exc}: cannot tell how the responses in {out_dir} were sampled; "
                        "use another --output") from None
    if not isinstance(stored, dict) or stored.get("kind") != MANIFEST_KIND:
        raise UserError(f"{out_dir} is not an esreason evaluation directory ({path} kind "
                        f"{stored.get('kind') if isinstance(stored, dict) else None!r}); use another --output")
    diffs = []
    for key, want in (current.get("protocol", {}) or {}).items():
        have = stored.get("protocol", {}).get(key)
        if have != want:
            diffs.append(f"{key}: {have!r} before, {want!r} now")
    if stored.get("split") != current.get("split"):
        diffs.append(f"split: {stored.get('split')!r} before, {current.get('split')!r} now")
    old_model, new_model = stored.get("model", {}).get("identity"), current.get("model", {}).get("identity")
    if old_model != new_model:
        diffs.append(f"model: {old_model} before, {new_model} now")
    if diffs:
        raise UserError(f"{out_dir} holds an evaluation with another protocol ({'; '.join(diffs)}); "
                        f"use another --output to start a new one")
    return stored


def write_manifest(out_dir: Path, manifest: Mapping[str, Any]) -> None:
    atomic_write_json(out_dir / MANIFEST_FILE, dict(manifest))


# --------------------------------------------------------------------------- summaries


def write_problem_table(task_dir: Path, ids: Sequence[str], table: Sequence[Mapping[str, float | None]]) -> None:
    """``problems.jsonl``: per problem, its id and metrics (for coverage analyses)."""
    lines = [json.dumps({"problem_id": pid, **row}) for pid, row in zip(ids, table)]
    atomic_write_text(task_dir / PROBLEMS_FILE, "".join(line + "\n" for line in lines))


_LABELS = {"greedy_acc": "Greedy", "entropy": "Entropy", "tokens": "Tokens", "formatted": "Formatted"}


def metric_label(name: str) -> str:
    if name.startswith("pass@"):
        return "Pass@" + name[5:]
    if name.startswith("maj@"):
        k, _, rest = name[4:].partition("_")
        return f"Maj@{k}" + (" (E)" if rest == "expected" else "")
    return _LABELS.get(name, name)


def _fmt(name: str, est: Estimate) -> str:
    if est.value is None:
        return "–"
    percent = name not in ("entropy", "tokens")
    scale, digits = (100.0, 1) if percent else (1.0, 3 if name == "entropy" else 1)
    text = f"{est.value * scale:.{digits}f}"
    if est.low is not None and est.high is not None:
        text += f" [{est.low * scale:.{digits}f}, {est.high * scale:.{digits}f}]"
    return text


def summary_markdown(title: str, header_lines: Sequence[str], rows: Sequence[tuple[str, int, Mapping[str, Estimate]]],
                     names: Sequence[str]) -> str:
    """A Markdown table: one row per (label, problems, estimates)."""
    out = [f"# {title}", ""] + [f"{line}  " for line in header_lines] + [""]
    out.append("| task | problems | " + " | ".join(metric_label(n) for n in names) + " |")
    out.append("|---|---:|" + "---:|" * len(names))
    for label, n, est in rows:
        out.append(f"| {label} | {n} | " + " | ".join(_fmt(name, est[name]) for name in names) + " |")
    out += ["", "Pass@k, Maj@k, Greedy and Formatted in %, entropy in nats per generated token, tokens per "
            "response; brackets: 95% percentile-bootstrap intervals over problems (resampled within each "
            "task for the average). Maj@k (E): expectation over random k-subsets; Maj@k: the first k samples.", ""]
    return "\n".join(out)


def write_summary(out_dir: Path, summary: Mapping[str, Any], markdown: str) -> None:
    atomic_write_json(out_dir / SUMMARY_JSON, dict(summary))
    atomic_write_text(out_dir / SUMMARY_MD, markdown)
