"""The paper's GRPO objective: our reference implementation, and TRL checked against it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from esreason.grpo.objective import clipped_surrogate, completion_logprobs, group_advantages, grpo_loss, k3_kl

# --------------------------------------------------------------------------- reference advantages


def test_group_advantage_uses_population_std():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.1, 0.0])
    a = group_advantages(r, 4)
    s = math.sqrt(3) / 4  # population std of (1, 0, 0, 0)
    expected_first = [0.75 / s, -0.25 / s, -0.25 / s, -0.25 / s]
    assert a[:4].tolist() == pytest.approx(expected_first, abs=1e-12)
    g2 = r[4:].numpy().astype(np.float64)  # the float32 rewards, exactly
    assert a[4:].numpy() == pytest.approx((g2 - g2.mean()) / g2.std(ddof=0), abs=1e-12)
    # Not Bessel's correction (TRL's torch.std default), which would be smaller by sqrt(3/4).
    assert a[0].item() != pytest.approx(0.75 / torch.tensor([1.0, 0, 0, 0]).std().item(), abs=1e-3)
    assert a.dtype == torch.float64


def test_constant_groups_get_exactly_zero_advantage():
    # 0.1 is not exact in binary: mean(0.1, 0.1, 0.1) - 0.1 can be a few ulps, which an
    # epsilon-free division would blow up. Equality of the rewards decides.
    r = torch.tensor([0.1, 0.1, 0.1, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0], dtype=torch.float32)
    for standardize in (True, False):
        assert torch.equal(group_advantages(r, 3, standardize=standardize), torch.zeros(9, dtype=torch.float64))


def test_group_relative_without_standardisation_is_centred_reward():
    r = torch.tensor([1.0, 0.0, 0.1, 0.1])
    assert group_advantages(r, 4, standardize=False).tolist() == pytest.approx([0.7, -0.3, -0.2, -0.2])


def test_group_advantage_rejects_bad_shapes_and_inf():
    with pytest.raises(ValueError, match="group_size=3"):
        group_advantages(torch.zeros(4), 3)
    with pytest.raises(ValueError, match="finite"):
        group_advantages(torch.tensor([1.0, float("inf")]), 2)


def test_unscorable_responses_are_left_out_of_their_group_as_trl_leaves_them():
    """NaN = every reward function returned None: out of the group's mean and std, advantage 0."""
    nan = float("nan")
    adv = group_advantages(torch.tensor([1.0, 0.0, nan, 0.5, 2.0, nan, nan, nan]), 4)
    scored = group_advantages(torch.tensor([1.0, 0.0, 0.5]), 3)  # the same group without its NaN
    assert torch.equal(adv[[0, 1, 3]], scored)
    assert adv[2] == 0 and torch.equal(adv[4:], torch.zeros(4, dtype=torch.float64))  # one scored / none scored
    assert torch.isfinite(adv).all()


def test_reference_loss_is_per_response_mean_then_mean():
    """Two responses of different lengths: each contributes its own token mean (not a token mean)."""
    logp = torch.zeros(2, 3)
    old = torch.zeros(2, 3)  # ratio 1: per-token loss = -A
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    parts = grpo_loss(logp, old, adv, mask)
    assert parts.loss.item() == pytest.approx(0.0)  # (-1 + 1) / 2; a token mean would give (-1 + 3) / 4
    # Clipping: ratio e^0.5 > 1.2 with A > 0 is clipped at 1.2 -> loss -1.2; with A < 0 the min keeps e^0.5.
    logp = torch.tensor([[0.5], [0.5]])
    parts = grpo_loss(logp, torch.zeros(2, 1), adv, torch.ones(2, 1), epsilon=0.2)
    assert parts.loss.item() == pytest.approx((-1.2 + math.exp(0.5)) / 2)
    assert parts.clip_high.item() == pytest.approx(0.5) and parts.clip_low.item() == 0.0


def test_k3_is_nonnegative_and_zero_at_equality():
    logp = torch.randn(4, 5)
    assert torch.all(k3_kl(logp, logp + torch.randn(4, 5)) >= 0)
    assert torch.equal(k3_kl(logp, logp), torch.zeros(4, 5))


# --------------------------------------------------------------------------- TRL against the reference


@pytest.fixture(scope="module")
def trl_setup(tiny_model_dir, tmp_path_factory):
    """A PaperGRPOTrainer on the tiny random model, configured by build_trl_args."""
    from esreason import tasks
    from esreason.backends.hf import load_model
    from esreason.grpo.config import load_grpo_config
    from esreason.grpo.plan import plan_batches
    from esreason.grpo.reward import trl_rewards
    from esreason.grpo.run import _build_dataset
    from esreason.grpo.trainer import PaperGRPOTrainer, build_trl_args, make_grpo_config

    cfg = load_grpo_config(None, [f"model={tiny_model_dir}", "train.limit=8", "train.batch_size=4",
                                  "grpo.num_generations=4", "grpo.micro_batch_size=16", "train.max_steps=1",
                                  "generation.max_new_tokens=12", "generation.temperature=0.7"])
    problems = tasks.get(cfg.task).load("train", None, cfg.train.limit)
    plan = plan_batches(cfg, len(problems))
    model, tok = load_model(str(tiny_model_dir))
    recorded: list[list[float]] = []

    def reward(*, completion_ids, problem_index, **_):
        # Deterministic, varied within groups; problem 0's group is constant (0.1).
        out = [0.1 if i == 0 else (sum(ids) % 5) / 4 for ids, i in zip(completion_ids, problem_index)]
        recorded.append(out)
        return out

    task = tasks.get(cfg.task)
    _, _, rows = trl_rewards(problems, tok, task.scorer(cfg.grpo.format_reward, tok))  # prompt + problem_index
    trainer = PaperGRPOTrainer(model=model, reward_funcs=reward,
                               args=make_grpo_config(build_trl_args(cfg, plan, tmp_path_factory.mktemp("trl"))),
                               train_dataset=_build_dataset(rows), processing_class=tok,
                               standardize_advantages=True)
    return trainer, model, tok, recorded, cfg


