"""Task and suite registry.

Task modules call :func:`register` at import time; :func:`get` imports every
module in ``_TASK_MODULES`` once, so adding a task family means adding its module
name here.
"""

from __future__ import annotations

import importlib

from esreason.errors import UserError
from esreason.tasks.base import Task

_TASK_MODULES = (
    "esreason.tasks.synthetic",   # embedded default families (demo-*)
    "esreason.tasks.paper",       # the paper's benchmarks and training sets
)

_TASKS: dict[str, Task] = {}
_loaded = False

#: Suites by name (issue "Tasks, verifiers and the evaluation harness").
SUITES: dict[str, tuple[str, ...]] = {
    "easy-indomain": ("gsm8k",),
    "easy-heldout": ("csqa", "hotpotqa", "countdown", "gpqa", "mbpp"),
    "hard-math": ("aime24", "aime25", "amc23", "math500"),
    "hard-heldout": ("gpqa", "mbpp", "csqa", "countdown"),
    "demo-indomain": ("demo-add",),
    "demo-heldout": ("demo-sub", "demo-sub3"),
}


def register(task: Task) -> Task:
    if task.name in _TASKS and _TASKS[task.name] is not task:
        raise ValueError(f"task {task.name!r} registered twice")
    _TASKS[task.name] = task
    return task


def _load_all() -> None:
    global _loaded
    if not _loaded:
        for mod in _TASK_MODULES:
            importlib.import_module(mod)
        _loaded = True


def names() -> list[str]:
    _load_all()
    return sorted(_TASKS)


def get(name: str) -> Task:
    _load_all()
    if name not in _TASKS:
        raise UserError(f"unknown task {name!r}; known tasks: {', '.join(sorted(_TASKS))}")
    return _TASKS[name]


def suite(name: str) -> tuple[str, ...]:
    if name not in SUITES:
        raise UserError(f"unknown suite {name!r}; known suites: {', '.join(sorted(SUITES))}")
    return SUITES[name]


def resolve(tasks: str | None = None, suite_name: str | None = None) -> list[str]:
    """Task names from ``--tasks a,b`` or ``--suite NAME`` (exactly one of them)."""
    if (tasks is None) == (suite_name is None):
        raise UserError("give exactly one of --tasks or --suite")
    chosen = list(suite(suite_name)) if suite_name else [t.strip() for t in tasks.split(",") if t.strip()]
    for t in chosen:
        get(t)
    return chosen
