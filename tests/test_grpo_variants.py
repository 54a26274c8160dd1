"""GRPO variants (grpo.loss_type, grpo.importance_sampling_level, the presets): our reference loss per
variant, and TRL 1.16's loss and gradients checked against it per variant."""

from __future__ import annotations

import math

import pytest
import torch

from esreason.config import ConfigError
from esreason.grpo.config import GRPORunConfig, load_grpo_config
from esreason.grpo.objective import (CLIPPED_LOSSES, LOSS_TYPES, aggregate, completion_logprobs, group_advantages,
                                     grpo_loss)
from esreason.grpo.variants import PRESETS
from test_grpo_objective import _fixed_batch  # the same left/right-padded batch as the base objective's test

# --------------------------------------------------------------------------- config


def test_defaults_are_the_papers_objective_and_reach_trl():
    from esreason.grpo.plan import plan_batches
    from esreason.grpo.trainer import build_trl_args

    cfg = GRPORunConfig()
    assert (cfg.grpo.loss_type, cfg.grpo.importance_sampling_level) == ("grpo", "token")
    cfg = load_grpo_config(None, ["grpo.loss_type=dr_grpo", "grpo.importance_sampling_level=sequence",
                                  "train.max_steps=1"])
    args = build_trl_args(cfg, plan_batches(cfg, 640), "out")
    assert (args["loss_type"], args["importance_sampling_level"]) == ("dr_grpo", "sequence")


@pytest.mark.parametrize("override, key", [("grpo.loss_type=gmpo", "grpo.loss_type"),
                                           ("grpo.loss_type=GRPO", "grpo.loss_type"),
                                           ("grpo.importance_sampling_level=group", "grpo.importance_sampling_level")])
