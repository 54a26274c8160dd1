"""Run the requested statistics over one (base, tuned) pair in a single streaming pass."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from esreason.analysis.weights.checkpoints import DEFAULT_CHUNK_ELEMS, Checkpoint
from esreason.analysis.weights.drift import DriftAccumulator, DriftResult
from esreason.analysis.weights.localize import Localization, TopKAccumulator
from esreason.analysis.weights.rounding import RoundingAccumulator, RoundingResult
from esreason.analysis.weights.scan import Accumulator, ScanInfo, scan


@dataclass
class PairAnalysis:
    """Statistics of ``tuned`` against ``base``; fields not requested are None."""

    label: str
    base: Path
    tuned: Path
    info: ScanInfo
    drift: DriftResult | None = None
    loc: Localization | None = None
    rounding: RoundingResult | None = None

    @property
    def notes(self) -> list[str]:
        """Caveats a reader of the numbers should know about."""
        out = []
        if self.info.base_dtypes != self.info.tuned_dtypes:
            out.append(f"{self.label}: base is stored as {'/'.join(sorted(self.info.base_dtypes))} and the tuned "
                       f"checkpoint as {'/'.join(sorted(self.info.tuned_dtypes))}: every Delta includes the cast "
                       "between them")
        return out

    def provenance(self) -> dict:
        return {
            "notes": self.notes,
            "label": self.label, "base": str(self.base), "tuned": str(self.tuned),
            "tensors": self.info.tensors, "tied_weights_counted_once": self.info.tied,
            "non_float_tensors_skipped": self.info.non_float,
            "base_dtypes": sorted(self.info.base_dtypes), "tuned_dtypes": sorted(self.info.tuned_dtypes),
        }


def analyze_pair(base: str | Path | Checkpoint, tuned: str | Path | Checkpoint, *, label: str = "tuned",
                 taus: Sequence[tuple[str, float]] | None = None, topk: int | None = None,
                 rounding: bool = False, chunk_elems: int = DEFAULT_CHUNK_ELEMS,
                 progress: bool = False) -> PairAnalysis:
    """Drift (when ``taus`` is given), top-k localisation (``topk``) and rounding statistics."""
    b = base if isinstance(base, Checkpoint) else Checkpoint(base, "base")
    t = tuned if isinstance(tuned, Checkpoint) else Checkpoint(tuned, label)
    accs: list[Accumulator] = []
    d_acc = DriftAccumulator(taus) if taus is not None else None
    k_acc = TopKAccumulator(topk) if topk is not None else None
    r_acc = RoundingAccumulator() if rounding else None
    accs = [a for a in (d_acc, k_acc, r_acc) if a is not None]
    info = scan(b, t, accs, chunk_elems=chunk_elems, progress=progress)
    return PairAnalysis(label, b.path, t.path, info,
                        drift=d_acc.result() if d_acc else None,
                        loc=k_acc.result() if k_acc else None,
                        rounding=r_acc.result() if r_acc else None)
