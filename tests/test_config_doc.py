"""docs/config.md is generated from the config dataclasses' field docstrings, covers every key and is current.

The reference is written by scripts/config_doc.py (:mod:`esreason.config_docs`). These tests fail
when a field has no docstring (naming the class, the field and its dotted key), when a key a loader
accepts is missing from docs/config.md, and when the file differs from what the generator writes now
(a changed type, default or docstring that was not followed by ``python scripts/config_doc.py``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from esreason import api_docs, config_docs
from esreason.config import GenerationConfig, RunConfig

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / config_docs.DOC_PATH
REGENERATE = "run: python scripts/config_doc.py"


def _doc_text() -> str:
    assert DOC.is_file(), f"{config_docs.DOC_PATH} is missing; {REGENERATE}"
    return DOC.read_text(encoding="utf-8")


def test_every_config_field_has_a_docstring():
    missing = [m for cls in config_docs.documented_classes() for m in config_docs.missing_docstrings(cls)]
    assert not missing, ("config fields without a docstring (add a string literal under each field): "
                         + "; ".join(missing))


def test_doc_is_current():
    assert _doc_text() == config_docs.render(), f"{config_docs.DOC_PATH} is stale; {REGENERATE}"


def _loader_keys() -> dict[str, list[str]]:
    """Every key the loaders accept, by file, as the known-key lists and dataclasses the parsers use."""
    from esreason.api.config import yaml_keys
    from esreason.experiments import sequence, spec, sweep
    from esreason.grpo.config import GRPORunConfig

    return {
        "ES run config": yaml_keys(RunConfig),
        "GRPO run config": yaml_keys(GRPORunConfig),
        "sequence file": list(sequence.TOP_KEYS),
        "experiment file": [k for k in spec.TOP_KEYS if k not in ("eval", "plan", "configs", "report")]
        + [f"eval.{k}" for k in spec.EVAL_KEYS] + ["plan.runaway_share", "configs.es", "configs.grpo",
                                                    "report.pairs"],
        "sweep section": [f"sweep.{k}" for k in sweep.SWEEP_KEYS],
    }


def test_every_key_is_in_the_doc():
    text = _doc_text()
    missing = [f"{where}: {key}" for where, keys in _loader_keys().items() for key in keys
               if f"| `{key}` |" not in text]
    assert not missing, f"keys missing from {config_docs.DOC_PATH} ({REGENERATE}): " + ", ".join(missing)


def test_documented_keys_are_the_loaders_keys():
    """The generator walks the same dataclasses the loaders build: same key sets, nothing invented."""
    from esreason.api.config import FIELD_KEYS, ESConfig, yaml_keys
    from esreason.grpo.config import GRPORunConfig

    assert config_docs.all_keys(RunConfig) == yaml_keys(RunConfig)
    assert config_docs.all_keys(GRPORunConfig) == yaml_keys(GRPORunConfig)
    api = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    lines = [line for line in api.splitlines() if line.startswith("- [")]
    for flat, key in FIELD_KEYS.items():  # docs/api.md lists each flat field under its YAML key's section
        line = next(line for line in lines if f"`{flat}` " in line)
        leaf = key.rpartition(".")[2]
        assert api_docs.key_anchor(key) in line and (leaf == flat or f"`{flat}` (`{leaf}`)" in line), flat
    assert len(dataclasses.fields(ESConfig)) == len(FIELD_KEYS) + 3  # output_dir, reward_weights, pass_threshold


def test_script_check_mode(capsys):
    spec = importlib.util.spec_from_file_location("_esreason_script_config_doc", REPO / "scripts" / "config_doc.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert module.main(["--check"]) == 0, capsys.readouterr().err


# --------------------------------------------------------------------------- the docstring reader itself


@dataclass(frozen=True)
class _Inner:
    """An inner section."""

    a: int = 1
    """Documented."""
    b: int = 2


@dataclass(frozen=True)
class _Outer:
    """An outer config."""

    x: str = ""
    """Documented too."""
    inner: _Inner = field(default_factory=_Inner)


@dataclass(frozen=True)
class _Sub(_Inner):
    a: int = 3
    b: int = 4
    """Now documented."""


@dataclass(frozen=True)
class _Bare:
    c: int = 0
    """Documented."""


@dataclass(frozen=True)
class _HasBare:
    """Holds a section whose class has no docstring."""

    bare: _Bare = field(default_factory=_Bare)


def test_missing_docstrings_are_named():
    assert config_docs.missing_docstrings(_Outer) == ["_Inner.b (inner.b)"]
    # a re-declared field needs its own docstring; an inherited one keeps its base's
    assert config_docs.missing_docstrings(_Sub) == ["_Sub.a (a)"]
    assert config_docs.field_doc(_Sub, "b") == "Now documented."
    assert config_docs.missing_docstrings(_HasBare) == ["_Bare (section bare)"]


def test_most_derived_docstring_wins():
    from esreason.grpo.config import GRPOGenerationConfig

    assert config_docs.field_doc(GRPOGenerationConfig, "temperature") != config_docs.field_doc(
        GenerationConfig, "temperature")
    assert config_docs.field_doc(GRPOGenerationConfig, "top_p") == config_docs.field_doc(GenerationConfig, "top_p")


@pytest.mark.parametrize("text,expected", [
    ("``a|b`` and :class:`~esreason.config.RunConfig`", "`a\\|b` and `esreason.config.RunConfig`"),
    ("<data_dir>/x, ``<kept>``", "&lt;data_dir&gt;/x, `<kept>`"),
    ("N*S, None", "N\\*S, null"),
])
def test_markdown_cell(text, expected):
    assert config_docs.markdown(text, yaml=True) == expected


def test_values_as_yaml_writes_them():
    assert [config_docs.value_text(v) for v in (None, True, 1.5e-3, 1e-8, (1, 16, 32), "", "demo")] == \
        ["null", "true", "0.0015", "1e-8", "[1, 16, 32]", '""', "demo"]
