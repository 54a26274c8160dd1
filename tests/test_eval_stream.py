"""Streamed evaluation on engines: every problem at once, recorded as it completes.

Runs the streamed path of the harness over the HF evaluation engine (our sampler, one seed per row:
batch-invariant, so a streamed, a call-by-call and a resumed evaluation give identical responses),
in process. The Ray fan-out of the stream is in tests/test_vllm_eval.py; the real vLLM engine in
tests/test_vllm_eval_twin.py (``pytest -m vllm``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from esreason.errors import UserError

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

KW = dict(samples=3, limit=5, max_new_tokens=64, greedy=True, progress=False, ci_resamples=0, batch_size=6)


@pytest.fixture()
def hf_engines(monkeypatch):
    """``backend='vllm'`` served by in-process HF evaluation engines (no vLLM needed)."""
    from esreason.backends import eval_pool

    real = eval_pool.build_eval_generator
    monkeypatch.setattr(eval_pool, "build_eval_generator", lambda model, **kw: real(model, kind="hf", **kw))


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _key(row: dict) -> tuple:
    return row["problem_id"], row["greedy"], row["sample"]


def test_streamed_equals_calls_and_records_seeds(hf_engines, tmp_path):
    from esreason.backends.vllm import request_seeds
    from esreason.eval.collect import call_seed
    from esreason.eval.harness import evaluate

    tasks = ["demo-add", "demo-sub"]
    calls = evaluate("demo", tasks, output_dir=tmp_path / "calls", backend="vllm", schedule="calls", **KW)
    stream = evaluate("demo", tasks, output_dir=tmp_path / "stream", backend="vllm", **KW)  # auto: streamed
    for task in tasks:
        a, b = _rows(tmp_path / "calls" / task / "responses.jsonl"), _rows(tmp_path / "stream" / task / "responses.jsonl")
        assert [(_key(r), r["text"], r["num_tokens"], r["correct"]) for r in a] == \
            [(_key(r), r["text"], r["num_tokens"], r["correct"]) for r in b]  # same rows, same file order
        for ra, rb in zip(a, b):
            if not ra["greedy"]:  # entropies of the sampled rows (greedy rows carry none)
                assert rb["entropy_sum"] == pytest.approx(ra["entropy_sum"], rel=1e-12)
        assert all(r["request_seed"] is None for r in a)
        # row j of problem i of call c: request_seeds(call_seed(seed, task, c), rows of c)[i * M + j]
        first = request_seeds(call_seed(0, task, 0), 2 * 3)  # batch 6 // 3 samples = 2 problems per call
        sampled = [r for r in b if not r["greedy"]]
        assert [r["request_seed"] for r in sampled[:6]] == first
        assert [r["request_seed"] for r in b if r["greedy"]][:2] == request_seeds(0, 2)
    assert stream.value("pass@1") == calls.value("pass@1")
    total = json.loads((tmp_path / "stream" / "summary.json").read_text())["timings"]["total"]
    assert total["schedule"] == "stream" and total["problems"] == 10 and total["rows"] == 40
    (engine,) = total["engines"]
    assert engine["rows"] == 40 and engine["groups"] == 10 and 0 < engine["generating_fraction"] <= 1
    per_task = json.loads((tmp_path / "stream" / "summary.json").read_text())["timings"]["demo-add"]
    assert per_task["generate_calls"] == 3 * 2  # the call path's 3 calls of 2 problems (+ greedy calls)
    assert json.loads((tmp_path / "stream" / "manifest.json").read_text())["schedule"] == "stream"
    assert json.loads((tmp_path / "calls" / "manifest.json").read_text())["schedule"] == "calls"


def test_a_kill_mid_stream_resumes_with_one_row_each_and_the_same_responses(hf_engines, tmp_path, monkeypatch):
    """The process dies after three problems were recorded, one more half-written: the rerun keeps the
    recorded ones, samples exactly the rest with the same seeds, and ends with the uninterrupted files."""
    from esreason.eval import results
    from esreason.eval.harness import evaluate

    tasks = ["demo-add", "demo-sub"]
    evaluate("demo", tasks, output_dir=tmp_path / "whole", backend="vllm", **KW)

    real_append = results.ResponsesFile.append
    appended = []

    class Killed(BaseException):
        pass

    def dying_append(self, records):
        records = list(records)
        if len(appended) == 3:  # the 4th problem: half its first line reaches the disk, then the process dies
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(records[0].lines()[0].to_json()[:40])
            raise Killed
        real_append(self, records)
        appended.append(records[0].problem_id)

    monkeypatch.setattr(results.ResponsesFile, "append", dying_append)
    with pytest.raises(Killed):
        evaluate("demo", tasks, output_dir=tmp_path / "cut", backend="vllm", **KW)
    monkeypatch.setattr(results.ResponsesFile, "append", real_append)
    files = list((tmp_path / "cut").glob("*/responses.jsonl"))
    whole_lines = sum(p.read_text().count("\n") for p in files)
    assert whole_lines == 3 * 4  # three problems of 4 rows were recorded before the kill
    assert sum(not p.read_text().endswith("\n") for p in files) == 1  # and one half-written line
    again = evaluate("demo", tasks, output_dir=tmp_path / "cut", backend="vllm", **KW)
    total = json.loads((tmp_path / "cut" / "summary.json").read_text())["timings"]["total"]
    assert total["problems"] == 10 - 3  # only the unrecorded problems were sampled again
    for task in tasks:
        cut, whole = _rows(tmp_path / "cut" / task / "responses.jsonl"), _rows(tmp_path / "whole" / task / "responses.jsonl")
        keys = [_key(r) for r in cut]
        assert len(keys) == len(set(keys)) == 5 * 4  # exactly one row per (problem, sample) and one greedy row
        assert [(_key(r), r["text"]) for r in cut] == [(_key(r), r["text"]) for r in whole]
    assert again.value("pass@1") == evaluate("demo", tasks, output_dir=tmp_path / "whole", backend="vllm",
                                             **KW).value("pass@1")


def test_schedule_is_checked(tmp_path):
    from esreason.eval.harness import evaluate

    with pytest.raises(UserError, match="schedule must be 'auto', 'stream' or 'calls'"):
        evaluate("demo", ["demo-add"], output_dir=tmp_path / "a", schedule="fast", **KW)
    with pytest.raises(UserError, match="schedule 'stream' needs evaluation engines"):
        evaluate("demo", ["demo-add"], output_dir=tmp_path / "b", schedule="stream", **KW)
    assert not (tmp_path / "b" / "summary.json").exists()


def test_stream_counts_and_splits(tmp_path):
    from esreason.backends.eval_stream import RequestGroup, split_groups

    groups = [RequestGroup(i, [1], [i], None) for i in range(7)]
    shares = split_groups(groups, 3)
    assert [[g.key for g in s] for s in shares] == [[0, 3, 6], [1, 4], [2, 5]]  # dealt round-robin
    assert [len(s) for s in split_groups(groups[:2], 4)] == [1, 1]
    assert split_groups([], 2) == []
