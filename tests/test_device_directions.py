"""Directions on the device (docs/es.md, "Directions on the device").

The ``meta`` device stands in for an accelerator: a model moved there has no host data, so
every tensor an ES operation creates on the CPU is one the operation made on the host.
A TorchDispatchMode records the output of every aten op while ``HFPolicy.perturb``,
``restore`` and ``apply_update`` run; no CPU tensor with more than 4,096 elements may
appear (scalars and small index tensors are fine; a parameter-sized host draw, a host
accumulator or a host copy of a direction is not).

The bounded pass: with the noise block shrunk to 64 elements, every float tensor the
update creates is at most a block (or a low-rank row chunk) -- never a whole tensor --
and the results equal the whole-tensor arithmetic bit for bit.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from esreason.backends.hf import HFPolicy, load_model
from esreason.es import lowrank as lowrank_mod
from esreason.es import noise
from esreason.es.noise import BLOCK_ELEMENTS, block_spans, direction, direction_block, tensor_seed
from esreason.es.sharded import Sharding
from esreason.es.params import CentredParameters, unique_named_parameters
from esreason.es.update import update_delta

HOST_LIMIT = 4096


class OpOutputs(TorchDispatchMode):
    """Records (op name, device type, numel, dtype) of every tensor an aten op returns."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str, int, torch.dtype]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self.seen.append((str(func), leaf.device.type, leaf.numel(), leaf.dtype))
        return out

    def host_tensors_over(self, limit: int) -> list[tuple[str, str, int, torch.dtype]]:
        return [s for s in self.seen if s[1] == "cpu" and s[2] > limit]


