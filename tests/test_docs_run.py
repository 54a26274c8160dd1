"""The documentation, run: every code block of README.md and docs/*.md, page by page, in order, in a fresh
copy of the tree, on the embedded default (tests/docs_blocks.py says how each kind of block runs and
which markers a block that needs a GPU or the hub carries).

Opt-in (`-m docs`): `.ci/run` runs it as its own part, the pages on two workers. Each page prints its
time and its slowest blocks (`-s`)."""

from __future__ import annotations

import pytest

from docs_blocks import PAGES, run_page

#: A page's blocks run in one test: the README's includes the full `esreason demo` (4-10 min idle), so the
#: suite's 600 s per test is too short on a busy machine; this bound only stops a hung page.
pytestmark = [pytest.mark.docs, pytest.mark.timeout(3600)]


@pytest.mark.parametrize("page", PAGES)
def test_the_page_runs(page, tmp_path):
    seconds = run_page(page, tmp_path)
    total = sum(s for _, s in seconds)
    slowest = ", ".join(f"{where} {s:.0f} s" for where, s in sorted(seconds, key=lambda x: -x[1])[:3])
    print(f"\ndocs-page: {page}: {len(seconds)} blocks in {total:.0f} s (slowest: {slowest or 'none'})")
