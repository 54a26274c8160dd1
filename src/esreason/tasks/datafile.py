"""Tasks defined by a YAML file: data, prompt, gold field, verifier or reward, vote key.

A task file (lm-evaluation-harness's idea, our fields; docs/custom-tasks.md has the walk-through)::

    task: digits-add                  # the registry name (required)
    description: 5-digit addition, partial credit per digit
    data:                             # local JSONL / JSON / Parquet per split, relative to this file
      train: data/train.jsonl         # (a directory holding <split>.jsonl works too)
      test: data/test.jsonl
    # or a hub dataset: dataset: {path: openai/gsm8k, name: main, splits: {train: train, test: test}}
    prompt:
      template: "{a}+{b}"             # str.format over the row's fields -> the user message
      system: "Please reason step by step."   # optional system message
      # or  field: question           (a text field is the user message)
      # or  messages: chat            (a field holding a list of {role, content} messages)
      # chat: false                   (a plain-text prompt, no chat template; TRL's "standard" format)
    gold: answer                      # the field the verifier compares with
    verifier: math                    # a built-in verifier (esreason tasks --verifiers lists them)
    # or  reward: reward.py:digit_reward     TRL-signature reward function(s); a list is combined with
    #     reward_weights: [1.0]              reward_weights as TRL combines them
    #     pass_threshold: 1.0                (a sample is correct when its reward >= this)
    # or  scorer: mypkg.scoring:score  score(response, gold) -> esreason.verifiers.Verdict
    vote: builtin                     # Maj@K key: builtin | {regex: "\\\\boxed\\{([^}]*)\\}"} | module:function
    id: uid                           # optional: a field with unique row ids (default: row order)
    override: false                   # true: replace a task of the same name (a built-in included)

``module:function`` names an importable module or a ``.py`` file relative to the task file, and
a function in it; the task file's directory is put on ``sys.path`` so a module beside it imports.
Unknown keys, missing fields and functions that do not import are errors naming the file and key.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any, Callable, Hashable, Mapping

import yaml

from esreason.errors import UserError
from esreason.tasks.base import Problem, Task
from esreason.tasks.sources import RawRow, Source, check_unique_ids, load_rows, read_file, resolve_local

KEYS = ("task", "description", "data", "dataset", "prompt", "gold", "verifier", "reward", "reward_weights",
        "pass_threshold", "scorer", "vote", "id", "override")
PROMPT_KEYS = ("template", "field", "messages", "system", "chat")
DATASET_KEYS = ("path", "name", "splits")
#: Verifiers whose gold is a string: numbers in the data are compared as their text.
_TEXT_GOLD = ("math", "choice", "hotpotqa")


class TaskFileError(UserError):
    """A task file that cannot be used: the message names the file and the key."""


def _fail(file: Path, key: str, msg: str) -> TaskFileError:
    return TaskFileError(f"task file {file}: key '{key}': {msg}")


def resolve_callable(spec: Any, file: Path, key: str) -> Callable[..., Any]:
    """``module:function`` (or ``file.py:function`` relative to the task file) as a callable."""
    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise _fail(file, key, f"expected 'module:function' or 'file.py:function', got {spec!r}")
    module_name, attr = spec.split(":")
    base = file.parent
    try:
        if module_name.endswith(".py"):
            path = (base / module_name).resolve()
            if not path.is_file():
                raise _fail(file, key, f"{spec}: file {path} not found")
            name = f"_esreason_task_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
            module = sys.modules.get(name)
            if module is None:
                loader_spec = importlib.util.spec_from_file_location(name, path)
                assert loader_spec is not None and loader_spec.loader is not None
                module = importlib.util.module_from_spec(loader_spec)
                sys.modules[name] = module  # functions pickle by reference in this process
                try:
                    loader_spec.loader.exec_module(module)
                except Exception:
                    del sys.modules[name]
                    raise
        else:
            if str(base) not in sys.path:
                sys.path.insert(0, str(base))  # a module beside the task file imports
            module = importlib.import_module(module_name)
    except TaskFileError:
        raise
    except Exception as exc:  # the user's module: name it and why it did not import
        raise _fail(file, key, f"{spec}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    func = getattr(module, attr, None)
    if func is None or not callable(func):
        raise _fail(file, key, f"{spec}: module {module_name!r} has no callable {attr!r}")
    return func


def _vote_fn(spec: Any, file: Path) -> Callable[[str], Hashable | None] | None:
    """The completion -> answer function of ``vote:`` (None: the verifier's own key)."""
    if spec is None or spec == "builtin":
        return None
    if isinstance(spec, Mapping):
        if set(spec) != {"regex"}:
            raise _fail(file, "vote", f"a mapping takes one key, 'regex' (got {', '.join(map(str, spec))})")
        try:
            pattern = re.compile(str(spec["regex"]))
        except re.error as exc:
            raise _fail(file, "vote.regex", f"invalid regular expression: {exc}") from None

        def last_match(text: str) -> str | None:
            found = None
            for found in pattern.finditer(text):
                pass
            if found is None:
                return None
            return (found.group(1) if pattern.groups else found.group(0)).strip()
        last_match.__name__ = "vote_regex"
        return last_match
    return resolve_callable(spec, file, "vote")


class _PromptBuilder:
    """Builds a problem's messages (or plain text) from a row, naming the row on errors."""

    def __init__(self, spec: Any, file: Path) -> None:
        if not isinstance(spec, Mapping):
            raise _fail(file, "prompt", f"expected a mapping with one of template / field / messages, got {spec!r}")
        unknown = sorted(set(spec) - set(PROMPT_KEYS))
        if unknown:
            raise _fail(file, f"prompt.{unknown[0]}", f"unknown key; known: {', '.join(PROMPT_KEYS)}")
        given = [k for k in ("template", "field", "messages") if k in spec]
        if len(given) != 1:
            raise _fail(file, "prompt", "give exactly one of template, field, messages")
        self.kind, self.value = given[0], spec[given[0]]
        if not isinstance(self.value, str) or not self.value:
            raise _fail(file, f"prompt.{self.kind}", f"expected a non-empty string, got {self.value!r}")
        self.system = spec.get("system")
        if self.system is not None and not isinstance(self.system, str):
            raise _fail(file, "prompt.system", f"expected a string, got {self.system!r}")
        self.chat = spec.get("chat", True)
        if not isinstance(self.chat, bool):
            raise _fail(file, "prompt.chat", f"expected true/false, got {self.chat!r}")
        if not self.chat and (self.kind == "messages" or self.system is not None):
            raise _fail(file, "prompt.chat", "a plain-text prompt (chat: false) takes a template or a field, "
                                             "without a system message")

    def __call__(self, row: RawRow) -> tuple[tuple[dict[str, str], ...], str | None]:
        where = f"{row.origin} row {row.number}"
        if self.kind == "messages":
            msgs = row.data.get(self.value)
            if not isinstance(msgs, list) or not all(isinstance(m, Mapping) and isinstance(m.get("role"), str)
                                                     and isinstance(m.get("content"), str) for m in msgs):
                raise UserError(f"{where}: field '{self.value}' must be a list of {{role, content}} messages")
            messages = [{"role": m["role"], "content": m["content"]} for m in msgs]
        else:
            if self.kind == "template":
                try:
                    content = self.value.format_map(dict(row.data))
                except KeyError as exc:
                    raise UserError(f"{where}: prompt template needs field {exc.args[0]!r}; the row has: "
                                    f"{', '.join(sorted(row.data))}") from None
                except (IndexError, ValueError) as exc:
                    raise UserError(f"{where}: prompt template {self.value!r}: {exc}") from None
            else:
                content = row.data.get(self.value)
                if not isinstance(content, str):
                    raise UserError(f"{where}: field '{self.value}' must be a string (got {content!r:.60}); "
                                    f"the row has: {', '.join(sorted(row.data))}")
            if not self.chat:
                return (), content
            messages = [{"role": "user", "content": content}]
        if self.system is not None:
            messages.insert(0, {"role": "system", "content": self.system})
        return tuple(messages), None


def load_task_file(file: str | Path) -> tuple[Task, bool]:
    """Parse a task file into a :class:`Task` (not yet registered) and its ``override`` flag."""
    from esreason.verifiers.reward_functions import RESERVED, RewardFunctions, Row

    file = Path(file).resolve()
    try:
        spec = yaml.safe_load(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskFileError(f"task file {file}: cannot read ({exc})") from None
    except yaml.YAMLError as exc:
        raise TaskFileError(f"task file {file}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(spec, Mapping):
        raise TaskFileError(f"task file {file}: top level must be a mapping")
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        import difflib

        near = difflib.get_close_matches(str(unknown[0]), KEYS, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise _fail(file, unknown[0], f"unknown key{hint}; known keys: {', '.join(KEYS)}")
    name = spec.get("task")
    if not isinstance(name, str) or not name:
        raise _fail(file, "task", f"expected the task's name, got {name!r}")
    override = spec.get("override", False)
    if not isinstance(override, bool):
        raise _fail(file, "override", f"expected true/false, got {override!r}")
    source, local = _data_source(spec, file, name)
    prompt = _PromptBuilder(spec.get("prompt"), file)
    kinds = [k for k in ("verifier", "reward", "scorer") if spec.get(k) is not None]
    if len(kinds) != 1:
        raise _fail(file, "verifier", "give exactly one of verifier (a built-in name), reward (TRL reward "
                                      "functions) or scorer (module:function returning a Verdict)")
    kind = kinds[0]
    for key in ("reward_weights", "pass_threshold"):
        if key in spec and kind != "reward":
            raise _fail(file, key, "only used with reward:")
    gold_field = spec.get("gold")
    if gold_field is None and kind != "reward":
        raise _fail(file, "gold", f"needed with {kind}: (the field the answer is checked against)")
    if gold_field is not None and not isinstance(gold_field, str):
        raise _fail(file, "gold", f"expected a field name, got {gold_field!r}")
    id_field = spec.get("id")
    if id_field is not None and not isinstance(id_field, str):
        raise _fail(file, "id", f"expected a field name, got {id_field!r}")
    answer_fn = _vote_fn(spec.get("vote"), file)

    verifier_name, factory, votes = "reward", None, True
    if kind == "verifier":
        from esreason import verifiers

        verifier_name = spec["verifier"]
        if not isinstance(verifier_name, str) or verifier_name not in verifiers.names():
            raise _fail(file, "verifier", f"unknown verifier {verifier_name!r}; known: "
                                          f"{', '.join(verifiers.names())}")
        if answer_fn is not None:
            factory = _with_answer(lambda fr, tok: verifiers.get(verifier_name, format_reward=fr), answer_fn)
    elif kind == "scorer":
        scorer = resolve_callable(spec["scorer"], file, "scorer")
        verifier_name = "scorer"
        factory = _with_answer(lambda fr, tok: scorer, answer_fn) if answer_fn else (lambda fr, tok: scorer)
    else:
        specs = spec["reward"] if isinstance(spec["reward"], list) else [spec["reward"]]
        funcs = [resolve_callable(s, file, "reward") for s in specs]
        weights = spec.get("reward_weights")
        if weights is not None and (not isinstance(weights, list) or len(weights) != len(funcs)
                                    or not all(isinstance(w, (int, float)) and not isinstance(w, bool)
                                               for w in weights)):
            raise _fail(file, "reward_weights", f"expected {len(funcs)} numbers, got {weights!r}")
        threshold = spec.get("pass_threshold", 1.0)
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise _fail(file, "pass_threshold", f"expected a number, got {threshold!r}")
        votes = answer_fn is not None

        def factory(fr: float, tok: Any = None) -> Any:
            return RewardFunctions(funcs, weights=weights, pass_threshold=float(threshold), answer_fn=answer_fn,
                                   tokenizer=tok)

    def convert(row: RawRow, split: str) -> Problem:
        messages, text = prompt(row)
        where = f"{row.origin} row {row.number}"
        if kind == "reward":
            bad = sorted(set(row.data) & set(RESERVED))
            if bad:
                raise UserError(f"{where}: column {bad[0]!r} is reserved for the reward functions' own arguments; "
                                "rename it")
            columns = {k: v for k, v in row.data.items() if k != "prompt"}
            gold: Any = Row(prompt=list(messages) if text is None else text, columns=columns)
        else:
            if gold_field not in row.data:
                raise UserError(f"{where}: no gold field {gold_field!r}; the row has: {', '.join(sorted(row.data))}")
            gold = row.data[gold_field]
            if verifier_name in _TEXT_GOLD and isinstance(gold, (int, float)) and not isinstance(gold, bool):
                gold = str(gold)
        if id_field is not None:
            if id_field not in row.data:
                raise UserError(f"{where}: no id field {id_field!r}; the row has: {', '.join(sorted(row.data))}")
            pid = str(row.data[id_field])
        else:
            pid = f"{name}-{split}-{row.index}"
        return Problem(task=name, id=pid, messages=messages, gold=gold, text=text,
                       meta={"source": row.origin, "row": row.number})

    def loader(split: str, data_path: Path | None) -> list[Problem]:
        if data_path is not None:
            rows = read_file(resolve_local(name, split, data_path, source))
        elif local is not None:
            if split not in local:
                raise UserError(f"task {name!r} (file {file}) has no split {split!r}; known: {', '.join(local)}")
            rows = read_file(resolve_local(name, split, local[split], source))
        else:
            rows = load_rows(name, split, None, source)
        problems = [convert(r, split) for r in rows]
        check_unique_ids([(p.id, r) for p, r in zip(problems, rows)])
        return problems

    task = Task(name=name, verifier=verifier_name, loader=loader, splits=tuple(source.splits),
                vote_key=_strip, description=str(spec.get("description") or f"user task ({file.name})"),
                scorer_factory=factory, votes=votes)
    return task, override


def _strip(answer: str | None) -> str | None:
    return None if answer is None else answer.strip() or None


def _with_answer(make: Callable[[float, Any], Any], answer_fn: Callable[[str], Hashable | None]
                 ) -> Callable[[float, Any], Any]:
    """A scorer factory whose verdicts carry ``answer_fn(text)`` as the extracted answer (Maj@K's key)."""
    from dataclasses import replace

    def factory(format_reward: float, tokenizer: Any = None) -> Any:
        inner = make(format_reward, tokenizer)

        def scorer(text: str, gold: Any) -> Any:
            answer = answer_fn(text)
            return replace(inner(text, gold), extracted=None if answer is None else
                           (answer if isinstance(answer, str) else repr(answer)))
        return scorer
    return factory


def _data_source(spec: Mapping[str, Any], file: Path, name: str) -> tuple[Source, dict[str, Path] | None]:
    """(the :class:`Source` for hub loading and split names, local paths per split or None)."""
    data, hub = spec.get("data"), spec.get("dataset")
    if (data is None) == (hub is None):
        raise _fail(file, "data", "give exactly one of data (local files per split) or dataset (a hub dataset)")
    if data is not None:
        if not isinstance(data, Mapping) or not data or not all(isinstance(k, str) and isinstance(v, str)
                                                                for k, v in data.items()):
            raise _fail(file, "data", f"expected a mapping of split name to file, got {data!r}")
        local = {split: (file.parent / path) for split, path in data.items()}
        for split, path in local.items():
            if not path.exists():
                raise _fail(file, f"data.{split}", f"file not found: {path}")
        return Source(hub_id=f"(local files of {file.name})", config=None, splits={s: s for s in local}), local
    if not isinstance(hub, Mapping) or "path" not in hub:
        raise _fail(file, "dataset", f"expected a mapping with path (and optional name, splits), got {hub!r}")
    unknown = sorted(set(hub) - set(DATASET_KEYS))
    if unknown:
        raise _fail(file, f"dataset.{unknown[0]}", f"unknown key; known: {', '.join(DATASET_KEYS)}")
    splits = hub.get("splits") or {"train": "train", "test": "test"}
    if not isinstance(splits, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in splits.items()):
        raise _fail(file, "dataset.splits", f"expected a mapping of our split name to the hub's, got {splits!r}")
    return Source(hub_id=str(hub["path"]), config=hub.get("name"), splits=dict(splits)), None


__all__ = ["TaskFileError", "load_task_file", "resolve_callable"]
