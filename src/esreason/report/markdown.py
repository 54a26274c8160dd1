"""Markdown rendering of the report tables.

Conventions (stated under every table): values x100 with one decimal (changes in
percentage points with a sign); ``<u>..</u>`` = best of Base/GRPO/ES in a task cell,
``**..**`` = best Average over all methods, ``*..*`` (italics) = second-best Average
(the paper shades it; Markdown has no cell shading). Intervals are in a companion
table right below each main table (same layout, ``[low, high]``), so the main table
reads like the paper's.
"""

from __future__ import annotations

from typing import Sequence

from esreason.report.load import Cell
from esreason.report.tables import Table

MARK_LEGEND = ("<u>underlined</u>: best of Base/GRPO/ES in a task cell; **bold**: best Average over all methods; "
               "*italic*: second-best Average (shaded in the LaTeX table). Ties at the displayed precision are "
               "all marked (none when all candidates tie); second best is the second-highest distinct displayed value.")


def _esc(text: str) -> str:
    return str(text).replace("|", "\\|")


def fmt(cell: Cell | None, signed: bool = False, digits: int = 1) -> str:
    if cell is None or cell.value is None:
        return "–"
    v = 100 * cell.value
    return f"{v:+.{digits}f}" if signed else f"{v:.{digits}f}"


def fmt_ci(cell: Cell | None, signed: bool = False, digits: int = 1) -> str:
    if cell is None or cell.low is None or cell.high is None:
        return "–"
    spec = f"+.{digits}f" if signed else f".{digits}f"
    return f"[{100 * cell.low:{spec}}, {100 * cell.high:{spec}}]"


def _header(table: Table) -> list[str]:
    cols = [f"{_esc(g.label)} {h}" for g in table.groups for _, h in g.columns]
    return ["| Method | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]


def table_markdown(table: Table) -> str:
    """The main table with marks."""
    out = _header(table)
    for m in table.rows:
        cells = []
        for g in table.groups:
            for metric, _ in g.columns:
                key = (m, g.key, metric)
                text = fmt(table.get(*key), table.signed)
                if key in table.underline:
                    text = f"<u>{text}</u>"
                if key in table.bold:
                    text = f"**{text}**"
                if key in table.shade:
                    text = f"*{text}*"
                cells.append(text)
        out.append(f"| {_esc(table.labels[m])} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def ci_markdown(table: Table) -> str:
    """The companion table of intervals (same layout)."""
    out = _header(table)
    for m in table.rows:
        cells = [fmt_ci(table.get(m, g.key, metric), table.signed) for g in table.groups for metric, _ in g.columns]
        out.append(f"| {_esc(table.labels[m])} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def simple_markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    out = ["| " + " | ".join(_esc(h) for h in header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(_esc(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def image(path: str, alt: str) -> str:
    return f"![{alt}]({path})"
