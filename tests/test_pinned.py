"""Pinned fp32 masters without power-of-two waste (esreason.backends.pinned).

On this CPU nothing can be page-locked: the tests check the layout (bytes pinned within 5 % of
the bytes asked for, at Qwen2.5-7B's real shapes), that the views are disjoint and usable, and,
with a recording stand-in for ``torch.cuda.cudart()``, that the buffer is registered by one call of
exactly its size and unregistered once. scripts/gpu-check.sh checks the real registration.
"""

from __future__ import annotations

import pytest
import torch

from esreason.backends.pinned import ALIGN, PinnedArena, plan_layout
from esreason.io.architectures import architecture, hf_config


def _qwen7b_master_specs() -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every parameter of Qwen2.5-7B-Instruct (meta device: no memory), as fp32 masters."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(architecture("Qwen/Qwen2.5-7B-Instruct")))
    return {n: (tuple(p.shape), torch.float32) for n, p in model.named_parameters()}


def _power_of_two_bytes(nbytes: int) -> int:
    return 1 << (nbytes - 1).bit_length()


def test_qwen7b_masters_pin_their_own_size_not_the_next_power_of_two():
    specs = _qwen7b_master_specs()
    layout = plan_layout(specs)
    payload = layout.payload
    assert 7.5e9 < payload / 4 < 7.7e9  # 7.6B parameters in fp32
    assert layout.total <= payload + ALIGN * len(specs)
    assert layout.total / payload < 1.05  # the bound: within 5 % of the bytes pinned
    # what one tensor at a time through the caching host allocator would pin: about twice as much
    rounded = sum(_power_of_two_bytes(n) for n in layout.nbytes.values())
    assert rounded / payload > 1.5


def test_views_are_aligned_disjoint_and_hold_what_is_written():
    specs = {"a": ((3, 5), torch.float32), "b": ((7,), torch.bfloat16), "c": ((2, 2, 3), torch.float32)}
    arena = PinnedArena(specs, register=False)
    assert not arena.registered and arena.pinned_bytes == 0
    offs = arena.layout.offsets
    assert all(o % ALIGN == 0 for o in offs.values())
    ends = sorted((offs[n], offs[n] + arena.layout.nbytes[n]) for n in specs)
    assert all(e0 <= s1 for (_, e0), (s1, _) in zip(ends, ends[1:]))  # no overlap
    for i, (name, (shape, dtype)) in enumerate(specs.items()):
        t = arena.tensors[name]
        assert tuple(t.shape) == shape and t.dtype == dtype and t.is_contiguous()
        t.copy_(torch.full(shape, float(i + 1)))
    for i, name in enumerate(specs):  # writing one view did not touch another
        assert torch.equal(arena.tensors[name].float(), torch.full(specs[name][0], float(i + 1)))


class _RecordingCudart:
    def __init__(self, code: int = 0) -> None:
        self.calls: list[tuple] = []
        self.code = code

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 (CUDA's name)
        self.calls.append(("register", ptr, size, flags))
        return self.code

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.calls.append(("unregister", ptr))
        return 0


def test_one_registration_of_exactly_the_buffer_and_one_unregistration(monkeypatch):
    cudart = _RecordingCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: cudart)
    specs = {"w": ((1000, 3), torch.float32), "b": ((3,), torch.float32)}
    with PinnedArena(specs) as arena:
        assert arena.registered and arena.pinned_bytes == arena.layout.total
        ptr = arena.tensors["w"].data_ptr()
        assert cudart.calls == [("register", ptr, arena.layout.total, 0)]
        assert arena.layout.total == 12000 + (-12000 % ALIGN) + 12
    assert cudart.calls[1:] == [("unregister", ptr)]
    arena.close()  # idempotent
    assert len(cudart.calls) == 2


def test_a_failed_registration_names_the_size_and_the_likely_limit(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: _RecordingCudart(code=2))
    with pytest.raises(RuntimeError, match=r"cudaHostRegister of 0\.00 GiB failed with CUDA error 2.*ulimit -l"):
        PinnedArena({"w": ((4,), torch.float32)})


def test_registration_needs_cuda_and_pins_when_it_is_there():
    """Without CUDA: refused, not silently skipped (the default registers only with CUDA). With CUDA
    (a GPU machine running the suite): the views are what torch calls pinned."""
    if torch.cuda.is_available():
        with PinnedArena({"w": ((4,), torch.float32)}, register=True) as arena:
            assert arena.tensors["w"].is_pinned() and arena.pinned_bytes == 16
        return
    with pytest.raises(RuntimeError, match="needs CUDA"):
        PinnedArena({"w": ((4,), torch.float32)}, register=True)
    assert not PinnedArena({"w": ((4,), torch.float32)}).registered
