"""Results computed once per test session and shared by every xdist worker (a file cache).

A module fixture is per worker: two test files that need the same trained run would train it
twice, and one file that needs two runs trains them one after the other on one worker. Here a
result is computed by the first worker that asks for it, under a file lock, written atomically as
JSON, and read by every other; a second worker asking meanwhile waits for it. Two files that each
start one of two independent runs therefore train them at the same time on the two cores.

The cache lives in this session's temporary root: under xdist the directory all workers' base
temps share, keyed by the run's ``PYTEST_XDIST_TESTRUNUID``; without xdist the session's own base
temp. Nothing persists across sessions, so every session trains its runs afresh.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from filelock import FileLock


def session_root(tmp_path_factory) -> Path:
    """A directory every worker of this pytest session shares (and no other session)."""
    base = tmp_path_factory.getbasetemp()
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    root = base.parent / f"shared-{uid}" if uid else base / "shared"
    root.mkdir(parents=True, exist_ok=True)
    return root


def shared(tmp_path_factory, name: str, compute: Callable[[Path], dict]) -> dict:
    """The JSON result ``name`` of this session: ``compute(workdir)`` the first time, read after.

    ``compute`` gets a fresh working directory of its own and returns a JSON-serialisable dict.
    """
    root = session_root(tmp_path_factory)
    out = root / f"{name}.json"
    with FileLock(str(root / f"{name}.lock")):
        if out.is_file():
            return json.loads(out.read_text())
        work = root / name
        work.mkdir(exist_ok=True)
        result = compute(work)
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result))
        os.replace(tmp, out)
        return result
