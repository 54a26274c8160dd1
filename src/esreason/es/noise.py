"""Seeded perturbation directions, drawn on the device that holds the weights, never stored.

A population member is an integer seed. Its direction eps_i is, per parameter tensor,
a standard-Gaussian tensor reconstructed from ``(seed, stable tensor name)`` (paper
appendix "Implementation Procedure", step 2: "regenerate eps_i from its seed"). The
tensor name is the one ``named_parameters()`` yields first, so tied weights (shared
embedding / LM head) are one tensor and are perturbed once.

Blocks. The flattened tensor is cut into blocks of ``BLOCK_ELEMENTS`` (2**22) elements;
block b is one ``torch.randn`` draw from a generator seeded with
``tensor_seed(seed, name, b)``. A block can therefore be drawn without drawing the
blocks before it, and every consumer (perturb, restore, the update) works one block at a
time: the extra memory of any ES operation is a few blocks (16 MiB each in fp32), never a
copy of a large tensor (a 7B model's embedding is 545 M elements = 2.2 GB in fp32). A block
and the update's fp32 accumulator of the same size (32 MiB together) fit in an H100's 50 MB
L2 cache, so the update's draw-and-accumulate loop can stay on chip between HBM passes.
Block 0's seed is the one every earlier version of esreason used for the whole tensor, so
tensors of at most 2**22 elements (all of the embedded default's) keep their directions.

Generator and the reproducibility contract (docs/es.md, "Directions on the device"):
each block is drawn by the *device's own* generator (``torch.Generator(device)``:
Philox on CUDA, the CPU generator on CPU) directly in float32 on the device of the
weights; no host tensor and no host-to-device copy per member. What is bit-identical:

- the same (seed, name, shape) on the same device type, torch version and -- for CUDA --
  GPU model gives the same direction; so engines of a pool (same GPU model by
  construction) hold bit-identical centres, and the pool's checksums guard it;
- on CPU, any machine with the same torch version (what CI and every test rely on).

What is not: CUDA and CPU draws differ, and CUDA draws can differ between GPU models
(the kernel's launch grid, hence its Philox offsets, follows the SM count). A run is
therefore reproducible on the same kind of hardware; across hardware, the checkpoints
(which store the centre, not the directions) carry the state. We chose this over a
counter-based generator written in tensor ops because an unfused one costs tens of
passes over the weights per member -- several times the generation it serves at 1.5B
(benchmarks/noise.py) -- and bit-identical Gaussian transforms across devices would
also need identical ``log``/``cos`` implementations, which CPU and CUDA do not share.
"""

from __future__ import annotations

import hashlib
import math
from typing import Iterator

import torch

#: Elements per independently seeded block of a flattened direction (16 MiB in fp32).
BLOCK_ELEMENTS = 1 << 22


def tensor_seed(seed: int, name: str, block: int = 0) -> int:
    """63-bit generator seed for (member seed, tensor name, block): blake2b, stable everywhere.

    Block 0 hashes ``"{seed}\\x1f{name}"`` (the whole-tensor seed of earlier versions);
    block b >= 1 hashes ``"{seed}\\x1f{name}\\x1f{b}"``.
    """
    key = f"{int(seed)}\x1f{name}" if block == 0 else f"{int(seed)}\x1f{name}\x1f{int(block)}"
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def device_generator(device: torch.device | str, seed: int) -> torch.Generator | None:
    """The device's own generator seeded with ``seed`` (None on ``meta``, which draws no values)."""
    device = torch.device(device)
    if device.type == "meta":
        return None
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen


def generator_domain(device: torch.device | str) -> str:
    """Where a seed means the same direction: device type, GPU model and SM count, torch version.

    Two places with equal domains draw bit-identical directions from the same seeds (the
    contract in the module docstring); a Ray pool refuses engines whose domains differ.
    """
    device = torch.device(device)
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return f"cuda:{props.name}:{props.multi_processor_count}SM:torch-{torch.__version__}"
    return f"{device.type}:torch-{torch.__version__}"


def numel_of(shape: torch.Size | tuple[int, ...]) -> int:
    return math.prod(int(d) for d in shape)


def block_spans(numel: int) -> Iterator[tuple[int, int, int]]:
    """(block index, start, stop) of the flattened elements [0, numel), in order."""
    for b, start in enumerate(range(0, numel, BLOCK_ELEMENTS)):
        yield b, start, min(numel, start + BLOCK_ELEMENTS)


def direction_block(seed: int, name: str, block: int, size: int, *,
                    device: torch.device | str = "cpu") -> torch.Tensor:
    """Block ``block`` of eps(seed, name): float32 [size], drawn on ``device`` by its own generator."""
    gen = device_generator(device, tensor_seed(seed, name, block))
    return torch.randn(size, generator=gen, dtype=torch.float32, device=device)  # [size] fp32


def direction(seed: int, name: str, shape: torch.Size | tuple[int, ...], *,
              device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """eps(seed, name): the whole i.i.d. N(0, 1) tensor of ``shape``, drawn on ``device``, cast to ``dtype``.

    Materialises the full tensor: for tests, analyses and consumers that need it dense.
    The ES operations (:mod:`esreason.es.apply`) use :func:`direction_block` instead.
    """
    n = numel_of(shape)
    if n <= BLOCK_ELEMENTS:
        eps = direction_block(seed, name, 0, n, device=device)  # [n] fp32
    else:
        eps = torch.empty(n, dtype=torch.float32, device=device)  # [n] fp32
        for b, start, stop in block_spans(n):
            eps[start:stop] = direction_block(seed, name, b, stop - start, device=device)
    eps = eps.view(tuple(shape))
    return eps if dtype == torch.float32 else eps.to(dtype)
