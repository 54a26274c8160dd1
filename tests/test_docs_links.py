"""The user documentation's cross-references resolve, and docs/ holds no project history.

- Every relative link in README.md and docs/*.md (``[text](path)``, ``[text](path#anchor)``,
  ``[text](#anchor)``) names a file that exists, and an anchor names a heading of the target
  (GitHub's anchor rules), so a renamed document or section fails here.
- Every ``docs/NAME.md`` mentioned in their text, code blocks included, exists.
- docs/*.md names no internal issue number (a reader has no tracker to look it up in; an issue of
  a named public repository, "owner/repo issue N", is a citation and allowed) and holds dates only
  in docs/measurements.md, where each measured figure carries the date it was measured.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md"] + DOCS

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(([^)\s]+)\)")  # [text](target); images excluded
DOC_MENTION = re.compile(r"(?<![\w./-])docs/[\w.-]+\.md\b")
ISSUE = re.compile(r"\bissues?[ -]?#?\d+", re.IGNORECASE)
PUBLIC_REPO_BEFORE = re.compile(r"[\w.-]+/[\w.-]+,? $")  # "owner/repo " right before "issue N"
DATE = re.compile(r"(?<![#\w])20\d\d-\d\d-\d\d(?!T\d)")  # not an anchor, not an ISO timestamp of sample output


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor the headings of ``path`` define (a repeated heading gets -1, -2, ...)."""
    count: dict[str, int] = {}
    found = set()
    for _, line in _prose(path.read_text(encoding="utf-8")):
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            n = count.get(base, 0)
            count[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def _label(page: Path, root: Path = REPO) -> str:
    return str(page.relative_to(root))


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    broken = []
    for number, line in _prose(page.read_text(encoding="utf-8")):
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            path_part, _, anchor = target.partition("#")
            dest = (page.parent / path_part).resolve() if path_part else page
            where = f"{_label(page, root)}:{number}: ({target})"
            if not dest.exists():
                broken.append(f"{where} no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} no heading with anchor #{anchor} in {_label(dest, root)}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=_label)
def test_relative_links_resolve(page):
    assert not broken_links(page), "\n".join(broken_links(page))


@pytest.mark.parametrize("page", PAGES, ids=_label)
def test_mentioned_docs_exist(page):
    missing = [f"{_label(page)}:{n}: {m}" for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
               for m in DOC_MENTION.findall(line) if not (REPO / m).is_file()]
    assert not missing, "these documents do not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("page", DOCS, ids=_label)
def test_docs_name_no_internal_issue_and_no_dates_outside_measurements(page):
    found = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
        for m in ISSUE.finditer(line):
            if not PUBLIC_REPO_BEFORE.search(line[:m.start()]):
                found.append(f"{_label(page)}:{number}: internal issue reference {m.group(0)!r}")
        if page.name != "measurements.md":
            found += [f"{_label(page)}:{number}: date {d!r} (dates belong to docs/measurements.md)"
                      for d in DATE.findall(line)]
    assert not found, "\n".join(found)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """A missing file, a missing anchor, an internal issue number and a diary date are each found."""
    (tmp_path / "a.md").write_text("# Title\n\n## Two words\n\nSee [b](b.md), [x](a.md#two-words), "
                                   "[y](a.md#gone) and [c](c.md#title).\n", encoding="utf-8")
    (tmp_path / "c.md").write_text("# Title\n", encoding="utf-8")
    page = tmp_path / "a.md"
    broken = [b.split(": ", 1)[1] for b in broken_links(page, tmp_path)]
    assert broken == ["(b.md) no such file", "(a.md#gone) no heading with anchor #gone in a.md"]
    assert slug("The paper's layout on an 8-GPU node") == "the-papers-layout-on-an-8-gpu-node"
    assert slug("`esreason demo` (one seed)") == "esreason-demo-one-seed"
    word = "issue"  # built from pieces: this file is itself checked for tracker references
    assert ISSUE.search(f"fixed in {word} 25") and ISSUE.search(f"({word}-37)")
    assert PUBLIC_REPO_BEFORE.search("(VsonicV/es-at-scale ")
    assert DATE.findall("measured 2026-11-28, since 2026-11-26T14:31:02") == ["2026-11-28"]



def test_every_page_is_two_clicks_from_the_readme():
    """README.md links the index docs/README.md, and the index links every page of docs/ (one line each)."""
    readme = {m for m in LINK.findall((REPO / "README.md").read_text())}
    assert "docs/README.md" in readme
    index = {m.split("#")[0] for m in LINK.findall((REPO / "docs" / "README.md").read_text())}
    missing = [p.name for p in DOCS if p.name != "README.md" and p.name not in index]
    assert not missing, f"docs/README.md does not list: {', '.join(missing)}"
