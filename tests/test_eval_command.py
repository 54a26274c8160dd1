"""`esreason eval`: a real run on a tiny model, and bad input as one-line errors (exit 2)."""

from __future__ import annotations

import json

import pytest

from esreason.cli import main
from esreason.errors import UserError
from esreason.eval.command import parse_ks

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py


def test_eval_command_writes_results(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "ev"
    rc = main(["eval", "--model", str(tiny_model_dir), "--tasks", "demo-add,demo-sub", "--samples", "2",
               "--max-new-tokens", "8", "--limit", "2", "--greedy", "--bootstrap", "50", "--batch-size", "4",
               "--output", str(out), "--no-progress"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| demo-add | 2 |" in printed and "**average**" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ks"] == [1, 2]  # default K in {1, 16, 32} cut at --samples, plus --samples
    assert set(summary["tasks"]) == {"demo-add", "demo-sub"}
    assert "greedy_acc" in summary["metrics"]
    for task in ("demo-add", "demo-sub"):
        assert len((out / task / "responses.jsonl").read_text().splitlines()) == 2 * 3


def _error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("esreason: error: ") and "\n" not in err
    return err


def test_bad_input_is_one_line_exit_2(tmp_path, tiny_model_dir, capsys):
    base = ["eval", "--model", str(tiny_model_dir), "--output", str(tmp_path / "o"), "--no-progress"]
    assert "known tasks:" in _error(capsys, base + ["--tasks", "demo-add,nope"])
    assert "known suites:" in _error(capsys, base + ["--suite", "nope"])
    assert "k=64 exceeds" in _error(capsys, base + ["--tasks", "demo-add", "--k", "1,64"])
    assert "'x' is not an integer" in _error(capsys, base + ["--tasks", "demo-add", "--k", "1,x"])
    assert "data directory not found" in _error(capsys, base + ["--tasks", "demo-add", "--data-dir",
                                                                str(tmp_path / "none")])
    assert "model path not found" in _error(capsys, ["eval", "--model", str(tmp_path / "no-model"), "--tasks",
                                                     "demo-add", "--output", str(tmp_path / "o2")])
    assert not (tmp_path / "o").exists()


def test_parse_ks():
    assert parse_ks("1, 16,32") == (1, 16, 32)
    assert parse_ks(None) is None
    with pytest.raises(UserError):
        parse_ks(",")