def test_unknown_variants_raise_a_config_error_naming_the_key(override, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_grpo_config(None, [override])


def _preset_config(name: str) -> GRPORunConfig:
    from esreason.config import build, merge, to_dict

    return build(GRPORunConfig, merge(to_dict(GRPORunConfig()), dict(PRESETS[name].overlay)))


def test_presets_are_valid_configs_with_their_sources_values():
    assert all(v.source and v.label for v in PRESETS.values())
    d, r, g = _preset_config("dapo").grpo, _preset_config("dr_grpo").grpo, _preset_config("gspo").grpo
    assert (d.loss_type, d.epsilon, d.epsilon_high, d.beta, d.mask_truncated_completions) == (
        "dapo", 0.2, 0.28, 0.0, True)
    assert (d.mini_batches, d.soft_overlong_punishment) == (16, 0.2)  # DAPO Sec. 4.1
    assert (r.loss_type, r.standardize_advantages, r.beta) == ("dr_grpo", False, 0.001)  # KL as the base config
    assert (g.loss_type, g.importance_sampling_level, g.epsilon, g.epsilon_high, g.beta, g.mini_batches) == (
        "grpo", "sequence", 3e-4, 4e-4, 0.0, 4)  # GSPO Sec. 5.1
    assert _preset_config("bnpo").grpo.loss_type == "bnpo"
    c, sp, lu, ve = (_preset_config(n).grpo for n in ("cispo", "sapo", "luspo", "vespo"))
    assert (c.loss_type, c.epsilon_high, sp.loss_type, ve.loss_type) == ("cispo", 5.0, "sapo", "vespo")
    assert (lu.loss_type, lu.importance_sampling_level) == ("luspo", "sequence")


def test_a_preset_steps_override_a_base_mini_batch_size():
    """A base config with the paper's mini_batch_size (2 steps per update) takes the preset's mini_batches."""
    from esreason.config import build, merge, to_dict

    base = merge(to_dict(GRPORunConfig()), {"train": {"batch_size": 64}, "grpo": {"mini_batch_size": 32}})
    cfg = build(GRPORunConfig, merge(base, dict(PRESETS["gspo"].overlay)))
    assert (cfg.grpo.mini_batch_size, cfg.grpo.mini_batches) == (None, 4)


@pytest.mark.parametrize("overrides, key", [
    (["grpo.mini_batch_size=2", "grpo.mini_batches=2"], "grpo.mini_batches"),
    (["train.batch_size=6", "grpo.mini_batches=4"], "grpo.mini_batches"),
    (["grpo.soft_overlong_punishment=1.0"], "grpo.soft_overlong_punishment"),
    (["generation.max_new_tokens=4", "grpo.soft_overlong_punishment=0.1"], "grpo.soft_overlong_punishment"),
    (["grpo.reference_dtype=int8"], "grpo.reference_dtype")])
def test_bad_steps_overlong_and_reference_settings_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_grpo_config(None, overrides)


def test_reference_dtype_reaches_trls_reference_model(base_setup, tmp_path):
    """grpo.reference_dtype: TRL builds the KL reference in the policy's dtype unless told (fp32 here)."""
    trainer, _ = make_trainer(base_setup, ["grpo.beta=0.001"], tmp_path / "policy")
    assert trainer.ref_model.dtype == torch.float32
    trainer, _ = make_trainer(base_setup, ["grpo.beta=0.001", "grpo.reference_dtype=bfloat16"], tmp_path / "bf16")
    assert trainer.ref_model.dtype == torch.bfloat16
    assert next(trainer.model.parameters()).dtype == torch.float32  # the policy keeps its own
    trainer, _ = make_trainer(base_setup, ["grpo.beta=0", "grpo.reference_dtype=bfloat16"], tmp_path / "none")
    assert trainer.ref_model is None  # beta 0: no reference at all


def test_the_memory_plans_reference_term_is_the_reference_trl_builds(base_setup, tmp_path):
    """The plan's reference term (a replica: DDP or one process) is the bytes of TRL's own reference model: in
    the policy's dtype by default, in grpo.reference_dtype when set, and nothing at beta 0."""
    from esreason.experiments.memplan import reference_dtype
    from esreason.experiments.memtrace import trace_grpo_microstep
    from esreason.io.architectures import architecture

    arch = architecture(base_setup[0][0].split("=", 1)[1])  # the tiny model's config.json
    for i, over in enumerate((["grpo.beta=0.001"], ["grpo.beta=0.001", "grpo.reference_dtype=bfloat16"],
                              ["grpo.beta=0"])):
        trainer, cfg = make_trainer(base_setup, over, tmp_path / str(i))
        held = 0 if trainer.ref_model is None else sum(p.nbytes for p in trainer.ref_model.parameters())
        traced = trace_grpo_microstep(arch, micro_batch=2, prompt_len=8, completion_len=8, autocast=None,
                                      beta=cfg.grpo.beta, reference_dtype=reference_dtype(cfg), extrapolate=False)
        assert traced.reference == held, over
    assert held == 0  # beta 0: TRL builds none, the plan holds none


def test_soft_overlong_punishment_is_trls_with_the_share_of_the_limit():
    """DAPO Eq. 13 at L_max = 20 and a 0.25 share (L_cache = 5): 0 up to 15 tokens, then linear to -1 at 20."""
    from esreason.grpo.reward import overlong_reward, reward_functions

    cfg = load_grpo_config(None, ["generation.max_new_tokens=20", "grpo.soft_overlong_punishment=0.25"])
    fn = overlong_reward(cfg)
    assert fn([[1] * 15, [1] * 17, [1] * 20]) == pytest.approx([0.0, -0.4, -1.0])
    assert overlong_reward(load_grpo_config(None, [])) is None
    funcs, n_task, _ = reward_functions(cfg, [], None, lambda text, gold: None)
    assert (len(funcs), n_task) == (2, 1) and funcs[1].__name__ == "soft_overlong_punishment_reward"


# --------------------------------------------------------------------------- reference aggregations


def test_each_aggregation_on_a_batch_computed_by_hand():
    """Two responses of 1 and 3 tokens at ratio 1, advantages +1 and -1: per-token losses -1 and +1, +1, +1."""
    logp = torch.zeros(2, 3)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    loss = {t: grpo_loss(logp, logp, adv, mask, loss_type=t, max_completion_length=4).loss.item()
            for t in ("grpo", "bnpo", "dapo", "dr_grpo")}
    assert loss["grpo"] == pytest.approx(0.0)  # (-1 + 1) / 2: each response's token mean, then the mean
    assert loss["bnpo"] == pytest.approx(0.5) and loss["dapo"] == pytest.approx(0.5)  # (-1 + 3) / 4 tokens
    assert loss["dr_grpo"] == pytest.approx(0.25)  # (-1 + 3) / (2 responses x 4 max tokens)
    dapo_step = grpo_loss(logp, logp, adv, mask, loss_type="dapo", num_items=8).loss.item()
    assert dapo_step == pytest.approx(0.25)  # the rollout batch's tokens per optimizer step as the normaliser
    with pytest.raises(ValueError, match="max_completion_length"):
        aggregate(torch.zeros(2, 3), mask, "dr_grpo")
    with pytest.raises(ValueError, match="loss_type"):
        aggregate(torch.zeros(2, 3), mask, "cispo")


def test_sequence_level_ratio_is_the_geometric_mean_and_is_clipped_per_response():
    """GSPO: one ratio per response, exp(mean_t log rho_t), clipped as a whole."""
    logp = torch.tensor([[0.3, 0.1, 0.0], [0.2, 0.0, 0.0]])
    old = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, 1.0])
    parts = grpo_loss(logp, old, adv, mask, epsilon=0.2, epsilon_high=0.15, importance_sampling_level="sequence")
    rho = [math.exp(0.2), math.exp(0.2)]  # (0.3 + 0.1) / 2 and 0.2 / 1: both above 1 + 0.15, clipped
    assert all(r > 1.15 for r in rho)
    assert parts.loss.item() == pytest.approx(-1.15)
    assert parts.clip_high.item() == 1.0 and parts.clip_low.item() == 0.0  # a fraction of responses
    token = grpo_loss(logp, old, adv, mask, epsilon=0.2, epsilon_high=0.15)
    assert token.loss.item() == pytest.approx(-(1.15 + math.exp(0.1)) / 2 / 2 - 1.15 / 2)  # token 0.1: inside
    assert token.clip_high.item() == pytest.approx(2 / 3)  # a fraction of tokens


