"""Synthetic verifiable task families for the embedded default (DESIGN §4).

Three families, generated deterministically from a seed, with disjoint train/test
splits. Prompts are short because the embedded model reads one token per character;
the paper's system prompts are still attached as messages (real models see them,
the demo chat template drops them).

- ``demo-add`` (in-domain): a + b with 2-4 digit operands (4-digit dominant).
  Target: a right-to-left column chain of thought, then ``\\boxed{sum}``::

      Q:4821+1937   A:1+7=8,2+3=5,8+9=17,4+1+1=6 \\boxed{6758}

  (each column "x+y[+carry]=s"; the next column adds 1 when s >= 10).
- ``demo-sub`` (held-out): a - b >= 0 with 3-4 digit operands, column chain with
  borrows ("x-y[-1]=r" and "b" when the column borrowed), ``\\boxed{difference}``.
- ``demo-countdown`` (held-out): reach a target with three numbers, each used once,
  with + - * /; the answer is an expression in ``<answer></answer>`` (no chain of
  thought: the model has to search, so sampling helps — the Pass@K regime).
- ``demo-sub3`` (held-out, not in the pretraining mixture): short subtraction, a 3-digit
  minus a 2-3 digit number, same chain and answer format as ``demo-sub``; its test and
  train questions never occur in ``demo-sub`` (neither split), so the embedded default
  never saw them. The ``demo-heldout`` suite uses it instead of ``demo-countdown``, on which
  the embedded default sits at the floor (Pass@1 < 1 %, docs/embedded.md).
"""

from __future__ import annotations

import random
from fractions import Fraction
from functools import lru_cache
from pathlib import Path

from esreason.errors import UserError
from esreason.tasks.base import Problem, Task
from esreason.tasks.registry import register

MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
COUNTDOWN_SYSTEM = ("Using the given numbers, each exactly once, and + - * /, write an expression equal to "
                    "the target inside <answer> </answer> tags.")

SPLIT_SEEDS = {"train": 1, "test": 2}
SPLIT_SIZES = {"train": 20000, "test": 500}


# --------------------------------------------------------------------------- solutions


def addition_solution(a: int, b: int) -> str:
    """Column chain of thought for a + b, right to left, then the boxed sum."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}+1={s}" if carry else f"{x}+{y}={s}")
        carry = 1 if s >= 10 else 0
    return ",".join(steps) + f" \\boxed{{{a + b}}}"


def subtraction_solution(a: int, b: int) -> str:
    """Column chain with borrows for a - b (a >= b), then the boxed difference."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, borrow = [], 0
    for i in range(len(da)):
        x = int(da[i])
        y = int(db[i]) if i < len(db) else 0
        r = x - y - borrow
        text = f"{x}-{y}-1" if borrow else f"{x}-{y}"
        borrow = 1 if r < 0 else 0
        r += 10 * borrow
        steps.append(f"{text}={r}" + ("b" if borrow else ""))
    return ",".join(steps) + f" \\boxed{{{a - b}}}"


# --------------------------------------------------------------------------- generators


def _operand(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def _gen_add(rng: random.Random) -> tuple[str, str, str, dict]:
    digits = rng.choices([2, 3, 4], weights=[1, 2, 7])[0]
    a, b = _operand(rng, digits), _operand(rng, rng.randint(max(1, digits - 1), digits))
    if rng.random() < 0.5:
        a, b = b, a
    return f"{a}+{b}", str(a + b), addition_solution(a, b), {"a": a, "b": b}


def _gen_sub(rng: random.Random) -> tuple[str, str, str, dict]:
    digits = rng.choice([3, 4])
    a, b = _operand(rng, digits), _operand(rng, rng.randint(digits - 1, digits))
    if b > a:
        a, b = b, a
    return f"{a}-{b}", str(a - b), subtraction_solution(a, b), {"a": a, "b": b}


def _gen_sub3(rng: random.Random) -> tuple[str, str, str, dict]:
    a, b = _operand(rng, 3), _operand(rng, rng.randint(2, 3))
    if b > a:
        a, b = b, a
    return f"{a}-{b}", str(a - b), subtraction_solution(a, b), {"a": a, "b": b}


_OPS = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y,
        "/": lambda x, y: x / y if y != 0 else None}


