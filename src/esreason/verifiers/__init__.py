"""Task verifiers by name: ``get(name)(response, gold) -> Verdict``, an open registry.

Built-in names and gold formats (see each module's docstring):

- ``math``      gold: str    last ``\\boxed{}``; equivalence by math-verify in a worker pool
- ``choice``    gold: letter last ``\\boxed{}``, one letter from the valid set
- ``hotpotqa``  gold: str    ``<answer>`` tags, official normalisation, EM (+F1)
- ``countdown`` gold: {"target": int, "numbers": [int]}  AST walker over Fractions
- ``mbpp``      gold: {"tests": [str], "setup": str}     sandboxed execution

The built-ins register themselves through :func:`register`, the function a user's package
calls to add a verifier; a task names its verifier by that name. TRL-style reward
functions need no registration: :class:`esreason.verifiers.reward_functions.RewardFunctions`
wraps them into a scorer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from esreason.errors import UserError
from esreason.verifiers.base import Scorer, Verdict, reward_for


@dataclass(frozen=True)
class VerifierEntry:
    """A registered verifier.

    factory: ``factory(format_reward=...) -> Scorer``.
    parallel: its calls wait on other processes (math-verify's pool, the MBPP sandbox), so an
        evaluation scores its responses from a thread pool; in-process verifiers are called inline.
    source: where it was registered ("built-in", a module name, ...), for listings.
    """

    factory: Callable[..., Scorer]
    parallel: bool = False
    source: str = "built-in"


_REGISTRY: dict[str, VerifierEntry] = {}


def register(name: str, factory: Callable[..., Scorer], *, parallel: bool = False, source: str = "user",
             override: bool = False) -> None:
    """Register verifier ``name``: ``factory(format_reward=...)`` returns the scorer.

    A second registration of a name is refused unless ``override`` (a task package that means
    to replace a built-in says so).
    """
    if not name or ":" in name:
        raise UserError(f"verifier name {name!r}: must be non-empty and contain no ':'")
    if name in _REGISTRY and not override and _REGISTRY[name].factory is not factory:
        raise UserError(f"verifier {name!r} is already registered ({_REGISTRY[name].source}); "
                        "pass override=True to replace it")
    _REGISTRY[name] = VerifierEntry(factory, parallel, source)


def _module_factory(module: str) -> Callable[..., Scorer]:
    """The ``make_scorer`` of a verifier module, imported on first use (math-verify is heavy)."""
    def factory(format_reward: float = 0.1) -> Scorer:
        return importlib.import_module(module).make_scorer(format_reward=format_reward)
    factory.__qualname__ = f"make_scorer[{module}]"
    return factory


for _name, _parallel in (("math", True), ("choice", False), ("hotpotqa", False), ("countdown", False),
                         ("mbpp", True)):
    register(_name, _module_factory(f"esreason.verifiers.{_name}"), parallel=_parallel, source="built-in")


def names() -> tuple[str, ...]:
    """Registered verifier names, sorted."""
    return tuple(sorted(_REGISTRY))


NAMES = names()  # the built-ins (registered above)


def entry(name: str) -> VerifierEntry:
    if name not in _REGISTRY:
        raise UserError(f"unknown verifier {name!r}; known: {', '.join(names())}")
    return _REGISTRY[name]


def get(name: str, *, format_reward: float = 0.1) -> Scorer:
    """The scorer of verifier ``name`` (``factory(format_reward=...)``)."""
    return entry(name).factory(format_reward=format_reward)


def is_parallel(name: str) -> bool:
    """True when ``name``'s calls wait on other processes (unknown names: False)."""
    found = _REGISTRY.get(name)
    return bool(found and found.parallel)


__all__ = ["NAMES", "Scorer", "Verdict", "VerifierEntry", "entry", "get", "is_parallel", "names", "register",
           "reward_for"]
