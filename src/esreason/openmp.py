"""How long torch's OpenMP threads spin before they sleep: a bounded default for the CLI (issue 36).

Why. torch's CPU build runs its intra-op work on GNU OpenMP (libgomp), whose idle threads *spin*
for ``GOMP_SPINCOUNT`` iterations (300,000 unless the user sets ``OMP_WAIT_POLICY`` or
``GOMP_SPINCOUNT``) before they sleep. A tiny model (the embedded default: 0.87M parameters) runs
operators of microseconds, most too small for torch to parallelise, so between parallel regions
the workers spin on the cores the main thread needs. On an idle machine nothing else wants those
cores; with any other runnable process they compete with it and with the main thread, and every
barrier waits for a time slice. Measured on a 2-core Intel Xeon (2026-11-28, torch 2.13.0, 2 torch
threads; ``esreason experiment plan configs/experiments/demo.yaml --calibrate``: the demo's wall
time, seconds, as the plan calibrated in each condition predicts it, idle / beside one ``yes``):

- libgomp's default, 300,000: idle 235; beside ``yes`` the calibration had not finished after
  9 minutes (idle: 45 s): its ES updates decoded in 21-26 s each, against 1.0-1.1 s idle;
- 100,000: 229 / 2,248;
- 10,000: 237 / 674;
- **3,000 (ours): 244 / 489**;
- 1,000: 311 / 435;
- 0 (``OMP_WAIT_POLICY=passive``): 344 / 405;
- 1 torch thread instead of 2 (libgomp's default spin): 400 / 397.

3,000 costs a few per cent idle and is several times faster than the default beside one busy
process. ``benchmarks/openmp_spin.py`` measures it side by side on the demo's ES updates (N 32,
B 16, 64 greedy tokens; same machine and day, 2 repeats per cell, seconds per update):

- 3,000 (two runs): idle 1.41 / 1.39 s at the default and 1.50 / 1.55 s at 3,000 (0.94x / 0.89x);
  beside one ``yes`` 28.5 / 26.0 s at the default and 3.09 / 3.26 s at 3,000 (9.2x / 8.0x faster).
  One busy process costs 18-20x at the default, 2.1x (the lost core) at 3,000.
- ``--spin 10000``: idle 0.97x, beside one ``yes`` 4.68 s (8.4x faster than the default, 1.45x
  slower than 3,000). We take 3,000: a machine with something else running is the common case on
  a user's desk, and its idle cost is 6-11 % of a tiny model's decode.

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

#: Spin iterations before an idle libgomp thread sleeps (the table above; libgomp's default 300,000).
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
