"""A TRL user's habits on ESTrainer / ESConfig: transformers TrainerCallbacks with TrainerControl honoured,
trainer.state and trainer.model, report_to and logging_steps, rewards/<function>/mean|std in the metrics,
and trainer_state handed to reward functions."""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.heavy  # short trained runs (`--fast` leaves this file out)

N, B = 2, 2  # members, prompts per update: every reward call scores B completions


def rows(n: int) -> list[dict]:
    return [{"prompt": f"{i}+{i + 1}", "total": 2 * i + 1} for i in range(n)]


def one(completions, **kwargs):
    return [1.0 for _ in completions]


def alternate(completions, **kwargs):
    """0, 1, 0, 1 ... per call: over the N x B responses of an update, mean 0.5 and (Bessel) std sqrt(1/3)."""
    return [float(i % 2) for i in range(len(completions))]


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def scalar_steps(run, key: str) -> list[int]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    return [e.step for e in acc.Scalars(key)] if key in acc.Tags()["scalars"] else []


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """One run of 5 planned updates with logging_steps 2, a callback recording every event and stopping
    after update 3, and reward functions recording the trainer_state they get."""
    from transformers import TrainerCallback

    from esreason import ESConfig, ESTrainer

    class Recorder(TrainerCallback):
        def __init__(self):
            self.events = []

        def __getattribute__(self, name):
            if name.startswith("on_") and name not in ("on_init_end", "on_prediction_step", "on_predict",
                                                        "on_push_begin", "on_substep_end", "on_pre_optimizer_step",
                                                        "on_optimizer_step"):
                def record(args, state, control, **kwargs):
                    self.events.append((name, state.global_step))
                    if name == "on_step_end" and state.global_step == 3:
                        control.should_training_stop = True
                    if name == "on_log":
                        assert "logs" in kwargs and kwargs["model"] is not None and args.logging_steps == 2
                return record
            return object.__getattribute__(self, name)

    seen = []

    def scheduled(completions, trainer_state=None, **kwargs):  # a reward that schedules on the step, as under TRL
        seen.append((trainer_state.global_step, trainer_state.max_steps))
        return [min(1.0, trainer_state.global_step / 10) for _ in completions]

    run = tmp_path_factory.mktemp("habits") / "run"
    recorder = Recorder()
    args = ESConfig(output_dir=str(run), task="habits-stop", population_size=N, batch_size=B, max_steps=5,
                    max_new_tokens=8, checkpoint_every=0, logging_steps=2, report_to="tensorboard")
    trainer = ESTrainer("demo", [one, alternate, scheduled], rows(8), args=args, callbacks=[recorder])
    assert trainer.state.global_step == 0  # as TRL's: there before train()
    result = trainer.train()
    return run, trainer, result, recorder.events, seen


def test_callbacks_get_transformers_events_and_should_training_stop_ends_the_run(stopped):
    run, trainer, result, events, _ = stopped
    assert events == [("on_train_begin", 0), ("on_epoch_begin", 0),
                      ("on_step_begin", 0), ("on_step_end", 1),
                      ("on_step_begin", 1), ("on_step_end", 2), ("on_log", 2),
                      ("on_step_begin", 2), ("on_step_end", 3), ("on_save", 3), ("on_epoch_end", 3),
                      ("on_train_end", 3)]
    assert result.steps == 3 and result.final_checkpoint == run / "checkpoints/step_3"
    assert [r["step"] for r in metrics(run)] == [1, 2, 3]  # metrics.jsonl keeps every update


def test_state_model_and_log_history_after_train(stopped):
    from safetensors.torch import load_file

    run, trainer, _, _, _ = stopped
    state = trainer.state
    assert (state.global_step, state.max_steps, state.logging_steps) == (3, 5, 2)
    assert [h["step"] for h in state.log_history] == [2]  # logging_steps=2: update 2 (3 was not a logging step)
    assert state.log_history[0]["reward/mean"] == metrics(run)[1]["reward/mean"]
    # trainer.model is the trained model: its weights are the final checkpoint's
    saved = load_file(str(run / "checkpoints/step_3/model.safetensors"))
    live = {k: v for k, v in trainer.model.state_dict().items() if k in saved}
    assert saved.keys() == live.keys() and all((saved[k] == live[k]).all() for k in saved)


def test_logging_steps_thin_tensorboard_not_metrics_jsonl(stopped):
    run, _, _, _, _ = stopped
    assert scalar_steps(run, "reward/mean") == [2]


def test_per_function_rewards_are_logged_as_trl_logs_them(stopped):
    run, _, _, _, _ = stopped
    row = metrics(run)[0]
    assert row["rewards/one/mean"] == 1.0 and row["rewards/one/std"] == 0.0
    assert row["rewards/alternate/mean"] == 0.5
    # TRL's nanstd is Bessel-corrected: over [0, 1, 0, 1] that is sqrt(1/3), not 0.5 (exact in float64)
    assert row["rewards/alternate/std"] == pytest.approx(math.sqrt(1 / 3), rel=1e-12)
    assert scalar_steps(run, "rewards/alternate/mean") == [2]


def test_reward_functions_get_the_trainer_state(stopped):
    run, _, _, _, seen = stopped
    assert sorted(set(seen)) == [(0, 5), (1, 5), (2, 5)]  # global_step = updates done when the population is scored
    assert len(seen) == 3 * N  # one call per member per update
    assert [r["rewards/scheduled/mean"] for r in metrics(run)] == [0.0, 0.1, 0.2]


def test_report_to_wandb_only_writes_no_tensorboard_and_builtin_verifiers_log_task_reward(tmp_path):
    from esreason import ESConfig, ESTrainer

    args = ESConfig(output_dir=str(tmp_path / "w"), task="demo-add", population_size=N, batch_size=B, max_steps=1,
                    max_new_tokens=8, report_to=["wandb"], wandb_mode="offline")
    ESTrainer("demo", args=args).train()
    assert list((tmp_path / "w/wandb").glob("offline-run-*")) and not (tmp_path / "w/tensorboard").exists()
    row = metrics(tmp_path / "w")[0]
    assert row["rewards/task_reward/mean"] == pytest.approx(row["reward/mean"], abs=1e-12)  # one function: the mean
    assert json.loads((tmp_path / "w/manifest.json").read_text())["config"]["logging"]["report_to"] == ["wandb"]
