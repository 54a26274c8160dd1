"""Structure of the package: no import cycles, no module over 500 lines, the ES core imports only downward.

The import graph is built from the source (``ast``; nothing is imported or executed):

- nodes are the modules of ``src/esreason`` (a package is its ``__init__``);
- an edge ``a -> b`` is an ``import``/``from ... import`` in ``a`` that names the
  esreason module ``b``. Module-level AND function-level (lazy) imports count: a lazy
  import is still a dependency, and a cycle through one is still a cycle (it only moves
  the failure from import time to call time). Relative imports are resolved, and
  ``from pkg import name`` is an edge to ``pkg.name`` when that is a submodule, else to
  ``pkg`` itself. Importing ``a.b.c`` counts as an edge to ``a.b.c`` only, not to the
  parent packages whose ``__init__`` Python also runs (those edges would turn every
  re-exporting ``__init__`` into a cycle with its own submodules).
- Not counted: imports under ``if TYPE_CHECKING:`` (never executed) and string-named
  ``importlib.import_module(...)`` registries (tasks, verifiers, ``esreason.grpo``'s lazy
  attributes) — they are not import statements.

The layer rule is the table :data:`LAYERS` below: a module in a layer may import only
the esreason modules whose names start with one of the layer's allowed prefixes
(third-party and stdlib imports are not restricted by it). Extend the table to fence
another layer.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "esreason"
MAX_LINES = 500

#: The config modules (dataclasses and their loading) and what the evaluation harness stands on.
_CONFIGS = ("esreason.config", "esreason.config_backend", "esreason.config_io", "esreason.config_logging")
_BELOW_EVAL = ("esreason.backends", "esreason.io", "esreason.tasks", "esreason.verifiers", "esreason.errors")

# layer (module-name prefix)   ->  esreason imports it may make (module-name prefixes)
LAYERS: dict[str, tuple[str, ...]] = {
    # The ES core: noise, cache, apply, population, shaping, update, params, lowrank, schedule. Torch,
    # numpy and the stdlib only; no backends, no loop, no I/O (docs/internals.md, "Code layout").
    "esreason.es": ("esreason.es", "esreason.errors"),
    # Policies and population evaluators sit below the evaluation harness, the ES loop, GRPO and the
    # experiments (docs/internals.md, "Code layout": no import runs back up). What both a backend and a
    # layer above need lives down here (backends.scoring, io.architectures).
    "esreason.backends": ("esreason.backends", "esreason.es", "esreason.embedded", "esreason.io",
                          "esreason.verifiers", "esreason.tasks", "esreason.errors"),
    # The bottom layer beside the core: run directories and files, the embedded model, tasks, verifiers.
    "esreason.io": ("esreason.io", "esreason.errors", "esreason.embedded", "esreason.openmp"),
    "esreason.embedded": ("esreason.embedded", "esreason.errors", "esreason.io", "esreason.tasks"),
    # A leaf like errors: the OpenMP spin setting (stdlib only), read by the manifest and `info`.
    "esreason.openmp": ("esreason.openmp",),
    # The evaluation harness: over policies and tasks, below the loops that call it.
    "esreason.eval": ("esreason.eval", *_BELOW_EVAL),
    # What a run costs (FLOPs, the manifest's budget): written by the ES loop and by GRPO, so below both;
    # GRPO's batch arithmetic (grpo.config, grpo.plan: configs and integers, no TRL) is config-level.
    "esreason.accounting": ("esreason.accounting", *_CONFIGS, "esreason.grpo.config", "esreason.grpo.plan",
                            *_BELOW_EVAL),
    # The ES loop, the GRPO comparator and the analyses stand on the layers above; none of them imports
    # the experiments, the report, the API or the command line (what a run needs from the memory plan
    # arrives as an argument: es_loop.run.run_es(resolve_engines=...)). GRPO reuses the ES loop's run
    # directory contract (resume, fingerprint, held-out evaluation); the analyses the loop itself.
    "esreason.es_loop": ("esreason.es_loop", "esreason.accounting", "esreason.eval", "esreason.es", *_CONFIGS,
                         *_BELOW_EVAL),
    "esreason.grpo": ("esreason.grpo", "esreason.es_loop", "esreason.accounting", "esreason.es", "esreason.quiet",
                      "esreason.embedded", *_CONFIGS, *_BELOW_EVAL),
    "esreason.analysis": ("esreason.analysis", "esreason.es_loop.run", "esreason.grpo.objective", "esreason.eval",
                          "esreason.es", "esreason.embedded", *_CONFIGS, *_BELOW_EVAL),
}


# --------------------------------------------------------------------------- graph


@dataclass
class ImportGraph:
    """Modules of one package, their line counts and their package-internal import edges."""

    files: dict[str, Path] = field(default_factory=dict)  # module name -> source file
    lines: dict[str, int] = field(default_factory=dict)  # module name -> line count
    edges: dict[str, set[str]] = field(default_factory=dict)  # module name -> modules it imports


def module_name(path: Path, root: Path) -> str:
    """``root/pkg/sub/mod.py`` -> ``pkg.sub.mod``; ``root/pkg/sub/__init__.py`` -> ``pkg.sub``."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement at any depth (functions, methods, try blocks), except under TYPE_CHECKING."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)  # the body never runs
        else:
            stack.extend(ast.iter_child_nodes(node))


