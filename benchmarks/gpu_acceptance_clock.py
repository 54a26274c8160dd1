"""Deadlines of the GPU acceptance (benchmarks/gpu_acceptance.py): one budget, the time left handed
to every child process as it starts, and sections that do not fit reported as not started.

- :class:`Budget`: seconds since the script started (``ESREASON_ACCEPTANCE_T0``, set by
  scripts/gpu-acceptance.sh before it installs the wheels, so the installation counts) and what is
  left of ``budget_s``; no budget: nothing is ever left out.
- :func:`run_child`: one child process in its own process group, stdout and stderr to files (no
  pipe can hold it open), with the time left at its start as its timeout; at the timeout, or when
  it exits, the whole group is killed, so nothing it started runs past the deadline. Every child is
  recorded (label, started, timeout, ended, exit, stopped at the deadline).
- :class:`Recorder`: the result object, rewritten after every section (a killed run keeps what it
  did). A section runs only when its estimate fits the time left; otherwise it is reported as
  ``not started`` with its estimate and the time left. A section whose packages failed to import in
  the preflight is ``skipped`` with the import error as its reason. A section's ``status``: ``done``,
  ``failed``, ``stopped at the deadline`` (a child of it was; listed with the failed), ``not started``
  or ``skipped``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

ROOT = Path(__file__).resolve().parents[1]
T0_ENV = "ESREASON_ACCEPTANCE_T0"
#: A section's status when one of its children was stopped at the deadline (it counts as failed).
STOPPED = "stopped at the deadline"


class SectionError(RuntimeError):
    """A child command failed or was stopped: the message names it and ends with its stderr's last lines.
    ``stopped``: it was stopped at the deadline."""

    def __init__(self, message: str, stopped: bool = False) -> None:
        super().__init__(message)
        self.stopped = stopped


class Budget:
    """Seconds since ``t0`` (epoch seconds; default: now) and what is left of ``budget_s`` (None: no limit)."""

    def __init__(self, budget_s: float | None, t0: float | None = None, now: Callable[[], float] = time.time) -> None:
        self.budget_s, self.now = budget_s, now
        self.t0 = now() if t0 is None else t0

    def elapsed(self) -> float:
        return self.now() - self.t0

    def left(self) -> float:
        return float("inf") if self.budget_s is None else self.budget_s - self.elapsed()


def script_t0(env: Mapping[str, str] | None = None) -> float | None:
    """The script's start (``ESREASON_ACCEPTANCE_T0``, epoch seconds), or None when unset or unreadable."""
    raw = (os.environ if env is None else env).get(T0_ENV, "")
    try:
        return float(raw) if raw.strip() else None
    except ValueError:
        return None


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone already


def _tail(path: Path, lines: int = 6) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def run_child(argv: Sequence[str], budget: Budget, label: str, logs: Path, children: list[dict[str, Any]],
              env: Mapping[str, str] | None = None) -> float:
    """Run ``argv`` with the time left as its timeout; its wall seconds. SectionError on a non-zero exit,
    on the deadline (the process group killed) or when no time is left to start it."""
    left = budget.left()
    if left <= 0:
        raise SectionError(f"{label}: not started, the budget of {budget.budget_s:.0f} s is spent", stopped=True)
    timeout = None if left == float("inf") else left
    logs.mkdir(parents=True, exist_ok=True)
    stem = f"{len(children):02d}-" + "".join(c if c.isalnum() else "-" for c in label)[:40]
    out_path, err_path = logs / f"{stem}.out", logs / f"{stem}.err"
    start = budget.elapsed()
    stopped = False
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(list(argv), stdout=out, stderr=err, cwd=ROOT, start_new_session=True,
                                env=dict(os.environ if env is None else env))
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            stopped = True
            _kill_group(proc.pid)
            code = proc.wait()
        _kill_group(proc.pid)  # whatever the child started and left behind
    end = budget.elapsed()
    children.append({"label": label, "started_s": round(start, 3), "timeout_s": None if timeout is None else
                     round(timeout, 3), "ended_s": round(end, 3), "exit": code, "stopped_at_deadline": stopped})
    if stopped:
        raise SectionError(f"{label}: stopped at the deadline ({budget.budget_s:.0f} s budget) after {end - start:.0f} s "
                           f"of its {timeout:.0f} s: {' '.join(argv)}: {_tail(err_path)}", stopped=True)
    if code != 0:
        raise SectionError(f"{label}: exit {code}: {' '.join(argv)}: {_tail(err_path)}")
    return end - start


class Children:
    """The driver's child processes: one budget, one log directory, one record list."""

    def __init__(self, budget: Budget, logs: Path, records: list[dict[str, Any]]) -> None:
        self.budget, self.logs, self.records = budget, logs, records

    def run(self, argv: Sequence[str], label: str, env: Mapping[str, str] | None = None) -> float:
        return run_child(argv, self.budget, label, self.logs, self.records, env)


class Recorder:
    """The result object, written to ``path`` after every section; sections run in the order called."""

    def __init__(self, path: Path | None, head: dict[str, Any], budget: Budget) -> None:
        self.path, self.budget = path, budget
        self.result: dict[str, Any] = dict(head)
        self.result.update(budget_s=budget.budget_s, section_s={}, estimates_s={}, order=[], failed=[],
                           not_started=[], skipped=[], children=[])

    @property
    def children(self) -> list[dict[str, Any]]:
        return self.result["children"]

    def section(self, name: str, estimate_s: float, fn: Callable[[], dict[str, Any]],
                missing: str | None = None) -> dict[str, Any]:
        """Run ``fn`` as section ``name`` if its packages import (``missing``: why not) and its estimate
        fits the time left; record it in every case."""
        left = self.budget.left()
        self.result["order"].append(name)
        self.result["estimates_s"][name] = estimate_s
        if missing is not None:
            out = {"status": "skipped", "reason": missing, "ok": False}
            self.result["skipped"].append(name)
        elif estimate_s > left:
            out = {"status": "not started", "estimate_s": estimate_s, "left_s": round(left, 1), "ok": False,
                   "reason": f"its estimate ({estimate_s:.0f} s) exceeds the time left ({max(left, 0):.0f} s)"}
            self.result["not_started"].append(name)
        else:
            t0 = time.perf_counter()
            status = None
            try:
                out = fn()
            except Exception as exc:  # noqa: BLE001 -- every section reports, failed ones included
                out = {"error": f"{type(exc).__name__}: {exc}", "ok": False}
                status = STOPPED if getattr(exc, "stopped", False) else None
            out = {**out, "status": status or ("done" if out.get("ok") else "failed")}
            self.result["section_s"][name] = time.perf_counter() - t0
            if not out["ok"]:
                self.result["failed"].append(name)
        self.result[name] = out
        self.write()
        return out

    def write(self) -> None:
        self.result["total_s"] = self.budget.elapsed()
        self.result["ok"] = not (self.result["failed"] or self.result["not_started"] or self.result["skipped"])
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.result, indent=2, default=str))
            os.replace(tmp, self.path)
