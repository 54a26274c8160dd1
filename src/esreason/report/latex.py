"""LaTeX rendering of the report tables (one ``.tex`` file per table).

The layout follows the paper's ``tab:rq1-instruct-final``: booktabs rules, one
``\\multicolumn`` per task with ``\\cmidrule`` underneath, ``\\underline`` for the best
Base/GRPO/ES task cell, ``\\textbf`` for the best and ``\\cellcolor{gray!35}`` for the
second-best Average. Needed packages (stated in each file's first lines):
``booktabs``, ``graphicx`` (``\\resizebox``) and ``xcolor`` with the ``table`` option
(which loads ``colortbl`` for ``\\cellcolor``).
"""

from __future__ import annotations

from typing import Sequence

from esreason.report.load import Cell
from esreason.report.tables import Table

PREAMBLE = ("% requires: \\usepackage{booktabs} \\usepackage{graphicx} "
            "\\usepackage[table]{xcolor}  (the table option loads colortbl for \\cellcolor)")

_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
             "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
             "→": r"$\to$", "Δ": r"$\Delta$", "×": r"$\times$", "–": "--"}


def latex_escape(text: str) -> str:
    """Escape LaTeX specials; arrows and Greek become math (``ES→GRPO`` -> ``ES$\\to$GRPO``)."""
    return "".join(_SPECIALS.get(ch, ch) for ch in str(text))


def format_value(cell: Cell | None, signed: bool = False, digits: int = 1) -> str:
    """Percent (or percentage points with a sign) of a cell; ``--`` when absent."""
    if cell is None or cell.value is None:
        return "--"
    v = 100 * cell.value
    return f"${v:+.{digits}f}$" if signed else f"{v:.{digits}f}"


def _marked(text: str, underline: bool, bold: bool, shade: bool) -> str:
    if underline:
        text = f"\\underline{{{text}}}"
    if bold:
        text = f"\\textbf{{{text}}}"
    if shade:
        text = f"\\cellcolor{{gray!35}}{text}"
    return text


def table_latex(table: Table, label: str) -> str:
    """The full ``table*`` environment of a :class:`Table`."""
    ncols = sum(len(g.columns) for g in table.groups)
    lines = [PREAMBLE, "\\begin{table*}[t]", "\\centering", "\\resizebox{\\textwidth}{!}{%",
             f"\\begin{{tabular}}{{@{{}}l*{{{ncols}}}{{r}}@{{}}}}", "\\toprule"]
    heads, rules, col = [""], [], 2
    for g in table.groups:
        n = len(g.columns)
        heads.append(f"\\multicolumn{{{n}}}{{c}}{{{latex_escape(g.label)}}}")
        rules.append(f"\\cmidrule(lr){{{col}-{col + n - 1}}}")
        col += n
    lines.append(" & ".join(heads) + " \\\\")
    lines.append(" ".join(rules))
    lines.append(" & ".join(["Method"] + [latex_escape(h) for g in table.groups for _, h in g.columns]) + " \\\\")
    lines.append("\\midrule")
    for m in table.rows:
        cells = [latex_escape(table.labels[m])]
        for g in table.groups:
            for metric, _ in g.columns:
                key = (m, g.key, metric)
                cells.append(_marked(format_value(table.get(*key), table.signed), key in table.underline,
                                     key in table.bold, key in table.shade))
        lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}%", "}", f"\\caption{{{latex_escape(table.caption)}}}",
              f"\\label{{{label}}}", "\\end{table*}", ""]
    return "\n".join(lines)


def simple_latex(header: Sequence[str], rows: Sequence[Sequence[str]], caption: str, label: str) -> str:
    """A plain booktabs ``table`` (text cells, escaped; first column left-aligned)."""
    lines = [PREAMBLE, "\\begin{table}[t]", "\\centering",
             f"\\begin{{tabular}}{{@{{}}l*{{{len(header) - 1}}}{{r}}@{{}}}}", "\\toprule",
             " & ".join(latex_escape(h) for h in header) + " \\\\", "\\midrule"]
    lines += [" & ".join(latex_escape(c) for c in row) + " \\\\" for row in rows]
    lines += ["\\bottomrule", "\\end{tabular}", f"\\caption{{{latex_escape(caption)}}}", f"\\label{{{label}}}",
              "\\end{table}", ""]
    return "\n".join(lines)