def _known(name: str, modules: Mapping[str, Path]) -> str | None:
    """The longest prefix of ``name`` that is a module of the package (None if outside it)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def resolve_imports(module: str, is_package: bool, tree: ast.AST, modules: Mapping[str, Path],
                    package: str) -> set[str]:
    """The package modules that ``module`` imports (see the module docstring for the rules)."""
    out: set[str] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == package or alias.name.startswith(package + "."):
                    target = _known(alias.name, modules)
                    if target:
                        out.add(target)
            continue
        if node.level:  # relative: from the containing package, up level - 1 more
            base_parts = module.split(".") if is_package else module.split(".")[:-1]
            base_parts = base_parts[:len(base_parts) - (node.level - 1)]
            base = ".".join(base_parts + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        if not (base == package or base.startswith(package + ".")):
            continue
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            target = sub if sub in modules else _known(base, modules)
            if target:
                out.add(target)
    out.discard(module)
    return out


def build_graph(root: Path, package: str) -> ImportGraph:
    """Parse every module of ``root/package`` (no imports executed) into an :class:`ImportGraph`."""
    graph = ImportGraph()
    for path in sorted((root / package).rglob("*.py")):
        graph.files[module_name(path, root)] = path
    for name, path in graph.files.items():
        text = path.read_text(encoding="utf-8")
        graph.lines[name] = len(text.splitlines())
        tree = ast.parse(text, filename=str(path))
        graph.edges[name] = resolve_imports(name, path.name == "__init__.py", tree, graph.files, package)
    return graph


# --------------------------------------------------------------------------- checks


def find_cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with a cycle, as [m0, m1, ..., m0].

    Tarjan's algorithm (iterative) for the components; inside a component, the shortest
    cycle through its smallest module name (BFS), so the report is deterministic.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1 or node in edges.get(node, ()):
                    components.append(sorted(comp))
    cycles = []
    for comp in sorted(components):
        members = set(comp)
        first = comp[0]
        parent: dict[str, str] = {}
        frontier = [first]
        found = None
        while frontier and found is None:
            nxt = []
            for node in frontier:
                for child in sorted(edges.get(node, ())):
                    if child == first:
                        found = node
                        break
                    if child in members and child not in parent:
                        parent[child] = node
                        nxt.append(child)
                if found is not None:
                    break
            frontier = nxt
        path = [found]
        while path[-1] != first:
            path.append(parent[path[-1]])
        cycles.append([first] + path[::-1][1:] + [first] if len(path) > 1 else [first, first])
    return cycles


def _in(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def layer_violations(edges: Mapping[str, set[str]], layers: Mapping[str, tuple[str, ...]]) -> list[str]:
    """'module -> imported (layer L may import only ...)' for every edge that leaves its layer's allowance."""
    out = []
    for module in sorted(edges):
        for layer, allowed in layers.items():
            if not _in(module, layer):
                continue
            for target in sorted(edges[module]):
                if not any(_in(target, a) for a in allowed):
                    out.append(f"{module} -> {target} (layer {layer} may import only {', '.join(allowed)})")
    return out


