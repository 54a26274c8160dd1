"""What a run trains on, beyond its config: a fingerprint of the training data and of the reward.

The run config names the task (``task``, ``data_path``, ``train.split``, ``train.limit``) but not
what is in it: a task file's JSONL, the ``train_dataset`` handed to :class:`esreason.ESTrainer` or the
reward functions can change while every config key stays the same. A run therefore records, in
``manifest.json`` under ``"fingerprint"``:

- ``data``: the number of training problems and a SHA-256 over each problem's id, prompt (messages or
  text) and gold object, in order (the data order of a resumed run is a function of this list);
- ``reward``: the reward functions by name (TRL's name, ``__name__``), their weights, the
  ``pass_threshold`` and the ``answer_fn``; or, for a task with a built-in verifier or a scorer, the
  verifier's name and the scorer's qualified name.

``--resume`` (``train(resume_from_checkpoint=...)``) compares the fingerprint of this invocation
with the run's and refuses a difference in one line naming what changed; ``--accept-task-change``
(``accept_task_change=True``) continues with the new data or reward and records the change in
``manifest.json`` (``"task_changes"``: the step, the old and the new fingerprint).

A function is known by its name, not its code: fixing a bug in a reward function and resuming (the
documented path after a reward error, docs/custom-tasks.md) is not a change; replacing it by another
function is. Runs written before fingerprints existed have none: they resume, and get one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any, Sequence

from esreason.errors import UserError

#: Key of the fingerprint in manifest.json.
FINGERPRINT_KEY = "fingerprint"
#: Key of the list of accepted changes in manifest.json.
CHANGES_KEY = "task_changes"
#: The CLI flag and the API argument that accept a change (named in the refusal).
ACCEPT_FLAG = "--accept-task-change"
ACCEPT_ARG = "accept_task_change=True"


def _plain(value: Any) -> Any:
    """JSON-able form of a gold object (Row and other dataclasses, tuples, numpy scalars)."""
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return repr(value)


def data_fingerprint(problems: Sequence[Any]) -> dict[str, Any]:
    """{"problems": n, "sha256": ...} over each problem's id, messages, text and gold, in order."""
    digest = hashlib.sha256()
    for p in problems:
        item = [p.id, [dict(m) for m in p.messages], p.text, p.gold]
        digest.update(json.dumps(item, sort_keys=True, default=_plain, ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return {"problems": len(problems), "sha256": digest.hexdigest()}


def _qualname(obj: Any) -> str:
    target = obj if callable(obj) and hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(obj).__name__)}"


def reward_fingerprint(task: Any, scorer: Any) -> dict[str, Any]:
    """The reward of ``task`` as ``scorer`` (its built scorer) computes it; see the module docstring."""
    from esreason.verifiers.reward_functions import RewardFunctions, function_name

    if isinstance(scorer, RewardFunctions):
        return {"functions": list(scorer.names), "weights": [float(w) for w in scorer.weights],
                "pass_threshold": scorer.pass_threshold,
                "answer_fn": function_name(scorer.answer_fn) if scorer.answer_fn is not None else None}
    return {"verifier": task.verifier, "scorer": _qualname(scorer)}


def fingerprint(task: Any, problems: Sequence[Any], scorer: Any) -> dict[str, Any]:
    """The run's fingerprint: {"data": ..., "reward": ...}."""
    return {"data": data_fingerprint(problems), "reward": reward_fingerprint(task, scorer)}


def _describe_reward(old: dict[str, Any], new: dict[str, Any]) -> str:
    parts = []
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            parts.append(f"{key} {old.get(key)!r} -> {new.get(key)!r}")
    return "the reward changed (" + "; ".join(parts) + ")"


def changes(saved: dict[str, Any] | None, now: dict[str, Any]) -> list[str]:
    """What differs between a run's saved fingerprint and this invocation's (empty: nothing, or no saved one)."""
    if not isinstance(saved, dict):
        return []
    out = []
    old_data, new_data = saved.get("data") or {}, now["data"]
    if old_data != new_data:
        out.append(f"the training data changed ({old_data.get('problems')} problems, sha256 "
                   f"{str(old_data.get('sha256'))[:12]} -> {new_data['problems']} problems, sha256 "
                   f"{new_data['sha256'][:12]})")
    old_reward = saved.get("reward") or {}
    if old_reward != now["reward"]:
        out.append(_describe_reward(old_reward, now["reward"]))
    return out


def saved_fingerprint(run_path: str | Path) -> dict[str, Any] | None:
    """The fingerprint in ``run_path``'s manifest.json, or None (no manifest, damaged, or none recorded)."""
    from esreason.io.manifest import MANIFEST_FILE
    from esreason.io.verify import DamagedFile, read_json_object

    try:
        manifest = read_json_object(Path(run_path) / MANIFEST_FILE)
    except DamagedFile:
        return None
    found = manifest.get(FINGERPRINT_KEY)
    return found if isinstance(found, dict) else None


def check_task_unchanged(run_path: str | Path, now: dict[str, Any], *, accept: bool) -> list[str]:
    """Refuse a resume whose data or reward differ from the run's (UserError, one line), unless
    ``accept``; returns the accepted changes (empty when nothing changed)."""
    found = changes(saved_fingerprint(run_path), now)
    if found and not accept:
        raise UserError(f"--resume of {run_path}: " + "; ".join(found) + f" since the run started; resume with "
                        f"the same data and reward functions, or pass {ACCEPT_FLAG} ({ACCEPT_ARG} in Python) "
                        "to continue with these")
    return found


def record_fingerprint(manifest: dict[str, Any], now: dict[str, Any], *, at_step: int | None = None,
                       accepted: Sequence[str] = ()) -> dict[str, Any]:
    """``manifest`` with this invocation's fingerprint; an accepted change appended to ``task_changes``."""
    old = manifest.get(FINGERPRINT_KEY)
    manifest[FINGERPRINT_KEY] = now
    if accepted:
        manifest.setdefault(CHANGES_KEY, []).append({"at_step": at_step, "changes": list(accepted),
                                                     "from": old, "to": now})
    return manifest


def update_manifest(run_path: str | Path, now: dict[str, Any], *, at_step: int, accepted: Sequence[str]) -> None:
    """On resume: write this invocation's fingerprint into the run's manifest.json (and the accepted
    change); nothing to do when the fingerprint is already there."""
    from esreason.io.atomic import atomic_write_json
    from esreason.io.manifest import MANIFEST_FILE
    from esreason.io.verify import read_json_object

    path = Path(run_path) / MANIFEST_FILE
    manifest = read_json_object(path)
    if manifest.get(FINGERPRINT_KEY) == now and not accepted:
        return
    atomic_write_json(path, record_fingerprint(manifest, now, at_step=at_step, accepted=accepted))


def add_accept_flag(parser: Any) -> None:
    """``--accept-task-change`` on ``train es`` and ``train grpo``."""
    parser.add_argument(ACCEPT_FLAG, action="store_true",
                        help="with --resume: continue although the training data or the reward functions differ "
                             "from the run's (recorded in manifest.json); without it such a resume is refused")


__all__ = ["ACCEPT_ARG", "ACCEPT_FLAG", "CHANGES_KEY", "FINGERPRINT_KEY", "add_accept_flag", "changes", "check_task_unchanged",
           "data_fingerprint", "fingerprint", "record_fingerprint", "reward_fingerprint", "saved_fingerprint",
           "update_manifest"]
