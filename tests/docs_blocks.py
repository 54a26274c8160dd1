"""Run the code blocks of README.md and docs/*.md as a reader would: in order, page by page, in a fresh copy
of the tree (tests/test_docs_run.py runs every page; tests/test_docs_blocks.py checks the markers and this
runner).

Blocks are found by markdown-it-py, the CommonMark parser (fences inside lists and quotes, info strings
and line numbers exactly as a renderer sees them). Neither pytest-markdown-docs nor mktestdocs fits the
rest: both run Python blocks (mktestdocs also bash) one at a time in the test's own process and
directory, while a page here is a session (a ``cd`` in one block holds for the next, a Python block uses
the names an earlier one defined, a command reads the run an earlier one wrote), and blocks that need a
GPU or the hub run in a CPU-twin or parse-only form. So the parsing is the library's and the ~200 lines
below are the session.

What a block is, by its info string:

- ``bash``: run with ``bash -e -o pipefail`` in the page's working directory (it carries over to the next
  block). ``python``: executed in one interpreter per page (names carry over), with the working directory
  on ``sys.path``. ``yaml``: a configuration, checked against its schema (a run config, GRPO config,
  experiment, sequence or task file, told apart by its keys; a fragment is merged into the defaults).
  ``json``/``toml``: parsed. ``text``: output, trees, messages; not run. A block with no info string fails
  the check: say what it is.

A block that cannot run here says so on its first line, visibly, in one of these forms:

- ``# [CI runs this with ARGS: REASON]``: every ``esreason`` command of the block runs with ``ARGS``
  appended (its CPU twin, or a short variant the page describes);
- ``# [CI parses this only: REASON]``: every ``esreason`` command (also inside ``accelerate launch ... -m
  esreason.cli``) is parsed against the CLI and its ``--config`` file loaded with its ``--set`` overrides
  against the schema; ``python SCRIPT.py ARGS`` runs the script only up to its argparse parsing (an unknown
  flag fails), ``bash SCRIPT.sh`` is checked with ``bash -n``; other programs (``ray``, ``pip``, ``wget``) are
  not run;
- ``# [CI runs these lines in .ci/run]``: each command line of the block is a line of ``.ci/run`` (the
  README's install and test commands, which CI runs as written on a clean clone).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = ("README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")))
RUN_LANGS = {"bash", "python"}
CHECK_LANGS = {"yaml", "json", "toml"}
QUIET_LANGS = {"text"}
MARKER = re.compile(r"^#\s*\[CI (?:(?P<twin>runs this with (?P<args>.+?): )|(?P<parse>parses this only: )|"
                    r"(?P<ci>runs these lines in \.ci/run))(?P<reason>[^\]]*)\]\s*$")


class DocsError(AssertionError):
    """A block that fails, or that does not say what it is."""


@dataclass(frozen=True)
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    mode: str = "run"  # run | twin | parse | ci
    args: str = ""
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: str, text: str | None = None) -> list[Block]:
    """The fenced code blocks of ``page`` (a path relative to the repository, or ``text`` given)."""
    from markdown_it import MarkdownIt

    text = (REPO / page).read_text(encoding="utf-8") if text is None else text
    out = []
    for tok in MarkdownIt("commonmark").parse(text):
        if tok.type != "fence":
            continue
        lang = tok.info.split()[0] if tok.info.strip() else ""
        first = next((ln.strip() for ln in tok.content.splitlines() if ln.strip()), "")
        mode, args, reason = "run", "", ""
        if first.startswith("# [CI"):
            m = MARKER.match(first)
            if not m:
                raise DocsError(f"{page}:{tok.map[0] + 1}: a CI marker of an unknown form: {first!r} "
                                "(tests/docs_blocks.py lists the forms)")
            mode = "twin" if m["twin"] else "parse" if m["parse"] else "ci"
            args, reason = (m["args"] or "").strip(), m["reason"].strip()
        out.append(Block(page, tok.map[0] + 1, lang, tok.content, mode, args, reason))
    return out


def check_labels(block: Block) -> None:
    """DocsError unless ``block`` says what it is and its marker suits its language."""
    if block.lang not in RUN_LANGS | CHECK_LANGS | QUIET_LANGS:
        raise DocsError(f"{block.where}: a code block labelled {block.lang!r}: label it bash, python, yaml, "
                        "json, toml or text (text: output and listings, not run)")
    if block.mode != "run" and not (block.lang == "bash" or (block.lang == "python" and block.mode == "parse")):
        raise DocsError(f"{block.where}: a {block.lang} block takes no '{block.mode}' marker (bash blocks take "
                        "every form; Python blocks run as written or are parsed only)")
    if block.mode in ("twin", "parse") and not block.reason:
        raise DocsError(f"{block.where}: the marker must say why the block cannot run as written")
    if block.lang == "bash" and block.mode in ("run", "twin") and re.search(r"(^|[\s;&|(])pip3?\s+install\b",
                                                                              block.code, re.M):
        # Run in the page's copy of the tree, `pip install -e` would re-point the environment's editable
        # install at that copy, which is deleted after the page: every later test would lose esreason.
        raise DocsError(f"{block.where}: a block that runs `pip install` would change the environment the docs "
                        "run in: mark it '# [CI parses this only: ...]' or '# [CI runs these lines in .ci/run]'")


# --------------------------------------------------------------------------- checking configurations


def check_yaml(block: Block, cwd: Path = REPO) -> str:
    """Validate a YAML block against the schema its keys name (relative paths from ``cwd``); returns the
    schema's name."""
    import yaml

    from esreason.config import ConfigError
    from esreason.errors import UserError

    data = yaml.safe_load(block.code)
    if not isinstance(data, dict):
        raise DocsError(f"{block.where}: a YAML block that is not a mapping")
    try:
        return _validate(data, block.code, cwd)
    except (ConfigError, UserError, ValueError, TypeError, KeyError) as exc:
        raise DocsError(f"{block.where}: {type(exc).__name__}: {exc}") from None


