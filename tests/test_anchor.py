"""Anchored ES (es.anchor_decay): the pull toward theta_0, its arithmetic, exact restore, the vLLM worker.

The update (esreason.es.anchor): theta' = theta + alpha/N sum w_i eps_i, then
theta <- theta' - c (theta' - theta_0) with c = alpha * anchor_decay, in three exactly rounded fp32
operations. Run-level behaviour (resume, the Ray pool) is in tests/test_anchor_runs.py.
"""

from __future__ import annotations

import pytest
import torch

from esreason.config import load_config
from esreason.errors import UserError
from esreason.es.anchor import anchor_factor, pull_toward
from esreason.es.apply import update_tensor
from esreason.es.params import CentredParameters
from esreason.es import noise
from esreason.es.update import update_delta
from test_device_directions import small_blocks  # noqa: F401 (a fixture: 64-element noise blocks)

SEEDS, WEIGHTS = [11, 12, 13, 14], [1.0, -0.5, 0.75, -1.25]
REAL_BLOCK = noise.BLOCK_ELEMENTS


def _module(dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.Linear(24, 8)).to(dtype)


def _state(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def test_anchor_decay_zero_is_the_plain_update_bit_for_bit():
    p = torch.randn(5000)
    q = p.clone()
    theta0 = torch.randn(5000)
    update_tensor(p, "w", SEEDS, WEIGHTS, 0.01)
    update_tensor(q, "w", SEEDS, WEIGHTS, 0.01, anchor=theta0, anchor_decay=0.0)
    assert torch.equal(p, q)
    assert CentredParameters(_module().named_parameters()).anchor_state() is None


def test_the_pull_is_three_exactly_rounded_operations():
    torch.manual_seed(1)
    p, theta0 = torch.randn(70_000), torch.randn(70_000)
    alpha, lam = 0.01, 7.0
    old = p.clone()
    update_tensor(p, "w", SEEDS, WEIGHTS, alpha, anchor=theta0, anchor_decay=lam)
    c = alpha * lam
    new = old + update_delta("w", old.shape, SEEDS, WEIGHTS, alpha)  # the ES step
    diff = new - theta0
    diff = diff * torch.tensor(c, dtype=torch.float32)
    assert torch.equal(p, new - diff)  # bit for bit: the docstring's arithmetic, no fused multiply-add
    # and it is the stated formula theta_0 + (1 - c)(theta' - theta_0) up to fp32 rounding: a few ulps
    # of |theta'| (<= ~5 here), so 1e-5 absolute
    ref = theta0.double() + (1 - c) * (new.double() - theta0.double())
    assert torch.allclose(p.double(), ref, rtol=0, atol=1e-5)


def test_a_bf16_model_with_masters_pulls_the_fp32_master_and_rounds_once():
    torch.manual_seed(2)
    p = torch.randn(5000).to(torch.bfloat16)
    master = p.float()
    theta0 = p.clone()  # the start weights, model dtype (exact: the start master is their fp32 widening)
    update_tensor(p, "w", SEEDS, WEIGHTS, 0.05, master=master)  # move away first
    expected = master.clone()
    expected += update_delta("w", p.shape, SEEDS, WEIGHTS, 0.01)
    pull_toward(expected, theta0, anchor_factor(0.01, 20.0))
    update_tensor(p, "w", SEEDS, WEIGHTS, 0.01, master=master, anchor=theta0, anchor_decay=20.0)
    assert torch.equal(master, expected) and torch.equal(p, expected.to(torch.bfloat16))


def test_without_reward_signal_the_distance_to_theta0_shrinks_by_one_minus_c_per_update():
    m = _module()
    params = CentredParameters(m.named_parameters(), anchor_decay=10.0)
    start = {n: t.clone() for n, t in params.anchor_state().items()}
    params.apply_update(SEEDS, WEIGHTS, 0.02)  # away from theta_0 (c = 0.2 pulls part of the step back)

    def dist():
        return sum(float(((p.detach().double() - start[n].double()) ** 2).sum()) for n, p in params.params) ** 0.5

    d = [dist()]
    for _ in range(4):
        params.apply_update(SEEDS, [0.0] * 4, 0.02)  # all-equal rewards: the ES step is exactly 0
        d.append(dist())
    # fp32 rounding of ~1e-2-sized differences: relative error far below 1e-4
    assert d[0] > 0 and all(b / a == pytest.approx(0.8, rel=1e-4) for a, b in zip(d, d[1:]))
    plain = CentredParameters(_module().named_parameters())
    before = _state(_module())
    plain.apply_update(SEEDS, WEIGHTS, 0.02)
    plain.apply_update(SEEDS, [0.0] * 4, 0.02)  # without the anchor nothing moves back
    moved = {n: p.detach() for n, p in plain.params}
    assert any(not torch.equal(moved[n], before[n]) for n in moved)


@pytest.mark.parametrize("dtype, master", [(torch.float32, False), (torch.bfloat16, True), (torch.bfloat16, False)])
def test_exact_restore_holds_with_anchor_decay(dtype, master):
    m = _module(dtype)
    params = CentredParameters(m.named_parameters(), master=master, anchor_decay=25.0)
    for t in range(3):
        params.apply_update([t, t + 1, t + 2], [1.0, -0.3, 0.6], 0.01)
        centre = _state(m)
        masters = params.master_state()
        params.perturb(100 + t, 0.05)
        assert any(not torch.equal(v, centre[k]) for k, v in m.state_dict().items())
        params.restore()
        assert all(torch.equal(v, centre[k]) for k, v in m.state_dict().items())
        if masters is not None:
            assert all(torch.equal(v, masters[k]) for k, v in params.master_state().items())


def test_alpha_times_lambda_must_stay_below_one():
    with pytest.raises(UserError, match=r"config key 'es.anchor_decay'.*must be < 1"):
        load_config(None, ["es.alpha=0.01", "es.anchor_decay=100"])
    with pytest.raises(UserError, match=r"config key 'es.anchor_decay': must be >= 0"):
        load_config(None, ["es.anchor_decay=-1"])
    params = CentredParameters(_module().named_parameters(), anchor_decay=200.0)
    before = {n: p.detach().clone() for n, p in params.params}
    with pytest.raises(ValueError, match=r"alpha \* anchor_decay"):
        params.apply_update(SEEDS, WEIGHTS, 0.01)  # c = 2: refused before anything moves
    assert all(torch.equal(p, before[n]) for n, p in params.params)


def test_the_api_config_has_the_key():
    from esreason.api.config import ESConfig, FIELD_KEYS

    assert FIELD_KEYS["anchor_decay"] == "es.anchor_decay"
    assert ESConfig(anchor_decay=3.0).to_run_config().es.anchor_decay == 3.0


def test_hf_policy_saves_and_loads_theta0_tensor_by_tensor(tiny_model_dir, tmp_path):
    from esreason.backends.hf import ANCHOR_FILE, HFPolicy, load_model

    model, tok = load_model(str(tiny_model_dir))
    policy = HFPolicy(model, tok, anchor_decay=5.0)
    start = {n: t.clone() for n, t in policy.params.anchor_state().items()}
    assert policy.save_anchor(tmp_path) and (tmp_path / ANCHOR_FILE).is_file()
    policy.apply_update(SEEDS, WEIGHTS, 0.01)
    other = HFPolicy(model, tok, anchor_decay=5.0)  # snapshots the *moved* weights
    assert any(not torch.equal(other.params.anchor_state()[n], start[n]) for n in start)
    assert other.load_anchor(tmp_path)
    assert all(torch.equal(other.params.anchor_state()[n], start[n]) for n in start)
    assert not HFPolicy(model, tok).save_anchor(tmp_path / "none")  # anchored ES off: nothing written
    with pytest.raises(UserError, match="es.anchor_decay"):
        other.load_anchor(tmp_path / "missing")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_vllm_worker_extension_pulls_exactly_like_hf_policy(tiny_model_dir, tmp_path, dtype):
    """The vLLM worker (on a stand-in for vLLM's worker, tests/test_vllm_worker.py) reads theta_0 from
    the start state and moves bit for bit as the HF policy does."""
    from esreason.backends.engine import policy_checksum
    from esreason.backends.hf import HFPolicy, load_model
    from test_vllm_worker import StandInWorker, _fused_model

    model, tok = load_model(str(tiny_model_dir), dtype)
    policy = HFPolicy(model, tok, anchor_decay=30.0)
    policy.save(tmp_path / "start")
    policy.save_anchor(tmp_path / "start")
    worker = StandInWorker(_fused_model(model, False))
    worker.es_setup(str(tmp_path / "start"), "exact", "auto", 30.0)
    plain = StandInWorker(_fused_model(model, False))
    plain.es_setup(str(tmp_path / "start"))
    for step in range(3):
        seeds, weights = [step, step + 5, step + 9], [0.7, -1.2, 0.4]
        assert worker.es_update(seeds, weights, 0.01) == pytest.approx(
            policy.apply_update(seeds, weights, 0.01), rel=1e-9)
        plain.es_update(seeds, weights, 0.01)
        assert worker.es_checksum() == policy_checksum(policy) != plain.es_checksum()
    (tmp_path / "bare").mkdir()
    for f in (tmp_path / "start").iterdir():
        if f.is_file():
            (tmp_path / "bare" / f.name).write_bytes(f.read_bytes())
    with pytest.raises(ValueError, match="anchor.safetensors is missing"):
        StandInWorker(_fused_model(model, False)).es_setup(str(tmp_path / "bare"), "exact", "auto", 30.0)


def test_the_anchored_update_is_one_bounded_pass_on_the_device(small_blocks, monkeypatch):
    """Every float tensor the anchored update creates is at most a noise block (the pull works piece by
    piece too), and with the weights on an accelerator (the meta device stands in: it holds no host
    data) and theta_0 in host memory, as on a GPU, no host tensor is created beyond views of theta_0."""
    from esreason.es.params import unique_named_parameters
    from test_device_directions import HOST_LIMIT, OpOutputs, Square, meta_policy

    m = Square()
    cp = CentredParameters(unique_named_parameters(m), cache_bytes=0, anchor_decay=50.0)
    with OpOutputs() as rec:
        cp.apply_update(SEEDS, WEIGHTS, 0.01)
    created = [n for op, _, n, dt in rec.seen if dt.is_floating_point
               and not any(k in op for k in ("view", "slice", "alias"))]
    assert created and max(created) <= small_blocks < max(p.numel() for p in m.parameters())

    monkeypatch.setattr(noise, "BLOCK_ELEMENTS", REAL_BLOCK)  # the real block size for the device check
    policy = meta_policy(torch.bfloat16, anchor_decay=5.0)  # fp32 masters on the device, theta_0 in bf16
    policy.params._anchor = {n: torch.zeros(p.shape, dtype=p.dtype) for n, p in policy.params.params}  # host
    with OpOutputs() as rec:
        policy.apply_update(SEEDS, WEIGHTS, 1e-3)
    made = [s for s in rec.host_tensors_over(HOST_LIMIT) if not any(k in s[0] for k in ("slice", "view", "alias"))]
    assert made == []
    assert any(op.startswith("aten.sub") and dev == "meta" and n > HOST_LIMIT for op, dev, n, _ in rec.seen)


def test_the_host_plan_counts_theta0_once_per_process_and_once_on_disk():
    """``esreason experiment plan`` / the disk check: Qwen2.5-1.5B in bf16 on 8 GPU engines."""
    from types import SimpleNamespace

    from esreason.experiments.memplan_host import es_host
    from esreason.io.architectures import architecture, parameter_count

    model = "Qwen/Qwen2.5-1.5B-Instruct"

    def host(decay):
        cfg = SimpleNamespace(model=model, dtype="bfloat16", device="cuda",
                              es=SimpleNamespace(master_weights="auto", restore="exact", direction_cache_mb=256,
                                                 anchor_decay=decay),
                              backend=SimpleNamespace(type="ray", engines_per_gpu=1),
                              checkpoint=SimpleNamespace(every=0, keep_last=1))
        return es_host(cfg, engines=8, gpu_gib=80.0, engine_fraction=0.9, updates=10)

    theta0 = 2 * parameter_count(architecture(model)) / 2**30  # bf16
    off, on = host(0.0), host(10.0)
    assert "trainer_anchor" not in off["host_ram_gib"] and "anchor" not in off["disk_gib"]
    assert on["host_ram_gib"]["trainer_anchor"] == pytest.approx(theta0, abs=0.01)
    assert on["pinned_gib"]["engine_anchor"] == pytest.approx(8 * theta0, abs=0.01)
    assert on["disk_gib"]["anchor"] == pytest.approx(theta0, abs=0.01)
    assert on["disk_gib"]["start_state"] == pytest.approx(off["disk_gib"]["start_state"] + theta0, abs=0.02)
