"""Fault injection for the damage suites (tests/test_faults_*.py, docs/faults.md).

Four damages, applied to one file: ``truncate`` (keep the first half of its bytes), ``zero``
(every byte set to 0, same size: what some file systems leave after a crash), ``delete``, and
``garble`` (the middle byte XOR 0xFF: a flipped byte, never valid UTF-8 in a text file).
"""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

DAMAGES = ("truncate", "zero", "delete", "garble")


def damage(path: Path, kind: str) -> None:
    """Apply one of :data:`DAMAGES` to ``path`` in place."""
    data = path.read_bytes()
    if kind == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif kind == "zero":
        path.write_bytes(b"\0" * len(data))
    elif kind == "delete":
        path.unlink()
    elif kind == "garble":
        i = len(data) // 2
        path.write_bytes(data[:i] + bytes([data[i] ^ 0xFF]) + data[i + 1:])
    else:
        raise ValueError(kind)


def copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def run_cli(argv: list[str]) -> tuple[int, str]:
    """``esreason ARGV`` in this process: (exit status, stderr)."""
    from esreason.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    return rc, err.getvalue()


def one_line_error(rc: int, err: str, needle: str) -> None:
    """A refusal: exit 2, one ``esreason: error:`` line naming ``needle``, no traceback."""
    lines = [x for x in err.splitlines() if x.startswith("esreason: error:")]
    assert rc == 2, err
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def warnings_naming(err: str, needle: str) -> list[str]:
    return [x for x in err.splitlines() if x.startswith("esreason: warning:") and needle in x]
