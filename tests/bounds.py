"""The one wall-clock bound the default suite may use, and what it means.

Some tests must show that work on untrusted input *terminates*: a sandboxed infinite loop is
killed, an extractor stays linear on adversarial text, ``99**98**97`` is refused instead of
evaluated, a hung sympy call is abandoned. Each of those, when broken, runs for minutes or
forever. A bound of :data:`TERMINATES_WITHIN_S` separates "ends" from "never ends" on any machine,
however loaded (two CPU hogs beside a two-worker suite slow a process about 2-4x here), so it is
not a speed claim: how *fast* these paths are is measured in ``benchmarks/`` (no test's verdict
depends on wall time or load).

Every hostile case bounded this way must, when uncontained, outlast the bound by a wide margin
(infinite loops, a 30-s sleep under a 2-s wall clock, a tower of powers); a case that would finish
by itself within the bound proves nothing and must be checked another way.
"""

from __future__ import annotations

TERMINATES_WITHIN_S = 20.0
"""Seconds within which bounded work must have ended (module docstring)."""