# --------------------------------------------------------------------------- TRL against the reference

#: Preset keys that set the batching or the rewards, not the loss: left out where a fixed batch is compared.
NOT_LOSS = ("mini_batches", "mini_batch_size", "soft_overlong_punishment")


def _overlay(name: str) -> list[str]:
    return [f"grpo.{k}={v}" for k, v in PRESETS[name].overlay["grpo"].items() if k not in NOT_LOSS]


#: Per variant: the GRPO config overrides.
VARIANTS = {
    "grpo": [],
    "dr_grpo": _overlay("dr_grpo"),
    "dapo": _overlay("dapo"),
    "bnpo": ["grpo.loss_type=bnpo", "grpo.epsilon_high=0.28"],
    "gspo": _overlay("gspo"),
    "gspo_kl": _overlay("gspo") + ["grpo.beta=0.001", "grpo.kl_ratio_correction=true"],
    "cispo": _overlay("cispo") + ["grpo.epsilon_high=1.3"],  # a weight cap the batch's ratios cross
    "sapo": _overlay("sapo"),
    "luspo": _overlay("luspo"),
    "vespo": _overlay("vespo") + ["grpo.beta=0.001"],
}
ADVANTAGES = [1.3, -0.7, 0.4, -1.1, 0.9, -0.2]
#: Mean log ratio of each response for the sequence-level variants, against GSPO's clip [1 - 3e-4, 1 + 4e-4]:
#: above with A > 0 (clipped high), below with A < 0 (clipped low, twice), inside, above with A < 0 (not
#: clipped: the min keeps the ratio), inside.
SEQUENCE_LOG_RATIOS = [1e-3, -1e-3, 1e-4, 1e-3, -1e-4, -1e-3]


