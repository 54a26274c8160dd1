"""The ES core: directions, shaping, population, schedule, perturb/restore/update numerics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from esreason.es import shaping
from esreason.es.noise import direction, tensor_seed
from esreason.es.params import CentredParameters, unique_named_parameters
from esreason.es.population import draw_population, sampling_seeds
from esreason.es.schedule import Schedule
from esreason.es.update import update_delta


class Tiny(torch.nn.Module):
    def __init__(self, dtype=torch.float32):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(7, 5).to(dtype)
        self.lin = torch.nn.Linear(5, 3).to(dtype)
        self.head = torch.nn.Linear(5, 7, bias=False).to(dtype)
        self.head.weight = self.emb.weight  # tied


def state(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def assert_bitwise_equal(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype
        assert torch.equal(a[k].view(torch.uint8) if a[k].dtype == torch.bfloat16 else a[k],
                           b[k].view(torch.uint8) if b[k].dtype == torch.bfloat16 else b[k]), k


# ---------------------------------------------------------------- directions

def test_direction_is_deterministic_per_seed_and_name():
    a = direction(123, "layer.weight", (4, 3))
    b = direction(123, "layer.weight", (4, 3))
    assert torch.equal(a, b)
    assert not torch.equal(a, direction(124, "layer.weight", (4, 3)))
    assert not torch.equal(a, direction(123, "layer.bias", (4, 3)))
    assert a.dtype == torch.float32
    assert tensor_seed(1, "x") != tensor_seed(1, "y")
    # standard Gaussian
    big = direction(7, "big", (200_000,))
    assert abs(float(big.mean())) < 0.01 and abs(float(big.std()) - 1) < 0.01


def test_tied_weights_are_listed_once():
    m = Tiny()
    names = [n for n, _ in unique_named_parameters(m)]
    assert names.count("emb.weight") == 1 and "head.weight" not in names
    assert len(names) == 3


# ---------------------------------------------------------------- shaping

def test_zscore_uses_population_std_and_handles_equal_rewards():
    r = np.array([1.0, 0.0, 0.5, 0.5])
    z = shaping.zscore(r, eps=0.0)
    expected = (r - r.mean()) / r.std(ddof=0)
    np.testing.assert_allclose(z, expected, rtol=0, atol=1e-15)
    assert np.all(shaping.zscore(np.full(8, 0.3)) == 0)
    assert np.all(shaping.zscore(np.full(8, 0.3), eps=0.0) == 0)  # never NaN
    assert not np.any(np.isnan(shaping.zscore(np.zeros(4), eps=0.0)))


@pytest.mark.parametrize("eps", [0.0, 1e-12, 1e-8, 1e-3])
@pytest.mark.parametrize("value", [0.1, 0.7, 1 / 3, 1.1, 0.0])
@pytest.mark.parametrize("n", [3, 7, 30, 32])
def test_zscore_equal_rewards_give_exact_zeros_whatever_eps(eps, value, n):
    """The float mean of N equal rewards can be one ulp off (3 x 0.1 -> 0.1 + 1.4e-17);
    z must still be exactly 0 (no update), not +-1 at eps 0 or +-1e-9 at eps 1e-8."""
    r = np.full(n, value)
    z = shaping.shape(r, "zscore", eps)
    assert z.shape == (n,) and np.all(z == 0.0)
    assert np.count_nonzero(shaping.zscore(np.full(3, 0.1), eps=0.0)) == 0  # the case that gave +-1


def test_equal_rewards_leave_the_centre_bit_identical():
    z = shaping.zscore(np.full(7, 0.1), eps=0.0)
    delta = update_delta("w", (4, 5), seeds=list(range(7)), weights=list(z), alpha=1.0)
    assert torch.count_nonzero(delta) == 0


def test_rank_and_none_shaping():
    r = np.array([0.2, 0.9, 0.2, 0.5])
    rk = shaping.centered_rank(r)
    assert rk[1] == 0.5 and rk[0] == rk[2] and rk.min() >= -0.5
    np.testing.assert_allclose(rk.sum(), 0.0, atol=1e-12)
    assert np.array_equal(shaping.shape(r, "none"), r)
    with pytest.raises(ValueError):
        shaping.shape(r, "bogus")


# ---------------------------------------------------------------- population & schedule

def test_population_seeds_are_reproducible_and_two_point_is_paired():
    a = draw_population(0, 5, 8, "one_point")
    assert a == draw_population(0, 5, 8, "one_point")
    assert a != draw_population(0, 6, 8, "one_point")
    assert all(0 <= s < 2**32 for s in a.seeds) and a.signs == (1,) * 8
    tp = draw_population(0, 5, 8, "two_point")
    assert len(tp) == 8
    assert tp.seeds[0::2] == tp.seeds[1::2]          # pairs share their direction
    assert tp.signs == (1, -1) * 4
    assert len(set(tp.seeds)) == 4                   # N/2 directions at the same budget
    assert sampling_seeds(0, 3, 4, "common") == [sampling_seeds(0, 3, 4, "common")[0]] * 4
    assert len(set(sampling_seeds(0, 3, 4, "independent"))) == 4


def test_keep_tail_schedule_reshuffles_each_epoch():
    s = Schedule(num_items=10, batch_size=4, epochs=2, seed=3)
    assert s.steps_per_epoch == 3 and s.total_steps == 6
    e0 = [s.batch(t) for t in range(3)]
    assert [len(b) for b in e0] == [4, 4, 2]                     # last partial batch kept
    assert sorted(i for b in e0 for i in b) == list(range(10))   # each item once per epoch
    e1 = [s.batch(t) for t in range(3, 6)]
    assert sorted(i for b in e1 for i in b) == list(range(10))
    assert e0 != e1                                              # reshuffled
    assert s.batch(4) == Schedule(10, 4, 2, 3).batch(4)          # pure function of t


# ---------------------------------------------------------------- update numerics

def test_update_equals_hand_computed_sum_on_small_module():
    m = Tiny()
    before = state(m)
    cp = CentredParameters(unique_named_parameters(m))
    seeds, weights, alpha = [11, 22, 11], [0.5, -1.25, 2.0], 0.1   # seed 11 twice: counts twice
    norm = cp.apply_update(seeds, weights, alpha)
    sq = 0.0
    for name in ("emb.weight", "lin.weight", "lin.bias"):
        shape = before[name].shape
        hand = sum(w * direction(s, name, shape) for s, w in zip(seeds, weights)) * (alpha / 3)
        got = m.state_dict()[name] - before[name]
        torch.testing.assert_close(got, hand, rtol=1e-5, atol=1e-7)
        sq += float((got ** 2).sum())
    assert m.head.weight is m.emb.weight                     # still tied, updated once
    assert norm == pytest.approx(sq ** 0.5, rel=1e-6)
    np.testing.assert_allclose(update_delta("lin.bias", (3,), [5], [0.0], 1.0).numpy(), 0.0)


def test_two_point_update_is_paired_difference():
    m1, m2 = Tiny(), Tiny()
    seeds = [7, 7, 9, 9]
    signs = [1, -1, 1, -1]
    z = np.array([1.0, -0.5, 0.25, 0.75])
    CentredParameters(unique_named_parameters(m1)).apply_update(seeds, list(z * signs), 0.2)
    # antithetic estimator: alpha/(N/2) * sum_j (z+ - z-)/2 eps_j
    CentredParameters(unique_named_parameters(m2)).apply_update([7, 9], [(1.0 + 0.5) / 2, (0.25 - 0.75) / 2], 0.2)
    for k in m1.state_dict():
        torch.testing.assert_close(m1.state_dict()[k], m2.state_dict()[k], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hundred_perturb_restore_cycles_are_bit_exact(dtype):
    m = Tiny(dtype)
    before = state(m)
    cp = CentredParameters(unique_named_parameters(m), restore="exact")
    for i in range(100):
        cp.perturb(1000 + i, 3e-2 if i % 2 else -3e-2)
        assert not torch.equal(m.lin.weight, before["lin.weight"])
        cp.restore()
    assert_bitwise_equal(state(m), before)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_masters_restore_bit_exactly_without_a_model_dtype_copy(dtype):
    """With fp32 masters the centre is restored from the master (round(master) == centre)."""
    m = Tiny(dtype)
    cp = CentredParameters(unique_named_parameters(m), restore="exact", master=True)
    for step in range(3):  # updates with sub-ulp and larger components move the master and the centre
        cp.apply_update([7 + step, 8 + step], [1.0, -0.5], 3e-3 if step % 2 else 3e-5)
        after_update = state(m)
        for i in range(20):
            cp.perturb(100 * step + i, 3e-2 if i % 2 else -3e-2)
            cp.restore()
        assert_bitwise_equal(state(m), after_update)
    assert cp._centre is None  # the saved model-dtype centre is not kept (one copy of the weights less)


def test_subtract_restore_is_the_paper_artifact_and_drifts():
    m = Tiny(torch.bfloat16)
    before = state(m)
    cp = CentredParameters(unique_named_parameters(m), restore="subtract")
    for i in range(16):
        cp.perturb(1000 + i, 3e-2)
        cp.restore()
    changed = sum(int((state(m)[k] != before[k]).sum()) for k in before)
    assert changed > 0   # p + d - d != p in floating point: the reason `exact` is the default


def test_fp32_masters_accumulate_updates_bf16_rounds_away():
    # Weights of 1.0 in bf16 have ulp 2^-7; updates of ~1e-4 are far below half an ulp.
    def run(master: bool):
        lin = torch.nn.Linear(64, 1, bias=False).to(torch.bfloat16)
        with torch.no_grad():
            lin.weight.fill_(1.0)
        cp = CentredParameters(unique_named_parameters(lin), master=master)
        for t in range(200):
            cp.apply_update([t], [1.0], 3e-4)   # |step| ~3e-4 < half an ulp (~2e-3) at 1.0
        return lin.weight.detach().float(), cp.master_state()

    plain, _ = run(False)
    mastered, master = run(True)
    assert torch.all(plain == 1.0)                       # every update rounded away
    hand = 1.0 + sum(direction(t, "weight", (1, 64)) * 3e-4 for t in range(200))
    torch.testing.assert_close(master["weight"], hand, rtol=0, atol=1e-5)  # fp32 master accumulates
    assert int((mastered != 1.0).sum()) > 10             # and the bf16 weights follow it
    torch.testing.assert_close(mastered, hand.to(torch.bfloat16).float(), rtol=0, atol=0)


def test_perturb_misuse_is_an_error():
    cp = CentredParameters(unique_named_parameters(Tiny()))
    with pytest.raises(RuntimeError):
        cp.restore()
    cp.perturb(1, 0.1)
    with pytest.raises(RuntimeError):
        cp.perturb(2, 0.1)
    with pytest.raises(RuntimeError):
        cp.apply_update([1], [1.0], 0.1)


def test_direction_cache_gives_bit_identical_updates():
    seeds, weights = [3, 4, 3, 9], [0.5, -1.0, 0.25, 2.0]
    results = []
    for cache_bytes in (0, 1 << 30, 200):  # off, everything, only part fits
        m = Tiny()
        cp = CentredParameters(unique_named_parameters(m), cache_bytes=cache_bytes)
        for s in seeds:
            cp.perturb(s, 0.01)
            cp.restore()
        cp.apply_update(seeds, weights, 0.1)
        assert len(cp.cache) == 0 and cp.cache.used_bytes == 0  # emptied by the update
        results.append(state(m))
    assert_bitwise_equal(results[0], results[1])
    assert_bitwise_equal(results[0], results[2])
