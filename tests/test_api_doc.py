"""The Python API documents itself: help() and docs/api.md, from one set of docstrings.

``help(ESConfig)``, ``help(ESTrainer)``, ``help(GRPOComparator)`` and ``help(evaluate)`` show every
parameter's type, default and meaning and an example (:mod:`esreason.docstrings` composes their
``__doc__`` when :mod:`esreason.api` is imported); docs/api.md is written from the same parts by
scripts/api_doc.py (:mod:`esreason.api_docs`). These tests fail when a parameter has no
documentation, when an entry names a parameter that does not exist, when docs/api.md is stale,
and when an example does not run.
"""

from __future__ import annotations

import importlib.util
import pydoc
import re
import sys
from pathlib import Path

import pytest

from esreason import api_docs, docstrings
from esreason.config_docs import slug

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / api_docs.DOC_PATH
REGENERATE = "run: python scripts/api_doc.py"


def test_every_parameter_is_documented():
    assert api_docs.missing() == [], "document each parameter (a `name: text` entry in the docstring, or an " \
                                     "attribute docstring under a config field): " + "; ".join(api_docs.missing())


def test_doc_is_current():
    assert DOC.is_file(), f"{api_docs.DOC_PATH} is missing; {REGENERATE}"
    assert DOC.read_text(encoding="utf-8") == api_docs.render(), f"{api_docs.DOC_PATH} is stale; {REGENERATE}"


def test_doc_names_every_public_name_and_links_each_key_to_its_entry():
    """Every entry point, public method and parameter is in docs/api.md; a config field that stands for a
    YAML key is listed with a link to the config.md section whose table has that key (its meaning is there)."""
    from esreason.config_docs import DOC_PATH as CONFIG_DOC

    text = DOC.read_text(encoding="utf-8")
    config = (REPO / CONFIG_DOC).read_text(encoding="utf-8")
    for public, obj in api_docs.api_objects():
        assert f"## `{public}`" in text, public
        if isinstance(obj, type):
            for name, _ in api_docs.public_methods(obj):
                assert f"### `{obj.__name__}.{name}`" in text, name
        found, _ = docstrings.params(obj, api_docs.yaml_keys(obj))
        for p in found:
            assert f"`{p.name.lstrip('*')}`" in text, f"{public}: {p.name}"
            if p.key:
                anchor = api_docs.key_anchor(p.key).partition("#")[2]
                assert f"(config.md#{anchor})" in text, p.key
                section = config.split("\n### ")[[slug(h.splitlines()[0]) for h in config.split("\n### ")]
                                                  .index(anchor)]
                assert f"| `{p.key}` |" in section, f"{p.key} is not in config.md#{anchor}"


@pytest.mark.parametrize("public", [name for name, _ in api_docs.api_objects()])
def test_help_shows_each_parameters_type_default_and_meaning_and_an_example(public):
    obj = dict(api_docs.api_objects())[public]
    text = pydoc.render_doc(obj, renderer=pydoc.plaintext)
    flat = " ".join(text.split())
    found, doc = docstrings.params(obj, api_docs.yaml_keys(obj))
    assert found and doc.example
    for p in found:
        head = f"{p.name} : {p.type}" + (f", default {p.default}" if p.default not in ("", "required") else "")
        assert head in text, head
        assert " ".join(p.doc.split()[:8]) in flat, p.name  # its meaning, as written in the source
        if p.key:
            assert f"(YAML key {p.key})" in text
    assert "Example\n" in text and doc.example.splitlines()[0] in text


@pytest.mark.heavy  # trains (the fast subset, `--fast`, leaves it out)
def test_the_examples_run(tmp_path, monkeypatch):
    """Each example, as docs/api.md shows it, in a fresh directory (cheap settings: about 5 s in all)."""
    (tmp_path / "configs").symlink_to(REPO / "configs")  # the ESConfig example reads a shipped config
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == len(api_docs.api_objects())
    for block in blocks:
        exec(compile(block, "docs/api.md", "exec"), {"__name__": "__example__"})
    assert (tmp_path / "runs/api-es/model/config.json").is_file()
    assert (tmp_path / "runs/api-grpo/checkpoints/step_1").is_dir()