def _validate(data: dict, text: str, cwd: Path) -> str:
    from esreason.config import RunConfig, build, merge, to_dict

    if "stages" in data:
        from esreason.experiments.sequence import plan_sequence

        plan_sequence(merge({"es": str(REPO / "configs/demo/es.yaml"), "grpo": str(REPO / "configs/demo/grpo.yaml")},
                            data), cwd)
        return "sequence"
    if {"methods", "configs", "analysis", "variants", "updates"} & data.keys():
        from esreason.experiments.spec import parse_spec

        base = {"name": "docs", "model": "demo", "task": "demo-add", "methods": ["base", "es"], "updates": 2,
                "eval": {"in_domain": ["demo-add"], "held_out": ["demo-sub"]}, "configs": {
            "es": str(REPO / "configs/demo/es.yaml"), "grpo": str(REPO / "configs/demo/grpo.yaml")}}
        parse_spec(merge(base, data), cwd)
        return "experiment"
    if "task" in data and ({"data", "dataset", "prompt", "reward", "verifier", "scorer"} & data.keys()):
        from esreason.tasks.datafile import load_task_file

        probe = cwd / ".docs-block-task.yaml"
        probe.write_text(text)
        try:
            load_task_file(probe)
        finally:
            probe.unlink()
        return "task file"
    if "grpo" in data:
        from esreason.grpo.config import GRPORunConfig

        build(GRPORunConfig, merge(to_dict(GRPORunConfig()), data))
        return "grpo run config"
    build(RunConfig, merge(to_dict(RunConfig()), data))
    return "es run config"


def check_data(block: Block, cwd: Path = REPO) -> None:
    try:
        if block.lang == "json":
            json.loads(block.code)
        elif block.lang == "toml":
            tomllib.loads(block.code)
        else:
            check_yaml(block, cwd)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise DocsError(f"{block.where}: {exc}") from None


# --------------------------------------------------------------------------- a block that shows a file

SHOWN_FILE = re.compile(r"^#\s+(?P<path>[\w./-]+\.(?:py|ya?ml|toml|sh|json|txt))\s*$")


def shown_file(block: Block, cwd: Path) -> Path | None:
    """The file a block shows, when its first line is ``# PATH`` naming a file (from ``cwd``, the page's
    directory, or the repository root) that exists."""
    lines = block.code.splitlines()
    m = SHOWN_FILE.match(lines[0].strip()) if lines else None
    if not m:
        return None
    for base in (cwd, REPO / Path(block.page).parent, REPO):
        if (base / m["path"]).is_file():
            return base / m["path"]
    return None


def check_shown_file(block: Block, cwd: Path) -> None:
    """A block whose first line names a file of the tree shows that file, whole and as it is."""
    path = shown_file(block, cwd)
    if path is None:
        return
    shown = block.code.split("\n", 1)[1] if "\n" in block.code else ""
    actual = path.read_text(encoding="utf-8")
    if shown.strip("\n") != actual.strip("\n"):
        import difflib

        diff = "\n".join(list(difflib.unified_diff(actual.splitlines(), shown.splitlines(), str(path.name),
                                                   "the block", lineterm=""))[:30])
        raise DocsError(f"{block.where}: the block names {path.name} on its first line but differs from it "
                        f"(show the file whole, or do not name it):\n{diff}")


# --------------------------------------------------------------------------- a page's session

