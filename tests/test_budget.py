"""Rollouts and tokens beside FLOPs (esreason.accounting.budget), GRPO variants as experiment methods and the
``match`` key (esreason.experiments.variants): spec validation and the accounting, no training."""

from __future__ import annotations

import json

import pytest
import yaml

from esreason.config import ConfigError
from esreason.accounting.budget import (combine, consumed, experiment_budget, planned, rollout_matched_updates,
                                         rollouts_per_update)
from esreason.experiments.spec import TRAINED, parse_spec, run_stages
from esreason.experiments.variants import method_stages

#: ES N = 8 x B = 4 and GRPO B = 4 x G = 2: FLOP-matched (2 N B = 8 B G = 64), ES samples 4x GRPO's rollouts.
ES = {"model": "demo", "task": "demo-add", "es": {"population_size": 8, "sigma": 2e-3, "alpha": 1e-3},
      "train": {"batch_size": 4, "limit": 8, "seed": 0}, "generation": {"max_new_tokens": 16},
      "checkpoint": {"every": 1}}
GRPO = {"model": "demo", "task": "demo-add", "grpo": {"num_generations": 2, "micro_batch_size": 2, "learning_rate": 1e-4},
        "train": {"batch_size": 4, "limit": 8, "seed": 0}, "generation": {"max_new_tokens": 16},
        "checkpoint": {"every": 1}}
P = 1000
#: DAPO's 16 optimizer steps per update (its preset) do not divide B = 4: 4 steps of one prompt here.
DAPO4 = {"config": {"grpo": {"mini_batches": 4}}}


def spec_data(**over):
    data = {"name": "t", "model": "demo", "task": "demo-add", "updates": 2,
            "methods": ["base", "es", "grpo", "dr_grpo", "dapo"], "configs": {"es": ES, "grpo": GRPO},
            "eval": {"in_domain": ["demo-indomain"], "held_out": ["demo-sub"], "samples": 2, "ks": [1, 2],
                     "max_new_tokens": 16, "limit": 2, "ci_resamples": 0}}
    data.update(over)
    if "variants" not in over and "dapo" in data["methods"]:
        data["variants"] = {"dapo": DAPO4}
    return data


def budget(spec):
    stages = {m.name: method_stages(spec, m, TRAINED) for m in spec.methods if m.kind in TRAINED}
    return experiment_budget(stages, 16, P, spec.match)


# --------------------------------------------------------------------------- variants as methods


def test_preset_variants_are_grpo_methods_with_their_objective_and_the_same_flops():
    spec = parse_spec(spec_data())
    rows = {m.name: (m.kind, m.label, m.variant) for m in spec.methods}
    assert rows["dr_grpo"] == ("grpo", "Dr. GRPO", True) and rows["dapo"] == ("grpo", "DAPO", True)
    assert rows["grpo"] == ("grpo", "GRPO", False) and spec.method("grpo").config is None  # configs.grpo itself
    dapo = spec.stage_config(spec.method("dapo"), "grpo").grpo
    assert (dapo.loss_type, dapo.epsilon_high, dapo.beta, dapo.mini_batches) == ("dapo", 0.28, 0.0, 4)
    assert spec.stage_config(spec.method("dr_grpo"), "grpo").grpo.standardize_advantages is False
    # Everything else is the experiment's GRPO config: B, G, learning rate, lengths, T.
    for name in ("dr_grpo", "dapo"):
        cfg = spec.stage_config(spec.method(name), "grpo")
        assert (cfg.train.batch_size, cfg.grpo.num_generations, cfg.grpo.learning_rate) == (4, 2, 1e-4)
        assert cfg.train.max_steps == spec.updates == 2 and cfg.model == "demo"
    summary, per = budget(spec)
    assert summary["flops_equal"] is True and summary["rollouts_equal"] is False
    assert {per[m]["flops"] for m in ("es", "grpo", "dr_grpo", "dapo")} == {2.0 * 2 * 8 * 4 * P * 16}
    assert per["es"]["rollouts"] == 2 * 8 * 4 and per["dapo"]["rollouts"] == 2 * 4 * 2
    assert [s for s in run_stages(spec) if s[1] == "grpo"] == [("train/grpo", "grpo", 2), ("train/dr_grpo", "grpo", 2),
                                                               ("train/dapo", "grpo", 2)]


