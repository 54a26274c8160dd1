"""Page-locked host tensors of exactly the bytes asked for (pinned fp32 masters).

A vLLM ES engine whose fp32 masters do not fit beside vLLM's reservation keeps them in pinned
host memory (``vllm_worker._es_snapshot``), so perturb and restore read them by DMA. Allocated as
``torch.empty(..., pin_memory=True)`` one tensor at a time, they go through torch's caching host
allocator, which rounds every block up to a power of two: at 7B (28.4 GiB of masters, the
embedding and head 2.03 GiB each, every MLP matrix 0.25 GiB) that pins 53.9 GiB per engine (1.90x),
431 GiB on an 8-GPU node.

:class:`PinnedArena` instead lays every tensor out in one flat buffer of ordinary (pageable) host
memory, allocated once at its exact size, and page-locks that buffer with one
``cudaHostRegister`` call (``torch.cuda.cudart()``): pinned bytes = the tensors' bytes plus at most
``ALIGN - 1`` per tensor. Registered memory is what ``Tensor.is_pinned()`` reports as pinned and
what asynchronous host-to-device copies need. Without CUDA (our CPU machines, the CPU twin) the
arena is the same layout in ordinary memory and nothing is registered: the layout and its byte
count are what the CPU tests check; the registration is checked on a GPU by scripts/gpu-check.sh.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import torch

log = logging.getLogger(__name__)

ALIGN = 512
"""Every tensor starts on a multiple of this many bytes: CUDA copies are fastest from 256-byte
aligned host addresses, and 512 also keeps every dtype's own alignment."""


@dataclass(frozen=True)
class Layout:
    """Where each named tensor lives in the flat buffer."""

    offsets: dict[str, int]
    """Byte offset of each tensor, a multiple of :data:`ALIGN`."""
    nbytes: dict[str, int]
    """Bytes of each tensor (numel x element size)."""
    total: int
    """Bytes of the flat buffer: the last tensor's end (no padding after it)."""

    @property
    def payload(self) -> int:
        """Bytes the tensors themselves need."""
        return sum(self.nbytes.values())


def plan_layout(specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]]) -> Layout:
    """Offsets for ``specs`` (name -> (shape, dtype)) in insertion order, each aligned to :data:`ALIGN`."""
    offsets, sizes, end = {}, {}, 0
    for name, (shape, dtype) in specs.items():
        numel = 1
        for d in shape:
            numel *= int(d)
        start = -(-end // ALIGN) * ALIGN
        offsets[name], sizes[name] = start, numel * torch.empty((), dtype=dtype).element_size()
        end = start + sizes[name]
    return Layout(offsets, sizes, end)


class PinnedArena:
    """Named host tensors carved out of one flat buffer, page-locked once when CUDA is present.

    ``register``: None registers exactly when ``torch.cuda.is_available()``; True requires it.
    Call :meth:`close` (or use it as a context manager) to unregister; the tensors stay valid
    ordinary memory until the arena is garbage collected.
    """

    def __init__(self, specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]], *,
                 register: bool | None = None) -> None:
        self.layout = plan_layout(specs)
        self._flat = torch.empty(max(self.layout.total, 1), dtype=torch.uint8)  # [total] bytes, pageable
        self.tensors: dict[str, torch.Tensor] = {}
        for name, (shape, dtype) in specs.items():
            off, n = self.layout.offsets[name], self.layout.nbytes[name]
            self.tensors[name] = self._flat[off:off + n].view(dtype).view(tuple(shape))
        want = torch.cuda.is_available() if register is None else register
        self.registered = False
        if want:
            self._register()

    def _register(self) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError("PinnedArena(register=True) needs CUDA: there is no device to pin host memory for")
        code = int(torch.cuda.cudart().cudaHostRegister(self._flat.data_ptr(), self._flat.numel(), 0))
        if code != 0:
            raise RuntimeError(f"cudaHostRegister of {self._flat.numel() / 2**30:.2f} GiB failed with CUDA error "
                               f"{code} (the host may not allow locking that much memory: ulimit -l)")
        self.registered = True
        log.info("pinned arena: %.3f GiB registered for %d tensors (%.3f GiB of payload)",
                 self.pinned_bytes / 2**30, len(self.tensors), self.layout.payload / 2**30)

    @property
    def pinned_bytes(self) -> int:
        """Bytes page-locked (0 when nothing is registered)."""
        return self._flat.numel() if self.registered else 0

    def close(self) -> None:
        """Unregister the buffer (idempotent)."""
        if self.registered:
            code = int(torch.cuda.cudart().cudaHostUnregister(self._flat.data_ptr()))
            self.registered = False
            if code != 0:
                raise RuntimeError(f"cudaHostUnregister failed with CUDA error {code}")

    def __enter__(self) -> PinnedArena:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
