"""Task and suite registry: one public :func:`register`, for the built-in tasks and for users'.

Where tasks come from, in the order they are loaded:

1. the built-ins: the demo families (:mod:`esreason.tasks.synthetic`) and the paper's benchmarks
   (:mod:`esreason.tasks.paper`), each calling :func:`register` at import;
2. plugin packages: every entry point of the group ``esreason.tasks`` (``[project.entry-points]``
   in the plugin's pyproject.toml). The entry point names a callable, called once with no
   arguments, that calls :func:`register` (or :func:`add_tasks_dir` for YAML files it ships), or
   a module whose import registers its tasks;
3. task files: every ``*.yaml`` / ``*.yml`` under the directories given by ``--tasks-dir``, the
   run config's ``tasks_dir`` key, or the environment variable ``ESREASON_TASKS_DIR``
   (``os.pathsep``-separated), parsed by :mod:`esreason.tasks.datafile`.

A task whose name is already registered is refused unless it is registered with
``override=True`` (``override: true`` in a task file). :func:`add_tasks_dir` also records the
directory in ``ESREASON_TASKS_DIR``, so processes esreason starts (accelerate's GRPO processes,
experiment stages) find the same tasks.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path

from esreason.errors import UserError
from esreason.tasks.base import Task

BUILTIN_MODULES = (
    "esreason.tasks.synthetic",   # embedded default families (demo-*)
    "esreason.tasks.paper",       # the paper's benchmarks and training sets
)
#: Entry-point group of plugin packages that register tasks.
ENTRY_POINT_GROUP = "esreason.tasks"
#: Environment variable with task directories (os.pathsep-separated).
TASKS_DIR_ENV = "ESREASON_TASKS_DIR"
BUILTIN = "built-in"

_TASKS: dict[str, Task] = {}
_SOURCES: dict[str, str] = {}
_DIRS: set[Path] = set()
_SKIPPED: list[Path] = []
_loading: str | None = None  # the source label of the tasks being registered right now
_loaded = False

#: Suites by name.
SUITES: dict[str, tuple[str, ...]] = {
    "easy-indomain": ("gsm8k",),
    "easy-heldout": ("csqa", "hotpotqa", "countdown", "gpqa", "mbpp"),
    "hard-math": ("aime24", "aime25", "amc23", "math500"),
    "hard-heldout": ("gpqa", "mbpp", "csqa", "countdown"),
    "demo-indomain": ("demo-add",),
    "demo-heldout": ("demo-sub", "demo-sub3"),
}


def register(task: Task, *, override: bool = False, source: str | None = None) -> Task:
    """Add ``task`` to the registry under ``task.name``; returns it.

    override: replace a task already registered under that name (a built-in included).
    source: where it came from, for ``esreason tasks`` (default: the module or file being loaded,
        else "python").
    """
    if not isinstance(task, Task):
        raise UserError(f"register() takes an esreason.tasks.Task, got {type(task).__name__}")
    if not task.name or any(c.isspace() for c in task.name) or "/" in task.name:
        raise UserError(f"task name {task.name!r}: must be non-empty, without spaces or '/'")
    builtin = getattr(task.loader, "__module__", "") in BUILTIN_MODULES  # imported before the registry loaded
    where = source or _loading or (BUILTIN if builtin else "python")
    old = _TASKS.get(task.name)
    if old is not None and old is not task and not override:
        raise UserError(f"task {task.name!r} ({where}) is already registered ({_SOURCES[task.name]}); "
                        "choose another name, or set override: true to replace it")
    _TASKS[task.name] = task
    _SOURCES[task.name] = where
    return task


def _with_source(label: str, load) -> None:  # type: ignore[no-untyped-def]
    global _loading
    before, _loading = _loading, label
    try:
        load()
    finally:
        _loading = before


def _load_plugins() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        label = f"plugin {ep.dist.name if ep.dist else '?'} ({ep.value})"

        def load(ep=ep, label=label) -> None:  # type: ignore[no-untyped-def]
            try:
                obj = ep.load()
            except Exception as exc:  # a third-party package: name it
                raise UserError(f"task plugin {ep.name!r} ({ep.value}) of entry-point group {ENTRY_POINT_GROUP!r} "
                                f"failed to import: {type(exc).__name__}: {exc}") from exc
            if callable(obj):
                obj()
        _with_source(label, load)


def _load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in BUILTIN_MODULES:
        _with_source(BUILTIN, lambda mod=mod: importlib.import_module(mod))
    _load_plugins()
    for entry in os.environ.get(TASKS_DIR_ENV, "").split(os.pathsep):
        if entry.strip():
            add_tasks_dir(entry.strip())


def add_tasks_dir(path: str | Path) -> list[str]:
    """Register every task file (``*.yaml``, ``*.yml``, searched recursively) under ``path``; returns
    the names registered. Idempotent per directory; the directory is added to ``ESREASON_TASKS_DIR``."""
    from esreason.tasks.datafile import load_task_file

    root = Path(path).expanduser()
    if not root.is_dir():
        raise UserError(f"tasks directory not found: {root}")
    root = root.resolve()
    _load_all()
    if root in _DIRS:
        return []
    _DIRS.add(root)
    current = [p for p in os.environ.get(TASKS_DIR_ENV, "").split(os.pathsep) if p.strip()]
    if str(root) not in current:
        os.environ[TASKS_DIR_ENV] = os.pathsep.join([*current, str(root)])
    added = []
    for file in sorted([*root.rglob("*.yaml"), *root.rglob("*.yml")]):
        if not is_task_file(file):
            _SKIPPED.append(file)
            continue
        task, override = load_task_file(file)
        register(task, override=override, source=f"file {file}")
        added.append(task.name)
    if not added:
        raise UserError(f"tasks directory {root} holds no task file (a *.yaml with top-level keys 'task' and "
                        "'data' or 'dataset')")
    return added


#: Top-level keys only a task file has (no run, experiment or sweep config uses them): a YAML file with
#: ``task`` and one of these is a task file even when ``data`` is misspelt, so the typo is an error.
TASK_FILE_MARKERS = ("data", "dataset", "prompt", "gold", "verifier", "reward", "reward_weights",
                     "pass_threshold", "scorer", "vote")


def is_task_file(file: Path) -> bool:
    """A YAML file under a tasks directory is a task file when its top level has ``task`` and a key only
    task files have (:data:`TASK_FILE_MARKERS`: ``data`` or ``dataset``, ``prompt``, ``reward``, ...).
    Run configs and other YAML files beside it are skipped, and named when a task is not found; a task
    file with a misspelt key (``dat:``) is parsed, and the key named as unknown."""
    import yaml

    try:
        spec = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return True  # load_task_file names what is wrong with it
    return isinstance(spec, dict) and "task" in spec and any(k in spec for k in TASK_FILE_MARKERS)


def names() -> list[str]:
    _load_all()
    return sorted(_TASKS)


def source(name: str) -> str:
    """Where task ``name`` was registered from ("built-in", "file ...", "plugin ...", "python")."""
    get(name)
    return _SOURCES[name]


def get(name: str) -> Task:
    _load_all()
    if name not in _TASKS:
        hint = f"; user tasks: --tasks-dir DIR or {TASKS_DIR_ENV}" if not _DIRS else ""
        if _SKIPPED:
            hint += (f"; not task files (no top-level 'task' with 'data' or 'dataset'): "
                     f"{', '.join(map(str, _SKIPPED[:5]))}")
        raise UserError(f"unknown task {name!r}; known tasks: {', '.join(sorted(_TASKS))}{hint}")
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