def test_trl_is_configured_with_the_papers_objective(trl_setup):
    trainer, *_ = trl_setup
    args = trainer.args
    assert trainer.loss_type == "grpo"
    assert trainer.epsilon_low == trainer.epsilon_high == 0.2
    assert trainer.beta == 0.001 and trainer.ref_model is not None
    assert args.use_bias_correction_kl is False
    assert trainer.num_iterations == 1 and trainer.importance_sampling_level == "token"
    from esreason.grpo.trainer import checkpointing_field

    assert args.bf16 is False and getattr(args, checkpointing_field()) is False
    assert args.lr_scheduler_type == "constant" and args.learning_rate == 1e-6
    assert args.weight_decay == 0.01 and args.max_grad_norm == 1.0
    assert trainer.temperature == 0.7 and trainer.top_k == 0


def _fixed_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n, p, c = 6, 7, 9
    prompt_ids = torch.randint(4, 100, (n, p), generator=g)
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    for i, pad in enumerate([0, 2, 1, 3, 0, 4]):  # left padding
        prompt_ids[i, :pad] = 0
        prompt_mask[i, :pad] = 0
    completion_ids = torch.randint(4, 100, (n, c), generator=g)
    completion_mask = torch.ones(n, c, dtype=torch.long)
    for i, length in enumerate([9, 3, 6, 1, 8, 5]):  # right padding
        completion_ids[i, length:] = 0
        completion_mask[i, length:] = 0
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask}


def test_trl_loss_and_gradients_match_the_reference(trl_setup):
    trainer, model, _, _, cfg = trl_setup
    temperature = cfg.generation.temperature
    batch = _fixed_batch()
    g = torch.Generator().manual_seed(1)
    model.train()
    with torch.no_grad():
        current = completion_logprobs(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                                      batch["completion_mask"], temperature)  # [N, C]
    old = current + 0.4 * torch.randn(current.shape, generator=g)  # ratios well outside [0.8, 1.2]
    ref = current + 0.3 * torch.randn(current.shape, generator=g)
    adv = torch.tensor([1.3, -0.7, 0.4, -1.1, 0.9, -0.2])
    inputs = {**batch, "advantages": adv, "old_per_token_logps": old, "ref_per_token_logps": ref,
              "num_items_in_batch": batch["completion_mask"].sum()}
    params = [p for p in model.parameters() if p.requires_grad]

    trainer.current_gradient_accumulation_steps = 1
    trainer._metrics["train"].clear()
    loss_trl = trainer.compute_loss(model, inputs)
    grads_trl = torch.autograd.grad(loss_trl, params)

    logp = completion_logprobs(model, batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"],
                               batch["completion_mask"], temperature)
    parts = grpo_loss(logp, old, adv, batch["completion_mask"], epsilon=cfg.grpo.epsilon, beta=cfg.grpo.beta,
                      ref_logp=ref, kl_ratio_correction=cfg.grpo.kl_ratio_correction)
    grads_ref = torch.autograd.grad(parts.loss, params)

    assert parts.clip_low.item() > 0.05 and parts.clip_high.item() > 0.05  # both clip branches exercised
    assert loss_trl.item() == pytest.approx(parts.loss.item(), rel=1e-5, abs=1e-6)
    for gt, gr in zip(grads_trl, grads_ref):
        torch.testing.assert_close(gt, gr, rtol=1e-4, atol=1e-6)
    logged = trainer._metrics["train"]
    assert logged["kl"][-1] == pytest.approx(parts.kl.item(), rel=1e-5)
    assert logged["clip_ratio/low_mean"][-1] == pytest.approx(parts.clip_low.item(), rel=1e-6)
    assert logged["clip_ratio/high_mean"][-1] == pytest.approx(parts.clip_high.item(), rel=1e-6)
    # The token-level mean (TRL's default "dapo") is a different number on this batch, so the
    # comparison above distinguishes the paper's per-response mean from it.
    maskf = batch["completion_mask"].float()
    per_token = clipped_surrogate(logp, old, adv, 0.2) + cfg.grpo.beta * k3_kl(logp, ref)
    token_mean = ((per_token * maskf).sum() / maskf.sum()).item()
    assert abs(token_mean - parts.loss.item()) > 1e-2


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_trl_trains_on_population_std_advantages(trl_setup):
    trainer, model, _, recorded, _ = trl_setup
    model.train()
    rows = [trainer.train_dataset[i] for i in range(4)]
    inputs = [row for row in rows for _ in range(trainer.num_generations)]  # TRL's layout: G copies per prompt
    recorded.clear()
    out = trainer._generate_and_score_completions(inputs)
    rewards = torch.tensor(recorded[-1])
    groups = rewards.reshape(4, 4)
    assert (groups[0] == 0.1).all()  # one constant group
    assert any(len(set(g.tolist())) > 1 for g in groups[1:])  # and some varied ones
    expected = group_advantages(rewards, 4).float()
    torch.testing.assert_close(out["advantages"], expected, rtol=0, atol=1e-7)
    assert torch.equal(out["advantages"][:4], torch.zeros(4))
    trl_default = (groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)
    assert not torch.allclose(out["advantages"], trl_default.reshape(-1), atol=1e-3)
    assert list(trainer._logs["advantages"]) == pytest.approx(expected.tolist(), abs=1e-6)
