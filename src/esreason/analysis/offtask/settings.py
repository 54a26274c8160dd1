"""The experiment file's ``analysis:`` section: what the off-task drift analysis measures on.

::

    analysis:
      offtask:                        # one source of off-task text, exactly one of task / file / dataset
        task: demo-countdown          # prompts of a task no method trains on; the base model samples the responses
        # file: data/offtask.jsonl    # or text from a file (relative to the experiment file)
        # dataset: Salesforce/wikitext    # or a Hugging Face hub dataset, loaded only when named
        # dataset_config: wikitext-2-raw-v1
        # split: test
        # column: text
        limit: 64                     # rows (prompts or texts)
        max_tokens: 64                # response tokens sampled / text tokens scored per row
        temperature: 1.0              # sampling temperature of the base model's responses (task only)
        seed: 0                       # sampling seed (task only)
        batch_size: 64                # sampler rows per generate call (task only)

A ``file`` is JSONL (one object per line: ``{"text": ...}``, or ``{"prompt": ..., "response": ...}``
to score a response behind a context) or plain text (``.txt``: one document per non-empty line). A
text is tokenised with the tokenizer's special tokens; its first token is the context and the rest
(up to ``max_tokens``) is scored. Errors name the key (``analysis.offtask.file``) or the file and line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from esreason.config import ConfigError, build

SOURCES = ("task", "file", "dataset")


@dataclass(frozen=True)
class OfftaskSettings:
    """Where the off-task set comes from and how large it is (``analysis.offtask``)."""

    task: str | None = None
    """A registered task whose test prompts the base model answers (responses sampled at
    ``temperature``): the demo uses a synthetic family no method trains on."""
    file: str | None = None
    """A local JSONL or text file of off-task text (relative to the experiment file); the offline choice."""
    dataset: str | None = None
    """A Hugging Face hub dataset of general text (e.g. ``Salesforce/wikitext``), read with
    ``datasets.load_dataset`` only when named."""
    dataset_config: str | None = None
    """The dataset's configuration name (wikitext: ``wikitext-2-raw-v1``)."""
    split: str = "test"
    """Split of ``task`` or ``dataset``."""
    column: str = "text"
    """Text column of ``dataset``."""
    limit: int = 64
    """Rows: the first ``limit`` prompts (task) or non-empty texts (file, dataset)."""
    max_tokens: int = 64
    """Scored tokens per row: the response limit of the base model's samples, or the text cut."""
    temperature: float = 1.0
    """Sampling temperature of the base model's responses. 1.0 samples the base model's own
    distribution, which makes the mean token KL an estimate of the sequence-level KL
    (docs/offtask.md); other values measure the KL on a tempered sample."""
    seed: int = 0
    """Sampling seed of the base model's responses."""
    batch_size: int = 64
    """Sampler rows per generate call when the base model samples the responses."""

    @property
    def source(self) -> str:
        """'task', 'file' or 'dataset': the one source given."""
        return next(s for s in SOURCES if getattr(self, s) is not None)


@dataclass(frozen=True)
class AnalysisSettings:
    """The experiment's ``analysis`` section (every analysis is off unless named)."""

    offtask: OfftaskSettings | None = None
    """Off-task drift: token KL from the base model and retention (docs/offtask.md); None: not measured."""


def parse_analysis(data: Any, base_dir: Path | None = None) -> AnalysisSettings:
    """Validate an ``analysis`` mapping (None: nothing). ConfigError names the key."""
    if data is None:
        return AnalysisSettings()
    if not isinstance(data, Mapping) or set(data) - {"offtask"}:
        extra = sorted(set(data) - {"offtask"}) if isinstance(data, Mapping) else None
        raise ConfigError(f"unknown config key 'analysis.{extra[0]}'; known keys under analysis: offtask"
                          if extra else f"config key 'analysis': expected a mapping, got {data!r}")
    raw = data.get("offtask")
    if raw is None:
        return AnalysisSettings()
    s = build(OfftaskSettings, raw, prefix="analysis.offtask")
    given = [k for k in SOURCES if getattr(s, k) is not None]
    if len(given) != 1:
        raise ConfigError(f"config key 'analysis.offtask': name exactly one of {', '.join(SOURCES)} "
                          f"(got {', '.join(given) or 'none'})")
    for key in ("limit", "max_tokens", "batch_size"):
        if getattr(s, key) < 1:
            raise ConfigError(f"config key 'analysis.offtask.{key}': must be >= 1 (got {getattr(s, key)})")
    if s.temperature <= 0:
        raise ConfigError(f"config key 'analysis.offtask.temperature': must be > 0 (got {s.temperature})")
    if s.task is not None:
        from esreason import tasks as registry
        from esreason.errors import UserError

        try:
            registry.get(s.task)
        except UserError:
            raise ConfigError(f"config key 'analysis.offtask.task': unknown task {s.task!r} "
                              f"(known: {', '.join(registry.names())})") from None
    if s.file is not None:
        path = Path(s.file).expanduser()
        path = path if path.is_absolute() or base_dir is None else base_dir / path
        if not path.is_file():
            raise ConfigError(f"config key 'analysis.offtask.file': {path} does not exist")
        s = replace(s, file=str(path))
    return AnalysisSettings(offtask=s)