#: Shell functions of the parse-only form: esreason is parsed, never run; other programs are not run.
_PARSE_FUNCTIONS = """
esreason() { "$DOCS_PYTHON" "$DOCS_HELPER" parse "$@"; }
accelerate() { "$DOCS_PYTHON" "$DOCS_HELPER" accelerate "$@"; }
ray() { echo "not run (needs the cluster): ray $*"; }
pip() { echo "not run (an install): pip $*"; }
wget() { echo "not run (the network): wget $*"; }
python() { "$DOCS_PYTHON" "$DOCS_HELPER" script python "$@"; }
bash() { "$DOCS_PYTHON" "$DOCS_HELPER" script bash "$@"; }
"""


def _bash_script(block: Block, state: Path) -> str:
    prelude = ""
    if block.mode == "twin":
        prelude = f'esreason() {{ command esreason "$@" {block.args}; }}\n'
    elif block.mode == "parse":
        prelude = _PARSE_FUNCTIONS
    return (f'cd "$(cat {state}/cwd)"\ntrap \'pwd > {state}/cwd\' EXIT\n{prelude}'
            f"{block.code}\n")


def ci_lines() -> set[str]:
    return {" ".join(line.split()) for line in (REPO / ".ci" / "run").read_text().splitlines()}


def check_ci_block(block: Block) -> None:
    """Each command line of ``block`` (comments and the clone itself aside) is a line of .ci/run."""
    lines = ci_lines()
    for raw in block.code.splitlines():
        line = " ".join(raw.split("  #")[0].split())
        if not line or line.startswith("#") or line.startswith("git clone"):
            continue
        if line not in lines:
            raise DocsError(f"{block.where}: {line!r} is not a line of .ci/run, so CI does not run it as written")


class Session:
    """One page's blocks, run in order in a fresh copy of the tree under ``root``."""

    def __init__(self, root: Path, *, env: dict[str, str] | None = None, timeout: float = 3000.0):
        self.root = root
        self.state = root / ".docs-state"
        self.tree = root / "tree"
        self.timeout = timeout
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                    "TOKENIZERS_PARALLELISM": "false", "DOCS_PYTHON": sys.executable,
                    "DOCS_HELPER": str(Path(__file__).resolve()), "PYTHONDONTWRITEBYTECODE": "1",
                    "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                    **(env or {})}
        self.env.pop("PYTEST_CURRENT_TEST", None)
        self.python: subprocess.Popen | None = None
        self.seconds: list[tuple[str, float]] = []

    def __enter__(self) -> "Session":
        copy_tree(self.tree)
        self.state.mkdir(parents=True, exist_ok=True)
        (self.state / "cwd").write_text(str(self.tree))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.python is not None:
            self.python.stdin.close()  # type: ignore[union-attr]
            self.python.wait(timeout=60)

    @property
    def cwd(self) -> Path:
        return Path((self.state / "cwd").read_text().strip())

    def run(self, block: Block) -> str:
        """Run or check ``block``; returns its output; DocsError when it fails."""
        check_labels(block)
        start = time.perf_counter()
        out = ""
        check_shown_file(block, self.cwd)
        if block.lang in CHECK_LANGS:
            check_data(block, self.cwd)
        elif block.lang == "python" and block.mode == "parse":
            check_python_names(block)
        elif block.lang == "python":
            out = self._python(block)
        elif block.lang == "bash":
            if block.mode == "ci":
                check_ci_block(block)
            else:
                out = self._bash(block)
        self.seconds.append((block.where, time.perf_counter() - start))
        return out

    def _bash(self, block: Block) -> str:
        try:
            proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", _bash_script(block, self.state)],
                                  env=self.env, capture_output=True, text=True, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise DocsError(f"{block.where}: still running after {self.timeout:.0f} s") from None
        out = proc.stdout + proc.stderr
        if proc.returncode != 0:
            raise DocsError(f"{block.where}: exit {proc.returncode}\n--- block ---\n{block.code}--- output (end) ---\n"
                            f"{out[-4000:]}")
        return out

    def _python(self, block: Block) -> str:
        if self.python is None:
            self.python = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "python"], env=self.env,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                           text=True, cwd=self.cwd)
        request = json.dumps({"code": block.code, "name": block.where, "cwd": str(self.cwd)})
        self.python.stdin.write(request + "\n")  # type: ignore[union-attr]
        self.python.stdin.flush()  # type: ignore[union-attr]
        lines = []
        for line in self.python.stdout:  # type: ignore[union-attr]
            if line.startswith("\0docs-block-done "):
                status = json.loads(line.split(" ", 1)[1])
                out = "".join(lines)
                if not status["ok"]:
                    raise DocsError(f"{block.where}: the Python block raised\n--- block ---\n{block.code}"
                                    f"--- output (end) ---\n{out[-2000:]}\n{status['error']}")
                return out
            lines.append(line)
        raise DocsError(f"{block.where}: the page's Python process ended\n{''.join(lines)[-3000:]}")