def test_a_variants_entry_defines_a_method_from_a_preset_with_an_overlay_and_family():
    spec = parse_spec(spec_data(methods=["es", "grpo", "gspo4", "dapo"], variants={
        "gspo4": {"preset": "gspo", "label": "GSPO (2 steps)", "config": {"grpo": {"mini_batches": 2, "micro_batch_size": 4}},
                  "family": True},
        "dapo": {"config": {"grpo": {"epsilon_high": 0.3, "mini_batches": 2}}}}))
    g = spec.method("gspo4")
    cfg = spec.stage_config(g, "grpo")
    assert (g.label, g.family, g.kind) == ("GSPO (2 steps)", True, "grpo")
    assert (cfg.grpo.importance_sampling_level, cfg.grpo.mini_batches, cfg.grpo.epsilon) == ("sequence", 2, 3e-4)
    dapo = spec.method("dapo")
    assert dapo.family is False and spec.stage_config(dapo, "grpo").grpo.epsilon_high == 0.3  # over the preset's
    assert spec.stage_config(dapo, "grpo").grpo.loss_type == "dapo"
    seeded = spec.with_seed(7)  # every method's own config takes the training seed too
    assert seeded.stage_config(seeded.method("gspo4"), "grpo").train.seed == 7


@pytest.mark.parametrize("over, needle", [
    ({"methods": ["es", "ppo"]}, "unknown method 'ppo'"),
    ({"methods": ["es", "grpo"], "variants": {"dapo": {}}}, "'variants.dapo': method 'dapo' is not in 'methods'"),
    ({"methods": ["es", "mine"], "variants": {"mine": {"preset": "vapo"}}}, "variants.mine.preset"),
    ({"methods": ["es"], "variants": {"es": {}}}, "'variants.es': a variant needs a new method name"),
    ({"methods": ["es", "dapo"], "variants": {"dapo": {"config": {"model": "x"}}}}, "variants.dapo.config.model"),
    ({"methods": ["es", "dapo"], "variants": {"dapo": {"config": {"train": {"max_steps": 9}}}}},
     "variants.dapo.config.train.max_steps"),
    ({"methods": ["es", "dapo"], "variants": {"dapo": {"family": "yes"}}}, "variants.dapo.family"),
    ({"methods": ["es", "dapo"], "variants": {"dapo": {"lr": 1}}}, "'variants.dapo': expected a mapping"),
    ({"methods": ["es", "mine"], "variants": {"mine": {"config": {"grpo": {"loss_type": "gmpo"}}}}},
     "variants.mine: .*grpo.loss_type"),
    ({"match": "samples"}, "'match'"),
    ({"match": "rollouts", "methods": ["es", "grpo", "es_grpo"]}, "compositions"),
    ({"match": "rollouts", "updates": 1, "configs": {"es": {**ES, "es": {"population_size": 3}}, "grpo": GRPO}},
     "rollouts cannot be matched"),
    ({"match": "rollouts", "methods": ["grpo"], "configs": {"grpo": GRPO}}, "needs configs.es"),
    ({"match": "compute", "methods": ["es", "grpo", "grpo_es"]}, "compute cannot be matched for the compositions"),
    ({"match": "compute", "updates": 3}, "compute cannot be matched: ES spends 3 x 32 responses"),
    ({"methods": ["es", "dapo"], "variants": {}}, r"variants.dapo: .*'grpo.mini_batches': must divide"),
])
def test_bad_variants_and_matches_are_refused_naming_the_key(over, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_spec(spec_data(**over))


def test_match_rollouts_gives_every_grpo_method_the_updates_that_sample_as_many_responses_as_es():
    spec = parse_spec(spec_data(match="rollouts", updates=3))
    assert spec.match == "rollouts" and spec.method_updates(spec.method("es")) == 3
    for name in ("grpo", "dr_grpo", "dapo"):  # T x N x B / (B x G) = 3 x 32 / 8
        m = spec.method(name)
        assert spec.method_updates(m) == 12 and spec.stage_config(m, "grpo").train.max_steps == 12
    assert spec.stage_config(spec.method("dapo"), "grpo").grpo.loss_type == "dapo"
    summary, per = budget(spec)
    assert summary["rollouts_equal"] is True and summary["flops_equal"] is False
    assert per["grpo"]["flops"] == 4 * per["es"]["flops"]  # 8 P L per GRPO response against 2 P L per ES one
    assert ("train/grpo", "grpo", 12) in run_stages(spec) and ("train/es", "es", 3) in run_stages(spec)


def test_match_compute_gives_every_grpo_method_the_updates_that_spend_es_flops():
    """At a shared L, ES spends N x B x 1 forward-equivalents per update, a GRPO method B x G x its own:
    GRPO here 2 responses x 4 prompts x 5 (sample, forward, backward 2, reference), DAPO (no reference, 4
    optimizer steps: an old-policy forward) 5 too, Dr. GRPO 5; ES 8 x 4 x 1 = 32 per update."""
    spec = parse_spec(spec_data(match="compute", updates=5))
    assert spec.method_updates(spec.method("es")) == 5
    for name in ("grpo", "dr_grpo", "dapo"):  # 5 x 32 / (8 x 5) = 4
        assert spec.method_updates(spec.method(name)) == 4, name
    summary, per = budget(spec)
    assert summary["flops_spent_equal"] is True and summary["flops_equal"] is False
    assert summary["matched"].startswith("FLOPs as spent")
    assert per["grpo"]["flops_spent"] == per["es"]["flops_spent"] == 2.0 * P * 5 * 32 * 16


def test_compute_record_counts_what_trl_runs_per_token():
    from esreason.accounting.budget import compute_record
    from esreason.grpo.config import load_grpo_config

    paper = load_grpo_config("configs/easy/grpo-qwen2.5-1.5b.yaml")  # beta 0.001, 2 optimizer steps, checkpointing
    c = compute_record(paper)
    assert c["passes_per_token"] == {"sample": 1, "forward": 1, "backward": 2, "recompute": 1, "old_policy": 1,
                                     "reference": 1}
    assert (c["forward_equivalents_per_token"], c["paper_forward_equivalents_per_token"]) == (7, 4.0)
    assert c["optimizer_steps_per_update"] == 2
    spec = parse_spec(spec_data())
    assert compute_record(spec.es)["passes_per_token"] == {"sample": 1}
    dapo = compute_record(spec.stage_config(spec.method("dapo"), "grpo"))
    assert dapo["passes_per_token"]["reference"] == 0 and dapo["passes_per_token"]["old_policy"] == 1
    one_step = compute_record(spec.grpo)  # one optimizer step, beta 0.001: no old-policy forward
    assert (one_step["passes_per_token"]["old_policy"], one_step["forward_equivalents_per_token"]) == (0, 5)


def test_an_experiment_written_before_match_existed_continues_under_match_flops(tmp_path):
    from esreason.errors import UserError
    from esreason.experiments.runner import SPEC_FILE, check_same_spec

    data = spec_data()
    (tmp_path / SPEC_FILE).write_text(yaml.safe_dump(data))  # no 'match' key
    check_same_spec(tmp_path, parse_spec(spec_data(match="flops")))
    with pytest.raises(UserError, match="key 'match'"):
        check_same_spec(tmp_path, parse_spec(spec_data(match="rollouts")))


# --------------------------------------------------------------------------- accounting


def test_planned_budget_is_the_papers_estimate_with_rollouts_beside_it():
    spec = parse_spec(spec_data())
    es, grpo = planned(spec.es, params=P, length=16), planned(spec.grpo, params=P)
    assert (es["updates"], es["rollouts_per_update"], es["rollouts"], es["max_tokens"]) == (2, 32, 64, 64 * 16)
    assert es["flops"] == 2.0 * 2 * 8 * 4 * P * 16 == grpo["flops"]
    assert (grpo["rollouts_per_update"], grpo["rollouts"]) == (8, 16) and rollouts_per_update(spec.grpo) == 8
    assert planned(spec.grpo, updates=5, params=P)["rollouts"] == 40
    assert rollout_matched_updates(spec.es, spec.grpo, 2) == 8


def test_consumed_sums_the_update_rows_and_leaves_diagnostics_out(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "heldout/pass@1": 0.5},  # update 0's held-out evaluation: no training
            {"step": 1, "rollouts": 32, "tokens": 400, "coverage/tokens": 90},
            {"step": 2, "rollouts": 28, "tokens": 350}]  # an epoch's tail batch: fewer prompts
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = consumed([path], "es", params=P)
    assert (got["updates"], got["rollouts"], got["tokens"], got["diagnostic_tokens"]) == (2, 60, 750, 90)
    assert got["mean_length"] == pytest.approx(12.5) and got["flops_at_measured_length"] == 2.0 * P * 750
    assert consumed([path], "grpo", params=P)["flops_at_measured_length"] == 8.0 * P * 750
    assert consumed([path], "grpo", params=P, passes=7)["flops_spent"] == 2.0 * P * 7 * 750
    assert consumed([path], "grpo", params=P)["flops_spent"] is None  # no manifest records the passes
    (tmp_path / "manifest.json").write_text(json.dumps({"budget": {"planned": {"compute": {
        "forward_equivalents_per_token": 5}}}}))
    assert consumed([path], "grpo", params=P)["flops_spent"] == 2.0 * P * 5 * 750  # the run's own record
    old = tmp_path / "old.jsonl"
    old.write_text(json.dumps({"step": 1, "tokens": 10}) + "\n")  # a run from before rollouts were logged
    assert consumed([old], "es")["rollouts"] is None and consumed([old], "es")["tokens"] == 10
    both = combine([got, consumed([path], "grpo", params=P)])
    assert both["rollouts"] == 120 and both["tokens"] == 1500 and len(both["stages"]) == 2


