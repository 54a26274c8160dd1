"""No internal issue numbers in what users read: README, docs, code, configs, scripts, tests.

A reader has no access to the project's tracker, so a pointer such as "(see the tracker's item
N)" tells them nothing; the reason itself belongs in place, and CHANGELOG.md states what changed and
why without it. Every file git knows is checked, pyproject.toml, CITATION.cff and CHANGELOG.md
included. External trackers are cited by address (``https://github.com/OWNER/REPO/issues/N``) or
as ``OWNER/REPO#N``, which the patterns below do not match.

Flagged, case-insensitively: the word for a tracker item, optionally plural, followed by a number
(with an optional space and ``#``), the same joined to a number by a hyphen, and the word followed
by a quoted title. The patterns are assembled from pieces so that this file does not match them.

Each top-level entry of the tree is its own test case (``-k src``, ``-k docs``, ...), and a failure
names every file and line.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

_WORD = "iss" + "ue"
#: The tracker-reference patterns (see the module docstring).
PATTERNS = (
    re.compile(r"\b" + _WORD + r"s? ?#?[0-9]+", re.IGNORECASE),
    re.compile(r"\b" + _WORD + r"-[0-9]+", re.IGNORECASE),
    re.compile(r"\b" + _WORD + r" [\"\u201c]", re.IGNORECASE),
)

#: Directory names never checked: caches and build metadata (src/*.egg-info holds a copy of the README).
SKIP_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}


def history_refs(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line of ``text`` that names a tracker item."""
    return [(i, line.strip()) for i, line in enumerate(text.splitlines(), 1)
            if any(p.search(line) for p in PATTERNS)]


def _git_files(place: str) -> list[Path] | None:
    """The files git knows under ``place`` (tracked, or new and not ignored); None without git."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", place],
                             cwd=REPO, capture_output=True, timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [REPO / name for name in out.decode().split("\0") if name]


def _top_level_entries() -> tuple[str, ...]:
    """Every top-level file and directory git knows (tracked, or new and not ignored); without git, every
    entry of the tree but hidden ones and virtual environments."""
    files = _git_files(".")
    if files is None:
        return tuple(sorted(p.name for p in REPO.iterdir() if not p.name.startswith(".") or p.name == ".ci"))
    return tuple(sorted({p.relative_to(REPO).parts[0] for p in files}))


#: Every place: each top-level entry of the tree (README.md, CHANGELOG.md, pyproject.toml, docs, src, ...).
PLACES = _top_level_entries()

def _walk(place: str) -> list[Path]:
    root = REPO / place
    if root.is_file():
        return [root]
    return [p for p in root.rglob("*") if p.is_file()
            and not any(part in SKIP_DIRS or part.endswith(".egg-info") for part in p.relative_to(REPO).parts)]


def files_of(place: str) -> list[Path]:
    """The files of ``place`` (binary files are passed over by :func:`_text`)."""
    files = _git_files(place) if (REPO / ".git").exists() else None
    files = _walk(place) if files is None else files
    return sorted(p for p in files if p.is_file())


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None  # binary
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_the_patterns_catch_tracker_references_and_not_external_addresses():
    # Built from pieces, as above, so that these lines do not trip the scan of tests/.
    w, big = _WORD, _WORD.capitalize()
    caught = [f"see {w} 36", f"({big} 23, item 4)", f"{w}s 35/36", f"{w} #12", f"{w}-25.md",
              f'the {w} "Scale-out and speed"', f"{big}s 24, 36"]
    for line in caught:
        assert history_refs(line) == [(1, line)], line
    passed = ["https://github.com/allenai/olmo-eval/" + w + "s/399", "pytorch/pytorch#122358",
              f"a known {w} with vLLM's CPU build", f"{w}s a kernel launch", "tissue 3", "tissue-3"]
    for line in passed:
        assert history_refs(line) == [], line
    assert history_refs(f"one\ntwo {w} 7\nthree") == [(2, f"two {w} 7")]


@pytest.mark.parametrize("place", PLACES)
def test_no_internal_issue_numbers(place):
    assert (REPO / place).exists(), f"{place} is gone: update PLACES"
    hits = []
    for path in files_of(place):
        text = _text(path)
        if text is None:
            continue
        hits += [f"{path.relative_to(REPO)}:{n}: {line}" for n, line in history_refs(text)]
    assert not hits, (f"{len(hits)} line(s) under {place} name an internal tracker item; state the reason "
                      "in place, or cite an external tracker by its address:\n" + "\n".join(hits))
