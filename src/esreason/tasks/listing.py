"""``esreason tasks``: every registered task, with its verifier, splits, suites and source."""

from __future__ import annotations

import json

from esreason.tasks import registry


def task_rows() -> list[dict[str, object]]:
    """One dict per registered task (sorted by name)."""
    suites: dict[str, list[str]] = {}
    for suite, members in registry.SUITES.items():
        for name in members:
            suites.setdefault(name, []).append(suite)
    rows = []
    for name in registry.names():
        task = registry.get(name)
        rows.append({"name": name, "verifier": task.verifier, "splits": list(task.splits),
                     "maj@k": task.votes, "suites": suites.get(name, []), "source": registry.source(name),
                     "description": task.description})
    return rows


def print_tasks(as_json: bool = False) -> int:
    rows = task_rows()
    if as_json:
        print(json.dumps({"tasks": rows}, indent=2))
        return 0
    width = max(len(str(r["name"])) for r in rows)
    for r in rows:
        splits = ",".join(map(str, r["splits"]))  # type: ignore[call-overload]
        print(f"{r['name']:<{width}}  {r['verifier']:<9}  {splits:<16}  {r['source']}")
        if r["description"]:
            print(f"{'':<{width}}  {r['description']}")
    return 0
