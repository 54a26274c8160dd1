"""Math verifier (gold: str) — the last ``\\boxed{}``, equivalence by math-verify.

Paper, appendix "Prompt Templates": "put your final answer within \\boxed{}"; the
training reward (appendix "Implementation-Level Training Procedure") is 1 for a
verifier-correct answer, ``format_reward`` for a boxed but wrong answer and 0
without a box.

Extraction: :func:`esreason.verifiers.extract.last_boxed` (nested braces, ``\\fbox``,
brace-less ``\\boxed 5``). ``formatted`` = that box exists and its content is not
blank. A right answer written only in the reasoning is neither formatted nor
correct.

Equivalence, cheapest first:

1. *Fast path* — both sides are plain numbers (integers, or decimals with at most 6
   fractional digits; optional sign, thousands commas ``1,000`` or ``1{,}000``,
   ``$``/``\\$``, ``%``/``\\%``, ``\\text{}`` around them): exact comparison of
   :class:`fractions.Fraction` values, in-process. A percentage on one side only
   matches either its number or its number / 100 (math-verify's rule: ``50\\%``
   matches ``50`` and ``0.5``). ES scores hundreds of integer answers per update;
   this path costs microseconds. Deviation: integers are compared exactly, where
   math-verify compares at 15 significant digits.
2. *Normalised text* — :func:`normalize_math_answer` of both sides is identical.
3. *math-verify* — ``verify(parse(gold), parse(pred))`` in a worker process of
   :mod:`esreason.verifiers.mathpool` with a hard per-call deadline (``timeout_s``).
   A deadline miss gives an incorrect verdict with reason "verify timeout" and the
   worker is replaced. Outcomes are cached (LRU), so repeated answers cost one call.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from decimal import Decimal
from fractions import Fraction
from typing import Any

from esreason.errors import UserError
from esreason.verifiers.base import Verdict, reward_for
from esreason.verifiers.extract import last_boxed, strip_latex_wrappers
from esreason.verifiers.mathpool import DEFAULT_TIMEOUT_S, Outcome, shared_pool

#: Boxed answers longer than this are not sent to math-verify (counted as wrong).
MAX_ANSWER_CHARS = 1000
#: Decimals with more fractional digits than this skip the fast path (math-verify
#: rounds to 6 decimals, an exact comparison would disagree with it).
FAST_PATH_DECIMALS = 6
CACHE_SIZE = 65536

_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?|[+-]?\.(\d+)")
_SPACING = re.compile(r"\\[!,;: ]|\\q?quad(?![A-Za-z])|~")
_LEFT_RIGHT = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?")


def _clean(s: str) -> str:
    """Formatting-only normalisation shared by the vote key and the number parser."""
    t = strip_latex_wrappers(s)
    t = t.replace("\\$", "").replace("$", "")
    for a, b in (("\\(", ""), ("\\)", ""), ("\\[", ""), ("\\]", ""), ("{,}", ","),
                 ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac")):
        t = t.replace(a, b)
    t = _LEFT_RIGHT.sub("", t)
    t = _SPACING.sub("", t)
    t = _DEGREES.sub("", t)
    t = "".join(t.split())
    return t.rstrip(".")


def plain_number(s: str, max_decimals: int | None = None) -> tuple[Fraction, bool] | None:
    """``(value, is_percent)`` when ``s`` is a plain number ('1,000', '-2.50', '72\\%', '\\$5'), else None.

    ``max_decimals`` rejects decimals with more fractional digits.
    """
    t = s.strip()
    if _NUMBER.fullmatch(t) is None:  # the common case ("42") skips the LaTeX clean-up
        t = _clean(t)
    percent = t.endswith("%")
    if percent:
        t = t[:-2] if t.endswith("\\%") else t[:-1]
    m = _NUMBER.fullmatch(t)
    if m is None:
        return None
    digits = m.group(1) or m.group(2) or ""
    if max_decimals is not None and len(digits) > max_decimals:
        return None
    return Fraction(t.replace(",", "")), percent


def numbers_equal(a: tuple[Fraction, bool], b: tuple[Fraction, bool]) -> bool:
    """Exact equality; a percentage on one side only also matches its value / 100."""
    (x, xp), (y, yp) = a, b
    if x == y:
        return True
    if xp and not yp:
        return x / 100 == y
    if yp and not xp:
        return y / 100 == x
    return False


def normalize_math_answer(s: str) -> str:
    """Maj@K vote key: formatting removed, plain numbers in canonical form.

    Removes ``\\text{}``-like wrappers (and a nested ``\\boxed{}``), ``$``, ``\\(\\)``,
    ``\\left``/``\\right``, spacing commands, all whitespace, degree marks and a trailing
    period; ``\\dfrac``/``\\tfrac`` -> ``\\frac``. A plain number becomes its canonical
    decimal (``1,000.50`` -> ``1000.5``; a percentage keeps its ``%``). Answers that
    differ only in form beyond this (``\\frac12`` vs ``0.5``) are grouped by
    :func:`math_equivalent`.
    """
    num = plain_number(s)
    if num is None:
        return _clean(s)
    value, percent = num
    if value.denominator == 1:
        text = str(value.numerator)
    else:
        text = format(Decimal(value.numerator) / Decimal(value.denominator), "f")
        text = text.rstrip("0").rstrip(".") if "." in text else text
    return text + ("%" if percent else "")


# --------------------------------------------------------------------------- comparison


class _OutcomeCache:
    """A small thread-safe LRU of math-verify outcomes keyed by (gold, pred, timeout)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[tuple[str, str, float], Outcome] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, float]) -> Outcome | None:
        with self._lock:
            out = self._data.get(key)
            if out is not None:
                self._data.move_to_end(key)
            return out

    def put(self, key: tuple[str, str, float], out: Outcome) -> None:
        with self._lock:
            self._data[key] = out
            self._data.move_to_end(key)
            while len(self._data) > self.size:
                self._data.popitem(last=False)


