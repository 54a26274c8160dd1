"""One streaming pass over a (base, tuned) checkpoint pair, feeding several accumulators.

The drift, localisation and rounding statistics all need Delta theta = theta - theta_0
coordinate by coordinate. :func:`scan` computes it once per chunk, in float64 (exact
for differences of bf16/fp16 values; for fp32 it is exact unless the two exponents
differ by more than 29), and hands it to every accumulator, so one read of the two
checkpoints serves all requested analyses.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import torch

from esreason.analysis.weights.checkpoints import DEFAULT_CHUNK_ELEMS, Checkpoint, PairedChunk, paired_chunks
from esreason.errors import UserError


class Accumulator(Protocol):
    """Consumes aligned chunks; ``b``, ``d``, ``a`` are 1-D float64: theta_0, Delta, |Delta|."""

    def add(self, chunk: PairedChunk, b: torch.Tensor, d: torch.Tensor, a: torch.Tensor) -> None: ...


@dataclass
class ScanInfo:
    """What a scan saw besides the statistics: skipped non-float tensors, tie rule applied."""

    tensors: int = 0
    non_float: list[str] = field(default_factory=list)
    tied: dict[str, str] = field(default_factory=dict)
    base_dtypes: set[str] = field(default_factory=set)
    tuned_dtypes: set[str] = field(default_factory=set)


def open_pair(base: str, tuned: str, tuned_label: str = "tuned") -> tuple[Checkpoint, Checkpoint]:
    return Checkpoint(base, "base"), Checkpoint(tuned, tuned_label)


def scan(base: Checkpoint, tuned: Checkpoint, accumulators: Sequence[Accumulator], *,
         chunk_elems: int = DEFAULT_CHUNK_ELEMS, progress: bool = False) -> ScanInfo:
    """Stream both checkpoints once; every float tensor's chunks go to every accumulator.

    Non-float tensors (integer buffers) are not parameters: they are skipped and listed,
    and must be identical in both checkpoints. Non-finite values raise UserError.
    """
    info = ScanInfo(tied={**base.tied_alias, **tuned.tied_alias})
    last = None
    names = base.names
    for ch in paired_chunks(base, tuned, chunk_elems=chunk_elems):
        if ch.name != last:
            info.tensors += 1
            last = ch.name
            if progress:
                print(f"\r[{info.tensors}/{len(names)}] {ch.name[:70]:<70}", end="", file=sys.stderr, flush=True)
        if not (base.infos[ch.name].is_float and tuned.infos[ch.name].is_float):
            if not torch.equal(ch.base, ch.tuned.to(ch.base.dtype)):
                raise UserError(f"non-float tensor {ch.name!r} differs between base and {tuned.label}")
            if ch.name not in info.non_float:
                info.non_float.append(ch.name)
            continue
        info.base_dtypes.add(ch.base_dtype)
        info.tuned_dtypes.add(ch.tuned_dtype)
        b = ch.base.to(torch.float64)   # [n] theta_0
        t = ch.tuned.to(torch.float64)  # [n] theta
        d = t - b                       # [n] Delta theta
        if not bool(torch.isfinite(d).all()):
            raise UserError(f"tensor {ch.name!r} holds non-finite values (inf/nan) in base or {tuned.label}")
        a = d.abs()
        for acc in accumulators:
            acc.add(ch, b, d, a)
    if progress:
        print(file=sys.stderr)
    return info