def _old_logps(current: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """Behaviour log-probs: per-token noise of 0.4 (ratios well outside [0.8, 1.2]); for sequence-level ratios the
    noise is centred per response and each response's mean log ratio set to SEQUENCE_LOG_RATIOS."""
    z = 0.4 * torch.randn(current.shape, generator=torch.Generator().manual_seed(1))  # [N, C]
    if level == "token":
        return current + z
    m = mask.float()
    centred = z - (z * m).sum(1, keepdim=True) / m.sum(1, keepdim=True)  # masked mean 0 per response
    return current - (centred + torch.tensor(SEQUENCE_LOG_RATIOS).unsqueeze(1))  # log ratio = centred + d_i


@pytest.fixture(scope="module")
def base_setup(tiny_model_dir):
    from esreason import tasks
    from esreason.backends.hf import load_model
    from esreason.grpo.reward import trl_rewards
    from esreason.grpo.run import _build_dataset

    base = [f"model={tiny_model_dir}", "train.limit=8", "train.batch_size=4", "grpo.num_generations=4",
            "grpo.micro_batch_size=16", "train.max_steps=1", "generation.max_new_tokens=12",
            "generation.temperature=0.7"]
    cfg = load_grpo_config(None, base)
    problems = tasks.get(cfg.task).load("train", None, cfg.train.limit)
    model, tok = load_model(str(tiny_model_dir))
    _, _, rows = trl_rewards(problems, tok, tasks.get(cfg.task).scorer(cfg.grpo.format_reward, tok))
    return base, model, tok, _build_dataset(rows), len(problems)


def make_trainer(base_setup, overrides, out, reward=None):
    from esreason.grpo.plan import plan_batches
    from esreason.grpo.trainer import PaperGRPOTrainer, build_trl_args, make_grpo_config

    base, model, tok, dataset, n = base_setup
    cfg = load_grpo_config(None, base + list(overrides))
    args = make_grpo_config(build_trl_args(cfg, plan_batches(cfg, n), out))
    trainer = PaperGRPOTrainer(model=model, reward_funcs=reward or (lambda completions, **_: [0.0] * len(completions)),
                               args=args, train_dataset=dataset, processing_class=tok,
                               standardize_advantages=cfg.grpo.standardize_advantages)
    return trainer, cfg


def _reference(model, batch, old, ref, adv, cfg, num_items):
    logp = completion_logprobs(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                               batch["completion_mask"], cfg.generation.temperature)
    g = cfg.grpo
    return grpo_loss(logp, old, adv, batch["completion_mask"], epsilon=g.epsilon, epsilon_high=g.epsilon_high,
                     beta=g.beta, ref_logp=ref, kl_ratio_correction=g.kl_ratio_correction, loss_type=g.loss_type,
                     importance_sampling_level=g.importance_sampling_level,
                     max_completion_length=cfg.generation.max_new_tokens, num_items=num_items)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_trl_loss_and_gradients_match_the_reference_per_variant(variant, base_setup, tmp_path):
    overrides = VARIANTS[variant]
    trainer, cfg = make_trainer(base_setup, overrides, tmp_path)
    g = cfg.grpo
    assert (trainer.loss_type, trainer.importance_sampling_level) == (g.loss_type, g.importance_sampling_level)
    assert trainer.epsilon_high == (g.epsilon if g.epsilon_high is None else g.epsilon_high)
    assert trainer.mask_truncated_completions == g.mask_truncated_completions and trainer.beta == g.beta
    model = base_setup[1]
    batch = _fixed_batch()
    model.train()
    with torch.no_grad():
        current = completion_logprobs(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                                      batch["completion_mask"], cfg.generation.temperature)  # [N, C]
    old = _old_logps(current, batch["completion_mask"], g.importance_sampling_level)
    ref = current + 0.3 * torch.randn(current.shape, generator=torch.Generator().manual_seed(2))
    adv = torch.tensor(ADVANTAGES)
    # 'dapo' divides by TRL's num_items_in_batch (the rollout batch's tokens): give it more than this
    # micro-batch holds, as a micro-batch of a larger step sees, so the normaliser itself is compared.
    num_items = batch["completion_mask"].sum() + (5 if g.loss_type == "dapo" else 0)
    inputs = {**batch, "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": num_items}
    params = [p for p in model.parameters() if p.requires_grad]
    trainer.current_gradient_accumulation_steps = 1
    trainer._metrics["train"].clear()
    loss_trl = trainer.compute_loss(model, inputs)
    grads_trl = torch.autograd.grad(loss_trl, params)
    parts = _reference(model, batch, old, ref, adv, cfg, num_items)
    grads_ref = torch.autograd.grad(parts.loss, params)

    # Both clip branches (or, per response, clipped and unclipped responses) occur, so the check covers them
    # (CISPO caps the weight from above only; SAPO and VESPO have no clip).
    if g.loss_type in CLIPPED_LOSSES:
        assert parts.clip_low.item() > 0.05 and parts.clip_high.item() > 0.05
        assert parts.clip_low.item() + parts.clip_high.item() < 0.95
    elif g.loss_type == "cispo":
        assert 0.05 < parts.clip_high.item() < 0.95
    # fp32 throughout; the two sides sum the same terms in a different order, which moves the result by a
    # few float32 ulps relative to its size (~1e-7): 1e-5 / 1e-4 leave room and still separate the variants.
    assert loss_trl.item() == pytest.approx(parts.loss.item(), rel=1e-5, abs=1e-6)
    for gt, gr in zip(grads_trl, grads_ref):
        torch.testing.assert_close(gt, gr, rtol=1e-4, atol=1e-6)
    logged = trainer._metrics["train"]
    if g.loss_type in CLIPPED_LOSSES:
        assert logged["clip_ratio/low_mean"][-1] == pytest.approx(parts.clip_low.item(), rel=1e-6)
        assert logged["clip_ratio/high_mean"][-1] == pytest.approx(parts.clip_high.item(), rel=1e-6)
    elif g.loss_type == "cispo":
        assert logged["cispo_clip_ratio"][-1] == pytest.approx(parts.clip_high.item(), rel=1e-6)
    if g.beta:
        assert logged["kl"][-1] == pytest.approx(parts.kl.item(), rel=1e-5)
    # The other aggregations give other numbers on this batch, so the match above identifies this one (bnpo
    # and an unscaled dapo are the same token mean: the dapo case compares a larger normaliser instead).
    for t in LOSS_TYPES:
        if t == g.loss_type or (g.loss_type, t) == ("bnpo", "dapo"):
            continue
        other = _reference(model, batch, old, ref, adv, load_grpo_config(None, base_setup[0] + overrides + [
            f"grpo.loss_type={t}"]), num_items).loss.item()
        assert abs(other - parts.loss.item()) > 1e-3, (variant, t)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_dr_grpo_trains_on_unscaled_advantages_and_logs_its_rollouts(base_setup, tmp_path):
    """Dr. GRPO's advantage is r - mean: our advantage override follows grpo.standardize_advantages, which the
    preset sets false (TRL's loss_type alone would keep its std scaling). Every update logs its rollouts."""
    recorded: list[list[float]] = []

    def reward(*, completion_ids, problem_index, **_):
        out = [0.1 if i == 0 else (sum(ids) % 5) / 4 for ids, i in zip(completion_ids, problem_index)]
        recorded.append(out)
        return out

    trainer, _ = make_trainer(base_setup, VARIANTS["dr_grpo"], tmp_path, reward)
    trainer.model.train()
    rows = [trainer.train_dataset[i] for i in range(4)]
    out = trainer._generate_and_score_completions([row for row in rows for _ in range(trainer.num_generations)])
    rewards = torch.tensor(recorded[-1])
    expected = group_advantages(rewards, 4, standardize=False).float()
    torch.testing.assert_close(out["advantages"], expected, rtol=0, atol=1e-7)
    assert not torch.allclose(expected, group_advantages(rewards, 4).float(), atol=1e-3)  # scaling would differ
    logged = trainer._metrics["train"]
    lengths = out["completion_mask"].sum(1)  # mask_truncated_completions is off: every generated token counts
    assert logged["rollouts"][-1] == 16 and logged["tokens"][-1] == lengths.sum().item()