def test_each_training_seed_trains_a_variant_from_its_own_seeded_config(tmp_path, monkeypatch):
    """The runner trains a variant of a seeded experiment with that seed (its own config, not configs.grpo)."""
    from esreason.embedded import demo_model_dir
    from esreason.experiments import runner, sequence

    trained = []

    def fake_train(kind, cfg, run, progress):
        trained.append((run.parent.name, run.name, cfg.train.seed, cfg.grpo.loss_type, cfg.train.max_steps))
        return cfg.train.max_steps, demo_model_dir()

    monkeypatch.setattr(sequence, "train_method", fake_train)
    monkeypatch.setattr(runner, "_evaluate", lambda *a, **k: 0.0)
    spec = parse_spec(spec_data(methods=["dapo"], seeds=[3, 4], match="rollouts", configs={"es": ES, "grpo": GRPO},
                                variants={"dapo": DAPO4}))
    record = runner.run_experiment(spec, tmp_path / "exp", progress=False, report=False, log=lambda *_: None).record
    assert trained == [("dapo", "seed3", 3, "dapo", 8), ("dapo", "seed4", 4, "dapo", 8)]
    assert set(record["methods"]["dapo"]["seeds"]) == {"3", "4"} and record["methods"]["dapo"]["updates"] == 8
