"""Tasks defined by data: YAML task files, the open registry, plugins, `esreason tasks`, one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from esreason.errors import UserError
from esreason.tasks import registry
from esreason.verifiers.reward_functions import RewardFunctions, Row


@pytest.fixture
def clean_registry(monkeypatch):
    """The registry as it was before the test (tests register and override tasks)."""
    registry.names()  # built-ins loaded
    saved = (dict(registry._TASKS), dict(registry._SOURCES), set(registry._DIRS), list(registry._SKIPPED))
    monkeypatch.delenv(registry.TASKS_DIR_ENV, raising=False)
    yield registry
    registry._TASKS.clear(); registry._TASKS.update(saved[0])  # noqa: E702
    registry._SOURCES.clear(); registry._SOURCES.update(saved[1])  # noqa: E702
    registry._DIRS.clear(); registry._DIRS.update(saved[2])  # noqa: E702
    registry._SKIPPED[:] = saved[3]


def write_task(root: Path, name: str, body: str, rows: list[dict] | None = None, file: str | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    for split in ("train", "test"):
        with open(root / "data" / f"{split}.jsonl", "w") as f:
            for r in rows or [{"a": 1, "b": 2, "total": 3}, {"a": 4, "b": 5, "total": 9}]:
                f.write(json.dumps(r) + "\n")
    path = root / (file or f"{name}.yaml")
    path.write_text(f"task: {name}\ndata: {{train: data/train.jsonl, test: data/test.jsonl}}\n" + textwrap.dedent(body))
    return path


REWARD = '''
def total_reward(completions, total, **kwargs):
    return [float(c.strip() == str(t)) for c, t in zip(completions, total)]

def answer(text):
    return text.strip() or None
'''


def test_template_prompt_builtin_verifier_and_text_gold(clean_registry, tmp_path):
    write_task(tmp_path, "my-sum", """
        prompt: {template: "{a}+{b}", system: "Box it."}
        gold: total
        verifier: math
    """)
    assert clean_registry.add_tasks_dir(tmp_path) == ["my-sum"]
    task = clean_registry.get("my-sum")
    p = task.load("test")[0]
    assert p.messages == ({"role": "system", "content": "Box it."}, {"role": "user", "content": "1+2"})
    assert p.gold == "3" and p.text is None  # numbers become the math verifier's text gold
    assert task.scorer()("\\boxed{3}", p.gold).correct
    assert clean_registry.source("my-sum") == f"file {tmp_path.resolve() / 'my-sum.yaml'}"
    assert os.environ[registry.TASKS_DIR_ENV] == str(tmp_path.resolve())


def test_reward_task_from_a_py_file_with_vote_function(clean_registry, tmp_path):
    (tmp_path / "rewards.py").write_text(REWARD)
    write_task(tmp_path, "my-reward", """
        prompt: {template: "{a}+{b}", chat: false}
        reward: rewards.py:total_reward
        vote: rewards.py:answer
    """)
    clean_registry.add_tasks_dir(tmp_path)
    task = clean_registry.get("my-reward")
    p = task.load("train")[1]
    assert p.text == "4+5" and p.messages == () and p.gold == Row("4+5", {"a": 4, "b": 5, "total": 9})
    scorer = task.scorer()
    assert isinstance(scorer, RewardFunctions) and task.votes
    assert [v.reward for v in scorer.score_batch(["9", "8"], [p.gold, p.gold])] == [1.0, 0.0]


def test_regex_vote_and_field_and_messages_prompts(clean_registry, tmp_path):
    write_task(tmp_path / "a", "by-field", """
        prompt: {field: q}
        gold: total
        verifier: math
        vote: {regex: "=(\\\\d+)"}
    """, rows=[{"q": "one plus two", "total": 3}])
    write_task(tmp_path / "b", "by-messages", """
        prompt: {messages: chat}
        gold: total
        verifier: math
    """, rows=[{"chat": [{"role": "user", "content": "hi"}], "total": 3}])
    clean_registry.add_tasks_dir(tmp_path)
    a = clean_registry.get("by-field")
    assert a.load("test")[0].messages == ({"role": "user", "content": "one plus two"},)
    assert a.scorer()("x=1, y=3 \\boxed{3}", "3").extracted == "3"  # the last regex match
    assert clean_registry.get("by-messages").load("test")[0].messages == ({"role": "user", "content": "hi"},)


def test_run_configs_beside_task_files_are_skipped_and_named_when_a_task_is_missing(clean_registry, tmp_path):
    write_task(tmp_path, "real-task", "prompt: {template: '{a}'}\ngold: total\nverifier: math\n")
    (tmp_path / "es.yaml").write_text("model: demo\ntask: real-task\n")
    assert clean_registry.add_tasks_dir(tmp_path) == ["real-task"]
    with pytest.raises(UserError, match=r"unknown task 'nope'.*not task files.*es\.yaml"):
        clean_registry.get("nope")


@pytest.mark.parametrize("body, message", [
    ("prompt: {template: '{a}'}\ngold: total\nverifier: math\nbogus: 1\n", r"key 'bogus': unknown key; known keys"),
    ("prompt: {template: '{a}', colour: red}\ngold: total\nverifier: math\n", r"key 'prompt.colour': unknown key"),
    ("prompt: {template: '{a}'}\ngold: total\nverifier: nope\n", r"key 'verifier': unknown verifier 'nope'"),
    ("prompt: {template: '{a}'}\nreward: no_such_module:fn\n",
     r"key 'reward': no_such_module:fn: cannot import 'no_such_module': ModuleNotFoundError"),
    ("prompt: {template: '{a}'}\nreward: json:no_such_fn\n", r"key 'reward': json:no_such_fn: module 'json' has no "
                                                           r"callable 'no_such_fn'"),
    ("prompt: {template: '{a}'}\nverifier: math\n", r"key 'gold': needed with verifier"),
    ("prompt: {template: '{a}'}\ngold: total\nverifier: math\nreward: json:dumps\n", r"give exactly one of verifier"),
])
def test_bad_task_files_name_the_file_and_the_key(clean_registry, tmp_path, body, message):
    path = write_task(tmp_path, "bad-task", body)
    with pytest.raises(UserError, match=message) as info:
        clean_registry.add_tasks_dir(tmp_path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


def test_a_row_missing_a_template_field_names_file_row_and_field(clean_registry, tmp_path):
    write_task(tmp_path, "holes", "prompt: {template: '{a}+{c}'}\ngold: total\nverifier: math\n")
    clean_registry.add_tasks_dir(tmp_path)
    with pytest.raises(UserError, match=r"train\.jsonl row 1: prompt template needs field 'c'; the row has: a, b, "
                                        r"total"):
        clean_registry.get("holes").load("train")


def test_a_user_task_named_like_a_builtin_is_refused_unless_override(clean_registry, tmp_path):
    write_task(tmp_path / "x", "demo-add", "prompt: {template: '{a}'}\ngold: total\nverifier: math\n")
    with pytest.raises(UserError, match=r"task 'demo-add' \(file .*\) is already registered \(built-in\); "
                                        r"choose another name, or set override: true"):
        clean_registry.add_tasks_dir(tmp_path / "x")
    write_task(tmp_path / "y", "demo-add", "prompt: {template: '{a}'}\ngold: total\nverifier: math\noverride: true\n")
    clean_registry.add_tasks_dir(tmp_path / "y")
    assert clean_registry.source("demo-add").startswith("file ") and len(clean_registry.get("demo-add").load("test")) == 2


def test_builtins_register_through_the_public_register(clean_registry):
    assert clean_registry.source("demo-add") == clean_registry.BUILTIN and clean_registry.source("gsm8k") == "built-in"
    from esreason import register_task
    from esreason.tasks.base import Task

    assert register_task is registry.register
    with pytest.raises(UserError, match="already registered"):
        register_task(Task(name="gsm8k", verifier="math", loader=lambda s, p: []))


def _plugin(root: Path, name: str) -> None:
    """A plugin package installed into ``root`` (an entry point of group esreason.tasks)."""
    pkg = root / f"{name}_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(f"""
        from esreason.tasks import Problem, Task, register

        def setup():
            register(Task(name="{name}", verifier="math", loader=lambda split, path: [
                Problem(task="{name}", id="p0", messages=({{"role": "user", "content": "1+1"}},), gold="2")]))
    """))
    dist = root / f"{name}_pkg-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}-pkg\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[esreason.tasks]\n{name} = {name}_pkg:setup\n")


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "esreason.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def test_esreason_tasks_lists_builtins_plugins_and_files_with_their_source(tmp_path):
    _plugin(tmp_path / "site", "plugged")
    write_task(tmp_path / "tasks", "filed", "prompt: {template: '{a}'}\ngold: total\nverifier: math\n")
    env = {"PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    out = run_cli("tasks", "--json", "--tasks-dir", str(tmp_path / "tasks"), env=env)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)["tasks"]}
    assert rows["demo-add"]["source"] == "built-in" and rows["demo-add"]["suites"] == ["demo-indomain"]
    assert rows["plugged"]["source"] == "plugin plugged-pkg (plugged_pkg:setup)"
    assert rows["filed"]["source"].startswith("file ") and rows["filed"]["verifier"] == "math"


def test_cli_errors_are_one_line_with_exit_2(tmp_path):
    write_task(tmp_path, "t1", "prompt: {template: '{a}'}\ngold: total\nverifier: math\nextra_key: 1\n")
    out = run_cli("tasks", "--tasks-dir", str(tmp_path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert out.stderr.startswith("esreason: error: task file ") and "key 'extra_key'" in out.stderr
    out = run_cli("tasks", "--tasks-dir", str(tmp_path / "missing"))
    assert out.returncode == 2 and "tasks directory not found" in out.stderr
