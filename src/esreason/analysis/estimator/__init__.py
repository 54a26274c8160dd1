"""The ES–ZO local perturbation diagnostic (paper appendix "ES–ZO Estimator Equivalence";
docs/estimator.md) — ``esreason analyze estimator``.

- :mod:`~esreason.analysis.estimator.diagnostic`: the protocol's settings (validation naming
  the flag) and result type;
- :mod:`~esreason.analysis.estimator.stats`: pooled Corr / kappa statistics and the observation arrays;
- :mod:`~esreason.analysis.estimator.objectives`: the objectives (rollout reward, supervised CE,
  fixed-rollout log-prob / sequence loss / GRPO surrogate);
- :mod:`~esreason.analysis.estimator.sst2`: the SST-2 loader and verbaliser of the supervised control;
- :mod:`~esreason.analysis.estimator.run`: :func:`run_diagnostic`, perturbing a model and observing X+, X0, X-;
- :mod:`~esreason.analysis.estimator.report`: tables, JSON payload, the kappa figure, the ``.npz``;
- :mod:`~esreason.analysis.estimator.command`: the ``analyze estimator`` parser and command.

Nothing is imported here, so importing a submodule does not load torch or the model code.
"""
