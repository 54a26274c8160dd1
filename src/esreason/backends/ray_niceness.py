"""The CPU priority of esreason's Ray actors: normal (nice 0) unless the user chooses another.

Why. Ray starts every worker process at ``RAY_worker_niceness``, 15 unless set: each worker's core
reads the variable from its own environment when it starts and calls ``nice(value)`` (drivers are
left alone). A worker at nice 15 gets a small share of a core beside any process at normal
priority: on a 2-core machine beside two busy processes the engine actors got a few per cent of a
core each and the Ray pool's tests ran several times slower at nice 15 than at nice 0
(docs/measurements.md). On a GPU node
the engines' CPU side (the decode loop's launches, vLLM's scheduler and tokenisation) competes in
the same way with the driver and its reward pool, which run at normal priority.

How. Every actor esreason starts (ES engine hosts, evaluation engines) carries
``runtime_env={"env_vars": {"RAY_worker_niceness": N}}`` (:func:`actor_runtime_env`). Ray starts
the actor's worker process with the raylet's environment plus these variables, so the setting
holds for a Ray instance esreason starts, for one a test or the user initialised in the process,
and for a cluster joined by ``backend.ray_address`` whatever its ``ray start`` was given (measured
with Ray 2.60: an actor on a ``ray start --head`` cluster reports nice 15 without it and 0 with it;
the per-actor variables are merged with the job's own ``runtime_env`` variables). Ray's other
workers (tasks, other jobs' actors) keep the cluster's setting.

N is the user's ``RAY_worker_niceness`` from the environment esreason runs in, when set (their
choice wins, as with ``GOMP_SPINCOUNT``: :mod:`esreason.openmp`), else :data:`DEFAULT_NICENESS`.
Each engine reports the niceness it got (``os.nice(0)``); where an engine runs at a lower priority
than N on top of the driver's own niceness (a raylet that itself runs niced adds its niceness; a
negative N needs the privilege to raise priority) the pool says so once (:func:`mismatch_warning`).
Processes an actor starts (vLLM's engine core, a tensor-parallel worker) inherit its priority.
docs/internals.md ("Processes and their CPU priority") lists every process esreason starts and the priority each gets.

Stdlib only: ``esreason info`` reads :func:`describe` without importing Ray.
"""

from __future__ import annotations

import os
from typing import Mapping

from esreason.errors import UserError

#: The environment variable Ray's workers read their niceness from (Ray's own name).
ENV = "RAY_worker_niceness"
#: Ray's default when the variable is unset (ray_config_def.h, ``worker_niceness``).
RAY_DEFAULT = 15
#: What esreason's actors run at when the user did not choose: normal priority.
DEFAULT_NICENESS = 0


def worker_niceness(environ: Mapping[str, str] | None = None) -> int:
    """The niceness esreason's actors ask for: the user's ``RAY_worker_niceness`` or 0.

    A value that is not an integer in [-20, 19] is a UserError naming the variable (Ray's worker
    would abort on it at start-up, with the message only in the worker's log)."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_NICENESS
    try:
        value = int(raw.strip())
    except ValueError:
        raise UserError(f"environment variable {ENV}={raw!r}: expected an integer niceness "
                        f"(-20..19; unset means {DEFAULT_NICENESS}, normal priority)") from None
    if not -20 <= value <= 19:
        raise UserError(f"environment variable {ENV}={raw!r}: niceness must be in -20..19")
    return value


def actor_runtime_env(environ: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """The ``runtime_env`` every esreason actor is started with (the module docstring)."""
    return {"env_vars": {ENV: str(worker_niceness(environ))}}


def describe(environ: Mapping[str, str] | None = None) -> str:
    """The priority esreason's Ray actors run at, in any Ray instance or cluster, for ``esreason info``."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV)
    if raw is None or raw.strip() == "":
        return f"nice {DEFAULT_NICENESS} (esreason default; {ENV} unset)"
    try:
        return f"nice {worker_niceness(env)} ({ENV}={raw.strip()})"
    except UserError as exc:
        return f"invalid: {exc}"


def expected_niceness(asked: int, base: int | None = None) -> int:
    """The niceness a worker asking for ``asked`` ends at on a node whose raylet runs at ``base``
    (default: this process's own, which a Ray instance started here inherits): Ray's ``nice()`` call
    adds to the niceness the worker process was started with; the kernel keeps the sum in -20..19."""
    base = os.nice(0) if base is None else base
    return max(-20, min(19, base + asked))


def mismatch_warning(got: Mapping[int, int], expected: int, who: str = "ray pool") -> str | None:
    """One line (prefixed ``who``) when some engines (rank -> the ``os.nice(0)`` they reported) run at
    a lower priority than ``expected`` (:func:`expected_niceness`); None otherwise. A driver started
    under ``nice`` passes its own niceness on to a Ray instance it starts: that is no mismatch."""
    off = {rank: n for rank, n in sorted(got.items()) if n > expected}
    if not off:
        return None
    seen = ", ".join(f"engine {rank}: nice {n}" for rank, n in off.items())
    return (f"{who}: {seen}, not nice {expected} ({ENV}={worker_niceness()} on a node at this driver's "
            f"priority); that node's raylet runs at a lower priority (a worker adds its niceness to the "
            f"raylet's) or the process lacks the privilege to raise priority. Start Ray on those nodes at "
            f"normal priority (`ray start ...`, not under `nice`)")


__all__ = ["DEFAULT_NICENESS", "ENV", "RAY_DEFAULT", "actor_runtime_env", "describe", "expected_niceness",
           "mismatch_warning", "worker_niceness"]
