"""``esreason experiment plan --hf-only``: the same experiment with every generation on the HF sampler."""

from __future__ import annotations

import dataclasses

from esreason.experiments.spec import ExperimentSpec


def hf_only(spec: ExperimentSpec) -> ExperimentSpec:
    """The same experiment with every generation on the HF sampler: ES on ``backend: hf`` (one GPU),
    GRPO with HF generate, evaluation with ``eval.backend: hf``."""
    es = spec.es
    if es is not None:
        es = dataclasses.replace(es, backend=dataclasses.replace(es.backend, type="hf", engines=1, engines_per_gpu=1,
                                                                 update="replicated"))
    grpo = spec.grpo
    if grpo is not None:
        grpo = dataclasses.replace(grpo, grpo=dataclasses.replace(grpo.grpo, use_vllm=False))
    return dataclasses.replace(spec, es=es, grpo=grpo, eval=dataclasses.replace(spec.eval, backend="hf", engines=1))


__all__ = ["hf_only"]
