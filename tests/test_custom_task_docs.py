"""docs/custom-tasks.md walks through examples/custom_task as it is: the blocks that name a file of the
example (``# train.py`` on their first line) show it whole, and the committed data is what make_data.py
writes (a fresh clone runs every command of the page without running it first)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "custom_task"
DOC = ROOT / "docs" / "custom-tasks.md"


def shown_files() -> dict[str, str]:
    """{file name: the block's text after its first line} for each fenced block whose first line is ``# NAME``."""
    out = {}
    for body in re.findall(r"^```\w+\n(.*?)^```$", DOC.read_text(encoding="utf-8"), flags=re.M | re.S):
        first, _, rest = body.partition("\n")
        m = re.fullmatch(r"#\s+([\w.-]+\.(?:py|yaml))\s*", first)
        if m and (EXAMPLE / m[1]).is_file():
            out[m[1]] = rest
    return out


def test_the_page_shows_the_example_files_whole():
    shown = shown_files()
    assert set(shown) == {"reward.py", "train.py", "carry_add.yaml"}, sorted(shown)
    for name, text in shown.items():
        assert text == (EXAMPLE / name).read_text(encoding="utf-8"), f"docs/custom-tasks.md's {name} is not the file"


def test_the_committed_data_is_what_make_data_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("custom_task_make_data", EXAMPLE / "make_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(out=tmp_path)
    for name in ("train.jsonl", "test.jsonl"):
        assert (EXAMPLE / "data" / name).read_bytes() == (tmp_path / name).read_bytes(), name
