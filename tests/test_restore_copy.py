"""Exact restore converts on the device, never in a blocking cross-device copy.

A vLLM engine whose fp32 masters live in pinned host memory restores a bf16 model on the GPU with
:func:`esreason.es.apply.copy_tensor`. One blocking ``copy_`` from host fp32 to device bf16 makes
ATen convert on the CPU (aten/src/ATen/native/cuda/Copy.cu, ``copy_kernel_cuda``), on one thread.

This machine has no GPU, so the tests stand the ``meta`` device in for it: a meta tensor has a
device other than the CPU and no data, and a :class:`TorchDispatchMode` records every ``copy_`` and
``_to_copy`` the restore asks torch for, with the devices and dtypes of both sides. The property
checked is the request itself (no single op both changes device and dtype), which is what decides
where ATen converts; the GPU only adds speed. On the tree before the fix the first four tests fail
(``copy_`` of meta bf16 <- cpu fp32 is recorded); the last guards the unchanged same-device path.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from esreason.backends.vllm_worker import ESWorkerExtension, Slot
from esreason.es.apply import copy_tensor
from esreason.es.noise import BLOCK_ELEMENTS

META = torch.device("meta")


class CopyRecorder(TorchDispatchMode):
    """Records (op, source device, source dtype, target device, target dtype, non_blocking) of every copy.

    A copy out of a meta tensor into a host one has no data to move: it is recorded and skipped.
    """

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[tuple[str, torch.device, torch.dtype, torch.device, torch.dtype, bool]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            nb = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
            self.copies.append(("copy_", src.device, src.dtype, dst.device, dst.dtype, nb))
            if src.device == META and dst.device != META:
                return dst
        elif func is torch.ops.aten._to_copy.default:
            src = args[0]
            dev = kwargs.get("device") or src.device
            dtype = kwargs.get("dtype") or src.dtype
            self.copies.append(("_to_copy", src.device, src.dtype, torch.device(dev), dtype,
                                bool(kwargs.get("non_blocking", False))))
        return func(*args, **kwargs)

    def cross_device_conversions(self) -> list[tuple]:
        return [c for c in self.copies if c[1] != c[3] and c[2] != c[4]]

    def transfers(self) -> list[tuple]:
        return [c for c in self.copies if c[1] != c[3]]


def test_host_fp32_to_device_bf16_moves_then_converts_on_the_device():
    numel = 2 * BLOCK_ELEMENTS + 5  # three pieces (meta tensors cost no memory)
    target = torch.empty(numel, dtype=torch.bfloat16, device=META)
    source = torch.empty(numel, dtype=torch.float32)  # the masters' host copy (not pinned here)
    with CopyRecorder() as rec:
        copy_tensor(target, source)
    assert rec.cross_device_conversions() == []
    moves = rec.transfers()
    assert len(moves) == 3 and all(m[1:5] == (torch.device("cpu"), torch.float32, META, torch.float32)
                                   for m in moves)
    assert not any(m[5] for m in moves)  # pageable host memory: a blocking move
    converts = [c for c in rec.copies if c[3] == META and c[2] != c[4]]
    assert len(converts) == 3 and all(c[1] == META and c[4] == torch.bfloat16 for c in converts)


def test_pinned_masters_move_asynchronously(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, device=None: self.device.type == "cpu")
    target = torch.empty(1000, dtype=torch.bfloat16, device=META)
    with CopyRecorder() as rec:
        copy_tensor(target, torch.empty(1000, dtype=torch.float32))
    (move,) = rec.transfers()
    assert move[5] is True  # non_blocking from page-locked memory, on the current stream
    assert rec.cross_device_conversions() == []


def test_the_workers_restore_path_converts_on_the_device():
    """``ESWorkerExtension.es_restore`` (exact, fp32 masters in host memory, bf16 weights on the device)."""
    worker = ESWorkerExtension()
    shapes = {"model.embed_tokens.weight": (64, 32), "model.norm.weight": (32,)}
    worker._es_slots = [Slot(n, n, 0, s) for n, s in shapes.items()]
    worker._es_params = {n: torch.nn.Parameter(torch.empty(s, dtype=torch.bfloat16, device=META),
                                               requires_grad=False) for n, s in shapes.items()}
    worker._es_centre = {n: torch.zeros(s, dtype=torch.float32) for n, s in shapes.items()}
    worker._es_restore, worker._es_master, worker._es_active = "exact", True, (3, 0.01)
    with CopyRecorder() as rec:
        worker.es_restore()
    assert rec.cross_device_conversions() == []
    assert len(rec.transfers()) == 2  # one move per tensor, in fp32


def test_device_to_host_converts_on_the_device_before_moving():
    target = torch.empty(100, dtype=torch.bfloat16)
    with CopyRecorder() as rec:
        copy_tensor(target, torch.empty(100, dtype=torch.float32, device=META))
    assert rec.cross_device_conversions() == []
    (move,) = rec.transfers()
    assert move[1:5] == (META, torch.bfloat16, torch.device("cpu"), torch.bfloat16)  # the narrower bits move


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_same_device_copy_rounds_to_nearest_even_in_one_copy(dtype):
    """On one device nothing changes: one copy per piece, the bits of ``Tensor.to`` (ties included)."""
    g = torch.Generator().manual_seed(0)
    source = torch.randn(BLOCK_ELEMENTS + 7, generator=g)
    # values exactly halfway between two bf16 numbers: 1 + 2^-8 (ties to 1) and 1 + 3 * 2^-8 (to 1 + 2^-6)
    source[:2] = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8])
    target = torch.empty(source.shape, dtype=dtype)
    with CopyRecorder() as rec:
        copy_tensor(target, source)
    assert len(rec.copies) == 2 and rec.transfers() == []
    assert torch.equal(target.view(torch.int16), source.to(dtype).view(torch.int16))
    if dtype is torch.bfloat16:
        assert target[:2].tolist() == [1.0, 1 + 2 ** -6]
