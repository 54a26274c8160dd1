"""Engine checksums hashed in parallel and gathered from every engine at once.

The digest is what the pool compares between the trainer's centre and every engine, so it must
not depend on how it was computed (threads, input order) and must change with any bit.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import torch

from esreason.backends.engine import tensors_checksum


def _named():
    g = torch.Generator().manual_seed(0)
    return [(f"layer{i}.weight", torch.randn(257, 33, generator=g).to(torch.bfloat16 if i % 2 else torch.float32))
            for i in range(9)]


def test_digest_does_not_depend_on_threads_or_order():
    named = _named()
    one = tensors_checksum(named, threads=1)
    assert tensors_checksum(named, threads=4) == one
    assert tensors_checksum(list(reversed(named)), threads=8) == one


def test_digest_changes_with_one_bit_a_name_a_dtype_or_a_shape():
    named = _named()
    base = tensors_checksum(named)
    flipped = [(n, t.clone()) for n, t in named]
    flipped[3][1].view(-1).view(torch.int16)[7] ^= 1  # one bit of one bf16 element
    assert tensors_checksum(flipped) != base
    assert tensors_checksum([("renamed" if i == 0 else n, t) for i, (n, t) in enumerate(named)]) != base
    assert tensors_checksum([(n, t.to(torch.float32)) if i == 1 else (n, t) for i, (n, t) in enumerate(named)]) != base
    assert tensors_checksum([(n, t.reshape(33, 257)) if i == 0 else (n, t) for i, (n, t) in enumerate(named)]) != base


def test_tensors_are_hashed_on_several_threads_at_once():
    """The first two digests wait for each other: with one thread the barrier would break."""
    import esreason.backends.engine as engine

    named = _named()
    barrier, calls = threading.Barrier(2, timeout=30), []
    original = engine._tensor_digest

    def meeting(name, t):
        calls.append(name)
        if len(calls) <= 2:
            barrier.wait()  # returns only when two hashes run at the same time
        return original(name, t)

    engine._tensor_digest = meeting
    try:
        assert tensors_checksum(named, threads=4) == tensors_checksum(named, threads=1)
    finally:
        engine._tensor_digest = original
    assert not barrier.broken


def test_the_pool_asks_every_engine_before_waiting_for_any():
    """RayEnginePool.checksums submits every engine's checksum call, then collects: the engines hash
    at the same time (one after another cost about 15 s per engine at 1.5B)."""
    from esreason.backends.ray_pool import RayEnginePool

    events: list[str] = []

    class Call:
        def __init__(self, rank):
            self.rank = rank

        def remote(self):
            events.append(f"submit {self.rank}")
            return self.rank

    def get(ref):
        events.append(f"get {ref}")
        return f"sum{ref}"

    slots = [SimpleNamespace(rank=r, actor=SimpleNamespace(checksum=Call(r))) for r in range(3)]
    fake = SimpleNamespace(_settle=lambda: None, slots=slots,
                           ray=SimpleNamespace(get=get, exceptions=SimpleNamespace(RayActorError=RuntimeError)))
    assert RayEnginePool.checksums(fake) == {0: "sum0", 1: "sum1", 2: "sum2"}
    assert events == ["submit 0", "submit 1", "submit 2", "get 0", "get 1", "get 2"]
