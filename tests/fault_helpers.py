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

import pytest

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


@pytest.fixture(scope="module")
def demo_dir() -> Path:
    """The embedded default's directory (import this fixture into a test module)."""
    from esreason.embedded import demo_model_dir

    return Path(demo_model_dir())


def reference_run(train, factory, name: str) -> Path:
    """A module's reference run: ``train(demo model dir, out) -> (rc, stderr)`` with 2 updates that both move the weights."""
    from esreason.embedded import demo_model_dir
    from esreason.io.hashing import hash_directory_safetensors

    run = factory.mktemp(name) / "run"
    rc, err = train(demo_model_dir(), run)
    assert rc == 0, err
    step = [hash_directory_safetensors(run / "checkpoints" / f"step_{i}") for i in (1, 2)]
    assert step[0] != step[1]  # update 2 moves the weights: re-training it is a real check
    return run


def extended_run(train, ref: Path, model_dir: Path, tmp: Path) -> tuple[Path, Path]:
    """``ref`` (2 updates) resumed with train.max_steps=3, and a fresh 3-update run: their final weights match."""
    from esreason.io.hashing import hash_directory_safetensors

    run, longer = copy_run(ref, tmp / "run"), tmp / "longer"
    rc, err = train(model_dir, run, "--resume", steps=3)
    assert rc == 0, err
    assert train(model_dir, longer, steps=3)[0] == 0
    ckpt = Path("checkpoints") / "step_3"
    assert hash_directory_safetensors(run / ckpt) == hash_directory_safetensors(longer / ckpt)
    return run, longer


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
