"""docs/custom-tasks.md walks through examples/custom_task as it is: its Python block is train.py, text for
text, and the committed data is what make_data.py writes (a fresh clone runs every command without it)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "custom_task"
DOC = ROOT / "docs" / "custom-tasks.md"


def fenced(text: str, language: str) -> list[str]:
    """The fenced code blocks of ``language`` in a Markdown text, each as written (with its last newline)."""
    return re.findall(rf"^```{language}\n(.*?)^```$", text, flags=re.M | re.S)


def test_the_documented_script_is_train_py():
    assert (EXAMPLE / "train.py").read_text(encoding="utf-8") in fenced(DOC.read_text(encoding="utf-8"), "python")


def test_the_committed_data_is_what_make_data_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("custom_task_make_data", EXAMPLE / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(out=tmp_path)
    for name in ("train.jsonl", "test.jsonl"):
        assert (EXAMPLE / "data" / name).read_bytes() == (tmp_path / name).read_bytes(), name