_CACHE = _OutcomeCache(CACHE_SIZE)


def compare(gold: str, pred: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[Outcome, str]:
    """Compare two answers; returns the outcome and the path that decided it ("fast", "text", "math-verify")."""
    g_num = plain_number(gold, FAST_PATH_DECIMALS)
    p_num = plain_number(pred, FAST_PATH_DECIMALS)
    if g_num is not None and p_num is not None:
        return Outcome("equal" if numbers_equal(g_num, p_num) else "different"), "fast"
    if _clean(gold) == _clean(pred):
        return Outcome("equal"), "text"
    if len(pred) > MAX_ANSWER_CHARS:
        return Outcome("different", f"answer longer than {MAX_ANSWER_CHARS} characters"), "math-verify"
    key = (gold, pred, float(timeout_s))
    cached = _CACHE.get(key)
    if cached is not None:
        return cached, "math-verify"
    out = shared_pool().compare(gold, pred, timeout_s)
    if out.status != "error" or "worker died" not in out.detail:
        _CACHE.put(key, out)
    return out, "math-verify"


def math_equivalent(a: str, b: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Whether two extracted answers are the same (grouping for Maj@K voting).

    Same machinery as the scorer with ``a`` in the gold position (math-verify is not
    symmetric); a timeout or error counts as "not equivalent".
    """
    return compare(a, b, timeout_s)[0].equal


# --------------------------------------------------------------------------- scorer


def _gold_text(gold: Any) -> str:
    if isinstance(gold, bool) or not isinstance(gold, (str, int)):
        raise UserError(f"math gold answer must be a string (or int), got {type(gold).__name__}: {gold!r}")
    text = str(gold).strip()
    if not text:
        raise UserError("math gold answer is empty")
    return text


class MathScorer:
    """``score(response, gold: str) -> Verdict`` (picklable; the worker pool is process-global)."""

    def __init__(self, format_reward: float = 0.1, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.format_reward = float(format_reward)
        self.timeout_s = float(timeout_s)

    def __call__(self, response: str, gold: Any) -> Verdict:
        gold_s = _gold_text(gold)
        box = last_boxed(response)
        if box is None or not box.strip():
            reason = "no \\boxed{} answer" if box is None else "empty \\boxed{}"
            return Verdict(0.0, False, None, reason, formatted=False)
        pred = box.strip()
        out, path = compare(gold_s, pred, self.timeout_s)
        ok = out.equal
        if ok:
            reason = "correct" if path != "math-verify" else "correct (math-verify)"
        elif out.status == "timeout":
            reason = "verify timeout"
        elif out.status == "error":
            reason = f"verify error: {out.detail}"
        else:
            reason = f"{pred!r} is not equivalent to {gold_s!r}" + (f" ({out.detail})" if out.detail else "")
        return Verdict(reward_for(ok, True, self.format_reward), ok, pred, reason, formatted=True,
                       extra={"path": path})


def make_scorer(format_reward: float = 0.1, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> MathScorer:
    """The math scorer; ``timeout_s`` is the hard deadline of one math-verify call."""
    return MathScorer(format_reward, timeout_s)
