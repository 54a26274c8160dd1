"""The repository is self-contained: no file git knows names an absolute path of a machine or a path that
leaves the repository.

A user's clone is the whole project: a citation of ``../something`` or of the directory a file was
written in (a workspace, a home directory) points at nothing on their machine, and evidence the docs
rely on must be committed (raw GPU results live in docs/gpu-results/). Checked, in every file git knows
(tracked, or new and not ignored), pyproject.toml, CITATION.cff and CHANGELOG.md included:

- **machine paths**: an absolute path under a home, workspace or mount root (home and Users
  directories, root's home, work, mnt, srv, scratch, a package index under opt, a Windows user
  directory: :data:`MACHINE_PATH`). System paths a program legitimately names (``/dev/null``,
  ``/proc/...``, ``/usr/bin/env``, ``/tmp``, ``/etc/...``) are not machine paths and pass;
- **paths that leave the repository**: a ``../`` path (in a Markdown link or in text) that, resolved
  from the file's directory and from the repository root, names no file of the repository either way.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: Absolute paths of a particular machine (see the module docstring). Assembled from pieces so that
#: this file's own source does not match them.
_SEP = "/"
MACHINE_PATH = re.compile(
    r"(?<![\w.~-])(?:"
    + "|".join([_SEP + "home" + _SEP + r"[A-Za-z_][\w.-]*", _SEP + "Users" + _SEP + r"[A-Za-z_][\w.-]*",
                _SEP + "root" + _SEP, _SEP + "work" + _SEP, _SEP + "mnt" + _SEP, _SEP + "srv" + _SEP,
                _SEP + "scratch" + _SEP, _SEP + "opt" + _SEP + "pypi"])
    + r"|[A-Za-z]:\\\\?Users\\\\?)")
#: A relative path that climbs: one or more ``../`` followed by a path.
CLIMBING = re.compile(r"(?:(?<=[\s(\[\"'`=:])|^)((?:\.\./)+[\w.\-/]*)")


#: Deliberate ``../`` strings, each with its reason: (file, text on the line).
ALLOWED = {
    ("tests/test_io.py", '"../x"'): "a run-directory name that must be refused (a path escape)",
    ("tests/test_verifiers_mbpp.py", "../esreason-escape.txt"): "a sandboxed program that tries to write "
                                                                "outside its directory",
    ("src/esreason/experiments/spec.py", "../demo/"): "an experiment file's example, relative to "
                                                      "configs/experiments/ (configs/demo/ exists)",
    ("tests/test_self_contained.py", "../"): "this test's own examples",
}


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, timeout=60, check=True).stdout.decode()
    return [REPO / name for name in out.split("\0") if name and (REPO / name).is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _inside(path: Path) -> bool:
    """``path`` exists and lies inside the repository."""
    try:
        path.resolve().relative_to(REPO)
    except ValueError:
        return False
    return path.exists()


def problems(path: Path, text: str) -> list[str]:
    """Lines of ``text`` (the file ``path``) that name a machine path or a path leaving the repository."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if MACHINE_PATH.search(line):
            out.append(f"{path.relative_to(REPO)}:{n}: machine path: {line.strip()[:160]}")
            continue
        where = str(path.relative_to(REPO))
        if any(where == f and s in line for f, s in ALLOWED):
            continue
        for rel in CLIMBING.findall(line):
            if not _inside(path.parent / rel) and not _inside(REPO / rel):
                out.append(f"{path.relative_to(REPO)}:{n}: leaves the repository ({rel}): {line.strip()[:160]}")
    return out


def test_the_patterns_catch_machine_paths_and_escapes_only(tmp_path):
    sep = _SEP
    caught = [f"see {sep}work{sep}shared{sep}x.md", f"({sep}home{sep}alice{sep}run)", f"{sep}root{sep}.cache",
              "C:" + "\\Us" + "ers\\bob\\x", f"{sep}opt{sep}pypi{sep}simple"]
    for line in caught:
        assert MACHINE_PATH.search(line), line
    passed = ["/dev/null", "/proc/self/status", "#!/usr/bin/env bash", "/tmp/x", "/etc/xdg/pip",
              "https://github.com/x/y", "runs/work/a", "docs/home/x"]
    for line in passed:
        assert not MACHINE_PATH.search(line), line
    inside = REPO / "docs" / "a.md"
    assert problems(inside, "[x](../README.md)") == []
    assert problems(inside, "see `../src/esreason`") == []
    leaving = problems(inside, "see `../" + "../shared/gpu-results/`")
    assert leaving and "leaves the repository" in leaving[0]
    assert problems(REPO / "README.md", "raw: ../" + "shared/x.json")


def test_no_file_points_outside_the_repository():
    hits = []
    for path in tracked_files():
        text = _text(path)
        if text is not None:
            hits += problems(path, text)
    assert not hits, (f"{len(hits)} line(s) point outside the repository; copy what you cite into the tree "
                      "and cite it by a relative path:\n" + "\n".join(hits))


@pytest.mark.parametrize("name", ["README.md", "gpucheck.json", "gpucheck_big.json", "grpo_real.jsonl",
                                  "gen_cmp.txt", "smi.txt"])
def test_the_raw_gpu_results_the_docs_cite_are_committed(name):
    assert (REPO / "docs" / "gpu-results" / "2026-11-28-h100" / name).is_file()