def _random_expression(rng: random.Random, nums: tuple[int, int, int]) -> tuple[str, Fraction | None]:
    """A random expression using each number once: shape (x o y) o z or x o (y o z)."""
    x, y, z = rng.sample(nums, 3)
    o1, o2 = rng.choice("+-*/"), rng.choice("+-*/")
    if rng.random() < 0.5:
        inner = _OPS[o1](Fraction(x), Fraction(y))
        value = None if inner is None else _OPS[o2](inner, Fraction(z))
        left = f"({x}{o1}{y})" if (o1 in "+-" and o2 in "*/") else f"{x}{o1}{y}"
        return f"{left}{o2}{z}", value
    inner = _OPS[o2](Fraction(y), Fraction(z))
    value = None if inner is None else _OPS[o1](Fraction(x), inner)
    return f"{x}{o1}({y}{o2}{z})", value


def _gen_countdown(rng: random.Random) -> tuple[str, dict, str, dict]:
    while True:
        nums = (rng.randint(1, 20), rng.randint(1, 20), rng.randint(1, 20))
        expr, value = _random_expression(rng, nums)
        if value is not None and value.denominator == 1 and 10 <= value <= 200:
            target = int(value)
            shown = ",".join(str(n) for n in nums)
            return (f"{shown}->{target}", {"target": target, "numbers": list(nums)},
                    f"<answer>{expr}</answer>", {"solution": expr})


_FAMILIES = {
    "demo-add": (_gen_add, MATH_SYSTEM, "math"),
    "demo-sub": (_gen_sub, MATH_SYSTEM, "math"),
    "demo-countdown": (_gen_countdown, COUNTDOWN_SYSTEM, "countdown"),
    "demo-sub3": (_gen_sub3, MATH_SYSTEM, "math"),
}
#: Families whose questions (both splits) a family never uses: demo-sub3 overlaps demo-sub's 3-digit part.
_DISJOINT_FROM = {"demo-sub3": ("demo-sub",)}
_DESCRIPTIONS = {
    "demo-add": "2-4 digit addition with a column chain of thought, answer in \\boxed{} (in-domain)",
    "demo-sub": "3-4 digit subtraction with borrows, answer in \\boxed{} (held-out)",
    "demo-countdown": "reach a target with three numbers, answer in <answer> tags (held-out)",
    "demo-sub3": "3-digit minus 2-3 digit subtraction with borrows, questions disjoint from demo-sub (held-out)",
}


@lru_cache(maxsize=16)
def _generate(family: str, split: str) -> tuple[Problem, ...]:
    """Deterministic problems of ``family``/``split``; test questions never occur in train, and no
    question of a family in ``_DISJOINT_FROM[family]`` (either split) occurs in either split."""
    gen, system, _ = _FAMILIES[family]
    test_keys: set[str] = set()
    if split == "train":
        test_keys = {p.messages[-1]["content"] for p in _generate(family, "test")}
    for other in _DISJOINT_FROM.get(family, ()):
        test_keys |= {p.messages[-1]["content"] for sp in SPLIT_SEEDS for p in _generate(other, sp)}
    rng = random.Random(f"esreason/{family}/{SPLIT_SEEDS[split]}")
    seen: set[str] = set()
    problems = []
    while len(problems) < SPLIT_SIZES[split]:
        question, gold, solution, meta = gen(rng)
        if question in seen or question in test_keys:
            continue
        seen.add(question)
        problems.append(Problem(
            task=family, id=f"{family}-{split}-{len(problems)}",
            messages=({"role": "system", "content": system}, {"role": "user", "content": question}),
            gold=gold, meta={**meta, "target_text": solution}))
    return tuple(problems)


def demo_problems(family: str, split: str) -> list[Problem]:
    """All problems of a synthetic family's split (cached; cheap to call repeatedly)."""
    if family not in _FAMILIES:
        raise UserError(f"unknown synthetic family {family!r}; known: {', '.join(_FAMILIES)}")
    if split not in SPLIT_SEEDS:
        raise UserError(f"synthetic family {family!r} has no split {split!r}; known: train, test")
    return list(_generate(family, split))


def solution_text(problem: Problem) -> str:
    """The SFT target (chain of thought + final answer) of a synthetic problem."""
    return problem.meta["target_text"]


def _loader(family: str):
    def load(split: str, data_path: Path | None) -> list[Problem]:
        if data_path is not None:
            raise UserError(f"task {family!r} is generated synthetically; it takes no data path ({data_path})")
        return demo_problems(family, split)
    return load


def _strip_key(answer: str | None) -> str | None:
    return None if answer is None else answer.strip()


for _name, (_gen, _sys, _verifier) in _FAMILIES.items():
    register(Task(name=_name, verifier=_verifier, loader=_loader(_name), splits=("train", "test"),
                  vote_key=_strip_key, description=_DESCRIPTIONS[_name]))
