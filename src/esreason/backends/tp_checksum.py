"""Checksums of a tensor-parallel engine: one digest per rank, and the reference's digest for the same layout.

A rank hashes what it holds (:func:`rank_named`): whole tensors under their ES names (as
:func:`~esreason.backends.engine.policy_checksum` does, so an engine of one rank reports exactly
the HF policy's digest), shards under their slot keys (the ES name and the region), flattened. The
engine's checksum combines the ranks' digests in rank order (:func:`combine`). The reference --
the trainer's HF policy, which holds every tensor whole -- cuts the same regions out of its tensors
and hashes them the same way (:func:`reference_checksum`), so a pool compares an engine of any
tensor-parallel degree with the trainer's centre bit for bit, without gathering the shards.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Mapping, Sequence

import torch

from esreason.backends.ckpt_layout import take_region
from esreason.backends.engine import policy_checksum, tensors_checksum
from esreason.backends.vllm_layout import Slot
from esreason.es.region import Region


def rank_named(slots: Sequence[Slot], local: Callable[[Slot], torch.Tensor],
               masters: Mapping[str, torch.Tensor] | None = None) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs a rank hashes: its slots (``local(slot)``), plus ``master:`` + key of each
    fp32 master (``masters``: by slot key)."""
    named = [(s.key, local(s) if s.region is None else local(s).reshape(-1)) for s in slots]
    if masters is not None:
        by_key = {s.key: s for s in slots}
        named += [(f"master:{k}", t if by_key[k].region is None else t.reshape(-1)) for k, t in masters.items()]
    return named


def combine(digests: Sequence[str]) -> str:
    """The engine's checksum from its ranks' digests (rank order); one rank: its digest unchanged."""
    if len(digests) == 1:
        return str(digests[0])
    h = hashlib.blake2b(digest_size=16)
    h.update(f"tp{len(digests)}".encode())
    for d in digests:
        h.update(bytes.fromhex(d))
    return h.hexdigest()


def layout_slots(layout: Mapping[str, Any]) -> list[Slot]:
    """The slots of one rank's ``es_layout`` (only what hashing needs: names and regions)."""
    out = []
    for hf_name, region in layout["slots"]:
        reg = None if region is None else Region(region[0], region[1], (region[2], region[3]),
                                                  (region[4], region[5]), region[6])
        out.append(Slot(hf_name, "", 0, tuple(layout["tensors"][hf_name][0]), reg))
    return out


def reference_checksum(policy: Any, layouts: Sequence[Mapping[str, Any]] | None = None) -> str:
    """The checksum an engine with ``layouts`` (one ``es_layout`` per rank; None or one whole-tensor
    rank: the plain :func:`policy_checksum`) reports when it holds ``policy``'s centre."""
    if not layouts or (len(layouts) == 1 and all(r is None for _, r in layouts[0]["slots"])):
        return policy_checksum(policy)
    params = dict(policy.params.params)
    masters = policy.params.master_state()
    digests = []
    for layout in layouts:
        slots = layout_slots(layout)
        local = {s.key: _cut(params[s.hf_name].detach(), s.region) for s in slots}
        rank_masters = None
        if masters is not None and layout.get("master"):
            rank_masters = {s.key: _cut(masters[s.hf_name], s.region) for s in slots}
        digests.append(tensors_checksum(rank_named(slots, lambda s: local[s.key], rank_masters)))
    return combine(digests)


def _cut(full: torch.Tensor, region: Region | None) -> torch.Tensor:
    """A whole tensor as it is (its shape is hashed), a region's elements flat."""
    return full if region is None else take_region(full, region)
