"""The sharded update (esreason.es.sharded): exact integer addition of per-shard partial sums.

Engines are simulated in one process: each "engine" first records what it would all-reduce,
then a second pass adds the other engines' records, which is what an all-reduce computes.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from esreason.es import noise
from esreason.es.apply import update_tensor
from esreason.es.noise import direction
from esreason.es.params import CentredParameters
from esreason.es.sharded import (EPS_BOUND, Sharding, assign_shards, dequantize, fixed_point_shift, quantize,
                                 shard_members, sharded_update_pieces)

SEEDS = [11, 22, 33, 44, 55, 66, 77]
WEIGHTS = [1.3, -0.4, 0.0, 2.1, -1.7, 0.25, -0.9]
ALPHA = 1e-2


class Record:
    """A reduce that keeps a copy of every tensor it is given (one engine's contributions)."""

    def __init__(self) -> None:
        self.calls: list[torch.Tensor] = []

    def __call__(self, t: torch.Tensor) -> None:
        self.calls.append(t.clone())


class AddOthers:
    """A reduce that adds the other engines' recorded contributions: an all-reduce (sum)."""

    def __init__(self, others: list[Record]) -> None:
        self.others, self.i = others, 0

    def __call__(self, t: torch.Tensor) -> None:
        for rec in self.others:
            t += rec.calls[self.i]
        self.i += 1


def engines_update(make_param, num_shards: int, engines: int, rank: int | None = None) -> list[torch.Tensor]:
    """Each simulated engine's updated tensor after a sharded update with an all-reduce."""
    records = [Record() for _ in range(engines)]
    for j in range(engines):
        p = make_param()
        shards = Sharding(num_shards, assign_shards(num_shards, engines, j), records[j])
        update_tensor(p, "w", SEEDS, WEIGHTS, ALPHA, rank=rank, sharding=shards)
    out = []
    for j in range(engines):
        p = make_param()
        others = [r for i, r in enumerate(records) if i != j]
        shards = Sharding(num_shards, assign_shards(num_shards, engines, j), AddOthers(others))
        update_tensor(p, "w", SEEDS, WEIGHTS, ALPHA, rank=rank, sharding=shards)
        out.append(p)
    return out


def test_shards_partition_the_members():
    members = sorted(i for k in range(3) for i in shard_members(7, 3, k))
    assert members == list(range(7))
    assert shard_members(7, 3, 1) == [1, 4]
    assert assign_shards(5, 2, 0) == (0, 2, 4) and assign_shards(5, 2, 1) == (1, 3)
    with pytest.raises(ValueError, match="shard 3 out of range"):
        shard_members(7, 3, 3)
    with pytest.raises(ValueError, match="position 2"):
        assign_shards(4, 2, 2)


def test_shift_leaves_headroom_and_zero_weights_have_none():
    s = fixed_point_shift(WEIGHTS)
    bound = EPS_BOUND * sum(abs(w) for w in WEIGHTS)
    assert 2.0 ** s * bound <= 2.0 ** 62 < 2.0 ** (s + 1) * bound
    assert fixed_point_shift([0.0, 0.0]) is None
    with pytest.raises(ValueError, match="finite"):
        fixed_point_shift([1.0, float("nan")])


def test_quantize_roundtrip_is_exact_for_fp32_values_above_the_resolution():
    x = torch.randn(10_000) * 3  # fp32
    x = x[x.abs() > 2.0 ** -16]
    s = 40
    back = dequantize(quantize(x * 2.0 ** s), s)
    assert torch.equal(back, x)  # |x| * 2**40 >= 2**24: an integer in fp32, every bit survives
    assert quantize(torch.tensor([2.75, -2.75])).tolist() == [2, -2]  # truncation toward zero


@pytest.mark.parametrize("rank", [None, 2])
def test_bit_identical_for_any_engine_count(rank):
    base = torch.randn(24, 40, generator=torch.Generator().manual_seed(0))

    def make():
        return base.clone()

    local = make()
    update_tensor(local, "w", SEEDS, WEIGHTS, ALPHA, rank=rank, sharding=Sharding.local(4))
    for engines in (1, 2, 3, 4):
        for p in engines_update(make, 4, engines, rank=rank):
            assert torch.equal(p, local), f"{engines} engines"
    assert not torch.equal(local, base)


def test_engine_multiblock_tensor_each_block_reduced(monkeypatch):
    monkeypatch.setattr(noise, "BLOCK_ELEMENTS", 64)
    base = torch.randn(200, generator=torch.Generator().manual_seed(1))
    rec = Record()
    p = base.clone()
    update_tensor(p, "w", SEEDS, WEIGHTS, ALPHA, sharding=Sharding(2, (0,), rec))
    assert [c.numel() for c in rec.calls] == [64, 64, 64, 8]  # one collective per block
    assert all(c.dtype == torch.int64 for c in rec.calls)


def test_accuracy_matches_the_float64_sum():
    shape = (64, 50)
    exact = sum(w * direction(s, "w", shape).double() for s, w in zip(SEEDS, WEIGHTS)) * ALPHA / len(SEEDS)
    got = torch.cat([d for _, _, d in sharded_update_pieces(torch.zeros(shape), "w", SEEDS, WEIGHTS, ALPHA,
                                                            Sharding.local(3))]).view(shape)
    err = (got.double() - exact).abs().max().item()
    scale = exact.abs().max().item()
    assert err <= 4 * scale * 2.0 ** -24  # fp32 rounding of the shard sums, nothing more


def test_all_zero_weights_change_nothing_and_enter_no_collective():
    rec = Record()
    p = torch.randn(30)
    before = p.clone()
    update_tensor(p, "w", SEEDS[:3], [0.0, 0.0, 0.0], ALPHA, sharding=Sharding(2, (0,), rec))
    assert torch.equal(p, before) and rec.calls == []


def test_centred_parameters_sharded_close_to_replicated_and_deterministic():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 4))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    seeds, weights = [1, 2, 3, 4, 5], [0.5, -1.0, 1.5, 0.0, -0.25]

    def run(sharding):
        model.load_state_dict(state)
        params = CentredParameters(model.named_parameters())
        norm = params.apply_update(seeds, weights, 0.1, sharding)
        return [p.detach().clone() for p in model.parameters()], norm

    replicated, n_rep = run(None)
    sharded, n_sh = run(Sharding.local(2))
    again, n_again = run(Sharding.local(2))
    assert all(torch.equal(a, b) for a, b in zip(sharded, again)) and n_sh == n_again
    assert all(torch.allclose(a, b, rtol=0, atol=1e-7) for a, b in zip(sharded, replicated))
    assert math.isclose(n_sh, n_rep, rel_tol=1e-5)
    # three shards is a different (equally exact) rounding of the same sum
    three, _ = run(Sharding.local(3))
    assert all(np.allclose(a.numpy(), b.numpy(), atol=1e-7) for a, b in zip(three, sharded))