def long_modules(graph: ImportGraph, limit: int = MAX_LINES) -> list[str]:
    return [f"{m} ({n} lines)" for m, n in sorted(graph.lines.items()) if n > limit]


# --------------------------------------------------------------------------- the package


def _graph() -> ImportGraph:
    return build_graph(SRC, PACKAGE)


def test_graph_sees_the_package() -> None:
    graph = _graph()
    assert "esreason.cli" in graph.files and "esreason.analysis.command" in graph.files
    # a lazy (function-level) import is an edge: cli imports the analyze command inside a function
    assert "esreason.analysis.command" in graph.edges["esreason.cli"]


def test_no_import_cycles() -> None:
    cycles = find_cycles(_graph().edges)
    assert not cycles, "import cycles (lazy imports included):\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_module_over_500_lines() -> None:
    long = long_modules(_graph())
    assert not long, f"modules over {MAX_LINES} lines: " + ", ".join(long)


def test_layers_import_only_downward() -> None:
    bad = layer_violations(_graph().edges, LAYERS)
    assert not bad, "upward imports:\n" + "\n".join(bad)


# --------------------------------------------------------------------------- the checker itself


def _write(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_checker_finds_a_cycle_through_relative_and_lazy_imports(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg import b\n",  # `from pkg import name` with name a submodule
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "def f():\n    from ..a import x\n",  # lazy and relative (level 2)
        "pkg/b.py": "import os\nfrom .sub import c\n",  # relative, to a submodule of sub
        "pkg/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",
        "pkg/e.py": "import pkg.sub.c\nfrom pkg.sub import nothing_here\n",
    })
    graph = build_graph(tmp_path, "pkg")
    assert graph.edges["pkg.a"] == {"pkg.b"}
    assert graph.edges["pkg.b"] == {"pkg.sub.c"}
    assert graph.edges["pkg.sub.c"] == {"pkg.a"}
    assert graph.edges["pkg.d"] == set()  # TYPE_CHECKING imports never run
    assert graph.edges["pkg.e"] == {"pkg.sub.c", "pkg.sub"}
    assert find_cycles(graph.edges) == [["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]]
    assert graph.lines["pkg.d"] == 3 and long_modules(graph, limit=2) == ["pkg.d (3 lines)"]


def test_cycle_finder_reports_each_component_once() -> None:
    edges = {"x": {"y"}, "y": {"x", "z"}, "z": {"z"}, "p": {"q"}, "q": {"r"}, "r": {"p", "x"}, "s": set()}
    assert find_cycles(edges) == [["p", "q", "r", "p"], ["x", "y", "x"], ["z", "z"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_layer_checker_flags_upward_imports(tmp_path: Path) -> None:
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/errors.py": "",
        "pkg/core/__init__.py": "",
        "pkg/core/noise.py": "import torch\nfrom pkg.errors import E\nfrom . import shaping\n",
        "pkg/core/shaping.py": "def f():\n    from pkg.backends import hf\n",  # lazy upward import
        "pkg/core_loop.py": "from pkg.backends import hf\n",  # a sibling whose name shares the prefix
        "pkg/backends/__init__.py": "",
        "pkg/backends/hf.py": "from pkg.core import noise\n",
    })
    graph = build_graph(tmp_path, "pkg")
    layers = {"pkg.core": ("pkg.core", "pkg.errors")}
    assert layer_violations(graph.edges, layers) == [
        "pkg.core.shaping -> pkg.backends.hf (layer pkg.core may import only pkg.core, pkg.errors)"]


def test_the_loops_and_analyses_cannot_import_what_stands_on_them() -> None:
    """The fence the table sets: an import of the experiments, the report, the API or the CLI from the ES
    loop, GRPO, the analyses or the accounting is a violation (the three such imports moved down)."""
    for layer in ("esreason.es_loop", "esreason.grpo", "esreason.analysis", "esreason.accounting"):
        for upper in ("esreason.experiments.budget", "esreason.experiments.spec", "esreason.report.document",
                      "esreason.api.trainer", "esreason.cli"):
            assert layer_violations({f"{layer}.run": {upper}}, LAYERS), (layer, upper)
