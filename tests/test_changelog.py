"""CHANGELOG.md keeps the form of Keep a Changelog 1.1.0: an ``[Unreleased]`` section first, then one section
per version, newest first, each ``## [X.Y.Z] - YYYY-MM-DD``, whose subsections are only the six kinds of
change; the version pyproject.toml declares has its section. (Tracker numbers: tests/test_no_history.py.)"""

from __future__ import annotations

import datetime
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
VERSION = re.compile(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})$")


def sections(text: str) -> list[tuple[str, list[str]]]:
    """(level-2 heading, its level-3 headings) in order."""
    out: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("## "):
            out.append((line, []))
        elif line.startswith("### "):
            assert out, f"a kind of change before any version: {line}"
            out[-1][1].append(line[4:].strip())
    return out


def check(text: str) -> list[str]:
    """Every way ``text`` departs from the form (empty: it keeps it)."""
    errors = []
    found = sections(text)
    if not found or found[0][0] != "## [Unreleased]":
        errors.append("the first section is not '## [Unreleased]'")
    dates = []
    for heading, kinds in found:
        if heading != "## [Unreleased]":
            match = VERSION.match(heading)
            if not match:
                errors.append(f"not a version heading: {heading!r}")
                continue
            dates.append(datetime.date.fromisoformat(match.group(2)))
            if not kinds:
                errors.append(f"{heading}: no Added/Changed/Fixed section")
        errors += [f"{heading}: '### {k}' is not a kind of change" for k in kinds if k not in KINDS]
    if dates != sorted(dates, reverse=True):
        errors.append("versions are not newest first")
    return errors


def test_the_changelog_keeps_the_form():
    text = (REPO / "CHANGELOG.md").read_text()
    assert check(text) == []
    version = re.search(r'^version\s*=\s*"([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert re.search(rf"^## \[{re.escape(version)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.M), \
        f"pyproject.toml's version {version} has no dated section"


def test_the_check_catches_the_old_form():
    old = "# Changelog\n\n## Unreleased (2026-11-29)\n\n- a change\n\n## 2026-11-28\n\n- another\n"
    errors = check(old)
    assert "the first section is not '## [Unreleased]'" in errors
    assert any("not a version heading" in e for e in errors)
    assert check("## [Unreleased]\n## [0.1.0] - 2026-11-29\n### Notes\n") == [
        "## [0.1.0] - 2026-11-29: '### Notes' is not a kind of change"]
