"""Countdown verifier (gold: ``{"target": int, "numbers": [int, ...]}``).

Paper, appendix "Prompt Templates": open QA and Countdown answer inside
``<answer> </answer>`` tags; the task (``HuggingFaceTB/Countdown-Task-GOLD``, built
like ``Jiayi-Pan/Countdown-Tasks-3to4``) is to reach the target with the given
numbers, each exactly once, and ``+ - * /``. The common TinyZero reward checks the
characters with a regular expression and then calls ``eval``: ``99**98**97`` passes
that regular expression and never finishes. Here the expression is parsed with
:mod:`ast` and evaluated by our own walker over :class:`fractions.Fraction`; nothing
is ever executed.

Rules (everything else is a formatted but wrong answer, with the reason):

- the content of the last ``<answer>`` block is the whole expression: binary
  ``+ - * /`` and parentheses over non-negative integer literals only (no ``=``, no
  unary ``-``/``+``, no ``**``/``^``/``//``/``%``, no names, calls, floats, strings);
- unary minus is rejected (decision): the given numbers are positive and the game
  has no negation; ``-(a-b)`` is always ``b-a``;
- the multiset of literals equals the multiset of given numbers (each used exactly
  once, none missing);
- bounded work: at most ``MAX_CHARS`` characters (checked before parsing), at most
  ``MAX_NODES`` AST nodes, literals at most ``MAX_LITERAL``; with only ``+ - * /``
  over bounded, counted literals no intermediate value can grow large;
- division by zero -> wrong (formatted); correct iff the exact value == target.

``formatted`` = a non-blank ``<answer>`` block exists. The Maj@K vote groups valid
answers by value: :func:`countdown_value`.
"""

from __future__ import annotations

import ast
from collections import Counter
from fractions import Fraction
from typing import Any, Sequence

from esreason.errors import UserError
from esreason.verifiers.base import Verdict, reward_for
from esreason.verifiers.extract import last_answer_block

MAX_CHARS = 512
MAX_NODES = 128
MAX_LITERAL = 10**9

_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class Rejected(ValueError):
    """The answer is not an allowed Countdown expression (message says why)."""


def _evaluate_node(node: ast.expr, literals: list[int]) -> Fraction:
    """Exact value of an allowed node; collects literals in order. Raises Rejected / ZeroDivisionError."""
    if isinstance(node, ast.Constant):
        if type(node.value) is not int:
            raise Rejected(f"only integer literals are allowed, got {node.value!r}"[:120])
        if node.value > MAX_LITERAL:
            raise Rejected(f"literal larger than {MAX_LITERAL}")
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp):
        op = _OPS.get(type(node.op))
        if op is None:
            raise Rejected(f"operator {type(node.op).__name__} is not allowed (only + - * /)")
        left = _evaluate_node(node.left, literals)
        right = _evaluate_node(node.right, literals)
        if op == "+":
            return left + right
        if op == "-":
            return left - right
        if op == "*":
            return left * right
        if right == 0:
            raise ZeroDivisionError("division by zero")
        return left / right
    if isinstance(node, ast.UnaryOp):
        raise Rejected("unary operators are not allowed")
    raise Rejected(f"{type(node).__name__} is not allowed (only numbers, + - * / and parentheses)")


def evaluate(expr: str, numbers: Sequence[int] | None = None) -> Fraction:
    """Validate and evaluate a Countdown expression exactly.

    ``numbers``: when given, the literals must be exactly this multiset. Raises
    :class:`Rejected` (with the reason) or :class:`ZeroDivisionError`.
    """
    text = expr.strip()
    if not text:
        raise Rejected("empty expression")
    if len(text) > MAX_CHARS:
        raise Rejected(f"expression longer than {MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise Rejected(f"not an arithmetic expression ({type(exc).__name__})") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise Rejected(f"expression has more than {MAX_NODES} syntax nodes")
    literals: list[int] = []
    value = _evaluate_node(tree.body, literals)
    if numbers is not None and Counter(literals) != Counter(numbers):
        missing = sorted((Counter(numbers) - Counter(literals)).elements())
        extra = sorted((Counter(literals) - Counter(numbers)).elements())
        parts = ([f"missing {missing}"] if missing else []) + ([f"not available or reused {extra}"] if extra else [])
        raise Rejected(f"numbers must be {sorted(numbers)} each used once: " + "; ".join(parts))
    return value


def countdown_value(expr: str | None, numbers: Sequence[int] | None = None) -> Fraction | None:
    """Vote key: the exact value of a valid expression (using ``numbers`` exactly once), else None."""
    if expr is None:
        return None
    try:
        return evaluate(expr, numbers)
    except (Rejected, ZeroDivisionError):
        return None


def parse_gold(gold: Any) -> tuple[int, list[int]]:
    """``(target, numbers)`` from ``{"target": int, "numbers": [int, ...]}``; UserError otherwise."""
    if not isinstance(gold, dict) or "target" not in gold or "numbers" not in gold:
        raise UserError(f"countdown gold must be {{'target': int, 'numbers': [int, ...]}}, got {gold!r}")
    target, numbers = gold["target"], gold["numbers"]

    def is_int(x: Any) -> bool:
        return isinstance(x, int) and not isinstance(x, bool)

    if not is_int(target):
        raise UserError(f"countdown gold 'target' must be an integer, got {target!r}")
    if not isinstance(numbers, (list, tuple)) or not numbers or not all(is_int(n) and n >= 0 for n in numbers):
        raise UserError(f"countdown gold 'numbers' must be a non-empty list of non-negative integers, got {numbers!r}")
    return int(target), [int(n) for n in numbers]


class CountdownScorer:
    """``score(response, gold) -> Verdict`` for Countdown (picklable)."""

    def __init__(self, format_reward: float = 0.1) -> None:
        self.format_reward = float(format_reward)

    def __call__(self, response: str, gold: Any) -> Verdict:
        target, numbers = parse_gold(gold)
        block = last_answer_block(response)
        if block is None or not block.strip():
            return Verdict(0.0, False, None, "no <answer> block" if block is None else "empty <answer> block",
                           formatted=False)
        expr = block.strip()
        wrong = reward_for(False, True, self.format_reward)
        try:
            value = evaluate(expr, numbers)
        except ZeroDivisionError:
            return Verdict(wrong, False, expr, "division by zero", formatted=True)
        except Rejected as exc:
            return Verdict(wrong, False, expr, str(exc), formatted=True)
        ok = value == target
        return Verdict(reward_for(ok, True, self.format_reward), ok, expr,
                       "correct" if ok else f"evaluates to {value}, target {target}", formatted=True,
                       extra={"value": str(value)})


def make_scorer(format_reward: float = 0.1) -> CountdownScorer:
    return CountdownScorer(format_reward)
