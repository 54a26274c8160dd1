"""The completions table of an ES run on W&B (``logging.wandb.table_every``; :mod:`esreason.io.wandb_log`).

After update t (logged as step t + 1) the updated centre answers the first ``table_rows`` prompts
of update t's mini-batch once, with the train-time sampling settings (``generation.*``) and the
sampling seed member 0 had at update t, and each answer is scored by the task's verifier: rows
(prompt, completion, reward). The members' own responses are not kept by the population
evaluators (they return rewards only; :class:`esreason.backends.base.PopulationResult`), so the
table shows the policy being trained rather than one perturbation of it.

Read-only: the centre is not changed, and the samplers draw from their own seeded generators, so
the training trajectory is the same with and without the table (tests/test_wandb_logging.py).
With vLLM engines the table is sampled where held-out evaluation samples
(:func:`esreason.es_loop.run.heldout_generator`).
"""

from __future__ import annotations

from typing import Any, Callable

from esreason.backends.base import Generator


def prompt_text(problem: Any) -> str:
    """The problem's last user message (what a reader wants to see; the model saw it in its chat template)."""
    users = [m.get("content", "") for m in problem.messages if m.get("role") == "user"]
    return users[-1] if users else str(problem.messages[-1].get("content", "")) if problem.messages else ""


def es_completions(trainer: Any, generator: Generator, rows: int) -> Callable[[int], list[tuple[str, str, float]]]:
    """``sample(step)``: (prompt, completion, reward) of the centre after update ``step - 1`` (see module doc).

    trainer: the :class:`esreason.es_loop.trainer.ESTrainer` (schedule, prompts, problems, scorer,
    sampling parameters); generator: what samples the centre.
    """

    def sample(step: int) -> list[tuple[str, str, float]]:
        t = step - 1
        trainer.wait_reference()  # a sharded pool updates the reference in the background
        idx = list(trainer.schedule.batch(t))[:rows]
        problems = [trainer.problems[i] for i in idx]
        params = trainer.member_params(t)[0]  # member 0's sampling seed at update t
        gen = generator.generate([trainer.prompts[i] for i in idx], params)
        return [(prompt_text(p), text, float(trainer.scorer(text, p.gold).reward))
                for p, text in zip(problems, gen.texts)]

    return sample


__all__ = ["es_completions", "prompt_text"]
