"""A full disk is an error, not a traceback (docs/faults.md, "A full disk").

The end-to-end test fills a small file system the test creates — a tmpfs mounted for it, when
this process may mount (root with CAP_SYS_ADMIN, as in CI) — while an ES run writes its next
checkpoint, and resumes it once there is space. Where mounting is not permitted it runs the
same test through the fallback: a wrapper around the checkpoint's safetensors write that
writes the first bytes of the file, then raises the error safetensors raises on ENOSPC. Which
path ran is recorded (``record_property('disk_full_path', ...)``) and the fallback warns.
``ESREASON_TEST_NO_MOUNT=1`` runs the fallback where mounting works.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Iterator

import pytest

from fault_helpers import demo_dir  # noqa: F401  (a fixture)
from fault_helpers import copy_run, one_line_error, reference_run

from esreason.errors import DiskFull
from esreason.io.atomic import atomic_directory, atomic_write_bytes
from esreason.io.metrics import MetricsLogger
from esreason.io.space import free_bytes, is_disk_full
from esreason.io.verify import verify_checkpoint

from test_faults_es import final, rows, train  # the ES fault suite's 2-update run

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

SAFETENSORS_ENOSPC = "Error while serializing: I/O error: No space left on device (os error 28)"


@contextlib.contextmanager
def small_fs(where: Path, size_mb: int) -> Iterator[bool]:
    """Mount a ``size_mb`` tmpfs at ``where``; yields False (and mounts nothing) where not permitted."""
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None or os.environ.get("ESREASON_TEST_NO_MOUNT"):  # the env var: try the fallback
        yield False
        return
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(where)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        yield False
        return
    try:
        yield True
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], capture_output=True)


def fill(fs: Path, leave: int) -> Path:
    """A filler file that leaves about ``leave`` bytes free on ``fs``."""
    filler = fs / "filler"
    with open(filler, "wb") as fh:
        fh.truncate(0)
        fh.write(b"\0" * max(0, (free_bytes(fs) or 0) - leave))
    return filler


def _fake_enospc_save(limit: int):
    """The fallback: write the first ``limit`` bytes of the file, then fail as safetensors does on ENOSPC."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file as real_save_file

    def save_file(tensors, filename, metadata=None):
        real_save_file(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as fh:  # what reached the disk before it filled
            fh.truncate(limit)
        raise SafetensorError(SAFETENSORS_ENOSPC)

    return save_file


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference_run(train, tmp_path_factory, "disk-ref")


def _no_temporaries(run: Path) -> None:
    assert not [p for p in run.rglob(".tmp-*")], "a partial file or directory was left behind"


def test_a_checkpoint_that_fills_the_disk_is_one_line_and_resumes_bit_identically(ref, demo_dir, tmp_path,
                                                                                     monkeypatch, record_property):
    fs = tmp_path / "fs"
    with small_fs(fs, 24) as mounted:
        record_property("disk_full_path", "tmpfs" if mounted else "safetensors write wrapper")
        run = copy_run(ref, fs / "run")
        shutil.rmtree(run / "checkpoints" / "step_2")  # as if killed before checkpoint 2: its update re-runs
        if mounted:
            filler = fill(fs, leave=400_000)  # metrics rows and TensorBoard events fit, the 3.4 MB weights do not
        else:
            warnings.warn("cannot mount a tmpfs here: ran the disk-full test through the safetensors write "
                          "wrapper (docs/faults.md)", UserWarning)
            import transformers.modeling_utils as mu

            monkeypatch.setattr(mu, "safe_save_file", _fake_enospc_save(400_000))
        rc, err = train(demo_dir, run, "--resume")
        one_line_error(rc, err, "checkpoints/step_2")
        line = next(x for x in err.splitlines() if x.startswith("esreason: error:"))
        assert re.search(r"disk full writing \S+/checkpoints/step_2: tried to write \d+ bytes .*, \d+ bytes .*free there",
                         line), line
        _no_temporaries(run)
        assert not (run / "checkpoints" / "step_2").exists()
        assert verify_checkpoint(run / "checkpoints" / "step_1")  # the previous checkpoint is intact
        if mounted:
            filler.unlink()  # space is freed
        else:
            monkeypatch.undo()
        rc, err = train(demo_dir, run, "--resume")
        assert rc == 0, err
        assert final(run) == final(ref)  # bit-identical to the uninterrupted run
        assert rows(run) == rows(ref)  # no duplicate step: the failed update's row was dropped on resume


def test_replacing_a_checkpoint_on_a_full_disk_keeps_the_previous_one(tmp_path, record_property):
    """atomic_directory over an existing checkpoint on a full disk: DiskFull, the old copy untouched."""
    fs = tmp_path / "fs"
    with small_fs(fs, 2) as mounted:
        record_property("disk_full_path", "tmpfs" if mounted else "wrapper")
        final_dir = fs / "step_1"
        final_dir.mkdir()
        (final_dir / "model.safetensors").write_bytes(b"old")
        with pytest.raises(DiskFull) as info:
            with atomic_directory(final_dir, expected_bytes=4_000_000) as tmp:
                if mounted:
                    (tmp / "model.safetensors").write_bytes(b"\1" * 4_000_000)
                else:
                    (tmp / "model.safetensors").write_bytes(b"\1" * 1000)
                    raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model.safetensors"))
        assert str(final_dir) in str(info.value) and "4000000 bytes" in str(info.value)
        assert (final_dir / "model.safetensors").read_bytes() == b"old"
        assert sorted(p.name for p in fs.iterdir()) == ["step_1"]


def test_atomic_write_and_metrics_rows_on_a_full_disk(tmp_path):
    fs = tmp_path / "fs"
    with small_fs(fs, 1) as mounted:
        if not mounted:
            pytest.skip("needs a mounted tmpfs (the write wrappers are covered by test_detection_and_appends)")
        (fs / "a.json").write_text("old")
        with pytest.raises(DiskFull) as info:
            atomic_write_bytes(fs / "a.json", b"x" * 2_000_000)
        msg = str(info.value)
        assert f"{fs / 'a.json'}: tried to write 2000000 bytes" in msg and "free there" in msg
        assert (fs / "a.json").read_text() == "old" and sorted(p.name for p in fs.iterdir()) == ["a.json"]
        with MetricsLogger(fs / "run", tensorboard=False) as log:
            log.log(1, {"x": 1})
            before = (fs / "run" / "metrics.jsonl").read_bytes()
            fill(fs, leave=4096)
            with pytest.raises(DiskFull, match="metrics.jsonl"):
                log.log(2, {"note": "y" * 100_000})
        assert (fs / "run" / "metrics.jsonl").read_bytes() == before  # no partial row


class _FullFile(io.RawIOBase):
    """A raw file whose writes succeed for ``room`` bytes, then fail with ENOSPC (the fallback wrapper)."""

    def __init__(self, path: Path, room: int) -> None:
        self._fh = open(path, "ab", buffering=0)
        self.room = room

    def writable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def fileno(self) -> int:
        return self._fh.fileno()

    def write(self, data) -> int:
        if self.room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = self._fh.write(bytes(data[: self.room]))
        self.room -= n
        return n


def test_detection_and_appends(tmp_path):
    from safetensors import SafetensorError

    from esreason.io.metrics import append_line

    assert is_disk_full(SafetensorError(SAFETENSORS_ENOSPC))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as exc:
            raise RuntimeError("[enforce fail at inline_container.cc] unexpected pos") from exc
    except RuntimeError as chained:
        assert is_disk_full(chained)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("28 rows"))

    path = tmp_path / "responses.jsonl"
    path.write_text('{"step": 1}\n')
    fh = _FullFile(path, room=5)  # the row's first 5 bytes fit, then the disk is full
    with pytest.raises(DiskFull) as info:
        append_line(fh, path, json.dumps({"step": 2, "text": "abcdefgh"}))
    assert str(path) in str(info.value) and "tried to write 32 bytes" in str(info.value)
    assert path.read_text() == '{"step": 1}\n'  # cut back: no partial row


