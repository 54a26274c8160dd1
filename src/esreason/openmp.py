"""How long torch's OpenMP threads spin before they sleep: a bounded default for the CLI.

Why. torch's CPU build runs its intra-op work on GNU OpenMP (libgomp), whose idle threads *spin*
for ``GOMP_SPINCOUNT`` iterations (300,000 unless the user sets ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT``) before they sleep. A tiny model (the embedded default: 0.87M parameters) runs
operators of microseconds, most too small for torch to parallelise, so between parallel regions
the workers spin on the cores the main thread needs. On an idle machine nothing else wants those
cores; with any other runnable process they compete with it and with the main thread, and every
barrier waits for a time slice. 3,000 costs a few per cent on an idle machine and is several times
faster than libgomp's default beside one busy process; a machine with something else running is
the common case on a user's desk, so we take 3,000 (``benchmarks/openmp_spin.py`` measures it side
by side; figures in docs/measurements.md).

What. :func:`configure` sets ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` in the environment when
the user set neither ``GOMP_SPINCOUNT`` nor ``OMP_WAIT_POLICY`` (their choice wins). libgomp reads
it once, when torch is first imported, so :func:`esreason.cli.main` calls this before any import
of torch; processes the CLI starts (``accelerate``, Ray workers, vLLM engines) inherit it. Where
torch was already imported (a test calling ``main`` in process) it changes nothing, and says so
by returning False. It affects only CPU threads: on a GPU node the CPU side hardly runs OpenMP.
"""

from __future__ import annotations

import os
import sys
from typing import MutableMapping

#: Spin iterations before an idle libgomp thread sleeps (the module docstring; libgomp's default 300,000).
SPIN_COUNT = 3000


def configure(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set ``GOMP_SPINCOUNT`` to :data:`SPIN_COUNT` unless the user chose a wait policy.

    Returns True when the setting takes effect in this process (torch not imported yet and the
    user set neither variable)."""
    env = os.environ if environ is None else environ
    if "GOMP_SPINCOUNT" in env or "OMP_WAIT_POLICY" in env:
        return False
    env["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return environ is not None or "torch" not in sys.modules


def describe(environ: MutableMapping[str, str] | None = None) -> str:
    """The OpenMP wait setting in force, for ``esreason info`` and the calibration's machine line."""
    env = os.environ if environ is None else environ
    if "OMP_WAIT_POLICY" in env:
        return f"OMP_WAIT_POLICY={env['OMP_WAIT_POLICY']}"
    if "GOMP_SPINCOUNT" in env:
        return f"GOMP_SPINCOUNT={env['GOMP_SPINCOUNT']}"
    return "libgomp default spin (300000)"


__all__ = ["SPIN_COUNT", "configure", "describe"]
