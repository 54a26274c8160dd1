"""Tensor-parallel shards get exactly the unsharded directions (es/region.py).

A shard (a band of rows, a band of columns, one expert's band of a stacked tensor) must receive
the full tensor's direction elements, and every ES operation on it (perturb, restore by
subtraction, the replicated and the sharded exact update, with and without fp32 masters) must
equal the same operation on the full tensor, sliced, bit for bit: the arithmetic is elementwise.
Shapes span several 2**22-element noise blocks with rows that straddle block edges.
"""

from __future__ import annotations

import pytest
import torch

from esreason.es.apply import perturb_tensor, subtract_tensor, update_tensor
from esreason.es.noise import BLOCK_ELEMENTS, direction
from esreason.es.region import Region
from esreason.es.sharded import Sharding

FULL = (1500, 6001)  # 9.0 M elements: 3 noise blocks, odd row length (rows straddle block edges)
NAME = "model.layers.0.mlp.down_proj.weight"


def _regions() -> list[tuple[str, Region, tuple]]:
    """(label, region, slice of the full [1500, 6001] tensor) for row bands, column bands, a mixed box."""
    n, (r, c) = FULL[0] * FULL[1], FULL
    return [
        ("rows", Region(n, c, (0, 700), (0, c)), (slice(0, 700), slice(None))),
        ("rows-tail", Region(n, c, (700, r), (0, c)), (slice(700, r), slice(None))),
        ("cols-rank0", Region(n, c, (0, r), (0, 3000)), (slice(None), slice(0, 3000))),
        ("cols-rank1", Region(n, c, (0, r), (3000, c)), (slice(None), slice(3000, c))),
        ("box", Region(n, c, (3, 1499), (17, 4123)), (slice(3, 1499), slice(17, 4123))),
        ("one-row", Region(n, c, (699, 700), (5, 6000)), (slice(699, 700), slice(5, 6000))),
    ]


def _local(full: torch.Tensor, where: tuple) -> torch.Tensor:
    return full[where].contiguous().clone()


def test_pieces_partition_the_shard_and_take_the_full_direction():
    full = direction(7, NAME, FULL)  # [1500, 6001] fp32
    for label, region, where in _regions():
        pieces = list(region.pieces())
        assert [lo for _, _, lo, _ in pieces] == [0] + [hi for _, _, _, hi in pieces[:-1]], label
        assert pieces[-1][3] == region.local_numel == full[where].numel(), label
        got = torch.cat([region.take(direction(7, NAME, FULL).view(-1)[b * BLOCK_ELEMENTS:
                                                                          b * BLOCK_ELEMENTS + size], b, lo, hi)
                         for b, size, lo, hi in pieces])
        assert torch.equal(got, full[where].reshape(-1)), label
    # a band of columns draws every block, a band of rows only the blocks it overlaps
    cols, rows = _regions()[2][1], _regions()[0][1]
    assert cols.block_count() == 3 and rows.block_count() == 2


