"""LICENSE holds the licence pyproject.toml declares; CITATION.cff is CFF 1.2.0 whose preferred citation is
the paper (GitHub's "Cite this repository" then offers the paper first), with the software entry beside it.

The paper's title, authors and code link are those of the paper this project implements. It carries no
arXiv identifier and no date; it cites work of 2026 and is cited as 2026. `.ci/run` validates the file
against the CFF schema with `cffconvert --validate`.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
PAPER_TITLE = "Understanding Evolution Strategies for LLM Reasoning: Broader Reasoning Coverage than GRPO"
PAPER_AUTHORS = ["Yunpeng Ba", "Zhi Zheng", "Yue Xie", "Jiaqing Li", "Xialiang Tong", "Tao Zhong", "Mingxuan Yuan",
                 "Zhichao Lu", "Xuyang Wu", "Zhenkun Wang"]


def _declared_license() -> str:
    match = re.search(r'^license\s*=\s*\{\s*text\s*=\s*"([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    assert match, "pyproject.toml declares no license = { text = ... }"
    return match.group(1)


def test_license_file_is_the_declared_apache_2():
    assert _declared_license() == "Apache-2.0"
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    head = " ".join(text.split()[:6])
    assert head == "Apache License Version 2.0, January 2004", head
    # the full text, not a notice: all nine sections of the terms and the end marker
    for n, section in enumerate(["Definitions", "Grant of Copyright License", "Grant of Patent License",
                                 "Redistribution", "Submission of Contributions", "Trademarks",
                                 "Disclaimer of Warranty", "Limitation of Liability",
                                 "Accepting Warranty or Additional Liability"], start=1):
        assert f"{n}. {section}." in text, section
    assert "END OF TERMS AND CONDITIONS" in text


def _citation() -> dict:
    data = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert isinstance(data, dict), "CITATION.cff is not a YAML mapping"
    return data


def test_citation_is_cff_for_the_software():
    cff = _citation()
    for key in ("cff-version", "message", "title", "authors"):  # required by CFF 1.2.0
        assert cff.get(key), f"CITATION.cff: missing '{key}'"
    assert cff["cff-version"] == "1.2.0"
    assert cff["type"] == "software"
    assert cff["license"] == _declared_license()
    version = re.search(r'^version\s*=\s*"([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M).group(1)
    assert str(cff["version"]) == version


def test_citation_names_the_paper():
    cff = _citation()
    entries = list(cff.get("references") or []) + ([cff["preferred-citation"]] if "preferred-citation" in cff else [])
    papers = [e for e in entries if e.get("title") == PAPER_TITLE]
    assert papers, f"CITATION.cff names no reference titled {PAPER_TITLE!r}"
    paper = papers[0]
    assert paper.get("type"), "a CFF reference needs a type"
    names = [f"{a['given-names']} {a['family-names']}" for a in paper["authors"]]
    assert names == PAPER_AUTHORS


def test_the_preferred_citation_is_the_paper_with_year_and_address():
    cff = _citation()
    paper = cff.get("preferred-citation")
    assert paper, "CITATION.cff: no preferred-citation (GitHub would offer only the software)"
    assert paper["title"] == PAPER_TITLE
    assert [f"{a['given-names']} {a['family-names']}" for a in paper["authors"]] == PAPER_AUTHORS
    assert paper["year"] == 2026
    assert paper["url"] == paper["repository-code"] == "https://github.com/yunpengba7/understanding-es"


def test_the_software_entry_is_dated_and_true_to_the_status():
    cff = _citation()
    released = str(cff["date-released"])
    changelog = (REPO / "CHANGELOG.md").read_text()
    assert f"## [{cff['version']}] - {released}" in changelog, "date-released is the changelog's release date"
    abstract = " ".join(cff["abstract"].split())
    # The paper's multi-GPU layout has not run with this software (README, "Status"): the abstract must
    # not say the software runs on a GPU cluster.
    assert "cluster of GPU nodes" not in abstract
    assert "have not yet been run" in abstract
