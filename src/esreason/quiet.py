"""Silence known third-party messages, narrowly, at the call that triggers them.

A user reading ``esreason demo``/``train``/``eval``/``experiment run`` should see our progress
and results, not library chatter they cannot act on. Nothing here is global: each message
is matched by its text *and* the module that emits it, only inside a ``with`` block around
the one call that triggers it, and filters are removed on exit. Our own warnings and any
message not listed still show.

Two kinds of message:

- Python warnings (``warnings.warn``), matched by category, message regex and the module the
  warning is attributed to (:class:`KnownWarning`), ignored with ``warnings.filterwarnings``
  inside ``warnings.catch_warnings()``.
- transformers' log lines (``[transformers] ...`` on stderr, ``logger.warning_once``), matched
  by the emitting logger's name and the message's start (:class:`KnownLogLine`), dropped by a
  ``logging.Filter`` attached to that one logger for the duration of the block.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence


@dataclass(frozen=True)
class KnownWarning:
    """A Python warning a library emits that users cannot act on."""

    category: type[Warning]
    """Its class (e.g. FutureWarning)."""
    message: str
    """Regex matched at the start of the message (``warnings.filterwarnings`` semantics)."""
    module: str
    """Regex matched at the start of the module the warning is attributed to (its ``stacklevel`` frame)."""
    why: str
    """Where it comes from, for the reader of the code."""


@dataclass(frozen=True)
class KnownLogLine:
    """A log line a library prints through its logger that users cannot act on."""

    logger: str
    """The exact name of the emitting logger (e.g. ``transformers.trainer_utils``)."""
    prefix: str
    """The start of the formatted message."""
    why: str
    """Where it comes from, for the reader of the code."""


class _DropPrefix(logging.Filter):
    """Drops records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: Sequence[str]) -> None:
        super().__init__()
        self.prefixes = tuple(prefixes)

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefixes)


# The messages the GRPO comparator's ``trainer.train`` call triggers (TRL 1.16 over transformers
# 5.20-5.24, measured). The ``past_key_values`` deprecation of transformers 5.24 is not among them:
# TRL 1.16 never names the cache (it generates through transformers' own ``generate``, which uses
# the new name); it came from our sampler, which now passes the name the release expects
# (:func:`esreason.backends.kvcache.cache_keyword`).
TRAINER_WARNINGS: tuple[KnownWarning, ...] = (
    KnownWarning(FutureWarning, r"`is_gradient_checkpointing` is deprecated", r"transformers\.modeling_utils\b",
                 "TRL 1.16 (trl/models/utils.py) reads the property transformers 5.23 deprecated; it is "
                 "warned without a stacklevel, so attributed to transformers.modeling_utils"),
    KnownWarning(UserWarning, r"You are using 'rollout_func', which is an experimental feature",
                 r"esreason\.grpo\.trainer\b",
                 "TRL 1.16's GRPOTrainer.__init__ on every rollout_func (our CPU rollouts, "
                 "esreason.grpo.rollouts); stacklevel 2 attributes it to PaperGRPOTrainer.__init__"),
)
TRAINER_LOG_LINES: tuple[KnownLogLine, ...] = (
    KnownLogLine("transformers.trainer_utils", "mtime may not be reliable on this filesystem",
                 "Trainer's checkpoint rotation: checkpoints saved within a second of each other"),
)


@contextmanager
def known_library_noise(known_warnings: Sequence[KnownWarning] = TRAINER_WARNINGS,
                        log_lines: Sequence[KnownLogLine] = TRAINER_LOG_LINES) -> Iterator[None]:
    """Within the block, ignore exactly ``known_warnings`` and drop exactly ``log_lines``."""
    by_logger: dict[str, list[str]] = {}
    for line in log_lines:
        by_logger.setdefault(line.logger, []).append(line.prefix)
    installed = [(logging.getLogger(name), _DropPrefix(prefixes)) for name, prefixes in by_logger.items()]
    with warnings.catch_warnings():
        for w in known_warnings:
            warnings.filterwarnings("ignore", message=w.message, category=w.category, module=w.module)
        for logger, filt in installed:
            logger.addFilter(filt)
        try:
            yield
        finally:
            for logger, filt in installed:
                logger.removeFilter(filt)
