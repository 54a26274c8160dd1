"""Markdown/LaTeX/JSON table writers of the analysis commands."""

from __future__ import annotations

import json

import pytest

from esreason.analysis.tables import Table, latex_escape, write_outputs


def test_markdown_escapes_pipes_and_latex_escapes_specials(tmp_path):
    t = Table("Largest |Δ|", ["Tensor", "max |Δ|", "share (%)"], caption="τ ≤ 1e-3, ‖Δ‖² in 50% of #1")
    t.add("model.layers.0.input_layernorm.weight", "0.01171875", "12.5")
    t.section("Llama")
    t.add("a_b", "x", "y")
    md = t.to_markdown()
    assert "| Tensor | max \\|Δ\\| | share (%) |" in md
    assert "| **Llama** | | |" in md
    tex = t.to_latex()
    assert "model.layers.0.input\\_layernorm.weight & 0.01171875 & 12.5 \\\\" in tex
    assert "\\multicolumn{3}{l}{\\textbf{Llama}} \\\\" in tex
    assert "\\caption{Largest $|$$\\Delta$$|$. $\\tau$ $\\le$ 1e-3, $\\|$$\\Delta$$\\|$$^2$ in 50\\% of \\#1}" in tex
    assert latex_escape("a&b_c{d}~") == "a\\&b\\_c\\{d\\}\\textasciitilde{}"
    with pytest.raises(ValueError, match="2 cells"):
        t.add("only", "two")
    paths = write_outputs(tmp_path / "o", "demo", [t], {"x": 1.5})
    assert json.loads(paths["json"].read_text()) == {"x": 1.5}
    assert paths["md"].read_text().startswith("**Largest")
    assert "booktabs" in paths["tex"].read_text()
