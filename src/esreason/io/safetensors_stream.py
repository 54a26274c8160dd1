"""Writing a ``.safetensors`` file tensor by tensor (:class:`SafetensorsStreamWriter`), and its dtype names.

Used where an output is model-sized and must not be held whole: the weight analyses
(:mod:`esreason.analysis.weights`) and the merge of a tensor-parallel engine's shards into one
checkpoint (:mod:`esreason.backends.tp_export`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, BinaryIO, Sequence

import torch

#: safetensors dtype strings <-> torch dtypes (the ones a causal-LM checkpoint holds).
ST_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
TORCH_TO_ST = {v: k for k, v in ST_DTYPES.items()}
FLOAT_ST = ("F64", "F32", "F16", "BF16")


class SafetensorsStreamWriter:
    """Write a ``.safetensors`` file tensor by tensor, chunk by chunk.

    ``safetensors.torch.save_file`` needs every tensor in memory at once; a model-sized
    output would defeat the streaming readers. The format is simple enough to stream:
    an 8-byte little-endian header length, a JSON header mapping each name to
    ``{dtype, shape, data_offsets}`` (offsets relative to the data section, header
    padded with spaces to 8-byte alignment, as the reference writer does), then the raw
    little-endian bytes in header order. Tensors must be written in the declared
    order and exactly fill their declared sizes; :meth:`close` checks this.
    """

    def __init__(self, path: str | Path, specs: Sequence[tuple[str, str, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        if sys.byteorder != "little":
            raise RuntimeError("SafetensorsStreamWriter assumes a little-endian host")
        self.path = Path(path)
        header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
        self._order: list[tuple[str, int]] = []
        pos = 0
        for name, dtype, shape in specs:
            if dtype not in ST_DTYPES:
                raise ValueError(f"unsupported dtype {dtype} for {name}")
            n = 1
            for s in shape:
                n *= s
            nbytes = n * torch.empty((), dtype=ST_DTYPES[dtype]).element_size()
            header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
            self._order.append((name, nbytes))
            pos += nbytes
        raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
        raw += b" " * (-len(raw) % 8)
        self._fh: BinaryIO = open(self.path, "wb")
        self._fh.write(len(raw).to_bytes(8, "little"))
        self._fh.write(raw)
        self._i = 0
        self._written = 0
        self._skip_empty()

    def _skip_empty(self) -> None:
        while self._i < len(self._order) and self._order[self._i][1] == 0:
            self._i += 1

    def write(self, name: str, chunk: torch.Tensor) -> None:
        """Append the next chunk (row-major, any shape) of tensor ``name``."""
        if chunk.numel() == 0:
            return
        if self._i >= len(self._order):
            raise RuntimeError(f"write({name!r}) after the last declared tensor")
        expect, nbytes = self._order[self._i]
        if name != expect:
            raise RuntimeError(f"tensors out of order: got {name!r}, expected {expect!r}")
        data = chunk.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
        self._fh.write(data)
        self._written += len(data)
        if self._written > nbytes:
            raise RuntimeError(f"tensor {name!r}: wrote {self._written} bytes, declared {nbytes}")
        if self._written == nbytes:
            self._i += 1
            self._written = 0
            self._skip_empty()

    def abort(self) -> None:
        """Close without the completeness check (the caller discards the file)."""
        self._fh.close()

    def close(self) -> None:
        self._fh.flush()
        self._fh.close()
        if self._i != len(self._order):
            raise RuntimeError(f"incomplete safetensors file {self.path}: {self._order[self._i][0]!r} not written")