def meta_policy(dtype: torch.dtype, **kw) -> HFPolicy:
    model, tok = load_model("demo")
    model.to(dtype).to("meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    return HFPolicy(model, tok, **kw)


@pytest.mark.parametrize("kw", [
    dict(),                                                  # fp32, exact restore, direction cache
    dict(direction_cache_mb=0),                              # every direction drawn twice
    dict(restore="subtract"),                                # the paper artifact's restore
    dict(perturbation="lowrank", rank=4),                    # low-rank factors
    dict(_sharded=True),                                     # the sharded update (int64 block sums)
    dict(perturbation="lowrank", rank=4, _sharded=True),
], ids=["exact", "no-cache", "subtract", "lowrank", "sharded", "lowrank-sharded"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16-masters"])
def test_es_operations_create_no_host_tensor_on_an_accelerator(dtype, kw):
    kw = dict(kw)
    sharded = kw.pop("_sharded", False)
    policy = meta_policy(dtype, **kw)
    largest = max(p.numel() for p in policy.model.parameters())
    assert largest > HOST_LIMIT  # the check can fail: the model has tensors larger than the limit
    seeds, weights = [11, 12, 13, 14], [1.0, -0.5, 0.0, 2.0]
    sharding = Sharding(2, (1,), lambda t: None) if sharded else None  # the reduce: a no-op stand-in
    with OpOutputs() as rec:
        for s in seeds:
            policy.perturb(s, 1e-3)
            policy.restore()
        norm = policy.apply_update(seeds, weights, 1e-3, sharding)
    assert rec.host_tensors_over(HOST_LIMIT) == []
    # and the operations did run on the stand-in device, at parameter size
    assert any(dev == "meta" and n == largest for _, dev, n, _ in rec.seen)
    assert all(p.device.type == "meta" for p in policy.model.parameters())
    assert norm != norm  # NaN: meta tensors hold no values to take a norm of


def test_the_recorder_sees_a_host_draw():
    """The guard against a vacuous test: the old path (CPU draw, then copy) is caught."""
    with OpOutputs() as rec:
        eps = torch.randn(10_000)  # a host draw of a parameter-sized direction
        eps.to("meta")
    assert rec.host_tensors_over(HOST_LIMIT)


# ---------------------------------------------------------------- blocks


def test_block_zero_keeps_the_whole_tensor_seed_and_blocks_are_independent_draws():
    gen = torch.Generator().manual_seed(tensor_seed(5, "w"))
    assert torch.equal(direction(5, "w", (30, 40)), torch.randn(1200, generator=gen).view(30, 40))
    assert tensor_seed(5, "w", 0) == tensor_seed(5, "w") != tensor_seed(5, "w", 1)
    assert [s for s in block_spans(2 * BLOCK_ELEMENTS + 3)] == [
        (0, 0, BLOCK_ELEMENTS), (1, BLOCK_ELEMENTS, 2 * BLOCK_ELEMENTS), (2, 2 * BLOCK_ELEMENTS, 2 * BLOCK_ELEMENTS + 3)]


@pytest.fixture
def small_blocks(monkeypatch):
    """Noise blocks (and low-rank row chunks) of 64 elements, so small tensors span several."""
    monkeypatch.setattr(noise, "BLOCK_ELEMENTS", 64)
    monkeypatch.setattr(lowrank_mod, "BLOCK_ELEMENTS", 64)
    return 64


def test_a_long_direction_is_its_blocks(small_blocks):
    eps = direction(3, "emb.weight", (30, 10))  # 300 elements = blocks of 64, 64, 64, 64, 44
    flat = eps.view(-1)
    for b, start, stop in block_spans(300):
        assert torch.equal(flat[start:stop], direction_block(3, "emb.weight", b, stop - start))
    assert not torch.equal(flat[:64], flat[64:128])
    assert abs(float(eps.mean())) < 0.3 and 0.7 < float(eps.std()) < 1.3


class Wide(torch.nn.Module):
    """Tensors of 300 and 240 elements (several 64-element blocks) and a bias of 12."""

    def __init__(self, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(30, 10).to(dtype)
        self.lin = torch.nn.Linear(20, 12).to(dtype)


@pytest.mark.parametrize("dtype,master", [(torch.float32, False), (torch.bfloat16, True), (torch.bfloat16, False)])
def test_blockwise_operations_equal_the_whole_tensor_arithmetic(small_blocks, dtype, master):
    m = Wide(dtype)
    before = {n: p.detach().clone() for n, p in unique_named_parameters(m)}
    cp = CentredParameters(unique_named_parameters(m), master=master, cache_bytes=1 << 20)
    sigma, alpha = 0.01, 0.05
    cp.perturb(7, sigma)
    for name, p in unique_named_parameters(m):
        want = torch.add(before[name].float(), direction(7, name, p.shape), alpha=sigma).to(dtype)
        assert torch.equal(p.detach(), want), name
    cp.restore()
    for name, p in unique_named_parameters(m):
        assert torch.equal(p.detach(), before[name]), name  # bit-exact restore
    seeds, weights = [7, 8, 9], [1.0, -2.0, 0.5]
    cp.apply_update(seeds, weights, alpha)
    for name, p in unique_named_parameters(m):
        delta = sum(w * direction(s, name, p.shape) for s, w in zip(seeds, weights)) * (alpha / 3)
        want = (before[name].float() + delta).to(dtype)
        # the update's fp32 accumulation order equals this hand sum's, so equality is exact
        assert torch.equal(p.detach(), want), name
        assert torch.equal(update_delta(name, p.shape, seeds, weights, alpha), delta.float())


class Square(torch.nn.Module):
    """A 40 x 40 matrix (1,600 elements: 25 blocks of 64) and its bias."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(40, 40)


@pytest.mark.parametrize("sharded", [False, True], ids=["replicated", "sharded"])
@pytest.mark.parametrize("perturbation", ["full", "lowrank"])
def test_the_update_is_one_bounded_pass(small_blocks, perturbation, sharded):
    """Peak extra memory: every float tensor the update creates is a block, a row chunk of at
    most a block, or (low-rank) the stacked factors [m + n, N r] -- never matrix-sized."""
    m = Square()
    seeds, weights, rank = [1, 2, 3, 4], [1.0, 0.5, -1.0, 2.0], 1
    cp = CentredParameters(unique_named_parameters(m), cache_bytes=0, perturbation=perturbation, rank=rank)
    largest = max(p.numel() for p in m.parameters())
    allowed = small_blocks if perturbation == "full" else max(small_blocks, 40 * len(seeds) * rank)
    assert allowed < largest
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    with OpOutputs() as rec:
        cp.apply_update(seeds, weights, 0.1, Sharding(3, (0, 2), lambda t: None) if sharded else None)
    created = [n for op, _, n, dt in rec.seen if (dt.is_floating_point or dt == torch.int64)
               and not any(k in op for k in ("view", "slice", "t.default", "alias", "transpose"))]
    assert created and max(created) <= allowed
    assert all(not torch.equal(p.detach(), before[n]) for n, p in m.named_parameters())  # it did update


# ---------------------------------------------------------------- where a seed means the same direction


def test_generator_domain_names_device_and_torch():
    from esreason.es.noise import generator_domain

    assert generator_domain("cpu") == f"cpu:torch-{torch.__version__}"
    assert generator_domain("meta") != generator_domain("cpu")


def test_a_pool_refuses_engines_that_draw_different_directions():
    from esreason.backends.engine import check_noise_domains
    from esreason.errors import UserError

    h100 = "cuda:NVIDIA H100 80GB HBM3:132SM:torch-2.14.0"
    a100 = "cuda:NVIDIA A100-SXM4-80GB:108SM:torch-2.14.0"
    check_noise_domains({0: h100, 1: h100}, h100)          # one GPU model, trainer on it: fine
    check_noise_domains({0: h100, 1: h100}, None)          # no reference policy: fine
    with pytest.raises(UserError, match="engine 1: cuda:NVIDIA A100"):
        check_noise_domains({0: h100, 1: a100}, None)      # mixed GPU models
    with pytest.raises(UserError, match="trainer: cpu:torch"):
        check_noise_domains({0: h100, 1: h100}, f"cpu:torch-{torch.__version__}")  # trainer on CPU, engines on GPU


def test_hf_engines_report_their_domain():
    from esreason.backends.engine import policy_noise_domain
    from esreason.es.noise import generator_domain

    model, tok = load_model("demo")
    assert policy_noise_domain(HFPolicy(model, tok)) == generator_domain("cpu")
