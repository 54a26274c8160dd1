"""Start commands truly at once, many times (tests/test_faults_concurrency.py, docs/faults.md).

:func:`race` starts one "zygote" Python process (tests/race_zygote.py) that imports what the
commands need once (torch, transformers, the CLI) and, for every round, forks one child per
command. The children block on reading one pipe; the zygote then closes its write end, so every
child sees end-of-file at the same instant (the barrier) and runs ``esreason ARGV`` (``main``
in the child: the CLI's own error handling, exit status and stderr). Forking from a zygote that
has imported but never run torch is safe and spares every round torch's import time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ZYGOTE = Path(__file__).with_name("race_zygote.py")


@dataclass
class Result:
    """One child of one round: exit status and what it wrote."""

    rc: int
    out: str
    err: str


def race(rounds: list[list[list[str]]], work: Path, *, heavy: bool = True, timeout: float = 1800) -> list[list[Result]]:
    """Run every round's commands at once (one fork per argv, one barrier per round), rounds one after another.

    ``argv`` is an ``esreason`` command line, or ``["__lock__", DIR, HOLD_S]`` for the lock
    primitive alone (take DIR's lock, append this pid to DIR/writers.log, hold HOLD_S seconds).
    ``heavy``: the zygote imports torch/transformers/the CLI before forking (commands); False for
    the primitive.
    """
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "rounds.json"
    spec.write_text(json.dumps({"rounds": rounds, "work": str(work), "heavy": heavy}))
    proc = subprocess.run([sys.executable, str(ZYGOTE), str(spec)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    results = []
    for i, rcs in enumerate(codes):
        results.append([Result(rc, (work / f"r{i}-{j}.out").read_text(), (work / f"r{i}-{j}.err").read_text())
                        for j, rc in enumerate(rcs)])
    return results


def one_line_refusal(result: Result, *needles: str) -> str:
    """The loser of a race: exit 2, exactly one ``esreason: error:`` line naming every needle, no traceback."""
    lines = [x for x in result.err.splitlines() if x.startswith("esreason: error:")]
    assert result.rc == 2, result.err
    assert len(lines) == 1 and all(n in lines[0] for n in needles), result.err
    assert "Traceback" not in result.err, result.err
    return lines[0]


def serialised(pair: list[Result]) -> bool:
    """True when both children of a barrier-released pair exited 0.

    The barrier releases both at one instant, but a loaded machine may schedule one child only after
    the other has finished a short command. Then the second finds the first's complete output and
    resumes it: a correct serialisation, not a race. The caller must then show that the second run
    was a no-op (nothing answered or trained twice); anything else is checked by
    :func:`winner_and_loser`.
    """
    return [r.rc for r in pair] == [0, 0]


def winner_and_loser(pair: list[Result]) -> tuple[Result, Result, int]:
    """(winner, loser, index of the winner) of a pair where exactly one exited 0."""
    rcs = [r.rc for r in pair]
    assert sorted(rcs) == [0, 2], [(r.rc, r.err[-2000:]) for r in pair]
    w = rcs.index(0)
    return pair[w], pair[1 - w], w
