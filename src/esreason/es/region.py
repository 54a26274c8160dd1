"""The part of a full tensor that a local tensor holds, and its share of the full tensor's noise blocks.

A tensor-parallel engine holds a *shard* of each weight: a column-parallel layer (q/k/v, gate/up,
a vocabulary shard) holds a band of rows, a row-parallel layer (o_proj, down_proj) a band of
columns, a stacked-expert weight one expert's band of rows or columns. The shard receives exactly
the direction elements the unsharded tensor would: eps(seed, name) is defined on the *full*
tensor (:mod:`esreason.es.noise`: blocks of 2**22 flattened elements, each drawn from its own
seed), and a shard takes its elements out of the blocks they fall in. A member's direction
therefore depends on the seed and the tensor only, never on the tensor-parallel degree or rank.

:class:`Region` names those elements: the full tensor is read as a matrix of rows of ``width``
elements starting at flat index ``offset`` (0 for a plain 2-D weight; an expert's matrix inside
a stacked [experts, rows, cols] tensor), and the local tensor, flattened, is its sub-matrix
``rows x cols`` in row-major order. Local element (i, j) is full element
``offset + (rows[0] + i) * width + cols[0] + j``; this map is increasing, so the local elements
that fall in one noise block are one contiguous local range (:meth:`Region.pieces`).

Cost. A block is drawn whole whatever part of it a shard needs (a seeded ``torch.randn`` cannot
start in the middle of its stream). A band of rows touches about 1/TP of the blocks (plus at most
one partly used block at each end); a band of columns touches *every* block of the tensor. So a
rank draws all of each row-parallel weight and 1/TP of the rest (docs/tensor-parallel.md has the
numbers per model); the extra memory is one block (16 MiB fp32) and the piece taken from it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import torch

from esreason.es.noise import BLOCK_ELEMENTS


@dataclass(frozen=True)
class Region:
    """Local elements = the ``rows x cols`` sub-matrix of the full tensor viewed as rows of ``width``
    elements from flat index ``offset`` (see the module docstring)."""

    numel: int
    """Elements of the full tensor (they fix its noise blocks)."""
    width: int
    """Row length of the matrix view of the full tensor."""
    rows: tuple[int, int]
    """Rows [start, stop) of that matrix held locally."""
    cols: tuple[int, int]
    """Columns [start, stop) of that matrix held locally."""
    offset: int = 0
    """Flat index of the matrix view's element (0, 0) in the full tensor."""

    def __post_init__(self) -> None:
        (r0, r1), (c0, c1) = self.rows, self.cols
        if not (0 <= r0 < r1 and 0 <= c0 < c1 <= self.width and self.offset >= 0
                and self.offset + (r1 - 1) * self.width + c1 <= self.numel):
            raise ValueError(f"region rows {self.rows} x cols {self.cols} of width {self.width} at offset "
                             f"{self.offset} does not lie in a tensor of {self.numel} elements")

    @classmethod
    def whole(cls, numel: int) -> "Region":
        """All of a tensor of ``numel`` elements (one row)."""
        return cls(int(numel), int(numel), (0, 1), (0, int(numel)))

    @property
    def local_cols(self) -> int:
        return self.cols[1] - self.cols[0]

    @property
    def local_rows(self) -> int:
        return self.rows[1] - self.rows[0]

    @property
    def local_numel(self) -> int:
        return self.local_rows * self.local_cols

    @property
    def is_whole(self) -> bool:
        """The local tensor is the full tensor, element for element."""
        return self.offset == 0 and self.local_numel == self.numel and self._contiguous

    @property
    def _contiguous(self) -> bool:
        return self.local_cols == self.width or self.local_rows == 1

    def full_index(self, k: int) -> int:
        """Flat index in the full tensor of local flat element ``k``."""
        i, j = divmod(int(k), self.local_cols)
        return self.offset + (self.rows[0] + i) * self.width + self.cols[0] + j

    def local_before(self, x: int) -> int:
        """How many local elements have a full index below ``x``."""
        y = int(x) - self.offset - self.rows[0] * self.width
        if y <= 0:
            return 0
        q, rem = divmod(y, self.width)
        if q >= self.local_rows:
            return self.local_numel
        return q * self.local_cols + min(max(rem - self.cols[0], 0), self.local_cols)

    def pieces(self) -> Iterator[tuple[int, int, int, int]]:
        """(block b, size of block b, local start, local stop) for every noise block holding local
        elements, in order; the local ranges partition [0, local_numel)."""
        first, last = self.full_index(0), self.full_index(self.local_numel - 1)
        for b in range(first // BLOCK_ELEMENTS, last // BLOCK_ELEMENTS + 1):
            start = b * BLOCK_ELEMENTS
            stop = min(self.numel, start + BLOCK_ELEMENTS)
            lo, hi = self.local_before(start), self.local_before(stop)
            if hi > lo:
                yield b, stop - start, lo, hi

    def block_count(self) -> int:
        """Noise blocks a rank holding this region draws (what its RNG work is proportional to)."""
        return sum(1 for _ in self.pieces())

    def take(self, block: torch.Tensor, b: int, lo: int, hi: int) -> torch.Tensor:
        """Local elements [lo, hi) out of noise block ``b`` (``block``: [size of block b]), as a
        [hi - lo] tensor: a view for a band of whole rows, else a copy (at most one block's worth)."""
        base = b * BLOCK_ELEMENTS
        if self._contiguous:
            s = self.full_index(lo) - base
            return block[s:s + (hi - lo)]
        cl, w = self.local_cols, self.width
        i0, j0 = divmod(lo, cl)
        i1, j1 = divmod(hi - 1, cl)
        s0 = self.full_index(lo) - base
        if i0 == i1:
            return block[s0:s0 + (hi - lo)]
        head = block[s0:s0 + (cl - j0)]  # [cl - j0]: the rest of local row i0
        mid_rows = i1 - i0 - 1
        m0 = self.full_index((i0 + 1) * cl) - base
        mid = block[m0:m0 + mid_rows * w].view(mid_rows, w)[:, :cl]  # [mid_rows, cl] strided view
        t0 = self.full_index(i1 * cl) - base
        tail = block[t0:t0 + j1 + 1]  # [j1 + 1]: the start of local row i1
        return torch.cat([head, mid.reshape(-1), tail])  # [hi - lo]