def test_expert_regions_of_a_stacked_tensor():
    """[experts, rows, cols]: expert e's band of rows (gate/up shard) and of columns (down shard)."""
    shape = (3, 1100, 2048)  # 6.8 M elements, experts straddle block edges
    n = 3 * 1100 * 2048
    full = direction(3, "model.layers.0.mlp.experts.gate_up_proj", shape)
    for e in range(3):
        for rows, cols in (((550, 825), (0, 2048)), ((0, 1100), (1024, 2048))):
            region = Region(n, 2048, rows, cols, offset=e * 1100 * 2048)
            local = torch.zeros(region.local_numel)
            perturb_tensor(local, "model.layers.0.mlp.experts.gate_up_proj", 3, 1.0, region=region)
            assert torch.equal(local, full[e, rows[0]:rows[1], cols[0]:cols[1]].reshape(-1)), (e, rows, cols)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_operations_on_a_shard_equal_the_sliced_full_operation(dtype):
    torch.manual_seed(0)
    centre = (torch.randn(FULL) * 0.02).to(dtype)
    master = centre.to(torch.float32) if dtype != torch.float32 else None
    seeds, weights = [4, 11, 4, 9], [0.7, -1.1, 0.25, 0.0]

    full = centre.clone()
    perturb_tensor(full, NAME, 5, 0.03, master=master)
    perturbed = full.clone()
    subtract_tensor(full, NAME, 5, 0.03)
    subtracted = full.clone()
    updated, fmaster = centre.clone(), None if master is None else master.clone()
    sq_full = update_tensor(updated, NAME, seeds, weights, 1e-3, master=fmaster)
    sharded, smaster = centre.clone(), None if master is None else master.clone()
    update_tensor(sharded, NAME, seeds, weights, 1e-3, master=smaster, sharding=Sharding.local(3))

    sq_parts = torch.zeros((), dtype=torch.float64)
    for label, region, where in _regions()[:2]:  # the row bands partition the tensor: their norms add up
        sq_parts += update_tensor(_local(centre, where), NAME, seeds, weights, 1e-3, region=region,
                                  master=None if master is None else _local(master, where))
    # the squared norm is an fp32 sum per piece (pieces cut differently): equal to fp32 summation
    # accuracy, ~sqrt(4M pieces' elements) * 6e-8 relative, not bit for bit (it is a logged metric)
    assert sq_parts.item() == pytest.approx(sq_full.item(), rel=1e-5)

    for label, region, where in _regions():
        m = None if master is None else _local(master, where)
        local = _local(centre, where)
        perturb_tensor(local, NAME, 5, 0.03, master=m, region=region)
        assert torch.equal(local, perturbed[where]), label
        subtract_tensor(local, NAME, 5, 0.03, region=region)
        assert torch.equal(local, subtracted[where]), label
        local = _local(centre, where)
        update_tensor(local, NAME, seeds, weights, 1e-3, master=m, region=region)
        assert torch.equal(local, updated[where]), label
        if m is not None:
            assert torch.equal(m, fmaster[where]), label
        local, m = _local(centre, where), None if master is None else _local(master, where)
        update_tensor(local, NAME, seeds, weights, 1e-3, master=m, region=region, sharding=Sharding.local(3))
        assert torch.equal(local, sharded[where]), label


def test_sharded_update_of_shards_over_engines_with_a_reduce():
    """Two engines each summing one of two shards of the members, on a column shard: the int64 sums
    added by a (here in-process) all-reduce give the slice of the single-process result."""
    centre = torch.randn(FULL) * 0.02
    seeds, weights = [1, 2, 3, 4], [0.5, -1.0, 0.25, 2.0]
    want = centre.clone()
    update_tensor(want, NAME, seeds, weights, 1e-3, sharding=Sharding.local(2))
    label, region, where = _regions()[3]
    partial: list[list[torch.Tensor]] = [[], []]
    for engine in range(2):  # first pass: each engine's int64 pieces, captured by a recording reduce
        update_tensor(_local(centre, where), NAME, seeds, weights, 1e-3, region=region,
                      sharding=Sharding(2, (engine,), lambda t, e=engine: partial[e].append(t.clone())))
    sums = iter([a + b for a, b in zip(*partial)])
    local = _local(centre, where)
    update_tensor(local, NAME, seeds, weights, 1e-3, region=region,
                  sharding=Sharding(2, (0,), lambda t: t.copy_(next(sums))))
    assert torch.equal(local, want[where])


def test_region_validation_and_lowrank_refusal():
    with pytest.raises(ValueError, match="does not lie"):
        Region(100, 10, (0, 11), (0, 10))
    with pytest.raises(ValueError, match="does not lie"):
        Region(100, 10, (0, 10), (5, 11))
    region = Region(100, 10, (0, 10), (0, 5))
    expert = Region(200, 10, (0, 10), (0, 5), offset=100)  # one expert's block of a stacked tensor: not a matrix
    with pytest.raises(ValueError, match="low-rank"):
        perturb_tensor(torch.zeros(10, 5), "w", 1, 0.1, rank=1, region=expert)
    with pytest.raises(ValueError, match="does not match"):
        perturb_tensor(torch.zeros(10, 4), "w", 1, 0.1, region=region)
    assert Region.whole(100).is_whole and not region.is_whole