def test_script_check_mode(capsys):
    spec = importlib.util.spec_from_file_location("_esreason_script_api_doc", REPO / "scripts" / "api_doc.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, capsys.readouterr().err


# --------------------------------------------------------------------------- the mechanism, on code of its own


def _trainer(model: str = "demo", callbacks: list | None = None, *, verbose: bool = False) -> None:
    """Train something.

    model: the model.
    callbacks: hooks called
        after every update.

        A second paragraph.
    verbose: say more.

    Prose after the entries.

    Example::

        _trainer("demo")
    """


def _flush(resume: bool | None = None, verbose: bool = False) -> None:
    """Entries continued without indentation, as some docstrings write them.

    resume: None starts afresh;
    True continues.
    verbose: say more.

    Prose after them.
    """


def test_entries_continued_without_indentation():
    found, doc = docstrings.params(_flush)
    assert [p.doc for p in found] == ["None starts afresh; True continues.", "say more."]
    assert doc.after == "Prose after them."


def _stale(model: str = "demo") -> None:
    """Docs for a parameter that went away.

    model: the model.
    report_to: where metrics go.
    """


def test_entries_types_defaults_and_example_are_read_from_the_source():
    found, doc = docstrings.params(_trainer)
    assert [(p.name, p.type, p.default) for p in found] == [
        ("model", "str", "'demo'"), ("callbacks", "list | None", "None"), ("verbose", "bool", "False")]
    assert found[1].doc == "hooks called after every update.\n\nA second paragraph."
    assert doc.before == "Train something." and doc.after == "Prose after the entries."
    assert doc.example == '_trainer("demo")'
    text = docstrings.compose(_trainer)
    assert "callbacks : list | None, default None\n    hooks called after every update." in text
    assert text.index("Parameters") < text.index("Prose after") < text.index("Example")


def test_a_new_parameter_needs_an_entry_and_a_stale_entry_is_named():
    def grown(model: str = "demo", logging_steps: int = 10) -> None:
        """Grown.

        model: the model.
        """

    assert docstrings.undocumented(grown) == [
        "test_a_new_parameter_needs_an_entry_and_a_stale_entry_is_named.<locals>.grown: parameter "
        "'logging_steps' has no documentation"]
    assert docstrings.undocumented(_stale) == [
        "_stale: the docstring documents 'report_to', which is not a parameter"]


def test_grouped_entries_and_variadic_parameters():
    def f(train_dataset=None, eval_dataset=None, **changes) -> None:
        """F.

        train_dataset / eval_dataset: datasets.
        changes: fields set on top.
        """

    found, _ = docstrings.params(f)
    assert [(p.name, p.doc) for p in found] == [("train_dataset", "datasets."), ("eval_dataset", "datasets."),
                                                 ("**changes", "fields set on top.")]


def test_a_new_config_field_is_picked_up_from_its_attribute_docstring():
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Args:
        """Settings.

        Example::

            Args(logging_steps=5)
        """

        logging_steps: int = 10
        """Log every this many updates."""
        report_to: str = "tensorboard"

    found, doc = docstrings.params(Args, {"logging_steps": "logging.steps"})
    assert found[0] == docstrings.Param("logging_steps", "int", "10", "Log every this many updates.", "logging.steps")
    assert docstrings.undocumented(Args) == [
        "test_a_new_config_field_is_picked_up_from_its_attribute_docstring.<locals>.Args: parameter 'report_to' "
        "has no documentation"]
    assert "logging_steps : int, default 10  (YAML key logging.steps)" in docstrings.compose(Args, {
        "logging_steps": "logging.steps"})


def test_without_the_source_the_docstring_is_left_as_written(monkeypatch):
    def f(x: int = 1) -> None:
        """F.

        x: a number.
        """

    monkeypatch.setattr(docstrings.inspect, "getsource", lambda obj: (_ for _ in ()).throw(OSError("no source")))
    docstrings.document(f)
    assert f.__doc__.strip().startswith("F.") and "Parameters" not in f.__doc__
