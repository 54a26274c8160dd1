"""What one evaluation produces: the sampling protocol and per-sample / per-problem records.

A :class:`SampleRecord` is one line of ``responses.jsonl``; it holds everything the
metrics need (verdict and vote key), so a summary can be recomputed from the file alone.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from esreason.errors import UserError
from esreason.tasks.base import Problem
from esreason.verifiers.base import Verdict

#: Default ks reported by the paper (appendix "Evaluation Configuration": K in {16, 32},
#: plus Pass@1).
PAPER_KS = (1, 16, 32)
#: Verdict.extra entries longer than this (strings) are not written to responses.jsonl.
MAX_EXTRA_CHARS = 200


@dataclass(frozen=True)
class Protocol:
    """How responses are sampled (paper, appendix "Evaluation Configuration").

    samples: M responses per problem (paper: 32).
    temperature: sampling temperature (paper: 0.6).
    top_p: nucleus mass (paper: 1.0, the full distribution).
    max_new_tokens: response limit (paper: 2,048 Easy, 8,192 Hard).
    greedy: also one greedy (temperature 0) response per problem (paper: Easy setting).
    seed: base seed; the seed of each generate call derives from (seed, task, call index).
    """

    samples: int = 32
    temperature: float = 0.6
    top_p: float = 1.0
    max_new_tokens: int = 2048
    greedy: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.samples, bool) or not isinstance(self.samples, int) or self.samples < 1:
            raise UserError(f"samples must be an integer >= 1, got {self.samples!r}")
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise UserError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise UserError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise UserError(f"seed must be an integer, got {self.seed!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def default_ks(samples: int) -> tuple[int, ...]:
    """The paper's K in {1, 16, 32} that fit in ``samples``, plus ``samples`` itself when smaller."""
    ks = [k for k in PAPER_KS if k <= samples]
    if samples < PAPER_KS[-1] and samples not in ks:
        ks.append(samples)
    return tuple(ks)


def check_ks(ks: Sequence[int] | None, samples: int) -> tuple[int, ...]:
    """Validated, sorted, de-duplicated ks (default :func:`default_ks`); UserError when k > samples."""
    if ks is None:
        return default_ks(samples)
    out = []
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise UserError(f"k must be an integer >= 1, got {k!r}")
        if k > samples:
            raise UserError(f"k={k} exceeds the number of samples per problem ({samples}); "
                            f"Pass@k and Maj@k need k <= samples")
        out.append(k)
    if not out:
        raise UserError("no k given (e.g. --k 1,16,32)")
    return tuple(sorted(set(out)))


def problem_fingerprint(problem: Problem) -> str:
    """Short hash of a problem's messages and gold: a resumed run refuses changed problems."""
    payload = json.dumps([list(problem.messages), problem.gold] + ([problem.text] if problem.text is not None else []),
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _small_extra(extra: dict[str, Any]) -> dict[str, Any]:
    """The JSON-friendly, short entries of Verdict.extra (F1, pass vectors, paths; not program output)."""
    kept: dict[str, Any] = {}
    for key, value in extra.items():
        if isinstance(value, (bool, int, float)) or value is None:
            kept[key] = value
        elif isinstance(value, str) and len(value) <= MAX_EXTRA_CHARS:
            kept[key] = value
        elif isinstance(value, (list, tuple)) and len(value) <= 1000 \
                and all(isinstance(v, (bool, int, float)) for v in value):
            kept[key] = list(value)
    return kept


@dataclass
class SampleRecord:
    """One response and its verdict (one line of ``responses.jsonl``).

    sample: index 0..M-1 among the problem's sampled responses (0 for the greedy one).
    greedy: the temperature-0 response (not part of Pass@K / Maj@K).
    num_tokens: generated tokens (stop token excluded).
    entropy_sum: sum over those tokens of the token-level entropy (nats), None if not measured.
    vote: the normalised answer Maj@K votes for (:mod:`esreason.eval.answers`), None = abstain.
    request_seed: the row's own sampling seed where an engine sampled it alone with that seed (the
        streamed engine path, :mod:`esreason.backends.eval_stream`); None where a call's seed drove a
        batch (the HF sampler).
    """

    task: str
    problem_id: str
    sample: int
    greedy: bool
    text: str
    num_tokens: int
    entropy_sum: float | None
    extracted: str | None
    correct: bool
    reward: float
    reason: str
    formatted: bool
    vote: str | None
    fingerprint: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    request_seed: int | None = None

    @classmethod
    def from_verdict(cls, problem: Problem, sample: int, greedy: bool, text: str, num_tokens: int,
                     entropy_sum: float | None, verdict: Verdict, vote: str | None,
                     fingerprint: str, request_seed: int | None = None) -> "SampleRecord":
        return cls(task=problem.task, problem_id=problem.id, sample=sample, greedy=greedy, text=text,
                   num_tokens=int(num_tokens), entropy_sum=None if entropy_sum is None else float(entropy_sum),
                   extracted=verdict.extracted, correct=bool(verdict.correct), reward=float(verdict.reward),
                   reason=verdict.reason, formatted=bool(verdict.formatted), vote=vote,
                   fingerprint=fingerprint, extra=_small_extra(verdict.extra),
                   request_seed=None if request_seed is None else int(request_seed))

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> "SampleRecord":
        return cls(**{k: row[k] for k in cls.__dataclass_fields__ if k in row})


@dataclass
class ProblemRecord:
    """All responses of one problem: ``samples`` in sample order, plus the greedy one if any."""

    task: str
    problem_id: str
    samples: list[SampleRecord]
    greedy: SampleRecord | None = None

    def lines(self) -> list[SampleRecord]:
        return list(self.samples) + ([self.greedy] if self.greedy is not None else [])
