"""What a training run costs, counted the same way by every layer that records it.

:mod:`esreason.accounting.flops` (the paper's FLOP formulas, forward-equivalents as spent) and
:mod:`esreason.accounting.budget` (the ``budget`` record of a run's manifest: planned and consumed rollouts,
tokens and FLOPs; the experiments' matching). They sit below the ES loop and the GRPO comparator, which
write the record, and above the configs (GRPO's batch arithmetic, :mod:`esreason.grpo.plan`, is config-level).
"""
