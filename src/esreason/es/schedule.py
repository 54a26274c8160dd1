"""Per-epoch keep-tail mini-batch schedule (paper procedure step 1).

Each epoch is a fresh permutation of the training split (we reshuffle every
epoch, seeded by (train seed, epoch)), cut into batches of B with the last
partial batch kept. Batch t is a pure function of t, so resuming needs only the
update index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_SCHEDULE_STREAM = 0x5C4E


@dataclass(frozen=True)
class Schedule:
    """num_items: training-set size; batch_size: B; epochs: passes; seed: train seed."""

    num_items: int
    batch_size: int
    epochs: int
    seed: int

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.num_items / self.batch_size)

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch index within epoch) of update ``step``."""
        return divmod(step, self.steps_per_epoch)

    def permutation(self, epoch: int) -> np.ndarray:
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, _SCHEDULE_STREAM, epoch])))
        return rng.permutation(self.num_items)

    def batch(self, step: int) -> list[int]:
        """Indices of the training items of update ``step`` (steps past the last epoch wrap around)."""
        epoch, idx = self.position(step)
        perm = self.permutation(epoch)
        return [int(i) for i in perm[idx * self.batch_size:(idx + 1) * self.batch_size]]