def check_python_names(block: Block) -> None:
    """Parse-only Python: it compiles, and every name it imports from esreason exists."""
    import ast
    import importlib

    try:
        tree = ast.parse(block.code, block.where)
    except SyntaxError as exc:
        raise DocsError(f"{block.where}: {exc}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "esreason":
            module = importlib.import_module(node.module)
            for alias in node.names:
                if not hasattr(module, alias.name):
                    try:
                        importlib.import_module(f"{node.module}.{alias.name}")
                    except ImportError:
                        raise DocsError(f"{block.where}: {node.module} has no {alias.name!r}") from None


def copy_tree(dest: Path) -> None:
    """The files git knows (tracked, or new and not ignored): what a fresh clone holds."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def run_page(page: str, root: Path, **kwargs: object) -> list[tuple[str, float]]:
    """Run every block of ``page`` in order; (block, seconds) for each."""
    with Session(root, **kwargs) as session:  # type: ignore[arg-type]
        for block in blocks(page):
            session.run(block)
        return session.seconds


# --------------------------------------------------------------------------- helpers run in the session


def _parse_command(argv: list[str]) -> None:
    """The parse-only ``esreason``: the CLI's parser, then the --config file with its --set overrides."""
    from esreason.cli import build_parser

    args = build_parser().parse_args(argv)  # exits 2 on an unknown command or flag
    config = getattr(args, "config", None)
    if config and not any(c in config for c in "<>"):
        from esreason.config import load_config

        overrides = getattr(args, "set", None) or []
        if "experiment" in argv[:2] and (argv[1:2] in (["run"], ["plan"])):
            from esreason.experiments.spec import load_spec

            load_spec(config, overrides)
        elif argv[:2] == ["train", "grpo"]:
            from esreason.grpo.config import load_grpo_config

            load_grpo_config(config, overrides)
        elif argv[:2] == ["train", "es"]:
            load_config(config, overrides)
    print(f"parsed: esreason {' '.join(argv)}")


def _accelerate(argv: list[str]) -> None:
    if "-m" in argv and argv[argv.index("-m") + 1] == "esreason.cli":
        _parse_command(argv[argv.index("-m") + 2:])
    else:
        print(f"not run (needs GPUs): accelerate {' '.join(argv)}")


def _script(program: str, argv: list[str]) -> None:
    """The parse-only ``python SCRIPT.py ARGS``: the script runs until its argparse parser has read ARGS (exit 2
    on an unknown flag), then stops. ``bash SCRIPT.sh ARGS``: the script exists and ``bash -n`` accepts it."""
    import argparse
    import runpy

    shown = f"{program} {' '.join(argv)}"
    if program == "python" and argv[:2] == ["-m", "esreason.cli"]:
        return _parse_command(argv[2:])
    if not argv or argv[0].startswith("-"):
        print(f"not run (parsed only): {shown}")
        return
    path = Path(argv[0])
    if not path.is_file():
        raise SystemExit(f"{shown}: no such file {path} (from {Path.cwd()})")
    if program == "bash":
        subprocess.run(["bash", "-n", str(path)], check=True)
        print(f"not run (syntax checked): {shown}")
        return

    class Parsed(Exception):
        pass

    parse = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        parse(self, args, namespace)
        raise Parsed

    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign]
    sys.argv = [str(path), *argv[1:]]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except Parsed:
        print(f"parsed: {shown}")
        return
    raise SystemExit(f"{shown}: the script ended without parsing arguments with argparse, so it ran in full")


def _python_server() -> None:
    """Execute Python blocks sent as JSON lines on stdin in one namespace; a status line after each."""
    import traceback

    namespace: dict[str, object] = {"__name__": "__main__"}
    for line in sys.stdin:
        request = json.loads(line)
        os.chdir(request["cwd"])
        if request["cwd"] not in sys.path:
            sys.path.insert(0, request["cwd"])
        status = {"ok": True, "error": ""}
        try:
            exec(compile(request["code"], request["name"], "exec"), namespace)
        except (Exception, SystemExit):  # a block's failure is reported to the session, not raised here
            status = {"ok": False, "error": traceback.format_exc()[-3000:]}
        sys.stdout.flush()
        sys.stderr.flush()
        print("\0docs-block-done " + json.dumps(status), flush=True)


if __name__ == "__main__":
    command, *rest = sys.argv[1:]
    if command == "python":
        _python_server()
    elif command == "parse":
        _parse_command(rest)
    elif command == "accelerate":
        _accelerate(rest)
    elif command == "script":
        _script(rest[0], rest[1:])
    else:
        raise SystemExit(textwrap.shorten(f"unknown helper command {command!r}", 80))
