"""Per-epoch keep-tail mini-batch schedule (paper procedure step 1), and the data stream of
a sequential composition.

Each epoch is a fresh permutation of the training split (we reshuffle every
epoch, seeded by (train seed, epoch)), cut into batches of B with the last
partial batch kept. Batch t is a pure function of t, so resuming needs only the
update index.

**The stream** (``train.stream_start``, set by a composition for both of its stages): the
same per-epoch permutations concatenated into one sequence of prompts, read B at a time
from position ``stream_start`` (prompts consumed before this run). Every batch is full (a
batch may cross an epoch boundary), so ES and GRPO (which cannot train on a partial rollout
batch) read it alike, and stage 2 of a composition, started at stage 1's end position, takes
exactly the batches one run of T updates would have taken next (paper §"Sequentially Mixed
Training": the budget is split, the data is not restarted).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

_SCHEDULE_STREAM = 0x5C4E


def epoch_permutation(num_items: int, seed: int, epoch: int) -> np.ndarray:
    """The order of ``epoch``: a permutation of range(num_items) seeded by (seed, epoch)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, _SCHEDULE_STREAM, epoch])))
    return rng.permutation(num_items)


def stream_items(num_items: int, seed: int, start: int, count: int) -> list[int]:
    """Items [start, start + count) of the data stream: the epoch permutations, concatenated."""
    if num_items < 1:
        raise ValueError("the data stream needs at least one training item")
    out: list[int] = []
    pos = start
    while len(out) < count:
        epoch, offset = divmod(pos, num_items)
        take = epoch_permutation(num_items, seed, epoch)[offset:offset + count - len(out)]
        out.extend(int(i) for i in take)
        pos += len(take)
    return out


@dataclass(frozen=True)
class Schedule:
    """num_items: training-set size; batch_size: B; epochs: passes; seed: train seed;
    stream_start: None = the keep-tail per-epoch schedule; an int = read the data stream from
    that prompt position (a composition's stage; full batches)."""

    num_items: int
    batch_size: int
    epochs: int
    seed: int
    stream_start: int | None = None

    @property
    def steps_per_epoch(self) -> int:
        if self.stream_start is not None:
            return max(1, self.num_items // self.batch_size)
        return math.ceil(self.num_items / self.batch_size)

    @property
    def total_steps(self) -> int:
        if self.stream_start is not None:  # what is left of `epochs` passes, in full batches
            return max(0, self.num_items * self.epochs - self.stream_start) // self.batch_size
        return self.steps_per_epoch * self.epochs

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, batch index within epoch) of update ``step`` (stream: the epoch its first prompt is in)."""
        if self.stream_start is not None:
            pos = self.stream_start + step * self.batch_size
            return pos // self.num_items, (pos % self.num_items) // self.batch_size
        return divmod(step, self.steps_per_epoch)

    def permutation(self, epoch: int) -> np.ndarray:
        return epoch_permutation(self.num_items, self.seed, epoch)

    def batch(self, step: int) -> list[int]:
        """Indices of the training items of update ``step`` (steps past the last epoch wrap around)."""
        if self.stream_start is not None:
            return stream_items(self.num_items, self.seed, self.stream_start + step * self.batch_size,
                                self.batch_size)
        epoch, idx = self.position(step)
        perm = self.permutation(epoch)
        return [int(i) for i in perm[idx * self.batch_size:(idx + 1) * self.batch_size]]
