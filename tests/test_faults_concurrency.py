"""One writer per directory (docs/faults.md, "Concurrent writers"): commands released by one
barrier into the same directory — exactly one runs, the other exits 2 with one line naming the
directory and the holder; the directory holds one run's rows and config.

Default suite: the lock primitive in 20 barrier-released pairs of light processes, the
in-process rules (re-entry, nesting, a killed holder, forks), and one barrier-released pair
each of ``esreason train es`` and ``esreason eval``. 20 pairs each of ``train es``, ``eval`` and
``experiment run`` (the only test of racing experiments, minutes):
``pytest -m slow tests/test_faults_concurrency.py``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from concurrency_helpers import one_line_refusal, race, serialised, winner_and_loser

from esreason.errors import DirectoryLocked
from esreason.io.lock import LOCK_FILE, directory_lock, has_content, held_directories

pytestmark = pytest.mark.heavy  # the fast subset (`--fast`) leaves this file out: tests/conftest.py

PAIRS = 20


# --------------------------------------------------------------------------- the primitive


def test_twenty_barrier_released_pairs_have_exactly_one_writer(tmp_path):
    rounds = [[["__lock__", str(tmp_path / f"d{i}"), "60"]] * 2 for i in range(PAIRS)]  # held until refused
    results = race(rounds, tmp_path / "work", heavy=False)
    named_pid = 0
    for i, pair in enumerate(results):
        _, loser, _ = winner_and_loser(pair)
        line = one_line_refusal(loser, f"test directory {tmp_path / f'd{i}'} is in use")
        writers = (tmp_path / f"d{i}" / "writers.log").read_text().split()
        assert len(writers) == 1  # the loser never wrote
        named_pid += f"pid {writers[0]} on host {socket.gethostname()}" in line
        assert not (tmp_path / f"d{i}" / LOCK_FILE).exists()  # released: removed under the lock
    assert named_pid == PAIRS  # the holder writes its pid right after flock; a loser waits for it briefly


def test_the_holder_is_named_and_a_killed_holder_does_not_block(tmp_path):
    d = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom esreason.io.lock import directory_lock\n"
                               f"with directory_lock({str(d)!r}):\n    print('held', flush=True)\n    time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(DirectoryLocked) as info:
            with directory_lock(d, what="run directory"):
                pass
        msg = str(info.value)
        assert str(d) in msg and f"pid {holder.pid}" in msg and socket.gethostname() in msg
        assert "\n" not in msg
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (d / LOCK_FILE).exists()  # a killed holder leaves its file ...
    with directory_lock(d):  # ... which blocks nobody: flock died with the process
        assert held_directories() == [Path(os.path.realpath(d))]
    assert not has_content(d)


def test_reentry_nesting_and_cleanup_in_one_process(tmp_path):
    d = tmp_path / "exp"
    with directory_lock(d) as got:
        assert got == d and (d / LOCK_FILE).is_file()
        with directory_lock(d):  # the same process again (a sequence running its stages): no deadlock
            with directory_lock(d / "runs" / "es"):  # a child directory takes its own lock
                assert len(held_directories()) == 2
        assert (d / LOCK_FILE).is_file()  # still held by the outer holder
        (d / "data").write_text("x")
    assert sorted(p.name for p in d.iterdir()) == ["data", "runs"]  # the lock file is gone, the data stay
    with directory_lock(tmp_path / "empty"):
        pass
    assert not (tmp_path / "empty").exists()  # created by the lock, nothing written: removed


def test_a_forked_child_does_not_hold_the_parents_lock(tmp_path):
    d = tmp_path / "run"
    with directory_lock(d):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            code = 0
            try:
                with directory_lock(d):
                    code = 3  # the child must not think it holds the lock
            except DirectoryLocked:
                code = 0
            os._exit(code)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        with pytest.raises(DirectoryLocked):  # the parent still holds it after the child closed its copy
            _other_process_locks(d)


def _other_process_locks(d: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", "import sys\nfrom esreason.io.lock import directory_lock\n"
                           "from esreason.errors import DirectoryLocked\ntry:\n"
                           f"    with directory_lock({str(d)!r}): pass\nexcept DirectoryLocked as e:\n"
                           "    print(e); sys.exit(2)"], capture_output=True, text=True)
    if proc.returncode == 2:
        raise DirectoryLocked(proc.stdout.strip())


def test_a_lock_file_is_not_content(tmp_path):
    (tmp_path / LOCK_FILE).write_text("{}")
    assert not has_content(tmp_path)
    (tmp_path / "metrics.jsonl").write_text("")
    assert has_content(tmp_path)


# --------------------------------------------------------------------------- the commands


def _es_argv(model_dir: str, out: Path, sigma: str) -> list[str]:
    over = [f"model={model_dir}", "task=demo-add", "train.limit=4", "train.batch_size=2", "train.max_steps=2",
            "es.population_size=2", f"es.sigma={sigma}", "es.alpha=0.002", "generation.max_new_tokens=8",
            "checkpoint.every=1"]
    return ["train", "es", *[a for o in over for a in ("--set", o)], "--output", str(out), "--no-progress"]


SIGMAS = ("0.003", "0.005")


def _eval_argv(out: Path) -> list[str]:
    return ["eval", "--model", "demo", "--tasks", "demo-add", "--samples", "2", "--limit", "2", "--max-new-tokens",
            "8", "--bootstrap", "0", "--output", str(out), "--no-progress"]


def _experiment_file(tmp: Path) -> Path:
    spec = {"name": "race", "model": "demo", "task": "demo-add", "updates": 1, "methods": ["es"],
            "configs": {"es": {"model": "demo", "task": "demo-add",
                               "es": {"population_size": 2, "sigma": 2e-3, "alpha": 1e-3},
                               "train": {"batch_size": 2, "limit": 4, "max_steps": 1, "seed": 0},
                               "generation": {"max_new_tokens": 8}, "checkpoint": {"every": 1}}},
            "eval": {"in_domain": ["demo-add"], "held_out": ["demo-sub"], "samples": 2, "ks": [1, 2], "max_new_tokens": 8,
                     "limit": 2, "ci_resamples": 0}}
    path = tmp / "race.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _experiment_argv(spec: Path, out: Path) -> list[str]:
    return ["experiment", "run", str(spec), "--output", str(out), "--no-report", "--no-progress"]


class _References(dict):
    """The final weights of an undisturbed run with a sigma, trained (in this process) when first asked for."""

    def __init__(self, tmp: Path) -> None:
        super().__init__()
        self.tmp = tmp

    def __missing__(self, sigma: str) -> str:
        from fault_helpers import run_cli

        from esreason.embedded import demo_model_dir
        from esreason.io.hashing import hash_directory_safetensors

        out = self.tmp / f"ref-{sigma}"
        rc, err = run_cli(_es_argv(str(demo_model_dir()), out, sigma))
        assert rc == 0, err
        self[sigma] = hash_directory_safetensors(out / "checkpoints" / "step_2")
        return self[sigma]


@pytest.fixture(scope="module")
def es_refs(tmp_path_factory):
    return _References(tmp_path_factory.mktemp("es-refs"))


def check_es_pair(pair, out: Path, refs: dict[str, str]) -> bool:
    """Exactly one run wrote ``out``: steps 1, 2 once each, config.yaml = the manifest's = the winner's sigma,
    the final checkpoint = the undisturbed run with that sigma."""
    from esreason.io.hashing import hash_directory_safetensors

    _, loser, w = winner_and_loser(pair)
    one_line_refusal(loser, str(out))
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config == json.loads((out / "manifest.json").read_text())["config"]
    assert str(config["es"]["sigma"]) == SIGMAS[w]
    assert hash_directory_safetensors(out / "checkpoints" / "step_2") == refs[SIGMAS[w]]
    assert not (out / LOCK_FILE).exists()
    return True  # different configs: a serialised second run is refused too, so every pair counts as raced


def check_eval_pair(pair, out: Path) -> bool:
    """Exactly one row per (problem, sample); True when the pair raced (one refusal), False when the
    machine ran it one after the other (then the second resumed every problem and answered none)."""
    raced = not serialised(pair)
    if raced:
        _, loser, _ = winner_and_loser(pair)
        one_line_refusal(loser, str(out))
    else:  # the summary is the later run's: it found both problems answered
        timings = json.loads((out / "summary.json").read_text())["timings"]["demo-add"]
        assert timings["problems_resumed"] == 2 and timings["responses"] == 0, timings
    rows = [json.loads(x) for x in (out / "demo-add" / "responses.jsonl").read_text().splitlines()]
    keys = [(r["problem_id"], r["greedy"], r["sample"]) for r in rows]
    assert len(keys) == len(set(keys)) == 2 * 2  # exactly one row per (problem, sample)
    return raced


def check_experiment_pair(pair, out: Path) -> bool:
    """One training, one row per (problem, sample); True when the pair raced (see :func:`check_eval_pair`)."""
    raced = not serialised(pair)
    if raced:
        _, loser, _ = winner_and_loser(pair)
        one_line_refusal(loser, str(out))
    record = json.loads((out / "experiment.json").read_text())
    assert sorted(record["methods"]) == ["es"]
    steps = [json.loads(x)["step"] for x in (out / "runs" / "es" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1]
    for task in ("demo-add", "demo-sub"):
        rows = [json.loads(x) for x in (out / "eval" / "es" / task / "responses.jsonl").read_text().splitlines()]
        assert len({(r["problem_id"], r["sample"]) for r in rows}) == len(rows) == 2 * 2
    return raced


KINDS = ("es", "eval", "experiment")


def _run_and_check(n: int, kinds: tuple[str, ...], tmp: Path, refs: dict[str, str]) -> None:
    """``n`` barrier-released pairs of each command in ``kinds``, one pair at a time, all checked."""
    from esreason.embedded import demo_model_dir

    spec, model_dir = _experiment_file(tmp), str(demo_model_dir())
    argvs = {"es": lambda i: [_es_argv(model_dir, tmp / f"es{i}", s) for s in SIGMAS],
             "eval": lambda i: [_eval_argv(tmp / f"eval{i}")] * 2,
             "experiment": lambda i: [_experiment_argv(spec, tmp / f"experiment{i}")] * 2}
    checks = {"es": lambda pair, i: check_es_pair(pair, tmp / f"es{i}", refs),
              "eval": lambda pair, i: check_eval_pair(pair, tmp / f"eval{i}"),
              "experiment": lambda pair, i: check_experiment_pair(pair, tmp / f"experiment{i}")}
    rounds = [(kind, i) for i in range(n) for kind in kinds]
    t0 = time.perf_counter()
    results = race([argvs[kind](i) for kind, i in rounds], tmp / "work")
    seconds = time.perf_counter() - t0
    raced = {kind: 0 for kind in kinds}
    for (kind, i), pair in zip(rounds, results):
        raced[kind] += checks[kind](pair, i)
    print(f"{n} pair(s) each of {', '.join(kinds)}: exactly one writer every time ({seconds:.0f} s); "
          f"pairs that overlapped (one refused): {raced}")
    if n >= PAIRS:  # many rounds: the barrier must produce real races, not only one-after-the-other runs
        assert all(raced[kind] >= n // 2 for kind in kinds), raced


def test_one_simultaneous_pair_of_train_es_and_of_eval(es_refs, tmp_path):
    _run_and_check(1, ("es", "eval"), tmp_path, es_refs)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_twenty_simultaneous_pairs_of_each_command(es_refs, tmp_path):
    """train es, eval and experiment run: 20 barrier-released pairs each (about 15 minutes on 2 cores)."""
    _run_and_check(PAIRS, KINDS, tmp_path, es_refs)


@pytest.mark.parametrize("rank, refused", [(0, True), (1, False)])
def test_only_grpo_rank_0_takes_the_run_directory_lock(tmp_path, monkeypatch, rank, refused):
    """Under accelerate only the main process locks; the other ranks never wait on (or fail at) it."""
    import esreason.grpo.run as grpo_run

    d = tmp_path / "run"
    calls = []
    monkeypatch.setattr(grpo_run, "_run_grpo", lambda cfg, out, **kw: calls.append(out) or "trained")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", str(rank))
    holder = subprocess.Popen([sys.executable, "-c", "import time\nfrom esreason.io.lock import directory_lock\n"
                               f"with directory_lock({str(d)!r}):\n    print('held', flush=True)\n    time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        if refused:
            with pytest.raises(DirectoryLocked, match=f"pid {holder.pid}"):
                grpo_run.run_grpo(None, d)
            assert calls == []
        else:
            assert grpo_run.run_grpo(None, d) == "trained" and calls == [d]
    finally:
        holder.kill()
        holder.wait()


def test_a_file_system_without_flock_warns_once_and_runs_unlocked(tmp_path, monkeypatch, capsys):
    import errno

    import esreason.io.lock as lock

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(lock.fcntl, "flock", no_locks)
    d = tmp_path / "nfs-nolock"
    with directory_lock(d):
        with directory_lock(d):  # re-entry still counted
            (d / "metrics.jsonl").write_text("")
    err = capsys.readouterr().err
    assert err.count("esreason: warning: cannot lock") == 1 and "No locks available" in err
    assert (d / "metrics.jsonl").exists() and not (d / LOCK_FILE).exists()