def test_cli_turns_a_library_enospc_into_one_line(monkeypatch, tmp_path):
    """ENOSPC raised where no writer of ours catches it (a library's own file) is one line, exit 2."""
    from fault_helpers import run_cli

    import esreason.eval.harness as harness

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "lib.bin"))

    monkeypatch.setattr(harness, "_evaluate_locked", full)
    rc, err = run_cli(["eval", "--model", "demo", "--tasks", "demo-add", "--samples", "1", "--limit", "1",
                       "--output", str(tmp_path / "out"), "--no-progress"])
    one_line_error(rc, err, "lib.bin")
    assert "disk full writing" in err and "free there" in err


def test_torch_saves_errno_less_failure_on_a_full_disk_is_one_line(monkeypatch, tmp_path):
    """torch.save (TRL's optimizer state) names no errno; on a nearly full file system it is a full disk."""
    from fault_helpers import run_cli

    import esreason.eval.harness as harness
    import esreason.io.space as space

    def torch_save_failed(*args, **kwargs):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(harness, "_evaluate_locked", torch_save_failed)
    argv = ["eval", "--model", "demo", "--tasks", "demo-add", "--samples", "1", "--limit", "1",
            "--output", str(tmp_path / "out"), "--no-progress"]
    monkeypatch.setattr(space, "free_bytes", lambda path: 4096)  # a full file system
    rc, err = run_cli(argv)
    one_line_error(rc, err, str(tmp_path / "out"))
    monkeypatch.setattr(space, "free_bytes", lambda path: 10 << 30)  # plenty of space: a genuine bug, raised
    with pytest.raises(RuntimeError, match="inline_container"):
        run_cli(argv)
